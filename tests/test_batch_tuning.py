"""A job re-tunes its own global batch in-process (``train.batch_tuning``), with the core's batch function,
and the scheduler knows it: the choice, the session's switch (exact samples and data order, LR rule), the
live plumbing (allocation, environment, tick), the ``ones`` policy's use of a measured noise scale."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ones_pipeline.core.goodput import job_batch
from ones_pipeline.core.policies import OnesPolicy
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    StopKind,
    StoppingRule,
    ThroughputObs,
    lr_for_batch,
)
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.scheduler.tick import _batch_change, hold_young_runs
from ones_pipeline.train.api import Placement, TrainingSession
from ones_pipeline.train.batch_tuning import BatchTuner
from ones_pipeline.train.checkpoint import load_checkpoint
from ones_pipeline.train.sampler import EpochOrder


def _spec(**kw) -> JobSpec:
    base = dict(name="tune", model="mlp", dataset_size=4096, per_gpu_batch=8, base_lr=0.01, max_global_batch=512,
                stopping=StoppingRule(StopKind.EPOCHS, epochs=6))
    return JobSpec(**{**base, **kw})


# A step of 1 ms fixed cost + 1 us per sample: large batches amortise the fixed cost.
def _times(batches, world=1):
    return {(world, 1, b): 1e-3 + 1e-6 * b for b in batches}


# ----------------------------------------------------------------------------------- the choice


def test_a_larger_noise_scale_gets_a_larger_batch_from_the_core_function():
    tuner = BatchTuner(_spec(), world_size=1, num_nodes=1, enabled=True)
    tuner.step_times.update(_times([8, 64]))
    batches = []
    for gns in (1.0, 50.0, 500.0, 5e4):
        change = tuner.choose(8, gns)
        batches.append(change.new if change is not None else 8)
        micro, accum = job_batch(tuner.spec, tuner.observations(), gns, 1, 1)
        assert batches[-1] == min(micro * (accum + 1), 512)  # the core's choice, as the policies predict it
    assert batches == sorted(batches) and batches[0] < batches[-1], batches
    assert batches[-1] == 512  # capped by max_global_batch
    grown = tuner.choose(8, 5e4)
    assert grown.gain is not None and grown.gain > 1.0  # predicted goodput at the new batch over the old
    assert "8 -> 512 on 1 CPU slot:" in grown.text("1 CPU slot") and "noise scale 50000 samples" in grown.text("")


def test_no_change_when_off_without_a_noise_scale_or_already_optimal():
    spec = _spec()
    on = BatchTuner(spec, 1, 1, enabled=True)
    on.step_times.update(_times([8]))
    assert BatchTuner(spec, 1, 1, enabled=False).choose(8, 5e4) is None
    assert on.choose(8, None) is None  # undefined estimate (|G|^2 <= 0): keep what it has
    best = on.choose(8, 5e4).new
    assert on.choose(best, 5e4) is None
    # A neighbour of the optimum promises less than MIN_GAIN more: kept (no oscillation on noise).
    assert on.choose(best - 1, 5e4) is None and on.choose(best // 8, 5e4) is not None


def test_bounds_per_gpu_cap_without_accumulation_and_the_lr_cap():
    # max_per_gpu_batch 16 on 2 processes: never more than 2 x 16 (the live step does not accumulate).
    tuner = BatchTuner(_spec(max_per_gpu_batch=16), world_size=2, num_nodes=1, enabled=True)
    tuner.step_times.update(_times([8], world=2))
    for gns in (10.0, 1e3, 5e4, 1e7):
        change = tuner.choose(8, gns)
        assert change is None or 8 < change.new <= 32
    assert tuner.choose(8, 1e7).new == 32
    # max_lr caps the batch at per_gpu_batch * max_lr / base_lr = 8 * 4 = 32.
    capped = BatchTuner(_spec(max_global_batch=None, max_lr=0.04), 1, 1, enabled=True)
    capped.step_times.update(_times([8]))
    assert capped.choose(8, 5e4).new == 32


def test_step_times_round_trip_and_need_steady_state():
    tuner = BatchTuner(_spec(), 2, 1, enabled=True)
    tuner.record(32, [0.01, 0.02])  # too few steps: nothing recorded
    assert tuner.state_dict() == []
    tuner.record(32, [0.01, 0.03, 0.02])
    assert tuner.observations() == (ThroughputObs(2, 1, 16, 0.02),)
    again = BatchTuner(_spec(), 2, 1, enabled=True)
    again.load_state_dict(json.loads(json.dumps(tuner.state_dict())))
    again.load_state_dict(None)  # a checkpoint from before batch tuning: nothing to add
    assert again.step_times == tuner.step_times


# ----------------------------------------------------------------------------------- the session


def _linear_regression(n: int, dim: int = 16, noise: float = 0.5):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=gen)
    y = x @ torch.randn(dim, 1, generator=gen) + noise * torch.randn(n, 1, generator=gen)
    return x, y


def _run(session: TrainingSession, x, y, seen: list[int] | None = None, on_step=None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session:
        model = session.prepare(model, opt)
        for idx in session.batches():
            if seen is not None:
                seen.extend(idx.tolist())
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx], reduction="sum") * session.loss_scale()
            loss.backward()
            opt.step()
            session.step_done(loss=float(loss.detach()))
            if on_step is not None:
                on_step(session)
            if session.epoch_ended and not session.stopped:
                with torch.no_grad():
                    mse = float(torch.nn.functional.mse_loss(model(x), y))
                session.end_epoch(accuracy=-mse, loss=mse)


def test_the_batch_grows_in_process_as_the_measured_noise_scale_grows(tmp_path):
    """Linear regression converging: |G|^2 falls, the noise scale grows, the job moves to a larger batch at
    an epoch end, in the same process and MLflow run; samples and data order stay exact."""
    mlflow = pytest.importorskip("mlflow")
    from ones_pipeline.adapters.mlflow import read_progress

    spec, uri = _spec(), f"sqlite:///{tmp_path / 'mlflow.db'}"
    x, y = _linear_regression(spec.dataset_size)
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=8, lr=0.01, generation=0,
                          state_dir=tmp_path, tracking_uri=uri, experiment="ones", tune_batch=True,
                          noise_scale_budget=math.inf)
    seen: list[int] = []
    session = TrainingSession(placement, spec.dataset_size)
    _run(session, x, y, seen)
    assert session.finished and session.progress.samples_done == 6 * spec.dataset_size
    order = EpochOrder(spec.dataset_size, seed=0)
    assert seen == np.concatenate([order.permutation(e) for e in range(6)]).tolist()  # exact order
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    changes = [r for r in rows if r["event"] == "batch"]
    assert changes and changes[0]["from"] == 8 and changes[0]["to"] > 8, rows
    assert changes[0]["grad_noise_scale"] > 0 and {r["generation"] for r in rows} == {0}
    assert sum(r["event"] == "mlflow_run" for r in rows) == 1  # one run: no new generation
    # MLflow: the batch and its reason; the scheduler reads the noise scale back.
    progress = read_progress(uri, "ones", ["tune"])["tune"]
    client = mlflow.tracking.MlflowClient(uri)
    batches = [m.value for m in sorted(client.get_metric_history(progress.run_id, "global_batch"),
                                       key=lambda m: m.step)]
    assert batches[0] == 8 and changes[0]["to"] in batches
    last = changes[-1]
    assert client.get_run(progress.run_id).data.tags["ones.batch"].startswith(
        f"global batch {last['from']} -> {last['to']} on 1 CPU slot: goodput-optimal")
    assert progress.grad_noise_scale is not None and progress.grad_noise_scale > 0
    assert load_checkpoint(tmp_path)["batch_tuning"]  # the step times travel with the checkpoint


def test_without_tuning_the_batch_never_changes(tmp_path):
    spec = _spec(stopping=StoppingRule(StopKind.EPOCHS, epochs=3))
    x, y = _linear_regression(spec.dataset_size)
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=8, lr=0.01, generation=0,
                          state_dir=tmp_path, tracking_uri=None, experiment="ones", noise_scale_budget=math.inf)
    batches: set[int] = set()
    _run(TrainingSession(placement, spec.dataset_size), x, y, on_step=lambda s: batches.add(s.global_batch))
    assert batches == {8}


def test_a_smaller_batch_takes_its_lr_at_once_a_larger_one_warms_up(tmp_path):
    spec = _spec()
    session = TrainingSession(Placement(spec=spec, rank=0, world_size=1, global_batch=256, lr=lr_for_batch(spec, 256),
                                        generation=0, state_dir=tmp_path, tracking_uri=None, experiment="ones"),
                              spec.dataset_size)
    session._use_batch(256, lr_for_batch(spec, 256))
    assert session.current_lr() == pytest.approx(0.32)
    session._use_batch(8, lr_for_batch(spec, 8))
    assert session.current_lr() == pytest.approx(0.01)  # no ramp down from 0.32 at batch 8
    session._use_batch(64, lr_for_batch(spec, 64))
    assert session.current_lr() == pytest.approx(0.01)  # starts where it was...
    session.progress.samples_done += spec.dataset_size // 2
    assert session.current_lr() == pytest.approx(0.045)  # ...halfway to 0.08 after half an epoch


change = st.tuples(st.integers(1, 40), st.integers(1, 12))  # (new global batch, steps before the next change)


@settings(max_examples=60, deadline=None)
@given(dataset_size=st.integers(1, 200), seed=st.integers(0, 2**31), changes=st.lists(change, min_size=1,
                                                                                     max_size=10))
def test_in_process_batch_changes_keep_samples_and_order_exact(tmp_path_factory, dataset_size, seed, changes):
    """The session's sample count and data order under any sequence of in-process batch changes (the
    sampler's property test covers changes across restarts)."""
    spec = JobSpec(name="p", model="mlp", dataset_size=dataset_size, per_gpu_batch=1, base_lr=0.01,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=2))
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=changes[0][0], lr=0.01, generation=0,
                          state_dir=tmp_path_factory.mktemp("s"), tracking_uri=None, experiment="ones", seed=seed,
                          noise_scale_budget=0.0)
    session = TrainingSession(placement, dataset_size, checkpoint_interval_s=1e9)
    session._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    session._model = torch.nn.Linear(1, 1)
    seen: list[int] = []
    plan, left = list(changes), changes[0][1]
    for idx in session.batches():
        seen.extend(idx.tolist())
        assert len(idx) == min(session.global_batch, dataset_size - session.progress.position)
        session.step_done()
        left -= 1
        if left == 0 and len(plan) > 1:  # the next change, at this step boundary
            plan.pop(0)
            session._use_batch(plan[0][0], lr_for_batch(spec, plan[0][0]))
            left = plan[0][1]
        if session.epoch_ended:
            session.end_epoch(accuracy=0.0)
    order = EpochOrder(dataset_size, seed)
    assert session.progress.samples_done == 2 * dataset_size
    assert seen == np.concatenate([order.permutation(0), order.permutation(1)]).tolist()


