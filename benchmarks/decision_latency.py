"""Time of one ``decide`` per policy at three scales (median of repeats) and the peak memory of ``ones``.

Every registered policy is timed (``sia`` and ``pollux`` included; ``pollux``'s job x node search, like
its authors', grows with jobs x nodes: at 4096 GPUs its population shrinks to fit ``max_cells`` and one
decision still takes minutes, so slow policies are timed once). Targets (issue 2): ``ones`` under 50 ms at
64 GPUs / 50 jobs, under 2 s at 4096 GPUs / 3000 jobs, and
under 1 GiB of memory. States are random but seeded (``ones_pipeline.sim.synthetic``): about half the
jobs running, most with throughput observations. Each policy decides once from scratch, then again
from its own schedule (the steady state of a live sensor); both are timed.

    python benchmarks/decision_latency.py [--repeats 3] [--policies ones,pollux] [--scales 64,4096]
        [--ones-params '{"wait_weight": null}']

``--ones-params`` (a JSON object of ``OnesParams`` options) times ``ones`` with them as well, on the same
states in the same run, as the row ``ones*``: what an option costs, measured against the defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

import numpy as np
from ones_options import ones_options  # same folder (the script's folder is on sys.path)

from ones_pipeline.core.policies import make_policy
from ones_pipeline.sim.runner import ALL_POLICIES
from ones_pipeline.sim.synthetic import random_scheduler_state

SCALES = [(64, 50, 4), (512, 400, 8), (4096, 3000, 8)]  # (GPUs, jobs, GPUs per node)


def time_policy(name: str, gpus: int, jobs: int, gpn: int, repeats: int, params: dict | None = None,
                ) -> tuple[float, float]:
    """(median seconds of a first decision, median seconds of a follow-up decision)."""
    firsts, seconds = [], []
    for rep in range(repeats):
        rng = np.random.default_rng(100 + rep)
        cluster, views, current = random_scheduler_state(rng, jobs, gpus // gpn, gpn)
        policy = make_policy(name, seed=rep, **(params or {}))
        # A first decision fits every job's step-time model (a new policy keeps no fits: nothing is skipped).
        t0 = time.perf_counter()
        schedule = policy.decide(1000.0, cluster, views, current)
        t1 = time.perf_counter()
        policy.decide(1060.0, cluster, views, schedule)
        t2 = time.perf_counter()
        firsts.append(t1 - t0)
        seconds.append(t2 - t1)
        if t2 - t0 > 20.0:  # a slow search (pollux at thousands of GPUs): one repeat says enough
            break
    return statistics.median(firsts), statistics.median(seconds)


def peak_memory_mib(name: str, gpus: int, jobs: int, gpn: int) -> float:
    rng = np.random.default_rng(100)
    cluster, views, current = random_scheduler_state(rng, jobs, gpus // gpn, gpn)
    policy = make_policy(name, seed=0)
    tracemalloc.start()
    policy.decide(1000.0, cluster, views, current)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", default=",".join(ALL_POLICIES))
    parser.add_argument("--scales", default=",".join(str(g) for g, _, _ in SCALES),
                        help="GPU counts of the scales to time (of " + ", ".join(str(g) for g, _, _ in SCALES) + ")")
    parser.add_argument("--ones-params", default=None,
                        help='JSON object of ones options, also timed as the row "ones*"')
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    variant = None if args.ones_params is None else ones_options(parser, args.ones_params, "--ones-params")
    wanted = {int(g) for g in args.scales.split(",") if g}
    scales = [s for s in SCALES if s[0] in wanted]
    if not scales:
        parser.error(f"--scales: none of {sorted(wanted)} is one of {[g for g, _, _ in SCALES]}")
    print(f"decide() latency, median of {args.repeats} (first decision / follow-up decision), milliseconds")
    header = f"{'policy':<11}" + "".join(f"{f'{g} GPUs/{j} jobs':>26}" for g, j, _ in scales)
    print(header)
    print("-" * len(header))
    # Untimed decisions first (other states): the first few in a process pay for lazy imports and warm-up.
    for name in dict.fromkeys(policies + (["ones"] if variant is not None else [])):
        for rep in range(4):
            cluster, views, current = random_scheduler_state(np.random.default_rng(90 + rep), 50, 16, 4)
            make_policy(name, seed=rep).decide(1000.0, cluster, views, current)
    rows = [(name, name, None) for name in policies] + ([("ones*", "ones", variant)] if variant is not None else [])
    for label, name, params in rows:
        cells = []
        for gpus, jobs, gpn in scales:
            first, follow = time_policy(name, gpus, jobs, gpn, args.repeats, params)
            cells.append(f"{first * 1e3:>11.1f} / {follow * 1e3:>9.1f} ms")
        print(f"{label:<11}" + "".join(f"{c:>26}" for c in cells), flush=True)
    if variant is not None:
        print(f"ones*: ones with {json.dumps(variant)}")
    if "ones" in policies:
        print()
        for gpus, jobs, gpn in scales:
            print(f"ones peak traced memory at {gpus} GPUs / {jobs} jobs: "
                  f"{peak_memory_mib('ones', gpus, jobs, gpn):.1f} MiB")
        import resource

        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak resident memory of this whole benchmark process: {rss_mib:.0f} MiB")
        print("targets: ones < 50 ms at 64 GPUs, < 2000 ms at 4096 GPUs, < 1024 MiB")


if __name__ == "__main__":
    main()
