"""In-place resize, the ranks' side: a running group changes members at a step boundary without a restart.

The launcher's side and the protocol are in ``resize_control``. Here, for one ``api.TrainingSession``:

* ``init_group``: the process group of a placement. Where the launcher can resize in place
  (``Placement.resize_dir``), a group exists at every size, one process included, and the model is wrapped in
  DDP at every size, so that the object ``prepare()`` returned to the script stays the one it trains with
  after any change (the script needs no change: ``change`` re-initialises that same DDP object on the new
  group).
* ``next_plan``: rank 0, at a step boundary that does not end an epoch (the script's evaluation there may use
  collectives of the old group): the next plan's number when the launcher has written it. It reaches the
  other ranks in the all-reduce that ends every step, so all ranks change at the same boundary.
* ``change``: a member of the running group. Rank 0 writes a checkpoint (the fallback's starting point:
  nothing is lost beyond it); a barrier on the old group, then it is destroyed (before any re-init); leavers
  stop there; survivors form the new group on the plan's fresh port (its own TCPStore), and
  take the plan's batch and LR (a larger LR warms up as after any batch change). With newcomers, rank 0
  broadcasts optimizer, progress, batch tuner, noise-scale averages and RNG, and DDP's re-initialisation
  broadcasts the model's parameters and buffers.
* ``join``: a newcomer, in ``prepare`` after its warm-up (imports, data, model): it says it is ready, waits
  for the plan (or a stop request), joins the new group and receives that state.

The sampler counts samples (``sampler``): the data order and sample count stay exact over any sequence of
changes; each rank's share of a step follows from its new rank and the new world size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import threading
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ones_pipeline.train.checkpoint import capture_rng_state, restore_rng_state
from ones_pipeline.train.noise_probe import NoiseScaleProbe
from ones_pipeline.train.placement import Placement

# ``s`` below: an ``api.TrainingSession`` (typed Any: api imports this module).
TrainingSession = Any

log = logging.getLogger("ones_pipeline.train")
PLAN_POLL_S = 0.02
# Seconds a rank waits in a collective (and in a group's rendezvous) for its peers before failing (a peer was
# killed). A membership change is bounded by its launcher's ``resize_timeout_s`` instead: it kills the ranks.
COLLECTIVE_TIMEOUT_S = 120
ORPHAN_POLL_S = 0.5


@contextlib.contextmanager
def _exit_if_orphaned(s: TrainingSession):
    """While a rank is inside a membership change (a rendezvous, a barrier, the state broadcast) it cannot stop at
    a step boundary: if its launcher dies meanwhile, it exits at once, saying so, instead of waiting up to
    ``COLLECTIVE_TIMEOUT_S`` beside the job's next generation (benchmarks/chaos.py: a newcomer whose launcher was
    killed as it joined a grow waited about 60 s in the rendezvous). Nothing is lost beyond the checkpoint rank 0
    wrote as the change began."""
    launcher = s._launcher_pid
    if launcher is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(ORPHAN_POLL_S):
            if os.getppid() != launcher:
                log.error("job %s rank %d: its launcher is gone during an in-place change: exiting",
                          s.p.spec.name, s.p.rank)
                logging.shutdown()
                os._exit(1)

    threading.Thread(target=watch, name="ones-orphan-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def init_group(p: Placement, store_rank: int = 0) -> None:
    """The group of ``p``, its rendezvous a TCPStore on the placement's port hosted by rank ``store_rank``. A
    grow hosts it in a newcomer, which is waiting already, and the old members take the plan up only once it
    listens (``go-<k>``): a client that finds no store retries after a back-off, and with rank 0 as the host
    the newcomer's first attempts failed, which cost 0.4-0.75 s of most grows."""
    backend = "nccl" if p.device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if store_rank == 0:
        dist.init_process_group(backend, init_method=f"tcp://{p.master_addr}:{p.master_port}", rank=p.rank,
                                world_size=p.world_size, timeout=timeout)
        return
    store = dist.TCPStore(p.master_addr, p.master_port, p.world_size, is_master=p.rank == store_rank,
                          timeout=timeout, wait_for_workers=False)
    if p.rank == store_rank:  # listening: the old members may come
        (p.resize_dir / f"go-{p.membership}").touch()
    dist.init_process_group(backend, store=store, rank=p.rank, world_size=p.world_size, timeout=timeout)


def wants_group(p: Placement) -> bool:
    """Whether this process starts in a process group now (a newcomer joins one later, in ``join``)."""
    return (p.world_size > 1 or p.resize_dir is not None) and not p.joining


def next_plan(p: Placement) -> float:
    """The number of the launcher's next plan once it can be taken up (``go-<k>``: written with a shrink's plan,
    by a grow's store host once it listens), else 0 (rank 0 asks, once per step)."""
    k = p.membership + 1
    return float(k) if p.resize_dir is not None and (p.resize_dir / f"go-{k}").exists() else 0.0


def _plan(p: Placement, k: int) -> dict:
    return json.loads((p.resize_dir / f"plan-{k}.json").read_text())


def _placed(p: Placement, plan: dict, rank: int) -> Placement:
    return dataclasses.replace(p, rank=rank, world_size=int(plan["world_size"]), master_port=int(plan["port"]),
                               global_batch=int(plan["global_batch"]), lr=float(plan["lr"]),
                               membership=int(plan["id"]), joining=False)


def _has_newcomers(plan: dict) -> bool:
    return int(plan["world_size"]) > _survivors(plan)


def _survivors(plan: dict) -> int:
    return sum(r is not None for r in plan["ranks"].values())


