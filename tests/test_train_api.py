"""The training session's loss weighting (``TrainingSession.loss_scale``), ranks simulated in one process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule  # noqa: E402
from ones_pipeline.train.api import Placement, TrainingSession  # noqa: E402

DATASET_SIZE, GLOBAL_BATCH, WORLD = 9, 7, 4  # steps of 7 (shares 2, 2, 2, 1) and 2 (shares 1, 1, 0, 0)


def _session(rank: int, position: int, tmp_path) -> TrainingSession:
    spec = JobSpec(name="job-a", model="mlp", dataset_size=DATASET_SIZE, per_gpu_batch=2, requested_gpus=WORLD,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=1))
    placement = Placement(spec=spec, rank=rank, world_size=WORLD, global_batch=GLOBAL_BATCH, lr=0.1,
                          generation=0, state_dir=tmp_path, tracking_uri=None, experiment="ones")
    session = TrainingSession(placement, DATASET_SIZE)
    session.progress.position = position
    return session


@pytest.mark.parametrize("position", [0, 7], ids=["full-uneven-batch", "short-last-batch-with-empty-shares"])
def test_loss_scale_makes_the_ranks_average_gradient_the_global_batch_mean(position, tmp_path, monkeypatch):
    monkeypatch.delenv("ONES_STOP_FILE", raising=False)
    monkeypatch.delenv("ONES_LAUNCHER_PID", raising=False)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(DATASET_SIZE, 3, generator=gen), torch.randn(DATASET_SIZE, generator=gen)
    w0 = torch.randn(3, generator=gen)

    def summed_loss(idx) -> tuple[torch.Tensor, torch.Tensor]:
        w = w0.clone().requires_grad_(True)
        loss = ((x[idx] @ w - y[idx]) ** 2).sum()
        return w, loss

    per_rank, seen = [], []
    for rank in range(WORLD):
        session = _session(rank, position, tmp_path)
        idx = torch.as_tensor(next(session.batches()), dtype=torch.long)  # this rank's share of the step
        w, loss = summed_loss(idx)
        (loss * session.loss_scale()).backward()  # an empty share: a zero loss, still scaled
        per_rank.append(w.grad)
        seen.append(idx)
    ddp_average = torch.stack(per_rank).mean(0)  # what DDP's all-reduce leaves on every rank

    step = torch.cat(seen)
    assert len(step) == min(GLOBAL_BATCH, DATASET_SIZE - position)
    assert len({len(i) for i in seen}) > 1  # the shares are uneven
    w, loss = summed_loss(step)
    (loss / len(step)).backward()  # the mean over the step's global batch
    torch.testing.assert_close(ddp_average, w.grad)


def test_accum_steps_is_logged_only_while_the_step_accumulates(tmp_path, monkeypatch):
    """MLflow's run page sorts its charts by name: a constant ``accum_steps`` of 0 came first on every job's page."""
    monkeypatch.delenv("ONES_STOP_FILE", raising=False)
    monkeypatch.delenv("ONES_LAUNCHER_PID", raising=False)

    def metrics(accumulating: bool) -> dict:
        spec = JobSpec(name="job-m", model="mlp", dataset_size=64, per_gpu_batch=4, max_per_gpu_batch=4,
                       requested_gpus=1, stopping=StoppingRule(StopKind.EPOCHS, epochs=1))
        placement = Placement(spec=spec, rank=0, world_size=1, global_batch=16, lr=0.1, generation=0,
                              state_dir=tmp_path / str(accumulating), tracking_uri=None, experiment="ones")
        session = TrainingSession(placement, 64)
        model = torch.nn.Linear(3, 1)
        session.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        steps = session.steps() if accumulating else session.batches()
        next(steps)
        return session.metrics()

    assert "accum_steps" not in metrics(accumulating=False)
    assert metrics(accumulating=True)["accum_steps"] == 3.0  # 16 samples in 4 micro-batches of 4


def test_step_metrics_are_logged_every_few_seconds_and_at_once_when_the_steps_are_first_timed(tmp_path, monkeypatch):
    """A script calls ``log_step_metrics`` after every step. An MLflow point takes ~6 ms to write, as long as the
    steps of a small model: logged every 10 steps, an mlp-digits job trained at 0.7x the rate. Two epochs of 16
    steps (well under ``LOG_EVERY_S``) log a point after the first step, one once the steps are timed, and one per
    epoch end."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("ONES_STOP_FILE", raising=False)
    monkeypatch.delenv("ONES_LAUNCHER_PID", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = JobSpec(name="job-l", model="mlp", dataset_size=64, per_gpu_batch=4, requested_gpus=1,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=2))
    placement = Placement(spec=spec, rank=0, world_size=1, global_batch=4, lr=0.1, generation=0, state_dir=tmp_path,
                          tracking_uri=uri, experiment="ones")
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with TrainingSession(placement, 64) as session:
        model = session.prepare(model, optimizer)
        for idx in session.batches():
            loss = model(torch.ones(len(idx), 3)).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            session.step_done(loss=float(loss.detach()))
            session.log_step_metrics()
            if session.epoch_ended and not session.stopped:
                session.end_epoch(accuracy=0.5)
    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ones").experiment_id])
    samples = sorted(m.step for m in client.get_metric_history(run.info.run_id, "samples"))
    timed = sorted(m.step for m in client.get_metric_history(run.info.run_id, "step_time_s"))
    assert samples[0] == 4 and timed and timed[0] < 64, (samples, timed)  # timed within the first epoch
    assert len(samples) <= 5, samples  # first step, first timed, two epoch ends (and their points), not 32
