"""Atomic checkpoints: previous kept, fallback on corruption, RNG round trip, survival of kill -9."""

from __future__ import annotations

import logging
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from ones_pipeline.train.checkpoint import (
    LATEST_NAME,
    PREV_NAME,
    CheckpointError,
    capture_rng_state,
    check_state_dir,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from ones_pipeline.train.models import build_model

REPO = Path(__file__).resolve().parents[1]


def _state(step: int) -> dict:
    return {"step": step, "payload": torch.full((1000,), float(step)), "progress": {"epoch": 1, "position": step}}


def test_save_keeps_exactly_one_previous(tmp_path):
    d = tmp_path / "job" / "state"  # created on demand
    assert load_checkpoint(d) is None
    assert save_checkpoint(d, _state(1)) == d / LATEST_NAME
    assert not (d / PREV_NAME).exists()
    save_checkpoint(d, _state(2))
    save_checkpoint(d, _state(3))
    assert {p.name for p in d.iterdir()} == {LATEST_NAME, PREV_NAME}  # no temporary file left
    assert torch.load(d / PREV_NAME, weights_only=True)["step"] == 2
    assert load_checkpoint(d)["step"] == 3


def test_model_and_optimizer_round_trip(tmp_path):
    torch.manual_seed(0)
    model = build_model("cnn", 10, (1, 8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "position": np.int64(7), "rng": capture_rng_state()})
    st = load_checkpoint(tmp_path, required_keys=("model", "optimizer"))
    assert st["position"] == 7 and type(st["position"]) is int  # numpy scalars become Python scalars
    model2 = build_model("cnn", 10, (1, 8, 8))
    model2.load_state_dict(st["model"])
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.5, momentum=0.9)
    opt2.load_state_dict(st["optimizer"])
    assert all(torch.equal(a, b)
               for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=False))
    assert opt2.param_groups[0]["lr"] == 0.1


def test_unloadable_state_is_rejected_before_writing(tmp_path):
    @dataclass
    class Progress:
        epoch: int = 0

    with pytest.raises(TypeError, match=r"state\['progress'\].*Progress"):
        save_checkpoint(tmp_path, {"progress": Progress()})
    with pytest.raises(TypeError, match=r"state\['a'\]\[1\].*ndarray"):
        save_checkpoint(tmp_path, {"a": [1, np.zeros(3)]})
    assert list(tmp_path.iterdir()) == []


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_corrupt_latest_falls_back_to_prev(tmp_path, caplog):
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    _truncate(tmp_path / LATEST_NAME)
    with caplog.at_level(logging.WARNING, logger="ones_pipeline.train.checkpoint"):
        st = load_checkpoint(tmp_path)
    assert st["step"] == 1 and torch.equal(st["payload"], torch.full((1000,), 1.0))
    assert any(LATEST_NAME in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_garbage_and_missing_keys_fall_back(tmp_path, caplog):
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, {"step": 2})
    assert load_checkpoint(tmp_path, required_keys=("payload",))["step"] == 1
    (tmp_path / LATEST_NAME).write_bytes(b"\x00" * 100)
    assert load_checkpoint(tmp_path)["step"] == 1


def test_latest_missing_uses_prev(tmp_path):
    """A writer killed between its two renames leaves only prev (and maybe a temporary file)."""
    save_checkpoint(tmp_path, _state(1))
    os.replace(tmp_path / LATEST_NAME, tmp_path / PREV_NAME)
    (tmp_path / ".checkpoint-dead.pt.tmp").write_bytes(b"partial")
    assert load_checkpoint(tmp_path)["step"] == 1
    save_checkpoint(tmp_path, _state(2))  # the next save clears the stale temporary file
    assert {p.name for p in tmp_path.iterdir()} == {LATEST_NAME, PREV_NAME}


def test_both_corrupt_raises_naming_both(tmp_path):
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    _truncate(tmp_path / LATEST_NAME)
    _truncate(tmp_path / PREV_NAME, keep=0.1)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert LATEST_NAME in str(err.value) and PREV_NAME in str(err.value)
    (tmp_path / PREV_NAME).unlink()  # latest corrupt, no prev: still an error, not a silent fresh start
    with pytest.raises(CheckpointError, match=LATEST_NAME):
        load_checkpoint(tmp_path)


