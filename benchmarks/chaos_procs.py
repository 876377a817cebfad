"""What ``benchmarks/chaos.py`` kills and watches: the processes of one live project, by role, and its
job directories (inotify), where it records every completed checkpoint and catches rank 0 writing one.

A process belongs to the project when its environment names it (``DAGSTER_HOME``, ``ONES_PROJECT_DIR``
or ``ONES_STATE_DIR`` under the project directory): the supervisor gets it from the benchmark, the
Dagster processes from ``ones run``, the training launcher and its ranks inherit it. Roles come from
the command line and the parent: ``dagster-daemon run`` (daemon), ``dagster api grpc`` (code server), a
``multiprocessing.spawn`` child of a code server (run worker) or of a run worker (step worker),
``-m ones_pipeline.train`` (training launcher), ``-m ones_pipeline.train.builtin`` (rank; its job, rank and
generation from its ``ONES_*`` variables).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import select
import signal
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

LATEST = "checkpoint-latest.pt"
TMP_PREFIX, TMP_SUFFIX = ".checkpoint-", ".pt.tmp"  # train/checkpoint.py: a write in progress
IN_MOVED_TO, IN_CREATE = 0x080, 0x100
ENV_KEYS = ("DAGSTER_HOME", "ONES_PROJECT_DIR", "ONES_STATE_DIR")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    role: str  # supervisor | daemon | code-server | run-worker | step-worker | launcher | rank | other
    cmdline: str
    job: str = ""  # ranks only
    rank: int = -1
    generation: int = -1
    started_s: float = 0.0  # process creation, Unix seconds
    launcher: int = 0  # ranks only: their launcher's PID
    joining: bool = False  # ranks only: started to join a running group (an in-place grow's newcomer)

    def describe(self) -> str:
        if self.role == "rank":
            return f"{self.job} generation {self.generation} rank {self.rank}"
        return self.cmdline[:90]


def _base_role(cmd: list[str]) -> str:
    text = " ".join(cmd)
    if cmd[-2:] == ["-m", "ones_pipeline.train.builtin"]:
        return "rank"
    if cmd[-2:] == ["-m", "ones_pipeline.train"]:
        return "launcher"
    if "dagster-daemon" in text and " run" in text:
        return "daemon"
    if "dagster api grpc" in text:
        return "code-server"
    if "multiprocessing.spawn" in text:
        return "spawn"
    if len(cmd) > 2 and Path(cmd[1]).name == "ones" and cmd[2] == "run":
        return "supervisor"
    return "other"


def project_processes(project: Path) -> list[Proc]:
    """Every live process of the project (zombies left out), with its role."""
    marker = str(project)
    raw: dict[int, tuple[int, list[str], Mapping[str, str]]] = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline", "environ", "status", "create_time"]):
        info = p.info
        env = info.get("environ") or {}
        if info.get("status") == psutil.STATUS_ZOMBIE or not any(marker in env.get(k, "") for k in ENV_KEYS):
            continue
        raw[info["pid"]] = (info["ppid"], list(info.get("cmdline") or []), env, info.get("create_time") or 0.0)
    base = {pid: _base_role(cmd) if cmd else "other" for pid, (_, cmd, _, _) in raw.items()}
    out = []
    for pid, (ppid, cmd, env, started) in raw.items():
        role = base[pid]
        if role == "spawn":  # a run worker is the code server's child, a step worker the run worker's
            parent = base.get(ppid)
            role = "run-worker" if parent == "code-server" else "step-worker" if parent == "spawn" else "other"
        job = Path(env.get("ONES_STATE_DIR", "")).name if role == "rank" else ""
        out.append(Proc(pid, ppid, role, " ".join(cmd), job, int(env.get("ONES_RANK", -1) or -1),
                        int(env.get("ONES_GENERATION", -1) or -1), started, int(env.get("ONES_LAUNCHER_PID") or 0),
                        env.get("ONES_JOINING") == "1"))
    return sorted(out, key=lambda p: p.pid)


def run_id_of_worker(worker: int, procs: list[Proc]) -> str:
    """The Dagster run a run worker executes, read from its step's compute-log tail command line (a child
    of the run worker, which runs its one step itself; or of a step worker under a multiprocess executor)."""
    near = {worker} | {p.pid for p in procs if p.ppid == worker}
    for p in procs:
        if p.ppid in near and "/storage/" in p.cmdline and "/compute_logs/" in p.cmdline:
            return p.cmdline.split("/storage/", 1)[1].split("/", 1)[0]
    return ""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _freeze(pid: int, timeout_s: float = 0.2) -> bool:
    """SIGSTOP ``pid`` and wait until it has stopped (a signal is delivered asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _state(pid) in ("T", "t"):
            return True
        time.sleep(0.0002)
    return False


@dataclass(frozen=True)
class MidWriteKill:
    job: str
    pid: int
    time_s: float
    tmp: str
    between_renames: bool  # the old latest already moved to prev, the new one not yet in place


class CheckpointWatcher(threading.Thread):
    """inotify on every job directory. Records each completed checkpoint (``records[job]``: (time s,
    samples) in the order seen) and, while ``armed`` is set, kill -9s rank 0 of a job the moment it is
    writing a checkpoint: a ``.checkpoint-*.pt.tmp`` appears, rank 0 is frozen (SIGSTOP), and killed
    only if the temporary file is still there, i.e. the write has not completed; otherwise it is let go
    (SIGCONT) and the next write is tried. Each kill is put on ``kills``."""

    def __init__(self, jobs_dir: Path, jobs: list[str], rank0: Callable[[str], int | None]):
        super().__init__(name="checkpoint-watcher", daemon=True)
        self.jobs_dir, self.jobs, self.rank0 = jobs_dir, jobs, rank0
        self.records: dict[str, list[tuple[float, int]]] = {j: [] for j in jobs}
        self.armed = threading.Event()
        self.kills: queue.Queue[MidWriteKill] = queue.Queue()
        self.misses = 0  # armed attempts that found the write already complete
        self._stop = threading.Event()
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, str] = {}
        for job in jobs:
            path = jobs_dir / job
            path.mkdir(parents=True, exist_ok=True)
            wd = libc.inotify_add_watch(self._fd, str(path).encode(), IN_CREATE | IN_MOVED_TO)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self._dirs[wd] = job

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        import torch  # here, not at import: only the watcher reads checkpoints

        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + length].rstrip(b"\0").decode()
                offset += 16 + length
                job = self._dirs.get(wd)
                if job is None:
                    continue
                if mask & IN_CREATE and name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX):
                    if self.armed.is_set():
                        self._try_kill(job, self.jobs_dir / job / name)
                elif mask & IN_MOVED_TO and name == LATEST:
                    self._record(torch, job)
        os.close(self._fd)

    def _record(self, torch, job: str) -> None:
        try:
            state = torch.load(self.jobs_dir / job / LATEST, map_location="cpu", weights_only=True)
            self.records[job].append((time.time(), int(state["progress"]["samples_done"])))
        except Exception:  # replaced again while we read it: the next event records the newer one
            pass

    def _try_kill(self, job: str, tmp: Path) -> None:
        pid = self.rank0(job)
        if pid is None:
            return
        try:
            frozen = _freeze(pid)
        except (ProcessLookupError, FileNotFoundError):
            return
        try:
            env = psutil.Process(pid).environ()
            mine = Path(env.get("ONES_STATE_DIR", "")).name == job and env.get("ONES_RANK") == "0"
            if frozen and mine and tmp.exists():
                between = not (tmp.parent / LATEST).exists()
                os.kill(pid, signal.SIGKILL)
                self.armed.clear()
                self.kills.put(MidWriteKill(job, pid, time.time(), tmp.name, between))
                return
            self.misses += 1
        except (psutil.Error, OSError):  # gone meanwhile; or not ours after all: let it go on
            pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
