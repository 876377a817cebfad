"""Start one training process per assigned slot, forward stop requests, wait within the grace period.

The launcher is what the Dagster step (or a shell) runs, for one ``RunAllocation`` (whose batch, LR and
slots were validated when it was made): it checks the rest before any process starts (model, state
directory, MLflow URI), creates the MLflow store once (concurrent first-time creation races), then
starts ``world_size`` processes of the built-in trainer or of the job's own command with the
allocation in ``ONES_*`` variables, in their own process session (a terminal's Ctrl-C or Docker's
SIGTERM reaches the launcher only). On SIGTERM or SIGINT it creates the stop file every rank polls at
each step boundary (a file, not a signal, so a rank still importing torch cannot be killed by it); the
ranks agree, rank 0 checkpoints and ends the MLflow run as KILLED, and the launcher exits 0 once all
ranks have, at most ``grace_period_s`` later (then it kills what is left and exits 1). Ranks whose
launcher disappears (kill -9) stop the same way, and so does a launcher started by a Dagster step (under
Pipes) whose step process disappears: its run has ended, and the scheduler starts the next generation.
A planned preemption reaches the launcher as a file, not a signal: the scheduler's apply run writes
``preempt-g<generation>.json`` in the job's directory (``config.layout.preempt_request_file``), the
launcher stops its ranks as on SIGTERM and exits 0, and the Dagster step ends normally (no interrupt, no
red failure). Every Slurm task's launcher sees the same file on the shared filesystem; only rank 0's task
decides that a generation had not trained yet and kills its rank at once, and the other tasks follow its
"stopped" event. Rank 0 is the one whose exit counts: once it has ended cleanly, a peer that fails as the
group breaks up (a collective whose rank 0 left) does not fail the launcher.
A launcher that holds all its ranks (not a Slurm task) also changes them in place on request
(``resize-g<generation>.json``, ``resize_control.request_resize``): new ranks warm up while the old ones train,
the group re-forms at a step boundary, and a change that fails restarts the new slot set from the checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE, STEP_PID_ENV, ProgressTail, preempt_request_file
from ones_pipeline.core.types import JobSpec, batch_and_lr
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.train.placement import Placement, spec_to_json
from ones_pipeline.train.records import BAD_INPUT_EXIT, result_path
from ones_pipeline.train.resize_control import DEFAULT_RESIZE_TIMEOUT_S, Resizer, kill_all
from ones_pipeline.train.slurm_ranks import read_leader_exit
from ones_pipeline.train.state_dir import check_state_dir

log = logging.getLogger("ones_pipeline.train")


class LaunchError(ValueError):
    """Bad input detected before any training process started (the message says what and where)."""


@dataclass(frozen=True)
class LaunchRequest:
    """One allocation (validated when it was made) and where the step keeps its state and logs."""

    allocation: RunAllocation
    state_dir: Path
    tracking_uri: str | None = None
    experiment: str = "ones"
    grace_period_s: float = 20.0
    seed: int = 0
    in_container: bool = False  # GPUs renumbered from 0 inside a container: no CUDA_VISIBLE_DEVICES
    dagster_run_id: str | None = None  # under Dagster Pipes: the run, tagged on the job's MLflow run
    # One Slurm task: start only these ranks (default: all), meet the others at this address and port
    # (default: 127.0.0.1 and a free port), on this device (default: cuda with GPUs, else cpu); Slurm
    # has set CUDA_VISIBLE_DEVICES.
    ranks: tuple[int, ...] | None = None
    master_addr: str | None = None
    master_port: int | None = None
    device: str | None = None
    num_nodes: int = 1
    # A Slurm task of a rank other than 0: the file rank 0's task writes when it ends (its exit code). Once
    # it says 0, this rank has ``grace_period_s`` to exit, as peers of rank 0 have on one machine.
    leader_exit_file: Path | None = None
    resize_timeout_s: float = DEFAULT_RESIZE_TIMEOUT_S  # an in-place resize's warm-up, and its change, at most

    @property
    def resizes_in_place(self) -> bool:
        """One launcher holds every rank, each on its own device (not a Slurm task, not GPUs renumbered in a
        container, where a rank's device follows its rank): it can change its ranks in place."""
        return self.ranks is None and not (self.in_container and self.allocation.gpus)

    @property
    def spec(self) -> JobSpec:
        return self.allocation.spec

    @property
    def world_size(self) -> int:
        return self.allocation.world_size


def validate(req: LaunchRequest) -> None:
    """Check what the allocation record cannot: the model, the state directory, the MLflow store (created
    here, once, before the ranks start: concurrent first-time creation races; by the task of rank 0 only
    when the ranks are split over Slurm tasks). Raises LaunchError."""
    spec = req.spec
    if spec.command is None:
        from ones_pipeline.train.catalogue import WORKLOADS

        if spec.model not in WORKLOADS:
            raise LaunchError(f"job {spec.name}: unknown built-in model {spec.model!r}; allowed: "
                              f"{', '.join(WORKLOADS)} (or give the job a command)")
    try:
        check_state_dir(req.state_dir)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"job {spec.name}: state directory {req.state_dir}: {exc}") from exc
    if req.tracking_uri and (req.ranks is None or 0 in req.ranks):
        from ones_pipeline.adapters.mlflow import TrackerError, check_reachable, ensure_store

        try:
            check_reachable(req.tracking_uri)
            ensure_store(req.tracking_uri, req.experiment)
        except TrackerError as exc:
            raise LaunchError(f"job {spec.name}: MLflow: {exc}") from exc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_rank(req: LaunchRequest, stop_file: Path, resize_dir: Path | None, rank: int, world_size: int, slot: int,
                port: int, membership: int = 0, joining: bool = False, global_batch: int | None = None,
                lr: float | None = None) -> subprocess.Popen:
    """One rank's process, in its own session, with its placement in ``ONES_*`` variables; ``slot``: its GPU
    where the allocation has GPUs. The rest: an in-place resize's (``resize_control``)."""
    alloc = req.allocation
    command = list(req.spec.command) if req.spec.command else [sys.executable, "-m", "ones_pipeline.train.builtin"]
    if command[0] in ("python", "python3"):  # the launcher's own interpreter (and its packages)
        command[0] = sys.executable
    placement = Placement(
        spec=req.spec, rank=rank, world_size=world_size, global_batch=global_batch or alloc.global_batch,
        lr=alloc.lr if lr is None else lr, generation=alloc.generation, tune_batch=alloc.tune_batch,
        state_dir=Path(req.state_dir), tracking_uri=req.tracking_uri,
        experiment=req.experiment, master_addr=req.master_addr or "127.0.0.1", master_port=port,
        device=req.device or ("cuda" if alloc.gpus else "cpu"), gpus=alloc.gpus, seed=req.seed,
        stop_file=stop_file, launcher_pid=os.getpid(), dagster_run_id=req.dagster_run_id,
        num_nodes=req.num_nodes, resize_dir=resize_dir, membership=membership, joining=joining)
    env = dict(os.environ)
    env.update(placement.to_env(spec_to_json(req.spec)))
    if alloc.gpus and not req.in_container:
        env["CUDA_VISIBLE_DEVICES"] = str(slot)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen(command, env=env, start_new_session=True)


