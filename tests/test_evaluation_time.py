"""Evaluation points (an epoch's end, the budget's end): the job measures how long one takes outside its steps
(``epoch_end_s``), and the scheduler adds that time, which no added GPU shortens, to every prediction it makes.
Live, a resnet18 job's evaluation took 11-13 s at each point, and its last grows were predicted to end 1.35-1.6x
too soon."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from policy_helpers import spec as make_spec

from ones_pipeline.adapters.live_ab import LiveViews
from ones_pipeline.core import estimates
from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobStatus,
    JobView,
    Schedule,
    StopKind,
    StoppingRule,
    ThroughputObs,
)
from ones_pipeline.scheduler.rationale import explain

STEPS = (ThroughputObs(1, 1, 32, 0.10, 0.0), ThroughputObs(2, 1, 32, 0.101, 0.001))  # 320 samples/s per GPU
COSTS = {"start": 10.0, "grow": 0.05, "shrink": 0.04, "restart": 10.0}


def _job(name: str, samples: float, done: float = 0.0, epoch_end_s: float = 0.0, running: bool = False) -> JobView:
    spec = dataclasses.replace(make_spec(name, model="cnn", max_gpus=2),  # dataset of 10,000 samples
                               stopping=StoppingRule(StopKind.SAMPLES, samples=samples))
    return JobView(spec=spec, status=JobStatus.RUNNING if running else JobStatus.PENDING, submit_time_s=0.0,
                   samples_done=done, progress_samples=done, throughput_obs=STEPS, grad_noise_scale=1e6,
                   change_costs=COSTS, epoch_end_s=epoch_end_s)


def test_the_evaluation_points_left_are_the_epoch_ends_passed_and_the_last_step():
    jobs = [_job("a", 25_000, done=5_000, epoch_end_s=12.0),  # 20,000 left: ends at 10,000, 20,000 and 25,000
            _job("b", 25_000, done=24_000, epoch_end_s=12.0),  # 1,000 left: its last evaluation only
            _job("c", 25_000, done=5_000)]  # not measured: nothing added
    fixed = estimates.evaluation_time(jobs, estimates.remaining_work(jobs))
    np.testing.assert_allclose(fixed, [36.0, 12.0, 0.0])
    rates = np.array([[0.0, 100.0, 200.0], [0.0, 100.0, 200.0], [0.0, 100.0, 200.0]])
    work = estimates.remaining_work(jobs)
    averaged = estimates.with_fixed_time(rates, work, fixed)
    np.testing.assert_allclose(work[0] / averaged[0, 1:], work[0] / rates[0, 1:] + 36.0)  # time left, each count
    assert averaged[0, 0] == 0.0 and (averaged[2] == rates[2]).all()


def test_a_job_whose_evaluation_takes_long_is_not_valued_as_the_shorter_one():
    """One slot, two queued jobs: 'a' trains 20 s, 'b' 30 s. Shortest first starts 'a'; but 'a''s last
    evaluation was measured at 30 s, so it takes 50 s in all and 'b' goes first."""
    cluster = Cluster.uniform(1, 1)

    def first(epoch_end_s: float) -> str:
        jobs = [_job("a", 6_400, epoch_end_s=epoch_end_s), _job("b", 9_600)]
        out = make_policy("ones", seed=0).decide(0.0, cluster, jobs, Schedule())
        (name,) = out.allocations
        return name

    assert first(0.0) == "a"
    assert first(30.0) == "b"


def test_the_predicted_time_left_includes_the_evaluations_a_grow_does_not_shorten():
    cluster = Cluster.uniform(1, 2)
    current = Schedule({"a": Allocation("a", (0,), 32, 0.1)})
    new = Schedule({"a": Allocation("a", (0, 1), 64, 0.2)})

    def why(epoch_end_s: float):
        job = _job("a", 25_000, done=5_000, epoch_end_s=epoch_end_s, running=True)
        return explain([job], cluster, current, new, ["a"], in_place={"a": True})["a"]

    plain, evaluated = why(0.0), why(12.0)
    assert evaluated.remaining_before_s == pytest.approx(plain.remaining_before_s + 36.0)
    assert evaluated.remaining_after_s == pytest.approx(plain.remaining_after_s + 36.0)


class _Seen:
    """A stand-in policy that keeps the views it was shown and changes nothing."""

    name = "seen"

    def __init__(self) -> None:
        self.epoch_end: list[dict[str, float]] = []

    def decide(self, now_s, cluster, jobs, current):
        self.epoch_end.append({j.name: j.epoch_end_s for j in jobs})
        return Schedule(dict(current.allocations))


def test_the_replay_shows_the_policy_the_evaluation_time_its_job_had_logged_by_then():
    seen = _Seen()
    views = LiveViews(seen, epoch_end={"a": [(10_000.0, 12.0), (20_000.0, 14.0)]})
    for done in (5_000.0, 10_000.0, 25_000.0):
        views.decide(0.0, Cluster.uniform(1, 1), [_job("a", 30_000, done=done), _job("b", 30_000)], Schedule())
    assert seen.epoch_end == [{"a": 0.0, "b": 0.0}, {"a": 12.0, "b": 0.0}, {"a": 14.0, "b": 0.0}]


def test_the_training_session_measures_its_evaluation_points(tmp_path, monkeypatch):
    """Three epochs of two steps, each evaluation 0.2 s long: ``epoch_end_s`` is logged once the step after an
    evaluation has begun, and it is that evaluation's time (plus the session's own work there)."""
    torch = pytest.importorskip("torch")
    from ones_pipeline.core.types import JobSpec
    from ones_pipeline.train.api import Placement, TrainingSession

    monkeypatch.delenv("ONES_STOP_FILE", raising=False)
    monkeypatch.delenv("ONES_LAUNCHER_PID", raising=False)
    spec = JobSpec(name="job-e", model="mlp", dataset_size=8, per_gpu_batch=4, requested_gpus=1,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=3))
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=4, lr=0.1, generation=0,
                          state_dir=tmp_path, tracking_uri=None, experiment="ones")
    session = TrainingSession(placement, 8)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = session.prepare(model, optimizer)
    logged = []
    for idx in session.batches():
        logged.append(session.metrics().get("epoch_end_s"))
        loss = model(torch.ones(len(idx), 3)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        session.step_done(loss=float(loss.detach()))
        if session.epoch_ended:
            time.sleep(0.2)
            session.end_epoch(accuracy=0.5)
    assert session.finished and len(logged) == 6
    assert logged[:2] == [None, None]  # no evaluation yet
    assert all(0.2 <= e < 2.0 for e in logged[2:]), logged
    # The last point, after which no step follows, is measured up to its record (the script's evaluation), so a
    # job shorter than an epoch still leaves its model a figure.
    assert 0.2 <= session.metrics()["epoch_end_s"] < 2.0
    (tmp_path / "short").mkdir()
    four = dataclasses.replace(spec, name="job-s", stopping=StoppingRule(StopKind.SAMPLES, samples=4))  # 1 step
    short = TrainingSession(dataclasses.replace(placement, spec=four, state_dir=tmp_path / "short"), 8)
    short.prepare(torch.nn.Linear(3, 1), torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in short.batches():
        short.step_done(loss=None)
        if short.epoch_ended:
            time.sleep(0.2)
            short.end_epoch(accuracy=0.5)
    assert short.finished and 0.2 <= short.metrics()["epoch_end_s"] < 2.0


def test_a_job_that_has_passed_no_evaluation_yet_is_valued_by_its_models_last():
    """Live, the second resnet18 job of the mix (2,152 samples, under one 2,500-sample epoch) passes only its last
    evaluation point; it takes the time the model's earlier job measured (kept in the cursor)."""
    import json

    from ones_pipeline.scheduler import SchedulerSettings, TickInputs, plan_tick, tick
    from ones_pipeline.scheduler.runs import ProgressInfo, TickPlan

    a, b = (dataclasses.replace(make_spec(n, model="resnet18", max_gpus=2), max_lr=0.2) for n in ("a", "b"))
    first = TickInputs(now=100.0, specs={"a": a}, finished=frozenset(), runs=[], cluster=Cluster((2,)),
                       progress={"a": ProgressInfo(samples_done=320.0, throughput_obs=STEPS, epoch_end_s=12.0)},
                       slot_ids=(0, 1), cursor={})
    cursor = json.loads(json.dumps(plan_tick(first, SchedulerSettings(params={"generations": 5})).cursor))
    assert cursor["model_epoch_end"] == {"resnet18": 12.0}

    def view_of_b(progress: ProgressInfo) -> JobView:
        second = TickInputs(now=200.0, specs={"b": b}, finished=frozenset({"a"}), runs=[], progress={"b": progress},
                            slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor)
        state, p = tick._State.from_cursor(cursor), TickPlan()
        (view,) = tick.job_views(second, SchedulerSettings(), tick.current_schedule(second, state, p), state, p)[0]
        return view

    assert view_of_b(ProgressInfo()).epoch_end_s == 12.0
    assert view_of_b(ProgressInfo(samples_done=64.0, throughput_obs=STEPS, epoch_end_s=5.0)).epoch_end_s == 5.0
