"""Start one training process per assigned slot, forward stop requests, wait within the grace period.

The launcher is what the Dagster step (or a shell) runs: it validates everything that can be wrong
before any process starts (model, batch bounds, state directory, MLflow URI), creates the MLflow store
once (concurrent first-time creation races), then starts ``world_size`` processes of the built-in
trainer or of the job's own command with the allocation in ``ONES_*`` variables, in their own process
session (a terminal's Ctrl-C or Docker's SIGTERM reaches the launcher only). On SIGTERM or SIGINT it
creates the stop file every rank polls at each step boundary (a file, not a signal, so a rank still
importing torch cannot be killed by it); the ranks agree, rank 0 checkpoints and ends the MLflow run
as KILLED, and the launcher exits 0 once all ranks have, at most ``grace_period_s`` later (then it
kills what is left and exits 1). Ranks whose launcher disappears (kill -9) stop the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.core.types import JobSpec, lr_for_batch
from ones_pipeline.train.api import Placement
from ones_pipeline.train.checkpoint import check_state_dir

log = logging.getLogger("ones_pipeline.train")


class LaunchError(ValueError):
    """Bad input detected before any training process started (the message says what and where)."""


@dataclass(frozen=True)
class LaunchRequest:
    spec: JobSpec
    state_dir: Path
    slots: int = 1  # CPU processes when no GPUs are given
    gpus: tuple[int, ...] = ()
    global_batch: int | None = None  # default: spec.per_gpu_batch x processes, capped (ONES's rule)
    lr: float | None = None  # default: linear scaling rule
    generation: int = 0
    tracking_uri: str | None = None
    experiment: str = "ones"
    grace_period_s: float = 20.0
    seed: int = 0
    in_container: bool = False  # GPUs renumbered from 0 inside a container: no CUDA_VISIBLE_DEVICES

    @property
    def world_size(self) -> int:
        return len(self.gpus) if self.gpus else self.slots


def validate(req: LaunchRequest) -> tuple[int, float]:
    """Check the request; return (global batch, lr). Raises LaunchError naming the bad field."""
    spec = req.spec
    if req.world_size < 1:
        raise LaunchError(f"job {spec.name}: slots must be >= 1, got {req.slots}")
    if spec.command is None:
        from ones_pipeline.train.catalogue import WORKLOADS

        if spec.model not in WORKLOADS:
            raise LaunchError(f"job {spec.name}: unknown built-in model {spec.model!r}; allowed: "
                              f"{', '.join(WORKLOADS)} (or give the job a command)")
    batch = req.global_batch if req.global_batch is not None else min(spec.per_gpu_batch * req.world_size,
                                                                      spec.global_batch_cap)
    if not 1 <= batch <= spec.global_batch_cap:
        raise LaunchError(f"job {spec.name}: global_batch {batch} outside 1..{spec.global_batch_cap} "
                          "(the cap from max_lr / base_lr or max_global_batch)")
    if spec.max_per_gpu_batch is not None and -(-batch // req.world_size) > spec.max_per_gpu_batch:
        raise LaunchError(f"job {spec.name}: global_batch {batch} over {req.world_size} processes is "
                          f"{-(-batch // req.world_size)} per process, above max_per_gpu_batch "
                          f"{spec.max_per_gpu_batch}")
    lr = req.lr if req.lr is not None else lr_for_batch(spec, batch)
    if not lr > 0:
        raise LaunchError(f"job {spec.name}: lr must be > 0, got {lr}")
    try:
        check_state_dir(req.state_dir)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"job {spec.name}: state directory {req.state_dir}: {exc}") from exc
    if req.tracking_uri:
        from ones_pipeline.adapters.mlflow_tracker import TrackerError, check_reachable, ensure_store

        try:
            check_reachable(req.tracking_uri)
            ensure_store(req.tracking_uri, req.experiment)
        except TrackerError as exc:
            raise LaunchError(f"job {spec.name}: MLflow: {exc}") from exc
    return batch, lr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(req: LaunchRequest) -> int:
    """Run the job's processes to completion or until stopped; return the exit code (0 = finished or
    cleanly stopped with a checkpoint)."""
    batch, lr = validate(req)
    port = _free_port()
    stop_file = Path(req.state_dir) / f".stop-{os.getpid()}-{port}"
    stop_file.unlink(missing_ok=True)
    command = list(req.spec.command) if req.spec.command else [sys.executable, "-m", "ones_pipeline.train.builtin"]
    if command[0] in ("python", "python3"):  # the launcher's own interpreter (and its packages)
        command[0] = sys.executable
    procs: list[subprocess.Popen] = []
    for rank in range(req.world_size):
        placement = Placement(
            spec=req.spec, rank=rank, world_size=req.world_size, global_batch=batch, lr=lr,
            generation=req.generation, state_dir=Path(req.state_dir), tracking_uri=req.tracking_uri,
            experiment=req.experiment, master_port=port, device="cuda" if req.gpus else "cpu",
            gpus=req.gpus, seed=req.seed)
        env = dict(os.environ)
        env.update(placement.to_env())
        env["ONES_STOP_FILE"] = str(stop_file)
        env["ONES_LAUNCHER_PID"] = str(os.getpid())
        if req.gpus and not req.in_container:
            env["CUDA_VISIBLE_DEVICES"] = str(req.gpus[rank])
        env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen(command, env=env, start_new_session=True))
    log.info("job %s generation %d: %d process(es), global batch %d, lr %.4g", req.spec.name, req.generation,
             req.world_size, batch, lr)

    deadline: list[float] = []

    def on_signal(signum, frame):
        if not deadline:
            log.info("job %s: stop requested (signal %d): checkpointing", req.spec.name, signum)
            deadline.append(time.monotonic() + req.grace_period_s)
            stop_file.touch()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    lingering_since: float | None = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if codes[0] == 0 and lingering_since is None:
                lingering_since = time.monotonic()
            if lingering_since is not None and time.monotonic() - lingering_since > req.grace_period_s:
                # Rank 0 ended cleanly (its checkpoint and MLflow run are final) but a peer has not
                # exited: it hangs in teardown. Do not let it hold the allocation.
                stuck = [r for r, c in enumerate(codes) if c is None]
                log.warning("job %s: rank(s) %s still running %.0f s after rank 0 exited cleanly: killing them",
                            req.spec.name, stuck, req.grace_period_s)
                for r in stuck:
                    procs[r].kill()
                    procs[r].wait()
                return 0
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                log.error("job %s: a training process exited with %s; stopping the others", req.spec.name, failed[0])
                on_signal(signal.SIGTERM, None)
            if deadline and time.monotonic() > deadline[0]:
                log.error("job %s: processes still running %.0f s after the stop request: killing them",
                          req.spec.name, req.grace_period_s)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                return 1
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)
    codes = [p.returncode for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


def run_training(spec: JobSpec, state_dir: str | os.PathLike, *, slots: int = 1, gpus: Sequence[int] = (),
                 global_batch: int | None = None, lr: float | None = None, generation: int = 0,
                 tracking_uri: str | None = None, experiment: str = "ones", grace_period_s: float = 20.0,
                 seed: int = 0) -> int:
    """The function launchers call: train ``spec`` on the given allocation until done or stopped."""
    return launch(LaunchRequest(spec=spec, state_dir=Path(state_dir), slots=slots, gpus=tuple(gpus),
                                global_batch=global_batch, lr=lr, generation=generation,
                                tracking_uri=tracking_uri, experiment=experiment,
                                grace_period_s=grace_period_s, seed=seed))