def _store_rank(plan: dict) -> int:
    """Who hosts the new group's store: the first newcomer where there is one (``init_group``), else rank 0."""
    return _survivors(plan) if _has_newcomers(plan) else 0


def change(s: TrainingSession, k: int) -> None:
    """Leave, or re-form the group of plan ``k`` with new ranks (module docstring); all ranks call it at the
    same step boundary."""
    t0, old = time.perf_counter(), s.p.world_size
    plan = _plan(s.p, k)
    new_rank = plan["ranks"].get(str(s.p.rank))
    if s.is_main:
        s.save()  # the fallback's starting point, should the change fail
        (s.p.resize_dir / f"began-{k}").touch()
    with _exit_if_orphaned(s):
        dist.barrier()
        dist.destroy_process_group()
        if new_rank is None:
            log.info("left the group at %d samples (resize %d -> %d in place)", s.progress.samples_done, old,
                     plan["world_size"])
            s.stopped = s.left = True
            return
        s.p = _placed(s.p, plan, int(new_rank))
        init_group(s.p, _store_rank(plan))
        s._use_batch(s.p.global_batch, s.p.lr)
        s._set_lr()
        _exchange(s, plan)
        _rewrap(s)
    paused = time.perf_counter() - t0
    if s.is_main:
        kind = "grew" if s.p.world_size > old else "shrank" if s.p.world_size < old else "re-formed"
        log.info("%s %d -> %d processes in place at %d samples: %.2f s without training", kind, old,
                 s.p.world_size, s.progress.samples_done, paused)
        s._report({"event": "resized", "from": old, "to": s.p.world_size, "paused_s": round(paused, 3),
                   "samples": s.progress.samples_done, "global_batch": s.global_batch, "generation": s.p.generation,
                   "membership": k})
        (s.p.resize_dir / f"done-{k}").touch()
        if s._run is not None:  # the MLflow run says so beside its restarts (tag ``ones.restarts``)
            s._run.set_tags({"ones.last_resize": f"{kind} {old} -> {s.p.world_size} processes in place at "
                                                 f"{s.progress.samples_done} samples, {paused:.2f} s without training"})


def join(s: TrainingSession) -> bool:
    """A newcomer: ready, wait for plan ``membership``, join, receive the state. False: stopped before."""
    p = s.p
    (p.resize_dir / f"ready-{p.membership}-{p.rank}").touch()
    path = p.resize_dir / f"plan-{p.membership}.json"
    while not path.exists():
        if s._stop_wanted():
            s.stopped = True
            return False
        time.sleep(PLAN_POLL_S)
    plan = _plan(p, p.membership)
    s.p = _placed(p, plan, p.rank)
    with _exit_if_orphaned(s):
        init_group(s.p, _store_rank(plan))
        _exchange(s, plan)
    return True


def _exchange(s: TrainingSession, plan: dict) -> None:
    """Rank 0's optimizer, progress, batch tuner, noise-scale averages and RNG to every rank (only where the
    plan has newcomers: survivors hold them already)."""
    if not _has_newcomers(plan):
        return
    box: list[Any] = [None]
    if s.is_main:
        box[0] = {"optimizer": s._optimizer.state_dict(), "progress": asdict(s.progress), "rng": capture_rng_state(),
                  "noise_scale": s._gns.state_dict(), "batch_tuning": s._tuner.state_dict()}
    dist.broadcast_object_list(box, src=0, device=s.device if s.device.type == "cuda" else None)
    if not s.is_main:
        state = box[0]
        s._optimizer.load_state_dict(state["optimizer"])
        s.progress = type(s.progress)(**state["progress"])
        restore_rng_state(state["rng"])
        s._gns.load_state_dict(state["noise_scale"])
        s._tuner.load_state_dict(state["batch_tuning"])
        s.global_batch = s.progress.global_batch or s.p.global_batch
        s._last_ckpt = time.monotonic()


def _rewrap(s: TrainingSession) -> None:
    """The same DDP object on the new group (it broadcasts rank 0's parameters and buffers), the session's
    forward hook again, a noise-scale probe for the new ranks with the averages so far."""
    model: DistributedDataParallel = s._model
    DistributedDataParallel.__init__(model, model.module,
                                     device_ids=[s.device.index] if s.device.type == "cuda" else None)
    _hooks(s, model)
    state = s._gns.state_dict()
    s._gns.detach()
    s._gns = NoiseScaleProbe.for_placement(s.p, s.dataset_size)
    s._gns.load_state_dict(state)
    s._gns.attach(model)
    s._tuner.world_size = s.p.world_size
    s.clock.new_configuration()
    s._steps_since_start = 0


def wrap(s: TrainingSession, model: torch.nn.Module) -> torch.nn.Module:
    """The model the script trains: DDP on the session's group when there is one (every size where the
    launcher resizes in place), else the model itself."""
    if not dist.is_initialized():
        return model
    model = DistributedDataParallel(model, device_ids=[s.device.index] if s.device.type == "cuda" else None)
    _hooks(s, model)
    return model


def _hooks(s: TrainingSession, model: DistributedDataParallel) -> None:
    """The session's forward hook. One process: DDP synchronises nothing (as inside ``no_sync()``, whose exit
    restores this) and its own forward's bookkeeping is skipped (the wrapper calls the module's forward directly).
    A step of mlp-digits at one process took 0.41 ms through DDP, 0.355 ms so, 0.32 ms without DDP (cnn-digits,
    9 ms: the same within noise)."""
    model.register_forward_pre_hook(s._on_forward)
    model.require_backward_grad_sync = s.p.world_size > 1
    if s.p.world_size > 1:
        model.__dict__.pop("forward", None)
    else:
        model.forward = model.module.forward
