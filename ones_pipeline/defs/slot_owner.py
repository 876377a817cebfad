"""Slot ownership across in-place changes: the run's slot tags, changed by the apply run (claim) and the step (free).

A Dagster run's tags cannot be removed, but their values can change (``instance.add_run_tags`` updates an
existing key), and ``dagster.yaml`` limits each ``(ones/<device>-<id>, held)`` pair to one in-flight run
(``defs.instance.instance_yaml``). So the run's slot tags stay the one record of who holds what; the run's
allocation (the slots it trains on, or will once its change is done, and its batch) is its run config's, changed
by its generation's in-place change request (``train.resize_control.request_resize``, ``defs.instance.run_info``):

* a run is created holding its first generation's slots (``Launch.tags``: ``ones/cpu-0: held``); the queued-run
  coordinator starts it only once no in-flight run holds any of them;
* an in-place grow: the apply run sets the new slots ``held`` on the run, then checks that no other in-flight run
  holds (or is queued for) them, else sets them ``free`` again and waits (``claim``: atomic against the
  queued-run coordinator); only then it writes the resize request, the run's new allocation;
* an in-place shrink: the apply run writes the request; the slot stays ``held`` until the step sees the change
  done (rank 0's ``resized`` event, or the launcher's ``resize_fallback``) and sets it ``free``. A run queued
  for that slot meanwhile waits in Dagster's queue.

A crash between the claim and the request leaves the run holding a slot its allocation lacks (it shows as
"freeing" in ``ones status``, and no other run is started on it) until the next change of that run or its end:
a slot idle for a while, never one slot trained on by two runs.

Every claim and free is also appended to the job's ``slots.jsonl`` (time, run, slots), with the run's first
slots written by its step as it starts: the history the no-double-booking check reads (tags say only "now"),
and what slot-time is counted from (``scheduler.runs.held_periods``: the partition's slot-hours, the report's
allocation plot, and the tick's attained service, ``JobView.attained_gpu_s``, through ``job_ledgers``).

No ``from __future__ import annotations`` (loaded with the Dagster definitions).
"""

import json
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import dagster as dg

from ones_pipeline.defs.instance import IN_FLIGHT_STATUSES, run_info
from ones_pipeline.scheduler.runs import SLOT_FREE, SLOT_HELD, RunInfo, slot_tag
from ones_pipeline.train.resize_control import request_resize

LEDGER = "slots.jsonl"


def record(job_dir: Path, run_id: str, generation: int, claimed=(), freed=(), first: bool = False) -> None:
    """Append one claim/free row to the job's slot ledger."""
    row = {"time_s": round(time.time(), 3), "run_id": run_id, "generation": int(generation),
           "claimed": [int(s) for s in claimed], "freed": [int(s) for s in freed], **({"first": True} if first else {})}
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(job_dir) / LEDGER, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def holders(instance: dg.DagsterInstance, slots, device: str, but: str) -> dict[int, str]:
    """Slot -> the in-flight run (other than ``but``) whose tag holds it."""
    out = {}
    for s in slots:  # as Dagster's tag concurrency limits count: every in-flight run with the tag ``held``
        flt = dg.RunsFilter(statuses=IN_FLIGHT_STATUSES, tags={slot_tag(s, device): SLOT_HELD})
        out.update({int(s): run.run_id for run in instance.get_runs(flt) if run.run_id != but})
    return out


def claim(instance: dg.DagsterInstance, resize: dict, job_dir: Path, wait_s: float, log) -> bool:
    """Give the run of ``resize`` (``scheduler.runs.Resize.to_dict``) its new allocation: claim the slots it adds
    on its tags once no other in-flight run holds them (waited for up to ``wait_s``: a shrink in the same tick
    frees them when its change is done), then ask its launcher for the change (the request, in ``job_dir``, is
    the run's allocation from then on). False: they stayed held, nothing changed.

    Hold first, then look: the new slots are set ``held`` on the run, then the other in-flight runs are read;
    if one holds (or is queued for) any of them, they are set ``free`` again and the claim waits. Dagster's
    queued-run coordinator reads the same tags before it starts a queued run, so a run queued for one of these
    slots is either seen here (and the claim gives way) or sees this run holding it (and waits in the queue):
    never both. Looking first and then setting the tags would leave a gap in which a run queued by a later tick
    could be started on the slot the grow then takes."""
    device, run_id = resize["device"], resize["run_id"]
    added = [s for s in resize["after"] if s not in resize["before"]]
    run = instance.get_run_by_id(run_id)
    owned = run.tags if run is not None else {}
    # (a slot still held by this run, a shrink of it not done yet, is its own: never set free here)
    tentative = {slot_tag(s, device): SLOT_HELD for s in added if owned.get(slot_tag(s, device)) != SLOT_HELD}
    deadline = time.monotonic() + wait_s
    while added:
        if tentative:
            instance.add_run_tags(run_id, tentative)
        busy = holders(instance, added, device, run_id)
        if not busy:
            break
        if tentative:
            instance.add_run_tags(run_id, dict.fromkeys(tentative, SLOT_FREE))
        if time.monotonic() > deadline:
            log(f"{resize['job']}: slot(s) {sorted(busy)} still held by {sorted(set(busy.values()))} after "
                f"{wait_s:.0f} s: in-place {resize['reason']} not made (the next tick decides again)")
            return False
        time.sleep(0.5)
    if added:
        record(job_dir, run_id, resize["generation"], claimed=added)
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    request_resize(job_dir, resize["generation"], resize["after"], global_batch=resize["global_batch"],
                   lr=resize["lr"], reason=resize["reason"], run_id=run_id, decided_s=resize.get("decided_s"))
    return True


def free_given_back(instance: dg.DagsterInstance, run_id: str, device: str, job_dir: Path,
                    generation: int) -> list[int]:
    """After an in-place change is done: set ``free`` every slot the run holds but its allocation (its
    generation's newest request in ``job_dir``) no longer has; return them."""
    info = allocation_now(instance, run_id, job_dir)
    gone = [s for s in (info.held_ids if info else ()) if s not in info.slot_ids]
    if gone:
        instance.add_run_tags(run_id, {slot_tag(s, device): SLOT_FREE for s in gone})
        record(job_dir, run_id, generation, freed=gone)
    return gone


def allocation_now(instance: dg.DagsterInstance, run_id: str, job_dir: Path) -> RunInfo | None:
    """The run's slots and batch now and the slots it holds (``defs.instance.run_info``), ``job_dir`` its job's."""
    run = instance.get_run_by_id(run_id)
    return run_info(run, lambda job: Path(job_dir)) if run is not None else None


def read_ledger(job_dir: Path) -> list[dict]:
    """The job's ledger rows, oldest first (an unreadable line is skipped)."""
    try:
        lines = (Path(job_dir) / LEDGER).read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return sorted(rows, key=lambda r: r.get("time_s", 0.0))


def job_ledgers(runs: Iterable[RunInfo], job_dir: Callable[[str], Path],
                skip: Collection[str] = ()) -> dict[str, list[dict]]:
    """The ledger rows of every job with a run that started (but the jobs in ``skip``, e.g. finished), for the
    tick (``TickInputs.ledgers``)."""
    return {job: read_ledger(job_dir(job)) for job in sorted({r.job for r in runs if r.start_s is not None})
            if job not in skip}
