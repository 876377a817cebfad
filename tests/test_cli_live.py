"""``ones submit | init | status`` in-process (``ones_pipeline.cli.main``) on a temporary project.

No daemon, no training: ``init`` writes the Dagster instance config and the MLflow store, ``status``
reads them back. The environment pins ``cluster: {gpus: none, cpu_slots: 2}`` so nothing asks NVML.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ones_pipeline.cli import main

SPEC = {"model": "mlp-digits", "per_gpu_batch": 32, "base_lr": 0.05, "max_lr": 0.2, "stopping": {"epochs": 2}}
ENV = {"cluster": {"gpus": "none", "cpu_slots": 2}, "scheduler": {"tick_interval_s": 5}}


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "proj"
    (root / "resources").mkdir(parents=True)
    (root / "resources" / "local.yaml").write_text(yaml.safe_dump(ENV))
    # `ones status` sets DAGSTER_HOME in-process; setting it here makes monkeypatch restore it afterwards.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "unused-dagster-home"))
    monkeypatch.delenv("ONES_PROJECT_DIR", raising=False)
    monkeypatch.delenv("ONES_ENV", raising=False)
    monkeypatch.chdir(tmp_path)  # the project is found through --project, never the working directory
    return root


def _spec_file(directory: Path, name: str, data: dict | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# -- submit ---------------------------------------------------------------------------------------------
def test_submit_copies_valid_spec(project: Path, tmp_path: Path, capsys):
    src = _spec_file(tmp_path / "incoming", "whatever.yaml", {**SPEC, "name": "mlp-a"})
    assert main(["submit", str(src), "--project", str(project)]) == 0
    target = project / "assets" / "jobs" / "mlp-a.yaml"
    assert target.read_text() == src.read_text()
    out = capsys.readouterr().out
    assert "submitted mlp-a" in out and str(target) in out
    assert sorted(p.name for p in target.parent.iterdir()) == ["mlp-a.yaml"]  # no temp file left behind


def test_submit_without_name_uses_file_name(project: Path, tmp_path: Path):
    src = _spec_file(tmp_path / "incoming", "mlp-b.yaml", SPEC)
    assert main(["submit", str(src), "--project", str(project)]) == 0
    assert (project / "assets" / "jobs" / "mlp-b.yaml").read_text() == src.read_text()


def test_submit_refuses_existing_without_force(project: Path, tmp_path: Path, capsys):
    first = _spec_file(tmp_path / "v1", "mlp-a.yaml", SPEC)
    second = _spec_file(tmp_path / "v2", "mlp-a.yaml", {**SPEC, "stopping": {"epochs": 5}})
    assert main(["submit", str(first), "--project", str(project)]) == 0
    capsys.readouterr()
    target = project / "assets" / "jobs" / "mlp-a.yaml"

    assert main(["submit", str(second), "--project", str(project)]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err and str(target) in err
    assert target.read_text() == first.read_text()

    assert main(["submit", str(second), "--project", str(project), "--force"]) == 0
    assert target.read_text() == second.read_text()


@pytest.mark.parametrize("data, needles", [
    ({**SPEC, "model": "gpt-5"}, ["field 'model'", "'gpt-5'", "allowed: mlp-digits, cnn-digits"]),
    ({**SPEC, "per_gpu_batch": -1}, ["field 'per_gpu_batch'", "out-of-range value -1", "in [1, 1048576]"]),
    ("model: mlp-digits\nper_gpu_batch: 32\n  stopping: {epochs: 2}\n", ["not valid YAML", "line 3"]),
], ids=["unknown-model", "negative-batch", "invalid-yaml"])
def test_submit_invalid_spec_exits_2_and_copies_nothing(project: Path, tmp_path: Path, capsys, data, needles):
    src = _spec_file(tmp_path / "incoming", "broken.yaml", data)
    assert main(["submit", str(src), "--project", str(project)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("ones submit: ")
    assert str(src) in captured.err
    for needle in needles:
        assert needle in captured.err, captured.err
    assert "submitted" not in captured.out
    jobs = project / "assets" / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []


def test_submit_with_bad_environment_exits_2(project: Path, tmp_path: Path, capsys):
    (project / "resources" / "local.yaml").write_text(yaml.safe_dump({"launcher": {"kind": "k8s"}}))
    src = _spec_file(tmp_path / "incoming", "mlp-a.yaml", SPEC)
    assert main(["submit", str(src), "--project", str(project)]) == 2
    assert "field 'launcher.kind'" in capsys.readouterr().err
    assert not (project / "assets" / "jobs" / "mlp-a.yaml").exists()


# -- init and status ------------------------------------------------------------------------------------
def test_init_writes_instance_and_mlflow_store_then_status_lists_pending(project: Path, tmp_path: Path, capsys):
    jobs = project / "assets" / "jobs"
    for name in ("mlp-a", "mlp-b", "cnn-c"):
        _spec_file(jobs, f"{name}.yaml", {**SPEC, "model": "cnn-digits"} if name.startswith("cnn") else SPEC)

    assert main(["init", "--project", str(project)]) == 0
    out = capsys.readouterr().out
    state = project / ".ones" / "state"
    config_path = state / "dagster" / "dagster.yaml"
    assert str(config_path) in out

    config = yaml.safe_load(config_path.read_text())
    runs = config["concurrency"]["runs"]
    limits = runs["tag_concurrency_limits"]
    assert sorted(limits, key=lambda x: x["key"]) == [  # CPU slots, not GPUs; a slot's tag counts while "held"
        {"key": "ones/cpu-0", "value": "held", "limit": 1}, {"key": "ones/cpu-1", "value": "held", "limit": 1}]
    assert runs["max_concurrent_runs"] >= 2
    assert config["run_monitoring"]["enabled"] is True
    import dagster as dg

    with dg.DagsterInstance.from_config(str(config_path.parent)) as instance:  # the queue Dagster builds from it
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == runs["max_concurrent_runs"]
        assert {lim["key"] for lim in queue.tag_concurrency_limits} == {"ones/cpu-0", "ones/cpu-1"}

    db = state / "mlflow.db"
    assert db.is_file() and db.read_bytes()[:16] == b"SQLite format 3\x00"
    assert (state / "jobs").is_dir()

    assert main(["init", "--project", str(project)]) == 0  # idempotent
    capsys.readouterr()

    assert main(["status", "--project", str(project)]) == 0
    table, _, notes = capsys.readouterr().out.strip().partition("\n\n")
    lines = table.splitlines()
    assert lines[0].split() == ["job", "state", "slots", "batch", "progress", "eta", "restarts"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert sorted(rows) == ["cnn-c", "mlp-a", "mlp-b"]
    # Under the table: where the slots come from, and why each pending job waits (all slots are free).
    assert notes.splitlines()[0].startswith("slots: ")
    assert sorted(line.split(":")[0] for line in notes.splitlines()[1:]) == ["cnn-c", "mlp-a", "mlp-b"]
    assert all("waiting: 2 slot(s) free (cpu 0,1)" in line for line in notes.splitlines()[1:]), notes
    for _job, cells in rows.items():
        assert cells[1:5] == ["pending", "-", "-", "0.0/2"], cells
        assert cells[-1] == "0"


def test_status_before_init_says_run_init(project: Path, capsys):
    assert main(["status", "--project", str(project)]) == 2
    err = capsys.readouterr().err
    assert "dagster.yaml" in err and "ones init" in err


def test_orphaned_runs_are_released_and_live_ones_kept(tmp_path):
    """A run left STARTED by a killed daemon holds its job and GPU tags forever (the default run launcher
    cannot check a worker's health): `ones init` cancels it, unless a process still runs it."""
    import subprocess
    import sys

    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from ones_pipeline.cli.supervise import process_cmdlines
    from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
    from ones_pipeline.defs.instance import release_orphaned_runs
    from ones_pipeline.scheduler import Launch, RunAllocation

    spec = JobSpec(name="job-a", model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=1))
    tags = {**Launch(RunAllocation.make(spec, (0,), "cpu", 32, 0), "start").tags(), "dagster/partition": "job-a"}
    with dg.instance_for_test() as instance:
        dead = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED, tags=tags)
        alive = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED, tags=tags)
        other = create_run_for_test(instance, job_name="report_job", status=DagsterRunStatus.STARTED)
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", alive.run_id])
        try:
            assert release_orphaned_runs(instance, process_cmdlines()) == [dead.run_id]
        finally:
            worker.kill()
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.CANCELED
        assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
        assert instance.get_run_by_id(other.run_id).status == DagsterRunStatus.STARTED  # not ours


