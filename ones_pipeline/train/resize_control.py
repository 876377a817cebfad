"""In-place resize of a running generation: the request, and the launcher's side of the change (torch-free).

A control plane (or a shell, or a test) asks a running launcher for another slot set with
``request_resize(job_dir, generation, slots)``: a file, ``resize-g<generation>.json`` in the job's directory,
beside the scheduler's preemption request (``config.layout.preempt_request_file``), written atomically and
polled by the launcher every 50 ms. The launcher of that generation then changes its ranks without stopping
them (``Resizer``), as the ONES prototype does (Bian et al., SC'21):

1. **Warm-up.** Slots the job did not hold get new rank processes, started with ``ONES_JOINING``: they import
   torch, load their data and build the model while the old members keep training, then each writes
   ``ready-<k>-<rank>`` in the launcher's resize directory (``k``: the membership change, counted from 1).
2. **Plan.** Once all are ready, the launcher writes ``plan-<k>.json``: the new world size, a fresh port
   (a fresh TCPStore per membership: a store is never reused across groups), the new rank of every old member
   (``null``: it leaves), the global batch and LR (the request's, else the core rule's, ``batch_and_lr``). The
   old members take it up on ``go-<k>``: written with a shrink's plan, and by the newcomer that hosts a grow's
   store once it listens (``membership.init_group``).
3. **Change** (``train.membership``, in the ranks). Rank 0 sees the plan at a step boundary that does not end
   an epoch and the ranks agree on it in the all-reduce that ends every step. Rank 0 writes a checkpoint; the
   old group meets in a barrier and is destroyed; leavers exit 0; survivors and newcomers form the new group;
   rank 0 broadcasts optimizer, progress (sampler position, sample count,
   LR warm-up), batch tuner, noise-scale averages and RNG; DDP, re-initialised on the new group, broadcasts
   the model. The new rank 0 writes ``done-<k>`` and a ``resized`` progress event, and training goes on.
4. **Fallback.** A member that dies or a change that outlasts ``resize_timeout_s`` (warm-up included): the
   launcher starts the new slot set from a checkpoint and writes a ``resize_fallback`` progress event saying
   why. Before the members paused they are healthy: they stop with a checkpoint through the launcher's stop
   file, as on a preemption. After (rank 0 has written ``began-<k>`` with its checkpoint at the change's step
   boundary), they are killed and that checkpoint is the one the new ranks start from. Nothing is lost.

Slots are interchangeable CPU processes: on CPU the first ranks survive a shrink whichever slot ids the
request names (rank 0, which holds the MLflow run, always survives). A GPU rank is bound to its GPU: only
the members whose GPU stays survive, and a change that would drop rank 0's GPU, or keep no member, is not
made in place (``in_place_reason`` says why; the launcher logs it and leaves the generation as it is: the
control plane's checkpoint path, preempt and relaunch, applies).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE

log = logging.getLogger("ones_pipeline.train")

RESIZE_FILE = "resize-g{generation}.json"
DEFAULT_RESIZE_TIMEOUT_S = 60.0


def resize_request_file(job_dir: Path | str, generation: int) -> Path:
    """Where a control plane asks ``generation`` of the job in ``job_dir`` for another slot set."""
    return Path(job_dir) / RESIZE_FILE.format(generation=int(generation))


def request_resize(job_dir: Path | str, generation: int, slots: Sequence[int], *, global_batch: int | None = None,
                   lr: float | None = None, reason: str = "", run_id: str | None = None,
                   decided_s: float | None = None) -> str:
    """Ask the running launcher of ``generation`` to train on ``slots`` (their ids, one rank each) in place;
    return the request's id. ``global_batch``/``lr``: default the core rule for the new count. A later request
    replaces one not yet carried out. The launcher's log and the job's ``progress.jsonl`` say what happened.
    ``run_id``: the Dagster run of the generation; the file is then also that run's record of its allocation
    (``read_resize_request``, ``scheduler.runs.RunInfo.from_run``), kept after the change. ``decided_s``: when the
    scheduler decided it (its tick's clock), from which the change's delay to its effect is measured."""
    slots = [int(s) for s in slots]
    if not slots or len(set(slots)) != len(slots) or min(slots) < 0:
        raise ValueError(f"slots must be distinct ids >= 0, at least one; got {slots}")
    if global_batch is not None and int(global_batch) < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    rid = f"{time.time_ns():x}-{os.getpid()}"
    path = resize_request_file(job_dir, generation)
    tmp = path.with_name(f".{path.name}.{rid}.tmp")
    tmp.write_text(json.dumps({"id": rid, "slots": slots, "global_batch": global_batch, "lr": lr, "reason": reason,
                               "time_s": time.time(), **({"run_id": run_id} if run_id else {}),
                               **({"decided_s": float(decided_s)} if decided_s else {})}))
    os.replace(tmp, path)
    return rid


def read_resize_request(job_dir: Path | str, generation: int) -> dict | None:
    """The newest in-place change asked of ``generation`` (``request_resize``'s fields), or None (none asked,
    or an unreadable file: written atomically, a file is whole or absent)."""
    return _read_json(resize_request_file(job_dir, generation))


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def in_place_reason(device: str, old_slots: Sequence[int], new_slots: Sequence[int]) -> str | None:
    """Why the change from ``old_slots`` (in rank order) to ``new_slots`` cannot be made in place; None: it can."""
    if device == "cpu":
        return None
    if old_slots[0] not in new_slots:
        return f"rank 0's GPU {old_slots[0]} is not in the new set {list(new_slots)}"
    return None


@dataclass
class Member:
    slot: int
    proc: subprocess.Popen


# start(rank, world_size, slot, port, membership, joining, global_batch, lr) -> a rank process
StartRank = Callable[[int, int, int, int, int, bool, int, float], subprocess.Popen]


class Resizer:
    """The launcher's side of in-place changes. ``procs`` is the list the launcher supervises (rank order);
    the resizer replaces its contents when a change commits or falls back. ``poll()`` each supervision tick."""

    def __init__(self, *, job: str, job_dir: Path, generation: int, device: str, slots: Sequence[int],
                 procs: list[subprocess.Popen], resize_dir: Path, stop_file: Path, start: StartRank,
                 batch_and_lr: Callable[[int], tuple[int, float]], free_port: Callable[[], int], timeout_s: float):
        self.job, self.job_dir, self.generation, self.device = job, Path(job_dir), generation, device
        self.members = [Member(s, p) for s, p in zip(slots, procs, strict=True)]
        self.procs, self.dir, self.stop_file, self.start = procs, resize_dir, stop_file, start
        self.batch_and_lr, self.free_port, self.timeout_s = batch_and_lr, free_port, timeout_s
        self.dir.mkdir(parents=True, exist_ok=True)
        self.request_file = resize_request_file(job_dir, generation)
        self.membership = 0  # changes committed or attempted
        self._seen: str | None = None  # the last request id taken up
        self._change: dict | None = None  # the change in progress
        self._leavers: list[tuple[subprocess.Popen, float]] = []

    @property
    def busy(self) -> bool:
        """A change is under way: the resizer, not the launcher, watches the ranks (their exits are its)."""
        return self._change is not None

    def poll(self) -> None:
        self._reap_leavers()
        if self._change is None:
            self._take_request()
        elif "stopping" in self._change:
            self._check_stopping()
        elif "plan" not in self._change:
            self._check_warmup()
        else:
            self._check_change()

    def close(self) -> None:
        """Kill what only the resizer knows of (newcomers warming up, leavers not gone yet); remove its directory."""
        self._abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _abandon(self) -> None:
        extra = list(self._change.get("newcomers", [])) if self._change else []
        for p in [*extra, *(p for p, _ in self._leavers)]:
            if p.poll() is None:
                p.kill()
                p.wait()
        self._change, self._leavers = None, []

    # -- stages -------------------------------------------------------------------------------------
    def _take_request(self) -> None:
        req = _read_json(self.request_file) if self.request_file.exists() else None
        if req is None or req.get("id") == self._seen:
            return
        self._seen = req.get("id")
        try:
            new_slots = [int(s) for s in req["slots"]]
        except (KeyError, TypeError, ValueError):
            log.error("job %s: resize request %s: field 'slots' must be a list of slot ids", self.job,
                      self.request_file)
            return
        old_slots = [m.slot for m in self.members]
        batch, lr = self.batch_and_lr(len(new_slots))
        batch, lr = int(req.get("global_batch") or batch), float(req.get("lr") or lr)
        why = in_place_reason(self.device, old_slots, new_slots)
        if why is not None:  # the control plane's checkpoint path (preempt, relaunch) applies
            log.warning("job %s: resize %d -> %d slots cannot be made in place (%s): not carried out; stop the "
                        "generation with a checkpoint and start the new slot set instead", self.job, len(old_slots),
                        len(new_slots), why)
            return
        if self.device == "cpu":  # interchangeable: the first ranks stay, relabelled with the slots kept
            keep = list(range(min(len(old_slots), len(new_slots))))
        else:
            keep = [r for r, s in enumerate(old_slots) if s in new_slots]
        kept_slots = [old_slots[r] for r in keep] if self.device != "cpu" else new_slots[:len(keep)]
        joining = [s for s in new_slots if s not in kept_slots]
        self.membership += 1
        k, t0, port = self.membership, time.monotonic(), self.free_port()
        new_ranks = {str(r): i for i, r in enumerate(keep)}
        newcomers = [self.start(len(keep) + i, len(new_slots), s, port, k, True, batch, lr)
                     for i, s in enumerate(joining)]
        self._change = {"k": k, "t0": t0, "slots": kept_slots + joining, "batch": batch, "lr": lr, "port": port,
                        "ranks": new_ranks, "newcomers": newcomers, "keep": keep, "old": len(old_slots),
                        "requested_s": req.get("time_s")}
        log.info("job %s: resize %d -> %d slots in place (change %d): %s", self.job, len(old_slots), len(new_slots),
                 k, f"{len(newcomers)} new process(es) warming up" if newcomers else "pausing the members")

    def _check_warmup(self) -> None:
        ch = self._change
        if self._ended():
            return
        dead = [p.returncode for p in ch["newcomers"] if p.poll() is not None]
        if dead:
            return self._fall_back(f"a new process exited with {dead[0]} while warming up")
        crashed = [m.proc.returncode for m in self.members if m.proc.poll() not in (None, 0)]
        if crashed:
            return self._fall_back(f"a member exited with {crashed[0]} while the new processes warmed up")
        if time.monotonic() - ch["t0"] > self.timeout_s:
            return self._fall_back(f"new processes not ready within {self.timeout_s:.0f} s")
        ready = all((self.dir / f"ready-{ch['k']}-{len(ch['keep']) + i}").exists() for i in range(len(ch["newcomers"])))
        if ready:
            ch["plan"] = {"id": ch["k"], "world_size": len(ch["slots"]), "port": ch["port"], "ranks": ch["ranks"],
                          "global_batch": ch["batch"], "lr": ch["lr"]}
            tmp = self.dir / f".plan-{ch['k']}.tmp"
            tmp.write_text(json.dumps(ch["plan"]))
            os.replace(tmp, self.dir / f"plan-{ch['k']}.json")
            if not ch["newcomers"]:  # a grow's: its store's host, a newcomer, says go once it listens
                (self.dir / f"go-{ch['k']}").touch()
            ch["t_plan"] = time.monotonic()

    def _check_change(self) -> None:
        ch = self._change
        members = [self.members[r].proc for r in ch["keep"]] + list(ch["newcomers"])
        leaving = [m.proc for r, m in enumerate(self.members) if r not in ch["keep"]]
        failed = [p.returncode for p in members if p.poll() is not None] + \
                 [p.returncode for p in leaving if p.poll() not in (None, 0)]
        done = (self.dir / f"done-{ch['k']}").exists()
        if not done and self._ended():
            return
        if failed and not done:
            return self._fall_back(f"a member exited with {failed[0]} during the change")
        if not done:
            if time.monotonic() - ch["t_plan"] > self.timeout_s:
                self._fall_back(f"the change did not complete within {self.timeout_s:.0f} s")
            return
        took = time.monotonic() - ch["t0"]
        self._leavers += [(p, time.monotonic()) for p in leaving]
        self.members = [Member(s, p) for s, p in zip(ch["slots"], members, strict=True)]
        self.procs[:] = members
        log.info("job %s: %s %d -> %d slots in place in %.1f s (request to re-formed group)", self.job,
                 "grew" if len(members) > ch["old"] else "shrank", ch["old"], len(members), took)
        self._change = None

    def _ended(self) -> bool:
        """The old members all exited cleanly before the change (the job finished): drop it."""
        if not all(m.proc.poll() == 0 for m in self.members):
            return False
        log.info("job %s: the generation ended before the change: resize not carried out", self.job)
        self._abandon()
        return True

    def _fall_back(self, why: str) -> None:
        """The checkpoint path for the requested slot set. Before the members paused (no ``began-<k>``): they
        are healthy, so they stop with a checkpoint as on a preemption (the stop file), and nothing is lost.
        After: the change broke them; they are killed, and rank 0's checkpoint at the change's step boundary
        is the one the new ranks start from."""
        ch = self._change
        ch["why"] = why
        kill_all(ch["newcomers"])
        old = [m.proc for m in self.members]
        began = (self.dir / f"began-{ch['k']}").exists()
        if began or any(p.poll() is not None for p in old):
            kill_all(old)
            return self._restart("the checkpoint written as the change began" if began else "the last checkpoint")
        log.warning("job %s: in-place resize %d -> %d slots failed before the members paused (%s): stopping them "
                    "with a checkpoint", self.job, ch["old"], len(ch["slots"]), why)
        ch["stopping"] = time.monotonic()
        self.stop_file.touch()

    def _check_stopping(self) -> None:
        ch = self._change
        old = [m.proc for m in self.members]
        if any(p.poll() is None for p in old) and time.monotonic() - ch["stopping"] < self.timeout_s:
            return
        kill_all(old)
        self.stop_file.unlink(missing_ok=True)
        self._restart("the checkpoint written as they stopped")

    def _restart(self, where: str) -> None:
        """Start the requested slot set from the last checkpoint, in this generation."""
        ch = self._change
        slots, port = ch["slots"], self.free_port()
        procs = [self.start(r, len(slots), s, port, ch["k"], False, ch["batch"], ch["lr"]) for r, s in enumerate(slots)]
        self.members = [Member(s, p) for s, p in zip(slots, procs, strict=True)]
        self.procs[:] = procs
        log.warning("job %s: in-place resize %d -> %d slots failed (%s): restarted from %s", self.job, ch["old"],
                    len(slots), ch["why"], where)
        with open(self.job_dir / PROGRESS_FILE, "a") as fh:
            fh.write(json.dumps({"event": "resize_fallback", "from": ch["old"], "to": len(slots), "reason": ch["why"],
                                 "generation": self.generation, "time_s": time.time()}) + "\n")
        self._change = None

    def _reap_leavers(self) -> None:
        for p, since in list(self._leavers):
            if p.poll() is not None or time.monotonic() - since > self.timeout_s:
                if p.poll() is None:
                    log.warning("job %s: a rank that left the group has not exited: killing it", self.job)
                    p.kill()
                p.wait()
                self._leavers.remove((p, since))


def kill_all(procs: Sequence[subprocess.Popen]) -> None:
    """SIGKILL every process of ``procs`` still running, then reap them all."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