# ----------------------------------------------------------------------------------- the live plumbing


def test_tune_batch_travels_from_the_allocation_to_the_ranks(tmp_path):
    alloc = RunAllocation.make(_spec(), (0, 1), "cpu", 16, 0, tune_batch=True)
    back = RunAllocation.from_json(alloc.to_json())
    assert back.tune_batch and "(the job re-tunes it)" in back.describe()
    assert not RunAllocation.from_dict({k: v for k, v in alloc.to_dict().items() if k != "tune_batch"}).tune_batch
    p = Placement(spec=_spec(), rank=0, world_size=2, global_batch=16, lr=0.02, generation=0, state_dir=tmp_path,
                  tracking_uri=None, experiment="ones", tune_batch=True)
    assert Placement.from_env(p.to_env()).tune_batch
    assert not Placement.from_env(dataclasses.replace(p, tune_batch=False).to_env()).tune_batch


def test_a_batch_change_alone_restarts_only_a_job_that_does_not_tune_its_own():
    before = Allocation("a", (0, 1), 64, 0.08)
    assert _batch_change(before, Allocation("a", (0, 1), 128, 0.16))
    assert not _batch_change(before, Allocation("a", (0, 1), 128, 0.16, batch_tuned_by_job=True))
    assert not _batch_change(before, Allocation("a", (0, 1), 64, 0.08))
    # A young run is held only for a change that needs a restart.
    current = Schedule({"a": before})
    tuned = Schedule({"a": Allocation("a", (0, 1), 128, 0.16, batch_tuned_by_job=True)})
    assert hold_young_runs(tuned, current, {"a": None}).allocations["a"].global_batch == 128
    fixed = Schedule({"a": Allocation("a", (0, 1), 128, 0.16)})
    assert hold_young_runs(fixed, current, {"a": None}).allocations["a"].global_batch == 64