def test_state_dir_errors(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=str(f)):
        check_state_dir(f)
    with pytest.raises(ValueError, match="not a directory"):
        check_state_dir(f / "sub")
    with pytest.raises(ValueError, match=str(f)):
        save_checkpoint(f, _state(1))
    assert check_state_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_state_dir_is_named(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match=str(ro)):
            check_state_dir(ro)
        with pytest.raises(PermissionError, match=str(ro)):
            check_state_dir(ro / "job")
    finally:
        ro.chmod(0o700)


def test_rng_state_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leave a cached Gaussian in numpy's legacy state
    save_checkpoint(tmp_path, {"rng": capture_rng_state()})
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist(), random.gauss(0, 1))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(load_checkpoint(tmp_path)["rng"])
    got = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist(), random.gauss(0, 1))
    assert got == expected


# -- kill -9 --------------------------------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import sys
    import torch
    from ones_pipeline.train.checkpoint import load_checkpoint, save_checkpoint

    state_dir, n = sys.argv[1], int(sys.argv[2])
    print("imported", flush=True)
    sys.stdin.readline()  # wait for "go": the previous writer has been killed
    st = load_checkpoint(state_dir)
    step = st["step"] + 1 if st else 0
    first = True
    while True:
        save_checkpoint(state_dir, {"step": step, "payload": torch.full((n,), float(step)), "n": n, "tail": step})
        if first:
            print("saved", flush=True)
            first = False
        step += 1
""")


def _start_writer(state_dir: Path, n: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(state_dir), str(n)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc


def _expect_line(proc: subprocess.Popen, word: str) -> None:
    line = proc.stdout.readline()
    if line.strip() != word:
        proc.kill()
        raise AssertionError(f"writer said {line!r} instead of {word!r}; stderr: {proc.stderr.read()[-2000:]}")


def test_kill_9_never_leaves_a_partial_checkpoint(tmp_path):
    """SIGKILL a writer of 16 MB checkpoints at random moments; every time, load_checkpoint returns a
    complete checkpoint (latest or prev), and a restarted writer resumes after it."""
    rng = random.Random(1234)
    n = 1 << 22  # 16 MB of float32: a save takes tens of milliseconds, so kills land inside writes
    rounds, last_step, temps_left = 4, -1, 0
    nxt = _start_writer(tmp_path, n)  # the next writer imports torch while the current one runs
    for i in range(rounds):
        proc = nxt
        _expect_line(proc, "imported")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _expect_line(proc, "saved")
        nxt = _start_writer(tmp_path, n) if i + 1 < rounds else None
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        proc.stdout.close()
        proc.stderr.close()
        proc.stdin.close()
        temps_left += len(list(tmp_path.glob(".checkpoint-*.tmp")))
        st = load_checkpoint(tmp_path, required_keys=("step", "payload", "n", "tail"))
        assert st is not None
        assert st["n"] == n and st["tail"] == st["step"]
        assert st["payload"].shape == (n,) and bool((st["payload"] == float(st["step"])).all())
        assert st["step"] > last_step  # the writer of this round saved at least once after resuming
        last_step = st["step"]
    print(f"kill -9 rounds: {rounds}, partial temporary files found after kills: {temps_left}")


def test_unwritable_state_dir_error_names_it_even_as_root(tmp_path, monkeypatch):
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError, match=f"{tmp_path}.*not writable"):
        check_state_dir(tmp_path)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_checkpoints_and_reports_are_written_with_the_users_umask(tmp_path, umask, mode):
    """Issue 40: mkstemp's 0600 survived the rename whatever the umask."""
    from ones_pipeline.reporting import write_text

    old = os.umask(umask)
    try:
        latest = save_checkpoint(tmp_path, {"epoch": 1})
        report = write_text(tmp_path / "summary.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(latest.stat().st_mode) == mode
    assert stat.S_IMODE(report.stat().st_mode) == mode
