"""Which running jobs a tick keeps as they are, whatever the policy decided (``young_runs``, with ``stopped``:
the changes that stop a run), keeping them (``hold_young_runs``) and the runs stopped for nothing then
(``keep_stopped_for_nothing``): a run whose in-place change is still
being made, and a run younger than ``scheduler.min_run_s`` against any change that would stop it (its
start-up would be lost; a change made in place loses none of it). After an in-place change the policy's own
hold applies. The live replay (``adapters.live_ab.LiveViews``) holds as the tick does."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ones_pipeline.core.types import Allocation, Schedule
from ones_pipeline.scheduler.in_place import not_in_place


def batch_change(before: Allocation | None, after: Allocation | None) -> bool:
    """A change of batch alone that needs a new generation: not when the job re-tunes its batch itself
    (``Allocation.batch_tuned_by_job``; the running step moves to that batch without a restart)."""
    return (before is not None and after is not None and before.global_batch != after.global_batch
            and not after.batch_tuned_by_job)


@dataclass(frozen=True)
class Slots:
    """Where the runs are made: the launcher kind (``in_place.LAUNCHERS``), the slots' device ("cpu" or "gpu")
    and their ids in cluster order."""

    launcher: str
    device: str
    ids: tuple[int, ...]


def stopped(current: Schedule, new: Schedule, where: Slots, status: Mapping[str, str] | None = None,
            spec_changed: Collection[str] = ()) -> set[str]:
    """The jobs running in ``current`` whose allocation in ``new`` stops their run: a preemption, a changed spec
    file (restarted, never changed in place), a batch change the job does not tune itself, or a slot change the
    launcher cannot make in place. ``status``: each job's run status (``STARTED`` where absent)."""
    out = set()
    for job, before in current.allocations.items():
        after = new.allocations.get(job)
        moved = after is not None and tuple(before.gpus) != tuple(after.gpus)
        if after is None or job in spec_changed or batch_change(before, after) or (moved and not_in_place(
                where.launcher, where.device, tuple(where.ids[i] for i in before.gpus),
                tuple(where.ids[i] for i in after.gpus), (status or {}).get(job, "STARTED")) is not None):
            out.add(job)
    return out


def young_runs(now: float, min_run_s: float, started: Mapping[str, float], stopping: Collection[str],
               changing: Collection[str] = ()) -> dict[str, str]:
    """Job -> why its run is held (the words of its idle reason), of the jobs whose runs ``started`` (job -> when):
    those ``changing`` (an in-place change not made yet), and those younger than ``min_run_s`` that the new
    allocation would stop (``stopping``: ``stopped``)."""
    out = {}
    for job, since in started.items():
        if job in changing:
            out[job] = "its in-place change is being made"
        elif job in stopping and now - since < min_run_s:
            out[job] = f"its run started less than {min_run_s:.0f} s ago (min_run_s)"
    return out


def hold_young_runs(new: Schedule, current: Schedule, young: Mapping[str, object]) -> Schedule:
    """``new`` with the young runs' jobs kept as they are, and any job whose new allocation needs their
    slots kept as it is too (transitively), so the result stays free of double-booking."""
    held = {j for j in young if new.gpus_of(j) != current.gpus_of(j) or batch_change(current.allocations.get(j),
                                                                                  new.allocations.get(j))}
    while True:
        taken = {g for j in held for g in current.gpus_of(j)}
        more = {j for j, a in new.allocations.items() if j not in held and taken.intersection(a.gpus)}
        if not more:
            break
        held |= more
    allocations = {j: a for j, a in new.allocations.items() if j not in held}
    allocations.update({j: current.allocations[j] for j in held if j in current.allocations})
    return Schedule(allocations)


def keep_stopped_for_nothing(new: Schedule, current: Schedule, jobs: Collection[str],
                             ending: Collection[str] = ()) -> Schedule:
    """``new`` where each of ``jobs`` it stops (running in ``current``, absent from ``new``) whose slots no job
    takes keeps running as it is: a run is never stopped to leave its slots idle. The policy stops a job for
    another, and a hold may keep that other as it is; so does the tick for a run that has trained its whole
    budget (``ending``: its change is dropped, it uses its current slots). Live, a resnet18 job was stopped through
    its checkpoint for a cnn job that had just trained its last step, and its slot stood idle. A job may still be
    given an ending run's slots: its run, or its in-place grow, waits for them (``defs.slot_owner``)."""
    used = {g for j, a in new.allocations.items() for g in (current.gpus_of(j) if j in ending else a.gpus)}
    keep = {j: current.allocations[j] for j in jobs if j in current.allocations and j not in new.allocations
            and not used.intersection(current.allocations[j].gpus)}
    return Schedule({**new.allocations, **keep}) if keep else new
