"""``adapters.live_ab`` (``benchmarks/live_ab.py``'s definitions): the live A/B's figures from fabricated run
records, and its simulator prediction on a hand-checkable mix (no Dagster, no training)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from ones_pipeline.adapters.live_ab import (
    GPU_TEMPLATES,
    draw_mix,
    first_progress_s,
    gpu_slots,
    live_env,
    live_figures,
    pooled_step_times,
    ratios_to,
    run_each,
    run_timings,
    sim_workload,
    simulate_policies,
    step_time_at,
    wall_rate,
)
from ones_pipeline.adapters.live_report import FinishedJob
from ones_pipeline.config import load_env, parse_job_spec
from ones_pipeline.core.types import ThroughputObs
from ones_pipeline.scheduler.runs import RunInfo

# The scripts themselves (live_ab.py's arguments, live_ab_sim.py) are run as a user runs them.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(job, gen, slots, created, start, end, status="SUCCESS"):
    return RunInfo(f"{job}-{gen}", job, gen, slots, status, 32, created, start, end)


def test_first_progress_is_the_first_new_point_less_its_training_time():
    # Generation 0 logged up to 320 samples and stopped at 100 s; generation 1 starts at 130 s, logs 320
    # again at 131 s (its resume) and 640 at 150 s at 64 samples/s: it trained those 320 samples for 5 s.
    points = [(20.0, 320.0, 64.0), (99.0, 320.0, 64.0), (131.0, 320.0, None), (150.0, 640.0, 64.0)]
    assert first_progress_s(points, 0.0, 100.0) == pytest.approx(15.0)
    assert first_progress_s(points, 130.0, None) == pytest.approx(145.0)
    assert first_progress_s(points, 160.0, 170.0) is None  # nothing logged while it ran
    # Never before the run's start, whatever the logged rate says.
    assert first_progress_s([(101.0, 640.0, 1.0)], 100.0, None) == 100.0


def test_live_figures_from_fabricated_runs():
    jobs = [FinishedJob("a", 1000.0, 1100.0, None, None, 0), FinishedJob("b", 1020.0, 1200.0, None, None, 0)]
    runs = [_run("a", 0, (0,), 1000.0, 1002.0, 1100.0),
            _run("b", 0, (1,), 1020.0, 1022.0, 1060.0, "CANCELED"),  # preempted ...
            _run("b", 1, (0, 1), 1060.0, 1101.0, 1200.0),  # ... resumed on two slots once a finished
            _run("b", 2, (1,), 1199.0, None, None, "CANCELED")]  # created, never started: not a restart
    points = {"a": [(1012.0, 100.0, 50.0)],  # a trained from 1010
              "b": [(1032.0, 64.0, 32.0), (1059.0, 300.0, 32.0), (1111.0, 364.0, 16.0)]}  # from 1030, 1107
    timings = run_timings(runs, points)
    assert [(t.job, t.generation) for t in timings] == [("a", 0), ("b", 0), ("b", 1)]
    f = live_figures(jobs, runs, timings, now_s=1300.0)
    assert f["jct_s"] == {"a": 100.0, "b": 180.0}
    assert f["mean_jct_s"] == pytest.approx(140.0)
    assert f["makespan_s"] == pytest.approx(200.0)  # last finish - first submit
    assert f["restarts"] == 1  # b's second generation
    assert f["startup_s"] == pytest.approx((8.0 + 8.0 + 6.0) / 3)
    assert f["queued_s"] == pytest.approx((2.0 + 2.0 + 41.0) / 3)
    assert f["to_progress_s"] == pytest.approx((10.0 + 10.0 + 47.0) / 3)
    fifo = {**f, "mean_jct_s": 280.0, "makespan_s": 100.0}
    r = ratios_to({"fifo": fifo, "ones": f})
    assert r["fifo"] == {"mean_jct_s": 1.0, "makespan_s": 1.0}
    assert r["ones"] == {"mean_jct_s": pytest.approx(0.5), "makespan_s": pytest.approx(2.0)}
    assert all(math.isnan(v) for v in ratios_to({"ones": f})["ones"].values())  # no baseline


def test_step_times_pooled_and_interpolated():
    obs = [ThroughputObs(1, 1, 32, 0.4), ThroughputObs(1, 1, 32, 0.6), ThroughputObs(1, 1, 32, 0.5),
           ThroughputObs(2, 1, 16, 0.3), ThroughputObs(2, 1, 16, float("nan"))]
    m = pooled_step_times(obs)
    assert m == {(1, 32): 0.5, (2, 16): 0.3}
    assert step_time_at(m, 1, 32) == 0.5
    assert step_time_at(m, 1, 16) == pytest.approx(0.25)  # in proportion to the batch
    assert step_time_at(m, 2, 32) == pytest.approx(0.6)
    assert step_time_at({(1, 32): 0.5}, 2, 16) == pytest.approx(0.25)  # unmeasured count: perfect scaling
    with pytest.raises(KeyError):
        step_time_at({}, 1, 32)


def test_wall_rate_counts_only_runs_on_that_many_slots():
    runs = [_run("a", 0, (0,), 0.0, 0.0, 100.0), _run("a", 1, (0, 1), 100.0, 110.0, None)]
    points = [(10.0, 0.0, None), (60.0, 500.0, None), (120.0, 500.0, None), (170.0, 1500.0, None)]
    assert wall_rate(points, runs, 1) == pytest.approx(10.0)
    assert wall_rate(points, runs, 2) == pytest.approx(20.0)
    assert math.isnan(wall_rate(points, runs, 4))


def test_simulated_mix_by_hand():
    # Two 1-slot jobs of 32 samples x 100 steps at 1 s per step, the second arriving 50 s later, on 2 slots,
    # 10 s lost per start: fifo runs both at once, each 10 + 100 s; nothing restarts.
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 1,
            "stopping": {"samples": 3200}}
    specs = [parse_job_spec(spec, name, default_name=name) for name in ("a", "b")]
    measured = {"a": {(1, 32): 1.0}, "b": {(1, 32): 1.0}}
    workload = sim_workload(specs, {"a": 0.0, "b": 50.0}, {"a": 3200.0, "b": 3200.0}, measured, 10.0)
    out = simulate_policies(workload, ["fifo"], slots=2, interval_s=5.0, seed=0)["fifo"]
    assert out["jct_s"] == {"a": pytest.approx(110.0), "b": pytest.approx(110.0)}
    assert out["makespan_s"] == pytest.approx(160.0)
    assert out["restarts"] == 0


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    """``benchmarks/<name>`` run as a user runs it."""
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          timeout=300, cwd=BENCHMARKS.parent)


def test_a_recorded_mix_replays_through_the_simulator_with_policy_options(tmp_path):
    """``live_ab_sim.py`` rebuilds the by-hand mix above from a ``live_ab.py --json`` record: the same
    figures (fifo: both jobs 110 s, makespan 160 s), and ``--ones`` options reach the ones policy."""
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 1,
            "stopping": {"samples": 3200}}
    record = {"mix": [{"spec": {**spec, "name": name}, "offset_s": at} for name, at in (("a", 0.0), ("b", 50.0))],
              "step_times": {"a": {"1x32": 1.0}, "b": {"1x32": 1.0}}, "restart_cost_s": 10.0}
    (tmp_path / "ab.json").write_text(json.dumps(record))
    done = _script("live_ab_sim.py", str(tmp_path / "ab.json"), "--policies", "fifo")
    assert done.returncode == 0, done.stderr
    assert "fifo     mean JCT    110 s  makespan    160 s  restarts 0  [step times] | a 110 b 110" in done.stdout
    bad = _script("live_ab_sim.py", str(tmp_path / "ab.json"), "--policies", "ones", "--ones",
                  '{"gpu_time_weight": -1}')
    assert bad.returncode != 0 and "gpu_time_weight" in bad.stderr


def test_live_ab_refuses_bad_ones_options_by_name():
    """``live_ab.py --ones-params`` that is not a JSON object ends the script with one line naming the flag,
    before anything runs."""
    for bad, why in (('{"min_hold_s": ', "--ones-params is not JSON"),
                     ("[1]", "--ones-params must be a JSON object")):
        done = _script("live_ab.py", "--ones-params", bad)
        assert done.returncode == 2 and why in done.stderr, done.stderr


def test_ones_options_reach_the_ones_project_and_the_prediction(tmp_path):
    """The ``--ones-params`` object becomes the ones project's ``policy.params`` (and no other policy's), and
    the simulator's prediction builds ``ones`` with it; bad options are refused by name."""
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text(yaml.safe_dump(live_env("ones", 0, {"min_hold_s": 10})))
    env = load_env(tmp_path)  # a project the pipeline accepts, with the options as the policy's
    assert env.policy.name == "ones" and env.policy.params == {"min_hold_s": 10}
    assert live_env("fifo", 0, None)["policy"]["params"] == {}
    assert live_env("fifo", 0, None)["cluster"] == {"gpus": "none", "cpu_slots": 2}
    spec = {"model": "cnn-digits", "per_gpu_batch": 32, "base_lr": 0.02, "requested_gpus": 1, "max_gpus": 1,
            "stopping": {"samples": 3200}}
    specs = [parse_job_spec(spec, "a", default_name="a")]
    workload = sim_workload(specs, {"a": 0.0}, {"a": 3200.0}, {"a": {(1, 32): 1.0}}, 10.0)
    with pytest.raises(ValueError, match="gpu_time_weight"):
        simulate_policies(workload, ["ones"], 2, 5.0, 0, {"ones": {"gpu_time_weight": -1}})
    assert simulate_policies(workload, ["fifo"], 2, 5.0, 0, {"ones": {"gpu_time_weight": -1}})["fifo"][
        "makespan_s"] == pytest.approx(110.0)