def _start_ranks(req: LaunchRequest, port: int, stop_file: Path, resize_dir: Path | None) -> list[subprocess.Popen]:
    """One process per slot of the allocation (of this Slurm task's ranks)."""
    alloc = req.allocation
    procs = [_start_rank(req, stop_file, resize_dir, rank, req.world_size, alloc.slot_ids[rank], port)
             for rank in (req.ranks if req.ranks is not None else range(req.world_size))]
    log.info("job %s generation %d: %d process(es), global batch %d, lr %.4g", req.spec.name, alloc.generation,
             req.world_size, alloc.global_batch, alloc.lr)
    return procs


def launch(req: LaunchRequest, on_event: Callable[[dict], None] | None = None) -> int:
    """Run the job's processes to completion or until stopped; return the exit code (0 = finished or
    cleanly stopped with a checkpoint). ``on_event``: called with each progress event rank 0 reports
    (``{"event": "epoch", ...}``, ``{"event": "mlflow_run", ...}``) while the job trains."""
    validate(req)
    port = req.master_port or _free_port()
    stop_file = Path(req.state_dir) / f".stop-{os.getpid()}-{port}"
    stop_file.unlink(missing_ok=True)
    tail = ProgressTail(Path(req.state_dir) / PROGRESS_FILE)
    # The step that started us, as it says (killed while we started up, it left getppid() naming the reaper).
    parent = int(os.environ.get(STEP_PID_ENV) or 0) or os.getppid()
    trained: list[bool] = []  # rank 0 has taken a training step in this generation (its "training" event)
    killed_clean: list[bool] = []  # stopped before any training step: killing the ranks lost nothing
    procs, resizer = _start_all(req, port, stop_file)
    deadline: list[float] = []

    def on_signal(signum, frame):
        if not deadline:
            if frame is not None:  # a real signal (the calls below log their own reason)
                log.info("job %s: stop requested (signal %d): checkpointing", req.spec.name, signum)
            deadline.append(time.monotonic() + req.grace_period_s)
            stop_file.touch()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    preempt = preempt_request_file(req.state_dir, req.allocation.generation)
    leader = req.ranks is None or 0 in req.ranks

    def relay(final: bool = False) -> None:
        for row in tail.rows():
            if row.get("generation") == req.allocation.generation:
                if row.get("event") == "training":
                    trained.append(True)
                elif (row.get("event") == "stopped" and row.get("before_training") and not leader
                      and not killed_clean and not final):
                    # Rank 0's task stopped its rank before it trained: no checkpoint will be agreed on,
                    # so this task's ranks are stopped now too (nothing of theirs is lost).
                    kill_all(procs)
                    killed_clean.append(True)
            if on_event is not None:
                on_event(row)
        if not final and not deadline and preempt.exists():
            log.info("job %s: the scheduler asks generation %d to stop (%s): checkpointing", req.spec.name,
                     req.allocation.generation, _preempt_reason(preempt))
            on_signal(signal.SIGTERM, None)
            if not trained and leader:  # only rank 0's task decides (see _stop_before_training)
                _stop_before_training(req, procs)
                killed_clean.append(True)

    try:
        # Under Pipes (a Dagster run id), the process that started us is the run's step.
        return _supervise(req, procs, deadline, on_signal, relay,
                          orphaned=lambda: req.dagster_run_id is not None and os.getppid() != parent,
                          killed_clean=killed_clean, resizer=resizer)
    finally:
        if resizer is not None:
            resizer.close()
        relay(final=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)


