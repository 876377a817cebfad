"""Parameter sweep of the ``ones`` policy, tuned honestly: choose on workloads 1-4, check on 5-8.

Each setting is a JSON object of OnesPolicy keyword arguments. Prints mean JCT per workload (averaged
over ``--seeds`` policy seeds: the search is randomised, so single runs differ by a few percent) and the
geometric mean over the tuning and the held-out halves, so a setting that only fits some workloads
shows up as such.

    python benchmarks/research/tune_ones.py '{}' '{"horizon_s": 1200}' [--workloads 1,2,3,4,5,6,7,8,ones50]
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ones_pipeline.bench_workloads import CLUSTER, workloads
from ones_pipeline.config import traces_dir_from_environment
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.report import summarise
from ones_pipeline.sim.runner import run_one

ROOT = Path(__file__).resolve().parents[2]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")
CACHE = ROOT / "out" / "policy_quality"  # where a synthetic load's CSV is written
TUNE, HOLD_OUT = {"workload-1", "workload-2", "workload-3", "workload-4"}, {"workload-5", "workload-6",
                                                                              "workload-7", "workload-8"}


def _geomean(xs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def _run(args):
    label, spec, params, seed = args
    res = run_one(spec, "ones", CLUSTER, SimConfig(change_costs=PRESETS["pollux"]), seed, params)
    return label, json.dumps(params, sort_keys=True), summarise(res)["mean_jct_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help="JSON objects of OnesPolicy parameters")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8,ones50")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seeds", type=int, default=1, help="average the mean JCT over seeds 0..N-1")
    args = parser.parse_args()
    specs = workloads(args.workloads.split(","), TRACES, CACHE)
    settings = [json.loads(s) for s in args.settings]
    tasks = [(label, spec, params, seed) for params in settings for label, spec in specs.items()
             for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        rows = list(pool.map(_run, tasks))
    sums: dict[str, dict[str, list[float]]] = {}
    for label, key, mean in rows:
        sums.setdefault(key, {}).setdefault(label, []).append(mean)
    table = {key: {label: float(np.mean(v)) for label, v in by.items()} for key, by in sums.items()}
    labels = list(specs)
    print(f"{'setting':<60}" + "".join(f"{lab[-12:]:>14}" for lab in labels) + f"{'geo tune':>10}{'geo hold':>10}")
    for key, means in table.items():
        tune = [means[lab] for lab in labels if lab in TUNE]
        hold = [means[lab] for lab in labels if lab in HOLD_OUT]
        print(f"{key:<60}" + "".join(f"{means[lab]:>14.0f}" for lab in labels)
              + f"{_geomean(tune):>10.0f}{_geomean(hold):>10.0f}")


if __name__ == "__main__":
    main()