def test_the_gpu_mix_is_all_resnet18_and_falls_back_to_cpu_slots_without_a_gpu():
    slots, found = gpu_slots()
    mix = draw_mix(4, np.random.default_rng(0), 0.5, GPU_TEMPLATES, slots)
    assert [j.spec["model"] for j in mix] == ["resnet18-cifar-synthetic"] * 4
    assert all(j.spec["per_gpu_batch"] == 128 and "samples" in j.spec["stopping"] for j in mix)
    assert all(j.spec["max_gpus"] == slots for j in mix)
    first = mix[0].spec["stopping"]["samples"]
    assert 90_000 <= first <= 100_000 and first == max(j.spec["stopping"]["samples"] for j in mix)
    assert [j.offset_s for j in mix] == sorted(j.offset_s for j in mix) and mix[0].offset_s == 0
    assert live_env("ones", 0, None, slots, gpus=True)["cluster"] == {"gpus": "auto", "cpu_slots": slots}
    if "no GPU" in found:  # this machine: the configured CPU slots, as the CPU benchmark has
        assert slots == 2


def test_a_failed_policy_leaves_the_others_measured():
    """Issue 40: live_ab.py wrote no figures at all when one policy failed (the daemon's start-up race)."""
    ran = []

    def one(policy):
        ran.append(policy)
        return (policy != "ones", 10.0, "ones run exited 1" if policy == "ones" else "", {"figures": policy})

    results, walls, failed = run_each(["fifo", "ones", "pollux"], one)
    assert ran == ["fifo", "ones", "pollux"]  # the failure stopped nothing after it
    assert results == {"fifo": {"figures": "fifo"}, "pollux": {"figures": "pollux"}}
    assert walls == {"fifo": 10.0, "pollux": 10.0} and failed == {"ones": "ones run exited 1"}
