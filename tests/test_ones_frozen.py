"""``ones``' decisions frozen: the schedule digest (``sim.report.schedule_digest``: every change of a job's GPU
count with its time, every finish time) of ``ones`` at its defaults on a sample of the ``policy_quality``
workloads (the first 40 jobs of each, seed 0, 16 x 4 GPUs, 60 s rounds, 30 s per change), against the
digests recorded in ``tests/data/ones_decision_digests.json`` before the policy was slimmed (issue 37, step
1: deleting options that were off or inert at the defaults must not move a decision).

A simulation is chaotic: numpy's floating point differs between CPUs and numpy builds, and one different
rounding changes a decision and the rest of the run. The digests hold for the machine they were recorded
on (``host``); elsewhere the test skips, naming both. Re-record, on purpose only, when a change is meant
to move decisions: ``python tests/test_ones_frozen.py --record`` (and say why in the commit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.report import host, schedule_digest
from ones_pipeline.sim.runner import WorkloadSpec, run_one

RECORD = Path(__file__).parent / "data" / "ones_decision_digests.json"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
JOBS = 40
# One workload per load of docs/results.md, and the ONES trace.
SAMPLE = ("pollux:workload-1", "pollux:workload-6", "pollux-0.5:workload-3", "pollux-1.5:workload-2", "ones-trace")


def _spec(name: str) -> WorkloadSpec:
    if name == "ones-trace":
        return WorkloadSpec(TRACES / "ones_sc21" / "trace_1.csv", "ones", max_jobs=JOBS)
    return WorkloadSpec(workload_path(name), "pollux", max_jobs=JOBS)


# 30 s for every change, in place for no policy (the Pollux comparison's costs, which the digests were made with).
CONFIG = SimConfig(interval_s=60.0, restart_cost_s=30.0, change_costs=PRESETS["pollux"])


def digest_of(name: str) -> str:
    result = run_one(_spec(name), "ones", Cluster.uniform(16, 4), CONFIG, 0)
    return schedule_digest(result)


@pytest.mark.parametrize("name", SAMPLE)
def test_ones_decisions_are_those_recorded(name):
    record = json.loads(RECORD.read_text())
    if record["host"] != host():
        pytest.skip(f"digests recorded on {record['host']}; this machine is {host()} (floating point differs)")
    if name == "ones-trace" and not (TRACES / "ones_sc21" / "trace_1.csv").is_file():
        pytest.skip(f"the ONES trace is not at {TRACES / 'ones_sc21'}")
    assert digest_of(name) == record["digests"][name]


def test_the_digest_tells_runs_with_other_decisions_apart():
    spec = _spec("pollux-0.5:workload-3")
    a, b = (schedule_digest(run_one(spec, "ones", Cluster.uniform(16, 4), CONFIG, 0, params))
            for params in ({}, {"min_hold_s": 0.0}))
    assert a != b


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps({"host": host(), "jobs": JOBS, "digests": {n: digest_of(n) for n in SAMPLE}},
                                 indent=1) + "\n")
    print(RECORD.read_text())