def _start_all(req: LaunchRequest, port: int, stop_file: Path) -> tuple[list[subprocess.Popen], Resizer | None]:
    """The ranks, and what makes this launcher's in-place resizes (``resize_control``) where it can."""
    if not req.resizes_in_place:
        return _start_ranks(req, port, stop_file, None), None
    resize_dir = Path(req.state_dir) / f".resize-{os.getpid()}-{port}"
    procs = _start_ranks(req, port, stop_file, resize_dir)

    def start(rank, world_size, slot, port, membership, joining, batch, lr):
        return _start_rank(req, stop_file, resize_dir, rank, world_size, slot, port, membership, joining, batch, lr)

    def rule(n: int) -> tuple[int, float]:
        return batch_and_lr(req.spec, n)

    return procs, Resizer(job=req.spec.name, job_dir=Path(req.state_dir), generation=req.allocation.generation,
                          device="gpu" if req.allocation.gpus else "cpu", slots=req.allocation.slot_ids, procs=procs,
                          resize_dir=resize_dir, stop_file=stop_file, start=start, batch_and_lr=rule,
                          free_port=_free_port,
                          timeout_s=req.resize_timeout_s)


def _stop_before_training(req: LaunchRequest, procs: list[subprocess.Popen]) -> None:
    """A planned stop that reaches the ranks before any of them took a training step (they are still
    importing torch, loading the checkpoint or meeting each other): no state has changed since the
    checkpoint on disk, so they are killed at once instead of being waited for (a start-up under load can
    outlast the grace period, and the kill would then read as a failure), and rank 0's launcher records
    the stop for the orchestrator. The launcher then exits 0: a clean stop. Only rank 0's task decides
    this (Slurm tasks read the progress file at their own moments: a task of another rank deciding alone
    could kill its rank while rank 0 agrees a checkpoint with it); the others follow its "stopped" event."""
    log.info("job %s: generation %d had not trained yet: stopping its processes now (nothing to checkpoint)",
             req.spec.name, req.allocation.generation)
    kill_all(procs)
    if req.ranks is None or 0 in req.ranks:
        with open(Path(req.state_dir) / PROGRESS_FILE, "a") as fh:
            fh.write(json.dumps({"event": "stopped", "before_training": True, "samples": None, "epoch": None,
                                 "generation": req.allocation.generation, "time_s": time.time()}) + "\n")


def _preempt_reason(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("reason") or "no reason given")
    except (OSError, ValueError, AttributeError):
        return "no reason given"


def _ranks(req: LaunchRequest, n: int | None = None) -> list[int]:
    """This launcher's ranks; ``n``: how many it runs now (an in-place resize changes it)."""
    return list(req.ranks) if req.ranks is not None else list(range(req.world_size if n is None else n))


