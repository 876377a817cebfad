"""Whose exit counts when a generation's ranks end: rank 0's (its checkpoint and MLflow run are final), and
only rank 0's task decides that a stopped generation had not trained yet (a Slurm task of another rank
follows it). Real launcher, real rank processes (small scripts in place of the trainer, as a job's own
``command`` is run); no torch.

Found by a CI failure of the Slurm end-to-end test: a generation's Slurm job ended in a failed state
although its rank 0 had stopped with a checkpoint."""

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE, preempt_request_file
from ones_pipeline.core.types import JobSpec
from ones_pipeline.scheduler import RunAllocation
from ones_pipeline.train.launcher import LaunchRequest, launch

# A rank: RANK_<r>_EXIT says what it does (an exit code after a marker, or "stop": wait for the stop file
# and exit 0, or "hang": ignore everything for a minute); it writes rank-<r>.done as it exits.
RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    rank, state = os.environ["ONES_RANK"], Path(os.environ["ONES_STATE_DIR"])
    what = os.environ.get(f"RANK_{rank}", "0")
    (state / f"rank-{rank}.started").write_text("")
    if what.startswith("after:"):  # wait for another rank's end, then exit with this code
        other, code = what[6:].split(":")
        deadline = time.monotonic() + 60
        while not (state / f"rank-{other}.done").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (state / f"rank-{rank}.done").write_text(code)
        sys.exit(int(code))
    if what == "stop":
        stop = Path(os.environ["ONES_STOP_FILE"])
        deadline = time.monotonic() + 60
        while not stop.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (state / f"rank-{rank}.done").write_text("stop file" if stop.exists() else "timeout")
        sys.exit(0)
    if what == "hang":
        time.sleep(60)
    (state / f"rank-{rank}.done").write_text(what)
    sys.exit(int(what))
""")


def request(tmp_path: Path, monkeypatch, ranks=None, world=2, leader_exit: Path | None = None,
            grace_s: float = 20.0, **behaviour: str) -> LaunchRequest:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    for rank, what in behaviour.items():
        monkeypatch.setenv(rank.upper(), what)
    spec = JobSpec(name="ranks", model="custom", dataset_size=10, per_gpu_batch=1, max_lr=1.0,
                   command=(sys.executable, str(script)))
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return LaunchRequest(RunAllocation.make(spec, tuple(range(world)), "cpu", world, 0), state,
                         grace_period_s=grace_s, ranks=ranks, leader_exit_file=leader_exit,
                         master_addr="127.0.0.1" if ranks is not None else None,
                         master_port=29999 if ranks is not None else None)


def test_a_peer_failing_after_rank_0_ended_cleanly_does_not_fail_the_launcher(tmp_path, monkeypatch):
    req = request(tmp_path, monkeypatch, rank_0="0", rank_1="after:0:3")
    assert launch(req) == 0
    assert (req.state_dir / "rank-1.done").read_text() == "3"  # it did fail, after rank 0


def test_rank_0_failing_fails_the_launcher(tmp_path, monkeypatch):
    req = request(tmp_path, monkeypatch, rank_0="after:1:1", rank_1="0")
    assert launch(req) == 1
    (tmp_path / "b").mkdir()
    req = request(tmp_path / "b", monkeypatch, rank_0="1", rank_1="stop")
    assert launch(req) == 1  # and the other rank was stopped through its stop file
    assert (req.state_dir / "rank-1.done").read_text() == "stop file"


def test_a_slurm_task_of_another_rank_goes_by_what_rank_0s_task_wrote(tmp_path, monkeypatch):
    for verdict, expected in (("0", 0), ("1", 1)):
        leader_exit = tmp_path / f"rank-0-{verdict}.exit"
        req = request(tmp_path, monkeypatch, ranks=(1,), leader_exit=leader_exit, grace_s=10.0, rank_1="2")
        # Rank 0's task ends a moment after its peer failed (it waits on its own rank first).
        timer = threading.Timer(1.0, leader_exit.write_text, args=(verdict,))
        timer.start()
        try:
            assert launch(req) == expected, verdict
        finally:
            timer.cancel()


def test_a_slurm_task_of_another_rank_stops_its_rank_through_the_stop_file_not_at_once(tmp_path, monkeypatch):
    """The scheduler's request reaches every task; no "training" event yet. Only rank 0's task may take that
    as "not trained yet" and kill its rank (each task reads the progress file at its own moment): this one
    asks its rank to stop, and the rank stops with the group."""
    req = request(tmp_path, monkeypatch, ranks=(1,), leader_exit=tmp_path / "rank-0.exit", rank_1="stop")
    preempt_request_file(req.state_dir, 0).write_text(json.dumps({"reason": "test"}))
    assert launch(req) == 0
    assert (req.state_dir / "rank-1.done").read_text() == "stop file"


def test_a_slurm_task_of_another_rank_follows_rank_0s_stop_before_training(tmp_path, monkeypatch):
    req = request(tmp_path, monkeypatch, ranks=(1,), leader_exit=tmp_path / "rank-0.exit", rank_1="hang")
    preempt_request_file(req.state_dir, 0).write_text(json.dumps({"reason": "test"}))

    def leader_stops_before_training():
        while not (req.state_dir / "rank-1.started").exists():
            time.sleep(0.02)
        with open(req.state_dir / PROGRESS_FILE, "a") as fh:
            fh.write(json.dumps({"event": "stopped", "before_training": True, "generation": 0,
                                 "time_s": time.time()}) + "\n")

    threading.Thread(target=leader_stops_before_training, daemon=True).start()
    started = time.monotonic()
    assert launch(req) == 0
    assert time.monotonic() - started < 15  # killed on rank 0's word, not after the grace period (20 s)
    assert not (req.state_dir / "rank-1.done").exists()  # it hung: killed


def test_rank_0s_own_task_still_stops_an_untrained_generation_at_once(tmp_path, monkeypatch):
    req = request(tmp_path, monkeypatch, ranks=(0,), rank_0="hang")
    preempt_request_file(req.state_dir, 0).write_text(json.dumps({"reason": "test"}))
    started = time.monotonic()
    assert launch(req) == 0
    assert time.monotonic() - started < 15
    rows = [json.loads(line) for line in (req.state_dir / PROGRESS_FILE).read_text().splitlines()]
    assert {"event": "stopped", "before_training": True}.items() <= rows[-1].items()


def test_a_launcher_whose_step_died_while_it_started_stops_its_ranks(tmp_path, monkeypatch):
    """Found by benchmarks/chaos.py: a run worker killed while its launcher was still importing left the launcher an
    orphan from the start, so it took the reaper for its parent and trained on beside the job's next generation.
    The step now names itself (``ONES_STEP_PID``): here a process that is not the launcher's parent."""
    req = request(tmp_path, monkeypatch, rank_0="stop", rank_1="stop")
    import dataclasses
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv("ONES_STEP_PID", str(gone.pid))
    t0 = time.monotonic()
    assert launch(dataclasses.replace(req, dagster_run_id="run-1")) == 0
    assert time.monotonic() - t0 < 30
    assert {(req.state_dir / f"rank-{r}.done").read_text() for r in (0, 1)} == {"stop file"}
