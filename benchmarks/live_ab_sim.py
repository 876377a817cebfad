"""Replay a live A/B mix through the simulator under chosen policy options, without running it live.

``benchmarks/live_ab.py --json OUT`` records the mix (specs, arrival offsets), each job's step times as
measured live and the start-up cost; this script rebuilds the same simulation as the benchmark's own
prediction (``adapters.live_ab.sim_workload``: one node of 2 slots, a round every 5 s, noise scale hidden)
and prints mean JCT, makespan, restarts and per-job JCT for each policy, with ``--ones`` options for
``ones`` (e.g. ``'{"min_hold_s": 0}'``), so a policy change can be checked against that mix. Changes cost
what they cost live (``adapters.live_ab.LIVE_CHANGE_COSTS``: starts and restarts the recorded start-up,
grows and shrinks in place for every policy), which ``ones`` reads from its jobs' views.

    .venv/bin/python benchmarks/live_ab_sim.py OUT.json [--policies fifo,ones,pollux] [--ones '{...}']
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ones_pipeline.adapters.live_ab import LIVE_CHANGE_COSTS, LiveViews, sim_figures, sim_workload
from ones_pipeline.config import parse_job_spec
from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.scheduler.settings import live_policy_params
from ones_pipeline.sim.engine import SimConfig, simulate

SLOTS, TICK_S = 2, 5.0  # as live_ab.py runs it


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the --json output of benchmarks/live_ab.py")
    ap.add_argument("--policies", default="fifo,ones,pollux")
    ap.add_argument("--ones", default="{}", help="JSON object of OnesPolicy options")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    recorded = json.loads(Path(args.json).read_text())
    specs = [parse_job_spec(m["spec"], f"<{args.json}: {m['spec']['name']}>") for m in recorded["mix"]]
    offsets = {m["spec"]["name"]: float(m["offset_s"]) for m in recorded["mix"]}
    totals = {s.name: s.stopping.total_samples(s.dataset_size) for s in specs}
    measured = {job: {tuple(int(x) for x in key.split("x")): t for key, t in times.items()}
                for job, times in recorded["step_times"].items()}
    workload = sim_workload(specs, offsets, totals, measured, float(recorded["restart_cost_s"]))
    options = live_policy_params("ones", json.loads(args.ones))  # as a live project runs ones
    for name in args.policies.split(","):
        policy = make_policy(name, seed=args.seed, **(options if name == "ones" else {}))
        config = SimConfig(interval_s=TICK_S, change_costs=LIVE_CHANGE_COSTS)
        f = sim_figures(simulate(workload, LiveViews(policy), Cluster.uniform(1, SLOTS), config))
        per_job = " ".join(f"{job} {jct:.0f}" for job, jct in f["jct_s"].items())
        print(f"{name:8s} mean JCT {f['mean_jct_s']:6.0f} s  makespan {f['makespan_s']:6.0f} s  "
              f"restarts {f['restarts']}  | {per_job}")


if __name__ == "__main__":
    main()
