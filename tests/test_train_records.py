"""What a training job records survives kill -9 exactly (issue 40): an epoch's MLflow point and progress event
once each whatever the moment of the kill, restarts counted exactly, a kill of rank 0 after the job finished is
not a failure, and a checkpoint that cannot be this job's ends in one line, not a traceback per rank. Real
launchers and ranks (``python -m ones_pipeline.train``), real checkpoints and a real MLflow store; the faults are
injected by the job's command (``tests/faulty_job.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mlflow = pytest.importorskip("mlflow")

from ones_pipeline.config.layout import PROGRESS_FILE  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N = 1437  # digits' training set
FAULTY = ["python", str(ROOT / "tests" / "faulty_job.py")]


def launch(tmp: Path, generation: int, fault: str = "", times: int = 1, model: str = "mlp-digits", epochs: int = 3,
           slots: int = 1, uri: str | None = None, command: list[str] | None = FAULTY, wait: bool = True):
    spec = {"name": "rec", "model": model, "dataset_size": N, "per_gpu_batch": 16, "base_lr": 0.05, "max_lr": 0.2,
            "requested_gpus": 1, "stopping": {"kind": "epochs", "epochs": epochs}}
    if command:
        spec["command"] = command
    (tmp / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "ones_pipeline.train", "--spec", str(tmp / "spec.json"), "--slots", str(slots),
           "--generation", str(generation), "--state-dir", str(tmp / "job"), "--grace-period", "30",
           *(["--tracking-uri", uri] if uri else [])]
    env = {**os.environ, "FAULT": fault, "FAULT_TIMES": str(times)}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def epoch_events(job: Path) -> list[int]:
    rows = [json.loads(x) for x in (job / PROGRESS_FILE).read_text().splitlines() if x.strip()]
    return [r["samples"] for r in rows if r.get("event") == "epoch"]


@pytest.mark.parametrize("fault", ["kill-at-checkpoint", "kill-after-checkpoint"])
def test_a_kill_at_an_epochs_checkpoint_records_the_epoch_once(fault, tmp_path, uri):
    """Rank 0 killed as it begins (or just after) the checkpoint at an epoch's end: the epoch's MLflow point and
    progress event exist exactly once for every epoch, also the one the kill interrupted."""
    assert launch(tmp_path, 0, fault, uri=uri).returncode != 0  # killed at its first checkpoint
    done = launch(tmp_path, 1, uri=uri)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    history = mlflow.tracking.MlflowClient(uri).get_metric_history(result["mlflow_run_id"], "accuracy")
    assert sorted(m.step for m in history) == [N, 2 * N, 3 * N]
    assert epoch_events(tmp_path / "job") == [N, 2 * N, 3 * N]


def test_restarts_count_every_start_also_those_killed_before_their_first_checkpoint(tmp_path):
    """Two generations killed before any checkpoint was written, then one that finishes: two restarts."""
    for gen in (0, 1):
        assert launch(tmp_path, gen, "kill-at-checkpoint", times=2, epochs=2).returncode != 0
        assert load_checkpoint(tmp_path / "job") is None
    assert launch(tmp_path, 2, "kill-at-checkpoint", times=2, epochs=2).returncode == 0
    assert json.loads((tmp_path / "job" / "result.json").read_text())["restarts"] == 2
    assert launch(tmp_path, 3, epochs=2).returncode == 0  # started after the end: trains nothing, no restart
    assert json.loads((tmp_path / "job" / "result.json").read_text())["restarts"] == 2


def test_rank_0_killed_after_the_job_finished_is_not_a_failure(tmp_path):
    proc = launch(tmp_path, 0, "hang-after-result", epochs=1, slots=2, wait=False)
    result = tmp_path / "job" / "result.json"
    deadline = time.monotonic() + 120
    while not result.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no result"
        time.sleep(0.05)
    rank0 = next(p for p in __import__("psutil").Process(proc.pid).children() if p.environ().get("ONES_RANK") == "0")
    os.kill(rank0.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "after the job had finished (its result is written): the job is done" in err


def one_line(err: str) -> list[str]:
    """The lines a user reads: all but the launcher's INFO lines (its start)."""
    return [line for line in err.splitlines() if line.strip() and "ones_pipeline.train: job rec generation" not in line]


def test_a_checkpoint_of_another_model_ends_in_one_line(tmp_path):
    assert launch(tmp_path, 0, epochs=1, command=None).returncode == 0  # mlp-digits: a checkpoint
    out = launch(tmp_path, 1, model="cnn-digits", slots=2, command=None)
    assert out.returncode == 2
    lines = one_line(out.stderr)
    assert len(lines) == 1 and "is of model mlp-digits, this job trains cnn-digits" in lines[0], out.stderr[-3000:]
    assert str(tmp_path / "job") in lines[0]
    # A checkpoint from before the model was recorded in it: the state dicts do not fit, one line too.
    state = load_checkpoint(tmp_path / "job")
    del state["model_name"]
    save_checkpoint(tmp_path / "job", state)
    out = launch(tmp_path, 2, model="cnn-digits", slots=2, command=None)
    lines = one_line(out.stderr)
    assert out.returncode == 2 and len(lines) == 1 and "does not fit this job's model cnn-digits" in lines[0], \
        out.stderr[-3000:]


def test_an_unreadable_checkpoint_ends_in_one_line(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "checkpoint-latest.pt").write_bytes(b"not a checkpoint")
    out = launch(tmp_path, 0, slots=2, command=None)
    lines = [line for line in one_line(out.stderr) if "cannot load checkpoint" not in line]  # the loader's warning
    assert out.returncode == 2 and len(lines) == 1 and "no readable checkpoint" in lines[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr


def test_a_rank_whose_peer_was_killed_ends_in_one_line(tmp_path):
    """Rank 0 killed (here as it begins a checkpoint, its peer waiting in the barrier): the peer's collective fails;
    it says so in one line and exits 1 (found by benchmarks/chaos.py: a gloo traceback per surviving rank)."""
    out = launch(tmp_path, 0, "kill-at-checkpoint", slots=2, epochs=1)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "job rec rank 1: a peer left the group (killed or failed), so this rank stops" in out.stderr
