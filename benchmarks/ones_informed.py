"""What ``ones`` would reach if it knew its jobs' goodput: how much better estimates could buy, against
how much must come from better decisions.

Each workload (a ``policy_quality`` token) is simulated under ``ones`` with its defaults (or ``--params``)
as it is, and again with its goodput estimates replaced by the simulator's ground truth, so that the
decisions are the same code and only what they are told differs:

* ``throughput``: every job, measured or not, is valued by the truth's step times (at each GPU count, on the
  nodes a placement gives it, the best batch of ``sim.bound``'s grid), the statistical efficiency still
  from the job's own noise-scale estimate (the prior before it has one), as ``ones`` computes it: what a
  perfect step-time model would give.
* ``goodput``: step times and efficiency both from the truth, at the job's progress (its efficiency changes
  along training; quantised to 1/400 of it): what perfect step-time and noise-scale estimates would give.

Only the valuation changes (``ones_goodput.tuned_goodput``, which the goodput table, the current jobs' and
the placement re-score's goodput all come from). The batch a job runs is still the one it picks from its
own estimates (``tuned_schedule``), and the simulator runs the truth as before, so the figures are what
the search would decide with exact numbers, not a bound on any policy (``sim/bound.py`` is that).

    python benchmarks/ones_informed.py --workloads 0.5:1,0.5:2,0.5:3,0.5:4 [--modes throughput,goodput]
        [--params '{...}'] [--seed 0] [--processes 2]

Prints per workload the mean JCT of each mode and its ratio to ``ones`` as it is, and the mean over the
workloads; with ``--per-model`` also each model's mean JCT.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext

import numpy as np
from jct_by_model import CLUSTER  # same folder (the script's folder is on sys.path)
from ones_options import ones_options
from policy_quality import _config, checked_workloads, workloads

from ones_pipeline.core.efficiency import efficiency, gns_or_prior
from ones_pipeline.core.policies import ones_goodput
from ones_pipeline.sim.bound import _batch_grid, _config_rate
from ones_pipeline.sim.runner import run_one

MODES = ("ones", "throughput", "goodput")
PROGRESS_STEPS = 400  # the efficiency is looked up at this many points along a job's training


class _NoMemo(dict):
    """Stands in for ``tuned_table``'s memo of measured jobs' rows: with the truth a row moves with the
    job's progress, which the memo's key does not hold, so nothing is kept."""

    def get(self, key, default=None):
        return default

    def __setitem__(self, key, value) -> None:
        pass


class TruthGoodput:
    """``ones_goodput.tuned_goodput`` from the truth of the jobs of one workload (``truths``: job name ->
    ``JobTruth``), in ``mode`` ``throughput`` or ``goodput`` (the module docstring)."""

    def __init__(self, truths: dict, mode: str, gpus_per_node: int) -> None:
        if mode not in ("throughput", "goodput"):
            raise ValueError(f"mode must be throughput or goodput, got {mode!r}")
        self.truths, self.mode, self.gpn = truths, mode, gpus_per_node
        self.cache: dict[tuple, float] = {}

    def rate(self, view, nodes: int, gpus: int, use_efficiency: bool) -> float:
        """Base-equivalent samples/s (raw samples/s without ``use_efficiency``) of job ``view`` on ``gpus``
        GPUs spread as evenly as they go over ``nodes`` nodes, at its best batch of the grid."""
        truth, spec = self.truths[view.name], view.spec
        nodes = max(int(nodes), math.ceil(gpus / self.gpn), 1)
        step = int(PROGRESS_STEPS * min(view.progress_samples / truth.total_progress, 1.0))
        gns = gns_or_prior(view.grad_noise_scale, spec.per_gpu_batch) if self.mode == "throughput" else None
        key = (spec.model, spec.per_gpu_batch, spec.max_per_gpu_batch, spec.min_global_batch,
               spec.global_batch_cap, nodes, gpus, step if self.mode == "goodput" else gns, use_efficiency)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        base, extra = divmod(gpus, nodes)
        placement = tuple([base + 1] * extra + [base] * (nodes - extra))
        at = (step + 0.5) / PROGRESS_STEPS * truth.total_progress
        best = 0.0
        for batch in sorted(_batch_grid(spec, 24) | {spec.per_gpu_batch * gpus}):
            rated = _config_rate(truth, placement, batch)
            if rated is None:
                continue
            total, thr = rated
            if not use_efficiency:
                eff = 1.0
            elif self.mode == "goodput":
                eff = truth.efficiency(at, total)
            else:
                eff = float(efficiency(gns, spec.per_gpu_batch, total))
            best = max(best, thr * eff)
        self.cache[key] = best
        return best

    def __call__(self, jobs, rows, nodes, replicas, use_efficiency: bool = True, recipe_first: bool = False):
        return np.array([self.rate(jobs[int(r)], int(k), int(n), use_efficiency)
                         for r, k, n in zip(rows, nodes, replicas, strict=True)], dtype=float)


@contextmanager
def informed(truths: dict, mode: str, gpus_per_node: int):
    """Within the block, ``ones`` values jobs by ``TruthGoodput(truths, mode)``; restored after."""
    saved = ones_goodput.tuned_goodput, ones_goodput._ROWS
    ones_goodput.tuned_goodput, ones_goodput._ROWS = TruthGoodput(truths, mode, gpus_per_node), _NoMemo()
    try:
        yield
    finally:
        ones_goodput.tuned_goodput, ones_goodput._ROWS = saved


def _run(args: tuple) -> tuple[str, str, float, dict[str, float]]:
    token, mode, params, seed = args
    (label, spec), = workloads([token]).items()
    told = nullcontext() if mode == "ones" else informed(
        {job.spec.name: job.truth for job in spec.load()}, mode, max(CLUSTER.gpus_per_node))
    with told:
        res = run_one(spec, "ones", CLUSTER, _config(), seed, params)
    per: dict[str, list[float]] = defaultdict(list)
    for j in res.jobs:
        per[j.model].append(j.jct_s)
    return label, mode, float(np.mean([j.jct_s for j in res.jobs])), {m: float(np.mean(v)) for m, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="0.5:1,0.5:2,0.5:3,0.5:4")
    ap.add_argument("--modes", default="throughput,goodput", help=f"of {', '.join(MODES[1:])} (ones always runs)")
    ap.add_argument("--params", default="{}", help="JSON object of OnesPolicy options, for every mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--per-model", action="store_true", help="also each model's mean JCT")
    args = ap.parse_args()
    modes = ["ones"] + [m for m in args.modes.split(",") if m and m != "ones"]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: {', '.join(bad)} not one of {', '.join(MODES[1:])}")
    params = ones_options(ap, args.params, "--params")  # a bad option fails here, before anything runs
    tokens = [w for w in args.workloads.split(",") if w]
    labels = list(checked_workloads(ap, tokens, "--workloads"))  # a bad token too
    tasks = [(t, m, params, args.seed) for t in tokens for m in modes]
    with ProcessPoolExecutor(max(1, args.processes)) as pool:
        done = {(label, mode): (mean, per) for label, mode, mean, per in pool.map(_run, tasks)}
    print("mean JCT (s) of ones as it is and valuing jobs by the truth; ratio to ones")
    print(f"{'workload':<20}" + "".join(f"{m:>20}" for m in modes))
    for label in labels:
        base = done[(label, "ones")][0]
        print(f"{label:<20}" + "".join(f"{done[(label, m)][0]:>11.0f} ({done[(label, m)][0] / base:.3f}x)"
                                       for m in modes))
        if args.per_model:
            for model in sorted(done[(label, "ones")][1]):
                print(f"  {model:<18}" + "".join(f"{done[(label, m)][1][model]:>20.0f}" for m in modes))
    means = {m: float(np.mean([done[(label, m)][0] for label in labels])) for m in modes}
    print(f"{'mean':<20}" + "".join(f"{means[m]:>11.0f} ({means[m] / means['ones']:.3f}x)" for m in modes))


if __name__ == "__main__":
    main()
