"""Per-kind change costs in the simulator (issue 36): start, in-place grow and shrink, checkpoint restart, each
its own dead time; in place only where the policy's environment resizes in place; what a job's view carries."""

from __future__ import annotations

import json

import pytest

from ones_pipeline.core.types import Allocation, Cluster, Schedule
from ones_pipeline.sim.change_costs import PRESETS, ChangeCosts, change_kind, parse_change_costs
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.synthetic import synthetic_job

COSTS = ChangeCosts(start=7.0, grow=3.0, shrink=2.0, restart=11.0)
# Rounds of 100 s: start on GPU 0, grow to 0+1, shrink to 0, move to GPU 2, pause, resume on GPU 2, keep it.
SCRIPT = {0: (0,), 100: (0, 1), 200: (0,), 300: (2,), 400: (), 500: (2,)}


class Scripted:
    """Holds the job on the GPUs of ``SCRIPT`` in each round (from 500 s on: GPU 2), under the name of a policy
    whose environment resizes in place (``ones``) or not (``fifo``); records the views it is shown."""

    def __init__(self, name: str):
        self.name, self.seen = name, []

    def decide(self, now_s, cluster, jobs, current):
        self.seen.extend(jobs)
        gpus = SCRIPT.get(now_s, (2,))
        view = jobs[0]
        return Schedule({view.name: Allocation.for_spec(view.spec, gpus)} if gpus else {})

    def to_dict(self):
        return {}

    def load_state(self, state):
        pass


def _run(name: str, total: float, config: SimConfig):
    policy = Scripted(name)
    job = synthetic_job("j", 0.0, total, requested_gpus=1)  # 100 samples/s per GPU, linear, efficiency 1
    result = simulate([job], policy, Cluster.uniform(1, 4), config)
    return result.jobs[0], policy.seen


def test_each_kind_of_change_costs_its_own_dead_time_in_place():
    # In place: 93 s x 100 (start 7) + 97 x 200 (grow 3) + 98 x 100 (shrink 2) + 89 x 100 (move: restart 11)
    # + 89 x 100 (resume: restart 11) = 56 300 samples by 600 s; 5 000 more at 100/s: done at 650 s.
    record, seen = _run("ones", 61_300, SimConfig(interval_s=100, change_costs=COSTS))
    assert record.jct_s == pytest.approx(650.0)
    assert (record.restarts, record.in_place) == (4, 2)
    assert seen[0].change_costs == {"start": 7.0, "grow": 3.0, "shrink": 2.0, "restart": 11.0}


def test_where_the_environment_cannot_resize_in_place_every_change_is_a_restart():
    # The same script: the grow and the shrink cost 11 s each: 93 x 100 + 89 x 200 + 89 x 100 + 89 x 100
    # + 89 x 100 = 53 800 by 600 s; 7 500 more: done at 675 s.
    record, seen = _run("fifo", 61_300, SimConfig(interval_s=100, change_costs=COSTS))
    assert record.jct_s == pytest.approx(675.0)
    assert (record.restarts, record.in_place) == (4, 0)
    assert seen[0].change_costs == {"start": 7.0, "grow": 11.0, "shrink": 11.0, "restart": 11.0}


def test_a_cost_left_to_the_job_type_is_its_restart_cost_and_pollux_charges_it_for_everything():
    config = SimConfig(interval_s=100, restart_cost_s=20.0, change_costs=PRESETS["pollux"])
    record, seen = _run("ones", 61_300, config)
    assert seen[0].change_costs == dict.fromkeys(("start", "grow", "shrink", "restart"), 20.0)
    # 80 x 100 + 80 x 200 + 80 x 100 + 80 x 100 + 80 x 100 = 48 000 by 600 s; 13 300 more: 733 s.
    assert record.jct_s == pytest.approx(733.0) and record.in_place == 0
    by_model = SimConfig(interval_s=100, restart_cost_by_model={"synthetic": 4.0})  # the default preset
    assert _run("ones", 61_300, by_model)[1][0].change_costs == {"start": 4.0, "grow": 0.05, "shrink": 0.04,
                                                                   "restart": 4.0}


def test_change_kinds():
    assert change_kind((), (0,), started=False, in_place=True) == "start"
    assert change_kind((), (0,), started=True, in_place=True) == "restart"  # a resume: no member left
    assert change_kind((0,), (0, 1), started=True, in_place=True) == "grow"
    assert change_kind((0, 1), (1, 2), started=True, in_place=True) == "grow"  # a newcomer joins a survivor
    assert change_kind((0, 1), (1,), started=True, in_place=True) == "shrink"
    assert change_kind((0, 1), (0, 1), started=True, in_place=True) == "shrink"  # the batch alone
    assert change_kind((0, 1), (2, 3), started=True, in_place=True) == "restart"  # no survivor
    assert change_kind((0,), (0, 1), started=True, in_place=False) == "restart"


def test_parse_presets_overrides_and_bad_input():
    assert parse_change_costs("pollux") == PRESETS["pollux"]
    assert parse_change_costs("live").start == 11.7
    c = parse_change_costs("default,grow=2,restart=own,in_place=ones")
    assert (c.grow, c.shrink, c.restart, c.in_place) == (2.0, 0.04, None, ("ones",))
    assert parse_change_costs("shrink=1").grow == 0.05
    for bad, says in (("fast", "unknown preset 'fast'; allowed: default, pollux, live"),
                      ("grow=x", "grow='x' is not a number"), ("grow=-1", "'grow' must be a finite number >= 0"),
                      ("move=3", "unknown part 'move=3'")):
        with pytest.raises(ValueError, match="change cost") as err:
            parse_change_costs(bad)
        assert says in str(err.value) and "\n" not in str(err.value)


def test_ones_simulate_takes_the_change_costs(tmp_path, capsys):
    from ones_pipeline.cli import main

    rc = main(["simulate", "--workload", "pollux:workload-6", "--jobs", "4", "--gpus", "8", "--policies", "fifo",
               "--change-costs", "live,restart=6", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    meta = json.loads((tmp_path / "summary.json").read_text())
    assert json.dumps(meta).count('"restart": 6.0') == 1 and '"start": 11.7' in json.dumps(meta)
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "pollux:workload-6", "--change-costs", "nope"])
    err = capsys.readouterr().err
    assert "unknown preset 'nope'; allowed: default, pollux, live" in err
