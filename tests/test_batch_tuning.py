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
from ones_pipeline.scheduler.holds import batch_change, hold_young_runs
from ones_pipeline.train.api import Placement, TrainingSession
from ones_pipeline.train.batch_tuning import BatchChange, BatchTuner, accumulation_for, as_observation
from ones_pipeline.train.checkpoint import load_checkpoint
from ones_pipeline.train.sampler import EpochOrder


def _spec(**kw) -> JobSpec:
    base = dict(name="tune", model="mlp", dataset_size=4096, per_gpu_batch=8, base_lr=0.01, max_global_batch=512,
                stopping=StoppingRule(StopKind.EPOCHS, epochs=6))
    return JobSpec(**{**base, **kw})


# A step of 1 ms fixed cost + 1 us per sample: large batches amortise the fixed cost.
def _times(batches, world=1):
    return {(world, 1, b, 0): 1e-3 + 1e-6 * b for b in batches}


def _next_change(session, spec, plan: list, left: int) -> int:
    """After a step: count it against the current change of ``plan`` ((batch, steps) pairs), switch to the
    next one at this step boundary when it is used up, evaluate a finished epoch; the steps left."""
    left -= 1
    if left == 0 and len(plan) > 1:
        plan.pop(0)
        session._use_batch(plan[0][0], lr_for_batch(spec, plan[0][0]))
        left = plan[0][1]
    if session.epoch_ended:
        session.end_epoch(accuracy=0.0)
    return left


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


def test_a_batch_measured_worse_than_the_fit_promised_is_not_gone_back_to():
    """The fit promises more goodput at 128 than at 32; measured, 128 is slower than that. Back at 32, the
    job must not switch to 128 again on the fit's word: a batch this allocation has trained at counts at
    its measured step time (seen live: 32 -> 128 -> 32 -> 128 ..., each change "x1.07" or better)."""
    tuner = BatchTuner(_spec(max_global_batch=128), world_size=1, num_nodes=1, enabled=True)
    tuner.step_times.update({(1, 1, 32, 0): 1e-3 + 32e-6})
    gns = 5e4  # noisy enough that a large batch loses little statistical efficiency
    first = tuner.choose(32, gns)
    assert first is not None and first.new == 128  # only 32 measured: the fit's extrapolation decides
    tuner.step_times[(1, 1, 128, 0)] = 4 * (1e-3 + 32e-6) * 1.3  # measured: 30 % slower per sample than 32
    back = tuner.choose(128, gns)
    assert back is not None and back.new < 128  # the measurement says the smaller batch is better
    assert tuner._gain(tuner.observations(), gns, back.new, 128) < 1.0  # and 128 measured: not again
    again = tuner.choose(back.new, gns)
    assert again is None or again.new != 128


def test_bounds_per_gpu_cap_without_accumulation_and_the_lr_cap():
    # max_per_gpu_batch 16 on 2 processes, a script that cannot accumulate: never more than 2 x 16.
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


def test_with_accumulation_the_job_trains_the_core_batch_above_the_per_gpu_cap():
    """A script that accumulates (``steps()``) gets the core's choice, split into micro-batches that fit."""
    spec = _spec(max_per_gpu_batch=16)
    tuner = BatchTuner(spec, world_size=2, num_nodes=1, enabled=True)
    tuner.accumulates = True
    tuner.step_times.update(_times([8], world=2))
    change = tuner.choose(16, 1e7)
    micro, accum = job_batch(spec, tuner.observations(), 1e7, 1, 2)
    assert change.new == min(2 * micro * (accum + 1), 512) > 32  # the core's batch, above 2 x 16
    assert (change.micro, change.accum) == accumulation_for(change.new, 2, 16) and change.accum >= 1
    assert change.micro <= 16 and 2 * change.micro * (change.accum + 1) >= change.new
    assert change.to_dict()["accum_steps"] == change.accum
    text = BatchChange(64, 256, 900.0, 1.3, 64, 1).text("2 CPU slots")
    assert text.startswith("global batch 64 -> 256 (2 x 64 per slot, accumulated over 2 micro-batches) on 2 CPU")
    assert "accumulated" not in BatchChange(64, 128, 900.0, 1.3, 64, 0).text("2 CPU slots")


