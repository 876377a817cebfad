"""Process supervision for ``ones up`` / ``ones run``: start the Dagster daemon (or ``dagster dev``) in its
own process group, remember its PID in the state directory, stop it and everything under it. On Linux it
also gets SIGTERM when the ``ones`` process that started it dies, however that died (kill -9 included)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ones_pipeline.config import EnvConfig


class AlreadyRunning(RuntimeError):
    pass


def child_env(env: EnvConfig) -> dict:
    """The environment of the Dagster processes: where the instance is and which project/env to load."""
    out = dict(os.environ)
    out.update({"DAGSTER_HOME": str(env.layout.dagster_home), "ONES_PROJECT_DIR": str(env.project_dir),
                "ONES_ENV": env.name})
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl():
    """libc's ``prctl``, resolved here in the parent: the child must not ``dlopen`` anything (below)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


def _child_setup(parent: int, prctl) -> None:
    """In the child, before exec: default SIGINT/SIGTERM (a background start may have them ignored), and
    SIGTERM when ``parent`` (this ``ones`` process) dies. Dagster's commands map SIGTERM to SIGINT once they
    run (``setup_interrupt_handlers``), so Dagster then stops as on Ctrl-C; before that, still importing, the
    process ends quietly (SIGINT there printed a KeyboardInterrupt traceback into daemon.log: chaos.py's
    supervisor kills, issue 40). Its runs go on until the next ``ones run`` adopts them, rather than Dagster
    scheduling on unsupervised, which refuses the next ``ones run`` (and stopping it with the whole process
    group fails the runs it is executing).

    Nothing here loads a shared library: this runs between fork and exec, and when another thread of the
    parent was inside ``dlopen`` at the fork (an extension module imported by a Dagster or MLflow thread),
    the child's loader state is half-updated and a ``dlopen`` here (it was ``import ctypes`` /
    ``ctypes.CDLL``) aborts with ld.so's ``dl_open_worker_begin: Assertion ... r_state == RT_CONSISTENT``,
    exit 127: the daemon "died at start-up" in about one ``ones run`` in four (issue 40)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


LDSO_RACE = b"Inconsistency detected by ld.so"
LDSO_EXIT = 127


def died_of_the_loader_race(proc: subprocess.Popen, log_path: Path, offset: int) -> bool:
    """The process ended with ld.so's start-up abort (exit 127, the loader's message in its log after
    ``offset``): what a start should retry rather than report."""
    if proc.poll() != LDSO_EXIT:
        return False
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            return LDSO_RACE in fh.read(1 << 16)
    except OSError:
        return False


def running_dagster(env: EnvConfig) -> int | None:
    """PID of a Dagster daemon/dev process this project started and that still runs, else None."""
    try:
        pid = int(env.layout.pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        import psutil

        proc = psutil.Process(pid)
        return pid if proc.is_running() and "dagster" in " ".join(proc.cmdline()) else None
    except Exception:  # gone, or psutil missing: not running
        return None


def _supervisor_gone(env: EnvConfig) -> bool:
    """The ``ones`` process that started the recorded Dagster process (the pidfile's second PID) has died."""
    try:
        supervisor = int(env.layout.pidfile.read_text().split()[1])
    except (OSError, ValueError, IndexError):  # written by an older version: unknown
        return False
    try:
        import psutil

        return psutil.Process(supervisor).status() == psutil.STATUS_ZOMBIE
    except ImportError:
        return False
    except Exception:  # no such process
        return True


def refuse_if_running(env: EnvConfig, stopping_wait_s: float = 30.0) -> None:
    pid = running_dagster(env)
    if pid is not None and _supervisor_gone(env):
        # Its `ones` died, so it got SIGTERM (_child_setup) and is stopping: give it the time to.
        deadline = time.monotonic() + stopping_wait_s
        while (pid := running_dagster(env)) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
    if pid is not None:
        raise AlreadyRunning(f"Dagster is already running for this project (PID {pid}, {env.layout.pidfile}); "
                             f"stop it first (Ctrl-C in its terminal, or kill -INT {pid}: its runs go on and "
                             "the next `ones run` adopts them)")


def start_process(argv: list[str], env: EnvConfig, log_path: Path | None = None) -> subprocess.Popen:
    refuse_if_running(env)
    # The child keeps writing to it after this function returns: no context manager.
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115
    proc = subprocess.Popen(argv, env=child_env(env), cwd=str(env.project_dir), start_new_session=True,
                            preexec_fn=functools.partial(_child_setup, os.getpid(), _prctl()), stdout=out,
                            stderr=subprocess.STDOUT if out else None)
    env.layout.pidfile.write_text(f"{proc.pid} {os.getpid()}\n")  # Dagster's PID, then its supervisor's
    return proc


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing or the process is gone
        return []


def stop_process(proc: subprocess.Popen, timeout_s: float = 45.0) -> None:
    """SIGINT to the process group (the daemon, its code server, the run workers and their training
    steps, which checkpoint), wait up to ``timeout_s`` for all of them, then kill what is left."""
    if proc.poll() is not None:
        return
    children = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        import psutil

        alive = [psutil.Process(pid) for pid in children if psutil.pid_exists(pid)]
        _, alive = psutil.wait_procs(alive, timeout=max(deadline - time.monotonic(), 1.0))
        children = [p.pid for p in alive]
    except Exception:  # psutil missing or processes gone
        pass
    for pid in children:  # whatever outlived the grace period (e.g. a code server)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def process_cmdlines() -> str:
    """Every process's command line, joined (what `ones init` checks run ids against); "" without psutil."""
    try:
        import psutil

        return " ".join(" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    except Exception:  # without psutil, assume the run workers are gone
        return ""


def dagster_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def wait_foreground(proc: subprocess.Popen, on_stop) -> int:
    """Wait for ``proc`` or Ctrl-C/SIGTERM; on a signal call ``on_stop()`` (drain) and stop the process."""
    stop: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while proc.poll() is None and not stop:
            time.sleep(0.2)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc.poll() is None:
            print("stopping Dagster: cancelling the running steps (they checkpoint) ...", file=sys.stderr, flush=True)
            try:
                on_stop()
            except Exception as exc:  # stop anyway
                print(f"could not drain the runs: {exc}", file=sys.stderr)
            stop_process(proc)
    return 0 if stop else (proc.returncode or 0)
