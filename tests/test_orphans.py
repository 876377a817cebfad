"""A process of a run stops when the process that started it dies (found by ``benchmarks/chaos.py``: a
killed Dagster run worker left its step training beside the next generation of the same job).

Each test starts a short-lived middle process that starts the process under test and then exits, as a
killed run worker or step does; the orphan must notice and stop cleanly."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _orphan(tmp_path: Path, child_code: str, ready: Path) -> None:
    """Run ``child_code`` in a grandchild whose parent exits once ``ready`` exists."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(child_code))
    middle = tmp_path / "middle.py"
    # The child's imports (torch, Dagster) can take long on a loaded machine: the middle waits for ``ready``
    # long enough, since exiting before the child has looked at its parent would orphan it unobserved (a CI
    # run saw "not interrupted" so). It passes its PID on, so that the child can say who its parent was.
    middle.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        from pathlib import Path
        subprocess.Popen([sys.executable, {str(child)!r}], env={{**os.environ, "ONES_TEST_MIDDLE": str(os.getpid())}})
        deadline = time.monotonic() + 240
        while not Path({str(ready)!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    """))
    subprocess.run([sys.executable, str(middle)], cwd=ROOT, timeout=300, check=True)


def _wait_for(path: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} not written within {timeout_s:.0f} s")
        time.sleep(0.05)
    time.sleep(0.1)  # written in one call, but let it land
    return path.read_text()


def test_a_training_launcher_under_pipes_stops_its_ranks_when_its_step_dies(tmp_path):
    state = tmp_path / "state"
    rank = tmp_path / "rank.py"
    rank.write_text(textwrap.dedent("""
        import os, time
        from pathlib import Path
        stop, state = Path(os.environ["ONES_STOP_FILE"]), Path(os.environ["ONES_STATE_DIR"])
        (state / "rank.started").write_text("")
        deadline = time.monotonic() + 60
        while not stop.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (state / "rank.stopped").write_text("stop file" if stop.exists() else "timeout")
    """))
    _orphan(tmp_path, f"""
        import sys
        from pathlib import Path
        from ones_pipeline.core.types import JobSpec
        from ones_pipeline.scheduler import RunAllocation
        from ones_pipeline.train.launcher import LaunchRequest, launch
        spec = JobSpec(name="orphan", model="custom", dataset_size=10, per_gpu_batch=1, max_lr=1.0,
                       command=(sys.executable, {str(rank)!r}))
        state = Path({str(state)!r})
        request = LaunchRequest(RunAllocation.make(spec, (0,), "cpu", 1, 0), state, grace_period_s=20.0,
                                dagster_run_id="run-1")  # under Pipes: its parent is the run's step
        code = launch(request)
        (state / "launcher.exit").write_text(str(code))
    """, ready=state / "rank.started")
    assert _wait_for(state / "rank.stopped") == "stop file"
    assert _wait_for(state / "launcher.exit") == "0"


def test_a_training_step_interrupts_itself_when_its_run_worker_dies(tmp_path):
    pytest.importorskip("dagster")
    out = tmp_path / "out"
    _orphan(tmp_path, f"""
        import os, signal, time
        from pathlib import Path
        from ones_pipeline.defs.assets import _interrupt_when_orphaned
        out = Path({str(out)!r})
        # A step under Dagster has Dagster's SIGINT handler. Outside it, Python's default one, which Python
        # does not install when SIGINT was ignored at its start (tests run in the background by a shell):
        # install it, as Dagster installs its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with _interrupt_when_orphaned(poll_s=0.05):
                parent = os.getppid()
                (out.parent / "started").write_text("")
                time.sleep(60)
            middle = os.environ["ONES_TEST_MIDDLE"]
            out.write_text(f"not interrupted (parent at start {{parent}}, the middle {{middle}})")
        except KeyboardInterrupt:  # outside Dagster's handlers, its SIGINT is a KeyboardInterrupt
            out.write_text("interrupted")
    """, ready=tmp_path / "started")
    assert _wait_for(out, 90.0) == "interrupted"


def _project(tmp_path: Path):
    from ones_pipeline.config import load_env

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 1}\n")
    env = load_env(tmp_path)
    env.layout.root.mkdir(parents=True)
    return env


def _fake_daemon(lives_s: float) -> subprocess.Popen:
    """A process whose command line names dagster-daemon, returned once it does: between fork and exec (long
    on a loaded machine) the child still shows the parent's command line, and would not count as Dagster."""
    import psutil

    fake = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({lives_s})", "dagster-daemon"])
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            if "dagster-daemon" in psutil.Process(fake.pid).cmdline():
                return fake
        except psutil.Error:
            pass
        time.sleep(0.02)
    return fake


@pytest.mark.parametrize("daemon_exits", [True, False], ids=["stops", "stays"])
def test_dagster_whose_supervisor_died_is_waited_for_then_refused(tmp_path, daemon_exits):
    """`ones run` after a killed `ones run`: its Dagster got SIGINT and is stopping, so the new one waits
    for it rather than refusing at once; one that does not stop is refused, naming a stop that spares
    its runs (SIGINT to it alone, not to its process group)."""
    from ones_pipeline.cli.supervise import AlreadyRunning, refuse_if_running

    env = _project(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lives_s = 1.0 if daemon_exits else 60.0
    fake = _fake_daemon(lives_s)
    try:
        env.layout.pidfile.write_text(f"{fake.pid} {dead.pid}\n")
        if daemon_exits:
            threading.Thread(target=fake.wait, daemon=True).start()  # reaped as its parent would
            refuse_if_running(env, stopping_wait_s=20.0)
        else:
            with pytest.raises(AlreadyRunning, match=rf"kill -INT {fake.pid}:"):
                refuse_if_running(env, stopping_wait_s=1.0)
    finally:
        fake.kill()


def test_dagster_whose_supervisor_lives_is_refused_at_once(tmp_path):
    from ones_pipeline.cli.supervise import AlreadyRunning, refuse_if_running

    env = _project(tmp_path)
    fake = _fake_daemon(60.0)
    try:
        env.layout.pidfile.write_text(f"{fake.pid} {os.getpid()}\n")
        t0 = time.monotonic()
        with pytest.raises(AlreadyRunning, match="already running"):
            refuse_if_running(env, stopping_wait_s=20.0)
        assert time.monotonic() - t0 < 5
    finally:
        fake.kill()