def test_ones_gives_the_noisier_of_two_identical_jobs_the_larger_batch():
    """Two jobs identical but for the noise scale they measured: ``ones`` predicts (and starts them at) the
    batch each will pick, larger for the noisier one."""
    obs = (ThroughputObs(1, 1, 64, 0.10, 0.0), ThroughputObs(2, 1, 64, 0.12, 0.02))

    def job(name, gns):
        spec = JobSpec(name=name, model="m", dataset_size=50_000, per_gpu_batch=64, min_global_batch=64,
                       max_global_batch=4096, min_per_gpu_batch=16, max_per_gpu_batch=256, requested_gpus=2,
                       stopping=StoppingRule(StopKind.EPOCHS, epochs=20.0))
        return JobView(spec=spec, status=JobStatus.PAUSED, submit_time_s=0.0, throughput_obs=obs,
                       grad_noise_scale=gns)

    jobs = [job("quiet", 50.0), job("noisy", 50_000.0)]
    schedule = OnesPolicy(seed=0).decide(0.0, Cluster.uniform(1, 4), jobs, Schedule())
    quiet, noisy = schedule.allocations["quiet"], schedule.allocations["noisy"]
    assert quiet.batch_tuned_by_job and noisy.batch_tuned_by_job
    per_gpu = {a.job: a.global_batch / a.num_gpus for a in (quiet, noisy)}
    assert per_gpu["noisy"] > per_gpu["quiet"], schedule.allocations