def test_the_split_is_the_fewest_micro_batches_that_fit():
    assert accumulation_for(256, 2, None) == (128, 0)
    assert accumulation_for(256, 2, 128) == (128, 0)
    assert accumulation_for(256, 2, 64) == (64, 1)
    assert accumulation_for(257, 2, 64) == (43, 2)  # 129 per GPU: 3 micro-batches of at most 43
    assert accumulation_for(3, 4, 1) == (1, 0)  # fewer samples than processes: one each at most


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


def test_accumulated_step_times_reach_the_fit_in_its_own_terms():
    """Per optimizer step, keyed by micro-batch and accumulation; the fit gets one synchronising micro-batch
    (step - accum x micro-batch time) with its sync share; checkpoints before accumulation still load."""
    tuner = BatchTuner(_spec(max_per_gpu_batch=16), 2, 1, enabled=True)
    tuner.accumulates = True
    tuner.record(128, [0.40, 0.41, 0.39], [0.08, 0.09, 0.1])  # 64 per GPU: 4 micro-batches of 16
    assert tuner.step_times == {(2, 1, 16, 3): 0.40} and tuner.micro_times == {(2, 1, 16, 3): 0.09}
    (obs,) = tuner.observations()
    assert (obs.num_gpus, obs.per_gpu_batch) == (2, 16)
    assert obs.step_time_s == pytest.approx(0.40 - 3 * 0.09) and obs.sync_time_s == pytest.approx(0.40 - 4 * 0.09)
    assert obs.step_time_s - obs.sync_time_s == pytest.approx(0.09)  # the fit's compute: the measured micro-batch
    assert as_observation((2, 1, 16, 3), 0.2, 0.09).step_time_s == 0.09  # noisy: the update >= one compute
    again = BatchTuner(_spec(max_per_gpu_batch=16), 2, 1, enabled=True)
    again.load_state_dict(json.loads(json.dumps(tuner.state_dict())) + [[2, 1, 8, 0.05]])  # + an old-style row
    assert again.step_times == {(2, 1, 16, 3): 0.40, (2, 1, 8, 0): 0.05} and again.micro_times == tuner.micro_times


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
        left = _next_change(session, spec, plan, left)
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
    assert batch_change(before, Allocation("a", (0, 1), 128, 0.16))
    assert not batch_change(before, Allocation("a", (0, 1), 128, 0.16, batch_tuned_by_job=True))
    assert not batch_change(before, Allocation("a", (0, 1), 64, 0.08))
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


# ----------------------------------------------------------------------------------- gradient accumulation


def _run_steps(session: TrainingSession, x, y, micro_sizes: list[list[int]] | None = None) -> torch.nn.Module:
    """``_run`` on the accumulating loop (``steps()``), in float64 so that sums compare to rounding."""
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with session:
        model = session.prepare(model, opt)
        for step in session.steps():
            opt.zero_grad(set_to_none=True)
            sizes = []
            for idx in step:
                sizes.append(len(idx))
                loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx], reduction="sum") * session.loss_scale()
                loss.backward()
            opt.step()
            if micro_sizes is not None:
                micro_sizes.append(sizes)
            session.step_done()
            if session.epoch_ended and not session.stopped:
                session.end_epoch(accuracy=0.0)
    return model