def test_a_second_daemon_for_the_same_project_is_refused(tmp_path, capsys):
    import subprocess
    import sys

    from ones_pipeline.cli import main

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 1}\n")
    state = tmp_path / ".ones" / "state"
    state.mkdir(parents=True)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "dagster-daemon"])
    try:
        (state / "dagster.pid").write_text(f"{fake.pid}\n")
        assert main(["run", "--project", str(tmp_path), "--fresh"]) == 2
        assert "already running" in capsys.readouterr().err
        assert state.exists()  # --fresh deleted nothing
    finally:
        fake.kill()


@pytest.mark.parametrize("state_dir", [".", "''", "assets", "resources/.."])
def test_fresh_never_deletes_the_project(tmp_path, capsys, state_dir):
    """Issue 40, finding 2: with state_dir '.' or '' and a dagster/ folder from `ones init`, --fresh deleted
    the whole project (specs, resources, the user's files)."""
    from ones_pipeline.cli import main

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text(f"state_dir: {state_dir}\ncluster: {{gpus: none}}\n")
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "assets" / "jobs" / "a.yaml").write_text("model: mlp-digits\n")
    (tmp_path / "dagster").mkdir()
    (tmp_path / "assets" / "dagster").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["run", "--project", str(tmp_path), "--fresh"]) == 2
    assert "--fresh refuses to clear" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "assets" / "jobs" / "a.yaml").exists()
    assert (tmp_path / "resources" / "local.yaml").exists() and (tmp_path / "dagster").exists()