def test_a_decision_says_when_the_job_tunes_its_batch():
    from ones_pipeline.scheduler.runs import Decision

    tuned = Decision(0.0, "a", (), (0, 1), 128, "start", None, True, 812.4)
    assert tuned.line() == "a: - -> [0,1] batch 128 (goodput-optimal at noise scale 812; the job re-tunes it) (start)"
    assert tuned.to_dict()["batch_tuned_by_job"] and tuned.to_dict()["grad_noise_scale"] == 812.4
    fixed = Decision(0.0, "a", (), (0, 1), 128, "start")
    assert fixed.line() == "a: - -> [0,1] batch 128 (start)" and "batch_tuned_by_job" not in fixed.to_dict()


def test_a_generation_launched_after_the_job_finished_trains_nothing_and_leaves_mlflow_alone(tmp_path):
    """The scheduler can launch a generation before it has seen the job's end: that one trains nothing, is no
    restart, and does not reopen the finished MLflow run (which would stay RUNNING)."""
    mlflow = pytest.importorskip("mlflow")
    spec, uri = _spec(dataset_size=256, stopping=StoppingRule(StopKind.EPOCHS, epochs=2)), \
        f"sqlite:///{tmp_path / 'mlflow.db'}"
    x, y = _linear_regression(spec.dataset_size)
    first = Placement(spec=spec, rank=0, world_size=1, global_batch=8, lr=0.01, generation=0, state_dir=tmp_path,
                      tracking_uri=uri, experiment="ones")
    _run(TrainingSession(first, spec.dataset_size), x, y)
    result = json.loads((tmp_path / "result.json").read_text())
    late = TrainingSession(dataclasses.replace(first, generation=1), spec.dataset_size)
    steps: list[int] = []
    _run(late, x, y, seen=steps)
    assert late.finished and not steps and late.progress.restarts == 0
    assert json.loads((tmp_path / "result.json").read_text()) == result
    (run,) = mlflow.tracking.MlflowClient(uri).search_runs(
        [mlflow.tracking.MlflowClient(uri).get_experiment_by_name("ones").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["ones.restarts"] == "0"