def test_an_accumulated_step_is_the_single_big_step(tmp_path):
    """Linear regression, global batch 48 with max_per_gpu_batch 8: six micro-batches per step (the last step
    of the epoch, 16 samples, two) train the same model as one backward over the 48, to rounding; the
    one-process noise probe, which reads the accumulated gradient, ends with the same estimate."""
    x, y = (t.double() for t in _linear_regression(208))
    models, probes, sizes = [], [], []
    for cap in (None, 8):
        (tmp_path / str(cap)).mkdir()
        spec = _spec(dataset_size=208, max_per_gpu_batch=cap, stopping=StoppingRule(StopKind.EPOCHS, epochs=2))
        placement = Placement(spec=spec, rank=0, world_size=1, global_batch=48, lr=0.01, generation=0,
                              state_dir=tmp_path / str(cap), tracking_uri=None, experiment="ones",
                              noise_scale_budget=math.inf)
        session = TrainingSession(placement, spec.dataset_size)
        sizes.append([])
        models.append(_run_steps(session, x, y, sizes[-1]))
        probes.append(session._gns.smoother)
        assert session.progress.samples_done == 2 * 208
    assert sizes[0] == [[48]] * 4 + [[16]] + [[48]] * 4 + [[16]]
    assert sizes[1] == [[8] * 6] * 4 + [[8, 8]] + [[8] * 6] * 4 + [[8, 8]]
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert probes[1].observations == probes[0].observations > 0
    assert probes[1].grad_sqr == pytest.approx(probes[0].grad_sqr, rel=1e-9)
    assert probes[1].grad_var == pytest.approx(probes[0].grad_var, rel=1e-9)


def test_a_step_must_be_taken_whole():
    from ones_pipeline.train.micro_batches import Step

    step = Step(np.arange(10), 3, None)
    parts = list(step)
    assert [len(p) for p in parts] == [4, 3, 3] and np.concatenate(parts).tolist() == list(range(10))
    partial = Step(np.arange(10), 3, None)
    next(iter(partial))
    with pytest.raises(RuntimeError, match="1 of the step's 3 micro-batches"):
        partial.check_taken(0, 1)
    # Several processes: a step whose synchronising forward did not go through the DDP wrapper.
    with pytest.raises(RuntimeError, match="without calling the model"):
        step.check_taken(1, 2)


@settings(max_examples=40, deadline=None)
@given(dataset_size=st.integers(1, 150), seed=st.integers(0, 2**31), max_micro=st.integers(1, 6),
       changes=st.lists(change, min_size=1, max_size=8), resume_after=st.integers(1, 40))
def test_accumulation_changes_and_a_resume_keep_samples_and_order_exact(tmp_path_factory, dataset_size, seed,
                                                                       max_micro, changes, resume_after):
    """The accumulating loop under any sequence of batch changes, hence of accumulation counts (the
    micro-batch cap ``max_micro``), and a stop and resume from the checkpoint after ``resume_after`` steps:
    every micro-batch within the cap, each step in the fewest micro-batches, the exact samples and order."""
    spec = JobSpec(name="p", model="mlp", dataset_size=dataset_size, per_gpu_batch=1, base_lr=0.01,
                   max_per_gpu_batch=max_micro, stopping=StoppingRule(StopKind.EPOCHS, epochs=2))
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=changes[0][0], lr=0.01, generation=0,
                          state_dir=tmp_path_factory.mktemp("s"), tracking_uri=None, experiment="ones", seed=seed,
                          noise_scale_budget=0.0)

    def generation() -> TrainingSession:  # a new process: it restores the checkpoint, if any
        session = TrainingSession(placement, dataset_size, checkpoint_interval_s=1e9)
        model = torch.nn.Linear(1, 1)
        session.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
        return session

    session, seen, taken, accums, resumed = generation(), [], 0, set(), False
    plan, left = list(changes), changes[0][1]
    while not session.finished:
        for step in session.steps():
            assert len(step) == accumulation_for(session._batch_now, 1, max_micro)[1] + 1
            accums.add(len(step))
            for idx in step:
                assert 0 < len(idx) <= max_micro
                seen.extend(idx.tolist())
            session.step_done()
            taken += 1
            left = _next_change(session, spec, plan, left)
            if taken == resume_after and not session.finished:
                session._stop("KILLED")  # what a stop request does: checkpoint at this step boundary
        if not session.finished:
            session, resumed = generation(), True
    # A start of training after the first is a restart, counted at its first step (issue 40: so that starts
    # killed before their first checkpoint count too).
    assert session.progress.restarts == (1 if resumed else 0)
    order = EpochOrder(dataset_size, seed)
    assert session.progress.samples_done == 2 * dataset_size
    assert seen == np.concatenate([order.permutation(0), order.permutation(1)]).tolist()
