"""Progress of a long job on its partition (``defs.progress_events``): from its first training step, by samples of the
stopping rule's total, with percent and ETA, at most one observation per ``OBSERVE_EVERY_S``."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
dg = pytest.importorskip("dagster")

from observer_helpers import Recorder  # noqa: E402

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule  # noqa: E402
from ones_pipeline.defs.progress_events import OBSERVE_EVERY_S, ProgressObserver  # noqa: E402
from ones_pipeline.scheduler import RunAllocation  # noqa: E402
from ones_pipeline.train import records  # noqa: E402
from ones_pipeline.train.api import Placement, TrainingSession  # noqa: E402


def _spec(stopping: StoppingRule, dataset_size: int = 100) -> JobSpec:
    return JobSpec(name="job-s", model="mlp", dataset_size=dataset_size, per_gpu_batch=10, requested_gpus=1,
                   stopping=stopping)


def test_a_job_that_stops_on_samples_shows_samples_of_its_total_from_its_first_step(tmp_path, monkeypatch):
    """Real training (one process, 60 samples of a 100-sample epoch): the partition's first observation comes at the
    first step, before any evaluation, as samples of the rule's total with its percent (it came at the epoch's end,
    as "epoch 0.60" without a total, before)."""
    monkeypatch.delenv("ONES_STOP_FILE", raising=False)
    monkeypatch.delenv("ONES_LAUNCHER_PID", raising=False)
    spec = _spec(StoppingRule(StopKind.SAMPLES, samples=60))
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=10, lr=0.1, generation=0,
                          state_dir=tmp_path, tracking_uri=None, experiment="ones")
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 3, generator=gen), torch.randn(100, generator=gen)
    context = Recorder()
    observer = ProgressObserver(context, tmp_path / records.PROGRESS_FILE,
                                RunAllocation.make(spec, (0,), "cpu", 10, 0), poll_s=3600)
    with observer, TrainingSession(placement, 100) as session:
        model = torch.nn.Linear(3, 1)
        model = session.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for idx in session.batches():
            idx = torch.as_tensor(idx, dtype=torch.long)
            loss = ((model(x[idx]).squeeze(1) - y[idx]) ** 2).sum() * session.loss_scale()
            loss.backward()
            session.step_done(loss=float(loss.detach()))
            if session.epoch_ended:
                session.end_epoch(accuracy=0.5, loss=float(loss.detach()))
    rows = list(records.events(tmp_path))
    kinds = [r["event"] for r in rows]
    assert kinds[0] == "training" and kinds[-1] == "epoch" and kinds.count("epoch") == 1
    first = context.events[0].metadata
    assert first["progress"].value == "10/60 samples (16.7 %)"
    assert first["samples_total"].value == 60 and first["progress_percent"].value == pytest.approx(16.7)
    assert len(context.events) == 1  # the rows of the next seconds wait for the next OBSERVE_EVERY_S


def test_progress_rows_make_one_observation_per_interval_with_an_eta(tmp_path):
    """``progress`` rows every 5 s of a 3-epoch job (no epoch ends in the first 100 s): observations at the first
    training step and then each ``OBSERVE_EVERY_S``, never closer; the ETA is the remaining samples at this
    generation's rate since its first step; the last evaluation's accuracy is shown from the epoch row on."""
    assert OBSERVE_EVERY_S == 30.0  # the rows below are 5 s apart: observations at 0, 30, 60 and 90 s
    spec = _spec(StoppingRule(StopKind.EPOCHS, epochs=3), dataset_size=1000)
    path = tmp_path / records.PROGRESS_FILE
    path.write_text(json.dumps({"event": "progress", "samples": 5, "generation": 1, "time_s": 0.0}) + "\n")  # before
    context = Recorder()
    decisions = tmp_path / "decisions.jsonl"  # the scheduler's: its last decision for the job predicts its finish
    decisions.write_text("".join(json.dumps(d) + "\n" for d in (
        {"job": "job-s", "after": [0], "time_s": 900.0, "why": {"remaining_after_s": 500.0}},
        {"job": "other", "after": [1], "time_s": 950.0, "why": {"remaining_after_s": 10.0}},
        {"job": "job-s", "after": [0, 1], "time_s": 990.0, "why": {"remaining_after_s": 300.0}},
        {"job": "job-s", "after": [], "time_s": 995.0, "reason": "a decision that leaves it no slots"})) + "{half")
    observer = ProgressObserver(context, path, RunAllocation.make(spec, (0, 1), "cpu", 20, 2), poll_s=3600,
                                decisions=decisions)
    rows = [{"event": "training", "samples": 100, "generation": 2, "time_s": 1000.0}]
    rows += [{"event": "progress", "samples": 100 + 10 * t, "samples_per_s": 12.0, "global_batch": 20, "processes": 2,
              "generation": 2, "time_s": 1000.0 + t} for t in range(5, 101, 5)]
    rows.insert(18, {"event": "epoch", "epoch": 1.0, "samples": 1000, "accuracy": 0.81234, "loss": 0.7,
                     "generation": 2, "time_s": 1089.5})  # just before the row of t = 90 s
    with observer:
        path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in rows))
    shown = [e.metadata for e in context.events]
    assert [m["samples"].value for m in shown] == [100, 400, 700, 1000]  # t = 0, 30, 60, 90 s
    assert shown[0]["progress"].value == "100/3,000 samples (3.3 %)" and "eta_s" not in shown[0]
    assert shown[1]["eta_s"].value == pytest.approx((3000 - 400) / 10.0)  # 300 samples in 30 s
    assert shown[1]["predicted_finish"].value == 1290.0  # the grow to 2 slots at 990 s: 300 s left
    assert shown[1]["epoch"].value == "0.40/3" and "accuracy" not in shown[1]
    assert shown[3]["accuracy"].value == 0.8123 and shown[3]["slots"].value == "2 CPU slots"


def test_the_mlflow_run_is_a_link_where_the_ui_address_is_set():
    """A sqlite store with ``mlflow.ui_url`` (the example project's): the partition's progress rows link to the run
    (they said how to start `mlflow ui` instead, the same text on every row)."""
    from ones_pipeline.defs.resources import MlflowResource

    with_ui = MlflowResource(tracking_uri="sqlite:////tmp/x/mlflow.db", experiment="e", ui_url="http://127.0.0.1:5000/")
    link = with_ui.run_link("abc", "3")
    assert isinstance(link, dg.UrlMetadataValue)
    assert link.url == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    bare = MlflowResource(tracking_uri="sqlite:////tmp/x/mlflow.db", experiment="e").run_link("abc", "3")
    assert "mlflow ui --app-name ones" in bare.text