def test_fresh_deletes_what_ones_created_and_keeps_the_rest(tmp_path, capsys):
    from ones_pipeline.cli import main

    state = tmp_path / ".ones" / "state"
    for d in ("dagster", "jobs/a", "policy", "report"):
        (state / d).mkdir(parents=True)
    for f in ("mlflow.db", "decisions.jsonl", "failed_jobs.json", "jobs/a/result.json", "mine.txt"):
        (state / f).write_text("x")
    assert main(["run", "--project", str(tmp_path), "--fresh"]) == 2  # no spec: stops after --fresh
    out = capsys.readouterr()
    assert "--fresh: deleted" in out.out and "kept what ones did not create: mine.txt" in out.out
    assert sorted(p.name for p in state.iterdir()) == ["mine.txt"]
    (state / "mine.txt").unlink()
    (state / "dagster").mkdir()
    assert main(["run", "--project", str(tmp_path), "--fresh"]) == 2
    assert not state.exists()  # emptied: removed


def test_eta_comes_from_wall_clock_progress():
    from ones_pipeline.cli.status import eta_text

    # 218 of 600 epochs in 35 s held: about 61 s to go (a trainer's 'samples/s' said 4 s for this case).
    assert eta_text(remaining_samples=382 * 100, samples_done=218 * 100, held_s=35.0) == "61 s"
    assert eta_text(remaining_samples=100, samples_done=0, held_s=10.0) == "-"
    assert eta_text(remaining_samples=-5, samples_done=10, held_s=1.0) == "0 s"


# -- the decision log in `ones run`'s summary -----------------------------------------------------------
def test_decision_lines_from_the_log(project: Path):
    import json

    from ones_pipeline.cli.status import decision_lines
    from ones_pipeline.config import load_env

    env = load_env(project)
    assert decision_lines(env) == []  # no log yet
    rows = [{"time_s": 1000.0, "job": "long", "before": [], "after": [0], "global_batch": 64, "reason": "start"},
            {"time_s": 1062.4, "job": "long", "before": [0], "after": [0, 1], "global_batch": 64,
             "reason": "grow 1 -> 2", "policy": "ones", "decide_s": 0.01}]
    env.layout.decisions.parent.mkdir(parents=True)
    env.layout.decisions.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    assert decision_lines(env) == ["+   0 s  long: - -> [0] batch 64 (start)",
                                   "+  62 s  long: [0] -> [0,1] batch 64 (grow 1 -> 2)"]
    env.layout.decisions.write_text("\n".join(json.dumps({**rows[0], "time_s": 1000.0 + i}) for i in range(9)))
    short = decision_lines(env, limit=4)
    assert len(short) == 5 and short[2] == "... 5 more ..." and short[-1].startswith("+   8 s")
    # each change of a running job says its path, and the log ends with how many took each
    rows += [{"time_s": 1070.0, "job": "long", "before": [0, 1], "after": [0], "global_batch": 32,
              "reason": "shrink 2 -> 1 in place", "path": "in place"},
             {"time_s": 1090.0, "job": "long", "before": [0], "after": [], "global_batch": 0,
              "reason": "preempt (checkpoint, wait for GPUs)", "path": "checkpoint"}]
    env.layout.decisions.write_text("\n".join(json.dumps(r) for r in rows))
    lines = decision_lines(env)
    assert lines[2] == "+  70 s  long: [0,1] -> [0] batch 32 (shrink 2 -> 1 in place)"
    assert lines[-1] == "changes of running jobs: 1 in place (same run), 1 through a checkpoint (a new generation)"


