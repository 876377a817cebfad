"""Which running jobs a tick keeps as they are, whatever the policy decided (``young_runs``), and keeping them
(``hold_young_runs``): a run whose in-place change is still being made, and a run younger than
``scheduler.min_run_s`` against any change that would stop it (its start-up would be lost; a change made in
place loses none of it). After an in-place change the policy's own hold applies. The live replay
(``adapters.live_ab.LiveViews``) holds as the tick does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ones_pipeline.core.types import Allocation, Schedule
from ones_pipeline.scheduler.in_place import not_in_place
from ones_pipeline.scheduler.runs import RunInfo


def batch_change(before: Allocation | None, after: Allocation | None) -> bool:
    """A change of batch alone that needs a new generation: not when the job re-tunes its batch itself
    (``Allocation.batch_tuned_by_job``; the running step moves to that batch without a restart)."""
    return (before is not None and after is not None and before.global_batch != after.global_batch
            and not after.batch_tuned_by_job)


def young_runs(now: float, min_run_s: float, runs: Mapping[str, RunInfo], current: Schedule, new: Schedule,
               changing: Mapping[str, object], spec_changed: set[str], slot_ids: Sequence[int], device: str,
               launcher: str) -> dict[str, str]:
    """Job -> why its run is held (the words of its idle reason): ``changing``, runs (by id) with an in-place
    change not made yet; ``spec_changed``, jobs whose spec file changed (restarted, never changed in place)."""
    out = {}
    for job, run in runs.items():
        before, after = current.allocations.get(job), new.allocations.get(job)
        if before is None:
            continue
        if run.run_id in changing:
            out[job] = "its in-place change is being made"
            continue
        stops = after is None or job in spec_changed or batch_change(before, after) or not_in_place(
            launcher, device, tuple(slot_ids[i] for i in before.gpus), tuple(slot_ids[i] for i in after.gpus),
            run.status) is not None
        if stops and now - run.created_s < min_run_s:
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