def _leader_verdict(req: LaunchRequest, codes: Sequence[int | None], wait_s: float) -> bool:
    """Whether rank 0 ended cleanly: its exit code where this launcher ran it; else (a Slurm task of other
    ranks) what rank 0's task wrote in ``leader_exit_file``, waited for up to ``wait_s``: rank 0's task
    ends after its rank, and a peer of a rank that left fails at once."""
    ranks = _ranks(req, len(codes))
    if 0 in ranks:
        return codes[ranks.index(0)] == 0
    if req.leader_exit_file is None:
        return False
    deadline = time.monotonic() + wait_s
    while not (text := read_leader_exit(req.leader_exit_file)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return text == "0"


def _supervise(req: LaunchRequest, procs: list[subprocess.Popen], deadline: list[float], on_signal,
               relay: Callable[[], None], orphaned: Callable[[], bool] = lambda: False,
               killed_clean: Sequence[bool] = (), resizer: Resizer | None = None) -> int:
    """Poll the ranks until all exit: 0 when all did cleanly, or when rank 0 did (a peer failing as the
    group breaks up loses nothing: rank 0's checkpoint is final). A failed rank stops the others, and so
    does ``orphaned()`` turning true; ranks still running ``grace_period_s`` after the stop request, or
    after rank 0 ended cleanly, are killed."""
    lingering_since: float | None = None
    next_relay = 0.0
    while True:
        if time.monotonic() >= next_relay:
            relay()
            next_relay = time.monotonic() + 1.0
        if resizer is not None and not deadline:
            resizer.poll()  # may replace the ranks in ``procs`` (a change committed, or its fallback)
            if resizer.busy:  # it watches the ranks meanwhile: their exits are the change's
                if orphaned():
                    on_signal(signal.SIGTERM, None)
                time.sleep(0.05)
                continue
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            if all(c == 0 for c in codes) or killed_clean:
                return 0
            if _leader_verdict(req, codes, wait_s=req.grace_period_s):
                # Rank 0 ended cleanly: its checkpoint (or the job's result) and its MLflow run are final,
                # so a peer that failed as the group broke up (rank 0 gone from a collective) lost nothing.
                log.warning("job %s: rank(s) %s exited with %s after rank 0 ended cleanly: a failure while "
                            "the ranks broke up, not the job's", req.spec.name,
                            [r for r, c in zip(_ranks(req, len(codes)), codes, strict=True) if c],
                            sorted({c for c in codes if c}))
                return 0
            return _failed_exit(req, codes)
        if lingering_since is None and _leader_verdict(req, codes, wait_s=0.0):
            lingering_since = time.monotonic()
        if lingering_since is not None and time.monotonic() - lingering_since > req.grace_period_s:
            # Rank 0 ended cleanly (its checkpoint and MLflow run are final) but a peer has not
            # exited: it hangs in teardown. Do not let it hold the allocation.
            stuck = [r for r, c in enumerate(codes) if c is None]
            log.warning("job %s: rank(s) %s still running %.0f s after rank 0 exited cleanly: killing them",
                        req.spec.name, stuck, req.grace_period_s)
            kill_all([procs[r] for r in stuck])
            return 0
        failed = [c for c in codes if c not in (None, 0)]
        if failed and not deadline:
            if failed[0] != BAD_INPUT_EXIT or _rank0_code(req, codes) not in (None, BAD_INPUT_EXIT):
                # (else: ranks stopped on bad input, which rank 0 explains in one line)
                log.error("job %s: a training process exited with %s; stopping the others", req.spec.name, failed[0])
            on_signal(signal.SIGTERM, None)
        if not deadline and orphaned():
            log.warning("job %s: the Dagster step that started this launcher is gone: stopping with a checkpoint",
                        req.spec.name)
            on_signal(signal.SIGTERM, None)
        if deadline and time.monotonic() > deadline[0]:
            log.error("job %s: processes still running %.0f s after the stop request: killing them",
                      req.spec.name, req.grace_period_s)
            kill_all(procs)
            return _failed_exit(req, [p.poll() for p in procs])
        time.sleep(0.05)


def _rank0_code(req: LaunchRequest, codes: Sequence[int | None]) -> int | None:
    """Rank 0's exit code where this launcher runs it (None: still running, or not here)."""
    ranks = _ranks(req, len(codes))
    return codes[ranks.index(0)] if 0 in ranks else None


def _failed_exit(req: LaunchRequest, codes: Sequence[int | None]) -> int:
    """The exit code once the ranks have ended and not all cleanly: 2 when rank 0 stopped on bad input (it said why
    in one line, e.g. a checkpoint of another model); 0 when the job had finished (rank 0 wrote its result: model,
    MLflow run and result are final) before its ranks failed or were killed (e.g. rank 0 killed in its teardown),
    saying so; else 1."""
    if _rank0_code(req, codes) == BAD_INPUT_EXIT:
        return BAD_INPUT_EXIT
    if not result_path(req.state_dir).exists():
        return 1
    log.warning("job %s: rank(s) %s exited with %s after the job had finished (its result is written): the job is "
                "done, nothing was lost", req.spec.name, [r for r, c in zip(_ranks(req, len(codes)), codes, strict=True)
                                                          if c], sorted({c for c in codes if c}))
    return 0
