"""``adapters.live_as_ran``: how a live A/B run's jobs trained (samples per wall-clock second beside the other
jobs), from hand-made run records, and the simulator's replay of a run as it ran (no Dagster, no training)."""

from __future__ import annotations

import pytest

from ones_pipeline.adapters.live_ab import LIVE_CHANGE_COSTS, LiveViews, MeasuredTruth, sim_workload
from ones_pipeline.adapters.live_as_ran import as_ran_json, held_stretches, rates_as_ran, replay, thinned
from ones_pipeline.config import parse_job_spec
from ones_pipeline.core.types import Allocation, Cluster, Schedule, lr_for_batch
from ones_pipeline.scheduler.runs import RunInfo
from ones_pipeline.sim.engine import SimConfig, simulate


def _run(job, gen, slots, start, end):
    return RunInfo(f"{job}-{gen}", job, gen, slots, "SUCCESS", 32, start, start, end)


def test_rates_as_ran_per_condition_from_points_and_slot_ledgers():
    # a holds slot 0 from 0 to 100 s; b holds slot 1 from 40 to 80 s; a grows to both slots in place at 80 s.
    runs = [_run("a", 0, (0, 1), 0.0, 120.0), _run("b", 0, (1,), 40.0, 80.0)]
    ledgers = {"a": [{"time_s": 0.0, "run_id": "a-0", "claimed": [0], "freed": [], "first": True},
                     {"time_s": 80.0, "run_id": "a-0", "claimed": [1], "freed": []}],
               "b": [{"time_s": 40.0, "run_id": "b-0", "claimed": [1], "freed": [], "first": True}]}
    stretches = held_stretches(runs, ledgers, now_s=200.0)
    assert stretches == {"a": [(0.0, 80.0, 1), (80.0, 120.0, 2)], "b": [(40.0, 80.0, 1)]}
    # a: 100 samples/s alone (10 -> 40 s), 50 beside b (40 -> 80 s), 150 on both slots (80 -> 120 s). The
    # interval across its grow (80 s) lies in no one stretch: not counted.
    points = {"a": [(10.0, 0.0, None), (40.0, 3000.0, None), (60.0, 4000.0, None), (78.0, 4900.0, None),
                    (82.0, 5100.0, None), (120.0, 10800.0, None)],
              "b": [(50.0, 0.0, None), (70.0, 600.0, None)]}
    rates = rates_as_ran(points, stretches)
    assert rates["a"] == {(1, 0): pytest.approx(100.0), (1, 1): pytest.approx(50.0), (2, 0): pytest.approx(150.0)}
    assert rates["b"] == {(1, 1): pytest.approx(30.0)}
    assert as_ran_json(rates, {"b": [(0.0, 50.0)]}) == {
        "rates": {"a": {"1+0": pytest.approx(100.0), "1+1": pytest.approx(50.0), "2+0": pytest.approx(150.0)},
                  "b": {"1+1": pytest.approx(30.0)}},
        "noise": {"b": [[0.0, 50.0]]}}
    assert thinned(list(range(100)), 5) == [0, 25, 50, 74, 99]


def test_measured_truth_trains_at_the_rate_of_its_condition():
    t = MeasuredTruth("cnn-digits", 32, 1000.0, 10.0, {(1, 32): 0.1, (2, 32): 0.075},
                      rates={(1, 0): 100.0, (1, 1): 50.0}, noise=((0.0, 40.0), (500.0, 90.0)))
    assert t.step_time_among((1,), 32, 1) == (pytest.approx(32 / 50.0), 0.0)
    assert t.step_time_among((1,), 32, 0) == (pytest.approx(32 / 100.0), 0.0)
    # Two slots never measured: the one-slot rate nearest in others, times the step times' speed-up (320/s
    # on one slot, 2 x 32 / 0.075 = 853/s on two).
    assert t.rate_among(2, 0) == pytest.approx(100.0 * (2 * 32 / 0.075) / (32 / 0.1))
    assert [t.grad_noise_scale(p) for p in (0.0, 499.0, 500.0, 900.0)] == [40.0, 40.0, 90.0, 90.0]
    assert MeasuredTruth("cnn-digits", 32, 1000.0, 10.0, {(1, 32): 0.1}).step_time_among((1,), 32, 1) == (0.1, 0.0)


def _record(as_ran: dict) -> dict:
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 1}
    return {"mix": [{"spec": {**spec, "name": "a", "stopping": {"samples": 1500}}, "offset_s": 0.0},
                    {"spec": {**spec, "name": "b", "stopping": {"samples": 900}}, "offset_s": 0.0}],
            "step_times": {"a": {"1x32": 0.32}, "b": {"1x32": 0.32}}, "restart_cost_s": 10.0,
            "live": {"fifo": {"to_progress_s": 10.0, "submit_offset_s": {"a": 0.0, "b": 0.0}}}, "as_ran": as_ran}


