"""How fragmented the ``ones`` policy's placements are: of every allocation it emits (one per job per
decision), the share spread over more nodes than a consolidated placement (``ceil(n / GPUs per node)``,
what the fitness assumes), the share with an odd count (not 1, 2 or a multiple of 4), and the idle
GPU-rounds; with the mean JCT and restarts of the run.

    python benchmarks/ones_placement_stats.py '{}' '{"consolidate_moves": true}' --workload 1
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from policy_quality import workloads  # same folder (the script's folder is on sys.path)

from ones_pipeline.core.policies.ones import OnesPolicy
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.report import summarise
from ones_pipeline.sim.runner import run_one


def _counting(stats: Counter):
    plain = OnesPolicy.decide

    def decide(self, now_s, cluster, jobs, current):
        schedule = plain(self, now_s, cluster, jobs, current)
        gpn = max(cluster.gpus_per_node)
        for a in schedule.allocations.values():
            stats["allocations"] += 1
            stats["spread"] += len(cluster.placement(a.gpus)) > -(-a.num_gpus // gpn)
            stats["odd"] += a.num_gpus not in (1, 2) and a.num_gpus % gpn != 0
        stats["idle_gpu_rounds"] += cluster.num_gpus - sum(a.num_gpus for a in schedule.allocations.values())
        return schedule

    return decide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help="JSON objects of OnesPolicy parameters")
    parser.add_argument("--workload", default="1")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    (label, spec), = workloads([args.workload]).items()
    plain = OnesPolicy.decide
    try:
        for setting in args.settings:
            stats: Counter = Counter()
            OnesPolicy.decide = _counting(stats)
            res = run_one(spec, "ones", Cluster.uniform(16, 4), SimConfig(), args.seed, json.loads(setting))
            n = max(stats["allocations"], 1)
            print(f"{label} {setting}: mean JCT {summarise(res)['mean_jct_s']:.0f} s, restarts "
                  f"{sum(j.restarts for j in res.jobs)}, spread {100 * stats['spread'] / n:.1f} %, odd "
                  f"{100 * stats['odd'] / n:.1f} %, idle GPU-rounds {stats['idle_gpu_rounds']}")
    finally:
        OnesPolicy.decide = plain


if __name__ == "__main__":
    main()