def test_init_and_status_with_an_unreachable_mlflow_give_one_line_within_seconds(tmp_path, capsys):
    """Issue 40, finding 5: `ones init` ended in an uncaught TrackerError; `ones status` took 268 s."""
    import time

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text(
        "mlflow: {tracking_uri: 'http://127.0.0.1:9'}\ncluster: {gpus: none, cpu_slots: 1}\n")
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "assets" / "jobs" / "a.yaml").write_text(
        "model: mlp-digits\nper_gpu_batch: 32\nstopping: {epochs: 1}\n")
    assert main(["init", "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ones init: MLflow: tracking URI 'http://127.0.0.1:9'"), err
    t0 = time.monotonic()
    assert main(["status", "--project", str(tmp_path)]) == 0
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert "MLflow progress unavailable" in err and "server not reachable within 5 s" in err


def test_the_child_setup_between_fork_and_exec_loads_no_shared_library(tmp_path):
    """Issue 40: the daemon died at start in about one `ones run` in four with ld.so's RT_CONSISTENT
    assertion: the pre-exec hook dlopen'ed (ctypes) in a child forked while another thread was in dlopen.
    The hook now only calls what the parent resolved; an audit hook sees no dlopen and no import in it."""
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from ones_pipeline.cli.supervise import _child_setup, _prctl\n"
            "prctl = _prctl()\n"
            "seen = []\n"
            "watched = ('ctypes.dlopen', 'import')\n"
            "sys.addaudithook(lambda event, args: seen.append(event) if event in watched else None)\n"
            "_child_setup(os.getppid(), prctl)\n"
            "print(sorted(set(seen)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_daemon_dead_of_the_loader_race_is_told_apart(tmp_path):
    import subprocess
    import sys

    from ones_pipeline.cli.supervise import died_of_the_loader_race

    log = tmp_path / "daemon.log"
    log.write_bytes(b"an earlier start's output: Inconsistency detected by ld.so\n")
    offset = log.stat().st_size
    line = "Inconsistency detected by ld.so: dl-open.c: 581: dl_open_worker_begin: Assertion failed!"
    for exit_code, text, expected in ((127, line, True), (1, line, False), (127, "other", False)):
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, "-c", f"import sys; print({text!r}); sys.exit({exit_code})"],
                                    stdout=fh)
            proc.wait()
        assert died_of_the_loader_race(proc, log, offset) is expected
        offset = log.stat().st_size


def test_ones_run_starts_again_a_daemon_that_dies_of_the_loader_race(tmp_path, capsys, monkeypatch):
    """The supervisor's fallback (issue 40): a daemon that dies at start-up with ld.so's RT_CONSISTENT abort
    (exit 127; here a stand-in for the daemon binary, as the race cannot be produced at will) is started
    again, saying so, up to 3 starts; any other death is reported at once."""
    import ones_pipeline.cli.live as live

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 1}\n")
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "assets" / "jobs" / "a.yaml").write_text(
        "model: mlp-digits\nper_gpu_batch: 32\nstopping: {epochs: 1}\n")
    daemon = tmp_path / "fake-dagster-daemon"
    daemon.write_text("#!/bin/sh\necho 'Inconsistency detected by ld.so: dl-open.c: 581: dl_open_worker_begin: "
                      "Assertion `_dl_debug_update (args->nsid)->r_state == RT_CONSISTENT failed!'\nexit 127\n")
    daemon.chmod(0o755)
    monkeypatch.setattr(live, "dagster_bin", lambda name: str(daemon))
    assert main(["run", "--project", str(tmp_path), "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert "starting it again (2 of 3)" in err and "starting it again (3 of 3)" in err
    assert err.count("the Dagster daemon exited (127)") == 3
    daemon.write_text("#!/bin/sh\necho 'some other failure'\nexit 127\n")
    assert main(["run", "--project", str(tmp_path), "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert "starting it again" not in err and err.count("the Dagster daemon exited (127)") == 1


def test_dagster_started_by_a_supervisor_that_dies_mid_start_ends_without_a_traceback(tmp_path):
    """Issue 40 (chaos.py): a supervisor killed while the Dagster daemon it started was still importing left a
    KeyboardInterrupt traceback in daemon.log (the parent-death signal was SIGINT). It is SIGTERM now: a process
    still starting ends quietly, and Dagster's commands treat it as Ctrl-C once they run."""
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 1}\n")
    (tmp_path / ".ones" / "state").mkdir(parents=True)  # as `ones init` leaves it
    log = tmp_path / "daemon.log"
    # The stand-in for the daemon: Python busy at start-up (it would be importing Dagster), then waiting.
    child = "import time; print('starting', flush=True); time.sleep(120)"
    supervisor = ("import sys, time\n"
                  "from ones_pipeline.config import load_env\n"
                  "from ones_pipeline.cli.supervise import start_process\n"
                  f"proc = start_process([sys.executable, '-c', {child!r}], load_env({str(tmp_path)!r}), "
                  f"__import__('pathlib').Path({str(log)!r}))\n"
                  "print(proc.pid, flush=True)\n"
                  "time.sleep(120)\n")
    sup = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(sup.stdout.readline())
        deadline = time.monotonic() + 60
        while "starting" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the supervised process never started"
            time.sleep(0.1)
        sup.send_signal(signal.SIGKILL)  # kill -9 of `ones run`
        sup.wait(timeout=30)
        while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
            assert time.monotonic() < deadline, "the supervised process outlived its supervisor"
            time.sleep(0.1)
    finally:
        sup.kill()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