def test_the_replay_of_a_run_reflects_its_jobs_slowing_each_other_down():
    """Two 1-slot jobs on 2 slots, both started at 0 s (10 s start-up); each trained 100 samples/s alone and
    50 beside the other. b (900 samples) trains 10 -> 28 s beside a; a has 1,000 of its 1,500 samples after the
    round that b finished in (25 -> 30 s) and the last 500 alone: 35 s."""
    rates = {"a": {"1+0": 100.0, "1+1": 50.0}, "b": {"1+0": 100.0, "1+1": 50.0}}
    out = replay(_record({"fifo": {"rates": rates, "noise": {}}}), ["fifo"], seed=0)["fifo"]
    assert out["jct_s"] == {"a": pytest.approx(35.0), "b": pytest.approx(28.0)}
    # Without a record of how it ran, the step times alone: 100 samples/s whatever else runs.
    plain = replay(_record({}), ["fifo"], seed=0)["fifo"]
    assert plain["jct_s"] == {"a": pytest.approx(25.0), "b": pytest.approx(19.0)}


def test_replay_refuses_what_is_not_a_record():
    with pytest.raises(ValueError, match="not a live_ab.py --json record"):
        replay({"mix": []}, ["fifo"], seed=0)


class _Newest:
    """A stand-in policy: the one slot to the job submitted last, whatever runs."""

    name = "newest"

    def decide(self, now_s, cluster, jobs, current):
        j = max(jobs, key=lambda v: (v.submit_time_s, v.name))
        return Schedule({j.name: Allocation(j.name, (0,), 32, lr_for_batch(j.spec, 32))})

    def to_dict(self):
        return {}

    def load_state(self, state):
        pass


def _starts(views: LiveViews, interval_s: float) -> dict[str, float]:
    """When each of a (arriving at 0 s) and b (at 10 s) first got the slot, on one slot."""
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 1,
            "stopping": {"samples": 32000}}  # 100 s each
    specs = [parse_job_spec(spec, name, default_name=name) for name in ("a", "b")]
    workload = sim_workload(specs, {"a": 0.0, "b": 10.0}, {"a": 32000.0, "b": 32000.0},
                            {"a": {(1, 32): 0.1}, "b": {(1, 32): 0.1}}, 1.0)
    result = simulate(workload, views, Cluster.uniform(1, 1), SimConfig(interval_s=interval_s,
                                                                         change_costs=LIVE_CHANGE_COSTS))
    out: dict[str, float] = {}
    for t, job, gpus in result.timeline:
        if gpus:
            out.setdefault(job, t)
    return out


def test_the_replay_holds_a_young_run_as_the_live_tick_does():
    """b arrives at 10 s and the policy gives it a's slot at once; the live tick keeps a run younger than
    min_run_s (30 s) as it is, so b starts at 30 s."""
    assert _starts(LiveViews(_Newest()), 5.0)["b"] == 10.0
    assert _starts(LiveViews(_Newest(), min_run_s=30.0), 5.0)["b"] == 30.0


class _Share:
    """A stand-in policy that can change runs in place (named as one that does): the two slots split among the
    jobs, the one submitted first on slot 0."""

    name = "fifo"

    def decide(self, now_s, cluster, jobs, current):
        js = sorted(jobs, key=lambda v: (v.submit_time_s, v.name))
        slots = [(0, 1)] if len(js) == 1 else [(0,), (1,)]
        return Schedule({j.name: Allocation(j.name, g, 32 * len(g), lr_for_batch(j.spec, 32))
                         for j, g in zip(js, slots, strict=False)})

    def to_dict(self):
        return {}

    def load_state(self, state):
        pass


def test_the_replay_holds_a_run_from_its_start_not_from_an_in_place_change():
    """a (started at 0 s) shrinks in place at 40 s for b, b trains 10 s: a grows back as soon as b is done,
    though its shrink is younger than min_run_s (30 s), as the live tick does."""
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 2}
    specs = [parse_job_spec({**spec, "stopping": {"samples": n}}, name, default_name=name)
             for name, n in (("a", 64000), ("b", 3200))]
    workload = sim_workload(specs, {"a": 0.0, "b": 40.0}, {"a": 64000.0, "b": 3200.0},
                            {"a": {(1, 32): 0.1, (2, 64): 0.1}, "b": {(1, 32): 0.1}}, 1.0)
    result = simulate(workload, LiveViews(_Share(), min_run_s=30.0), Cluster.uniform(1, 2),
                      SimConfig(interval_s=1.0, change_costs=LIVE_CHANGE_COSTS))
    counts = [(t, g) for t, job, g in result.timeline if job == "a"]
    assert counts[0] == (0.0, 2) and counts[1][1] == 1 and 40.0 <= counts[1][0] <= 42.0
    b_done = {j.name: j.finish_s for j in result.jobs}["b"]
    assert counts[2][1] == 2 and counts[2][0] <= b_done + 2.0 < 70.0


def test_the_replay_decides_at_the_live_sensors_ticks():
    """Ticks recorded at 0, 12.2 and 24.9 s (then every 12.45 s): in rounds of 1 s, b (arriving at 10 s) is seen
    at the round nearest 12.2 s."""
    assert _starts(LiveViews(_Newest()), 1.0)["b"] == 10.0
    views = LiveViews(_Newest(), ticks_s=[0.0, 12.2, 24.9])
    assert _starts(views, 1.0)["b"] == 12.0
    assert [views._tick(i) for i in (2, 3, 4)] == pytest.approx([24.9, 37.35, 49.8])
