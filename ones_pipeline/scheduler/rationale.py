"""Why a decision: the numbers behind each change, in words a user reads in the UI and the decision log.

For a job whose allocation changes, the scheduler's own throughput model (``core.estimates``: the job's
fitted throughput, its noise scale, its remaining work) predicts how long the job still needs at its old
size and at its new one; the restart a change costs (what the policy charges for one: ``restart_cost_s``
of ``ones``, ``restart_penalty_s`` of ``pollux``/``sia``, else the default below) is added to the new one.
A change that leaves the job itself later (a grow whose restart costs more than it saves) says so: the
policy decided for all jobs. A shrink or preemption names the jobs its slots go to. Policy-independent:
the same numbers whichever policy decided. The predictions are the scheduler's, not a promise: the
throughput fit is only as good as the configurations the job has run in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.estimates import goodput_of, noise_scales, remaining_work
from ones_pipeline.core.goodput import GoodputModel
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule

DEFAULT_RESTART_COST_S = 30.0  # a generation's start-up (process start, model build, checkpoint load)


@dataclass(frozen=True)
class Why:
    """The numbers behind one decision (times in seconds; None where they do not apply)."""

    remaining_before_s: float | None  # predicted time to finish at the old allocation (None: it had none)
    remaining_after_s: float | None  # ... at the new one, restart included (None: it waits)
    restart_cost_s: float
    frees_for: tuple[str, ...] = ()  # jobs that get slots this job gives up

    def text(self) -> str:
        parts = []
        before, after = self.remaining_before_s, self.remaining_after_s
        if before is not None and after is not None:
            parts.append(f"predicted to finish in {_dur(before)} -> {_dur(after)}")
            parts.append(f"incl. {self.restart_cost_s:.0f} s restart")
            if after > before:  # the policy weighs every job's completion (and idle slots), not this one's
                parts.append("later for this job alone; the policy expects a lower mean over all jobs")
        elif after is not None:
            parts.append(f"predicted to finish in {_dur(after)} (incl. {self.restart_cost_s:.0f} s start-up)")
        elif before is not None:
            parts.append(f"it waits; it would have finished in {_dur(before)}")
        if self.frees_for:
            parts.append(f"frees slots for {', '.join(self.frees_for)}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"remaining_before_s": _round(self.remaining_before_s),
                "remaining_after_s": _round(self.remaining_after_s), "restart_cost_s": self.restart_cost_s,
                "frees_for": list(self.frees_for)}


def policy_restart_cost(policy) -> float | None:
    """The restart cost the policy's own objective charges (None: it charges none we know of)."""
    for owner, name in ((getattr(policy, "config", None), "restart_cost_s"), (policy, "restart_penalty_s")):
        value = getattr(owner, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return None


def _restart_charge(policy, cap: float, time_left_s: float | None) -> float:
    """What the policy charges this job for the change: ``ones``'s own scaled charge
    (``OnesParams.change_cost``), else the flat ``cap``."""
    change_cost = getattr(getattr(policy, "config", None), "change_cost", None)
    if change_cost is None or time_left_s is None:
        return cap
    return float(change_cost(time_left_s))


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "waiting"
    if not np.isfinite(seconds):
        return "never"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _time_left(params, gns, view: JobView, work: float, alloc: Allocation | None, cluster: Cluster) -> float | None:
    if alloc is None or not alloc.gpus:
        return None
    nodes = len(cluster.placement(alloc.gpus))  # nodes the allocation spans
    rate = float(goodput_of(params, gns, view.spec.per_gpu_batch, view.spec.max_per_gpu_batch or np.inf,
                            len(alloc.gpus), max(nodes, 1), alloc.global_batch))
    return work / rate if rate > 0 else float("inf")


def explain(views: Sequence[JobView], cluster: Cluster, current: Schedule, new: Schedule, jobs: Sequence[str],
            policy=None) -> dict[str, Why]:
    """``Why`` for each of ``jobs`` (the ones whose allocation changes), from the policy's view of all;
    ``policy``: the deciding policy, whose own restart charge is quoted (``policy_restart_cost``)."""
    by_name = {v.name: i for i, v in enumerate(views)}
    wanted = [j for j in jobs if j in by_name]
    if not wanted:
        return {}
    subset = [views[by_name[j]] for j in wanted]
    params, gns, work = GoodputModel().prior(subset), noise_scales(subset), remaining_work(subset)
    restart_cost_s = policy_restart_cost(policy)
    cost = DEFAULT_RESTART_COST_S if restart_cost_s is None else restart_cost_s
    out = {}
    for i, job in enumerate(wanted):
        p = params.select(i)
        before = _time_left(p, gns[i], subset[i], work[i], current.allocations.get(job), cluster)
        after = _time_left(p, gns[i], subset[i], work[i], new.allocations.get(job), cluster)
        job_cost = _restart_charge(policy, cost, before if before is not None else after)
        if after is not None:
            after += job_cost
        given_up = set(current.gpus_of(job)) - set(new.gpus_of(job))
        frees = tuple(sorted(o for o, a in new.allocations.items() if o != job and given_up & set(a.gpus)))
        out[job] = Why(before, after, round(job_cost, 1), frees)
    return out


def waiting_reason(job: str, holders: Mapping[str, Sequence[int]], free: Sequence[int], device: str) -> str:
    """Why a pending job waits: no free slots (and who holds them), or the policy keeps it queued."""
    if not free:
        held = "; ".join(f"{j} ({device} {','.join(map(str, s))})" for j, s in sorted(holders.items()))
        return f"waiting: no free slots; held by {held}" if held else "waiting: no slots in the inventory"
    return (f"waiting: {len(free)} slot(s) free ({device} {','.join(map(str, free))}) but the policy ranks "
            "other jobs first or this job's next size does not fit")
