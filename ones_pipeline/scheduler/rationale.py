"""Why a decision: the numbers behind each change, in words a user reads in the UI and the decision log.

For a job whose allocation changes, the scheduler's own throughput model (``core.estimates``: the job's
fitted throughput, its noise scale, its remaining work) predicts how long the job still needs at its old
size and at its new one; what that kind of change costs where it runs (``JobView.change_costs``, measured
by the deployment: a start, a grow or shrink in place, a restart through a checkpoint) is added to the new
one and named ("grow in place, ~0.1 s"). A change that leaves the job itself later says so: the policy
decided for all jobs (or, alone, by its own goodput model). A shrink or preemption names the jobs its slots
go to. Slots left idle beside a running job that could use them are explained too (``idle_reasons``).
Policy-independent: the same numbers whichever policy decided. The predictions are the scheduler's, not a
promise: the throughput fit is only as good as the configurations the job has run in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.estimates import evaluation_time, goodput_of, noise_scales, remaining_work
from ones_pipeline.core.goodput import GoodputModel
from ones_pipeline.core.types import Allocation, Cluster, JobStatus, JobView, Schedule

# Predictions this close (a fraction of the time left) are "about as soon": a shrink predicted at 6.1 -> 6.0 min
# read as if it made the job sooner, beside a grow of the same job predicted at 5.8 -> 5.6 min.
SAME_WITHIN = 0.05
UNKNOWN_COST_S = 30.0  # what a change is taken to cost where the job's view gives no figure
# the words for each kind of change (``sim.change_costs.KINDS``) in a reason
KIND_WORDS = {"start": "start-up", "restart": "restart from a checkpoint", "grow": "grow in place",
              "shrink": "shrink in place"}


@dataclass(frozen=True)
class Why:
    """The numbers behind one decision (times in seconds; None where they do not apply)."""

    remaining_before_s: float | None  # predicted time to finish at the old allocation (None: it had none)
    remaining_after_s: float | None  # ... at the new one, the change's cost included (None: it waits)
    change_cost_s: float  # what this kind of change costs the job where it runs (0: none now)
    frees_for: tuple[str, ...] = ()  # jobs that get slots this job gives up
    change: str = "restart"  # its kind (``sim.change_costs.KINDS``; "" when it only stops)
    alone: bool = False  # the only active job
    measured: bool = True  # False: neither the job nor its model's earlier jobs have measured a step (no times)
    lag_s: float = 0.0  # a grow in place: its delay from the decision to its effect (the job trains on meanwhile)

    def text(self) -> str:
        parts = []
        before, after = self.remaining_before_s, self.remaining_after_s
        cost = f"{KIND_WORDS.get(self.change, self.change)}, ~{_cost(self.change_cost_s)}" + \
            (f", in effect after ~{_cost(self.lag_s)}" if self.lag_s > 0 else "")
        if not self.measured:
            parts.append(f"not measured yet: how long it trains is unknown until its first steps are timed ({cost})"
                         if self.change else "not measured yet")
        elif before is not None and after is not None:
            same = abs(after - before) <= SAME_WITHIN * before  # within the estimate's own error: no "sooner"
            parts.append(f"predicted to finish {'about as soon, ' if same else ''}in {_dur(before)} -> {_dur(after)} "
                         f"({cost})")
            if after > before and not same:  # the policy weighs every job's completion (and idle slots), not this one's
                parts.append("later by the scheduler's estimate; the policy's own goodput model predicts sooner"
                             if self.alone else "later for this job alone; the policy expects a lower mean over "
                             "all jobs")
        elif after is not None:
            parts.append(f"predicted to finish in {_dur(after)} ({cost})")
        elif before is not None:
            parts.append(f"it waits; it would have finished in {_dur(before)}")
        if self.frees_for:
            parts.append(f"frees slots for {', '.join(self.frees_for)}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"remaining_before_s": _round(self.remaining_before_s),
                "remaining_after_s": _round(self.remaining_after_s), "change": self.change,
                "change_cost_s": self.change_cost_s, "frees_for": list(self.frees_for)}


def _cost(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s" if seconds >= 0.95 else f"{seconds:.2f} s"


def change_kind(view: JobView, before: Sequence[int], after: Sequence[int], in_place: bool) -> str:
    """The kind of the change of ``view``'s job from slots ``before`` to ``after``, made in place or not: a
    start (its first) or a restart from its checkpoint when it held nothing, "" when it stops."""
    if not after:
        return ""
    if not before:
        return "restart" if view.max_gpus_seen > 0 or view.status is JobStatus.PAUSED else "start"
    if not in_place:
        return "restart"
    return "grow" if len(after) > len(before) else "shrink"


def timed(view: JobView) -> bool:
    """Whether the job or its model's earlier jobs have timed a step: else its reasons predict nothing."""
    return bool(view.throughput_obs or view.model_obs)


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "waiting"
    if not np.isfinite(seconds):
        return "never"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _time_left(params, gns, view: JobView, work: float, fixed: float, alloc: Allocation | None,
               cluster: Cluster) -> float | None:
    """Seconds ``view`` takes to train ``work`` on ``alloc``, plus its ``fixed`` seconds (its evaluation points:
    ``estimates.evaluation_time``); None without GPUs."""
    if alloc is None or not alloc.gpus:
        return None
    nodes = len(cluster.placement(alloc.gpus))  # nodes the allocation spans
    rate = float(goodput_of(params, gns, view.spec.per_gpu_batch, view.spec.max_per_gpu_batch or np.inf,
                            len(alloc.gpus), max(nodes, 1), alloc.global_batch))
    return work / rate + fixed if rate > 0 else float("inf")


def explain(views: Sequence[JobView], cluster: Cluster, current: Schedule, new: Schedule, jobs: Sequence[str],
            in_place: Mapping[str, bool] | None = None) -> dict[str, Why]:
    """``Why`` for each of ``jobs`` (the ones whose allocation changes), from the policy's view of all;
    ``in_place``: job -> whether its change is made in place (absent: not)."""
    by_name = {v.name: i for i, v in enumerate(views)}
    wanted = [j for j in jobs if j in by_name]
    if not wanted:
        return {}
    subset = [views[by_name[j]] for j in wanted]
    params, gns, work = GoodputModel().prior(subset), noise_scales(subset), remaining_work(subset)
    fixed = evaluation_time(subset, work)
    out = {}
    for i, job in enumerate(wanted):
        p = params.select(i)
        old, alloc = current.allocations.get(job), new.allocations.get(job)
        before = _time_left(p, gns[i], subset[i], work[i], fixed[i], old, cluster)
        after = _time_left(p, gns[i], subset[i], work[i], fixed[i], alloc, cluster)
        kind = change_kind(subset[i], old.gpus if old else (), alloc.gpus if alloc else (),
                           bool((in_place or {}).get(job)))
        cost = float(subset[i].change_costs.get(kind, UNKNOWN_COST_S)) if kind else 0.0
        lag = float(subset[i].change_costs.get("lag", 0.0)) if kind == "grow" and before is not None else 0.0
        if after is not None:
            after += cost
            if lag > 0:  # it trains at its old size until the grow lands (or it is done)
                after = before if before <= lag else lag + after * (1.0 - lag / before)
        given_up = set(current.gpus_of(job)) - set(new.gpus_of(job))
        frees = tuple(sorted(o for o, a in new.allocations.items() if o != job and given_up & set(a.gpus)))
        measured = timed(subset[i])
        if not measured:  # no step time to predict from
            before = after = None
        out[job] = Why(before, after, round(cost, 3), frees, kind, len(views) == 1, measured, round(lag, 3))
    return out


def waiting_reason(job: str, holders: Mapping[str, Sequence[int]], free: Sequence[int], device: str) -> str:
    """Why a pending job waits: no free slots (and who holds them), or the policy keeps it queued."""
    if not free:
        held = "; ".join(f"{j} ({device} {','.join(map(str, s))})" for j, s in sorted(holders.items()))
        return f"waiting: no free slots; held by {held}" if held else "waiting: no slots in the inventory"
    return (f"waiting: {len(free)} slot(s) free ({device} {','.join(map(str, free))}) but the policy ranks "
            "other jobs first or this job's next size does not fit")


def waiting_reasons(new: Schedule, active: Sequence[str], slot_ids: Sequence[int], device: str) -> dict[str, str]:
    """Why each active job without an allocation in ``new`` waits (``waiting_reason``)."""
    holders = {j: tuple(slot_ids[i] for i in a.gpus) for j, a in new.allocations.items() if a.gpus}
    taken = {s for slots in holders.values() for s in slots}
    free = [s for s in slot_ids if s not in taken]
    return {job: waiting_reason(job, holders, free, device) for job in active if job not in holders}


def idle_reasons(views: Sequence[JobView], cluster: Cluster, new: Schedule, held: Mapping[str, str]) -> dict[str, str]:
    """Why each running job that could use more slots (its cap) is left beside slots ``new`` leaves idle: its
    run is held (``held``: job -> why), or the scheduler's estimate of its time left on the idle slots too,
    a grow in place included (no sooner: nothing to gain; sooner: the policy's own goodput model disagrees)."""
    free = [g for g in range(cluster.num_gpus) if g not in {s for a in new.allocations.values() for s in a.gpus}]
    out: dict[str, str] = {}
    if not free:
        return out
    running = [v for v in views if new.gpus_of(v.name) and len(new.gpus_of(v.name)) < min(v.spec.gpu_cap,
                                                                                         cluster.num_gpus)]
    if not running:
        return out
    model = GoodputModel()
    params, gns, work = model.prior(running), noise_scales(running), remaining_work(running)
    fixed = evaluation_time(running, work)
    for i, v in enumerate(running):
        alloc = new.allocations[v.name]
        n, k = len(alloc.gpus), min(len(free), v.spec.gpu_cap - len(alloc.gpus))
        idle = f"{len(free)} slot(s) idle beside it"
        if v.name in held:
            out[v.name] = f"{idle}: {held[v.name]}"
            continue
        if not timed(v):
            out[v.name] = f"{idle}: not measured yet; its size is decided once its first steps are timed"
            continue
        gpus = tuple(alloc.gpus) + tuple(free[:k])
        smallest = alloc.batch_tuned_by_job and v.grad_noise_scale is None
        if alloc.batch_tuned_by_job:  # the batch the job would pick there itself (``core.goodput.job_batch``)
            micro, accum = model.batch(v.spec, v.throughput_obs, v.grad_noise_scale,
                                       len(cluster.placement(gpus)), n + k)
            batch = micro * (n + k) * (accum + 1)
        else:
            batch = min(alloc.global_batch * (n + k) // n, v.spec.global_batch_cap)
        more = Allocation(v.name, gpus, batch, alloc.lr)
        now = _time_left(params.select(i), gns[i], v, work[i], fixed[i], alloc, cluster)
        grown = _time_left(params.select(i), gns[i], v, work[i], fixed[i], more, cluster)
        if now is None or grown is None:
            continue
        grown += float(v.change_costs.get("grow", UNKNOWN_COST_S))
        verdict = ("no sooner there" if grown >= now else
                   "sooner by the scheduler's estimate, but the policy's own goodput model expects less of them")
        at = (f": on {n + k} it would train at batch {batch}, its smallest, until it has measured its noise scale"
              if smallest else "")
        out[v.name] = (f"{idle}: predicted to finish in {_dur(now)} on {n}, {_dur(grown)} on {n + k} incl. the "
                       f"grow; {verdict}{at}")
    return out


def describe_change(before: Sequence[int], after: Sequence[int], resumed: bool, spec_changed: bool) -> str:
    """What a decision does to a job, in the words its decision record starts with: the slots it held
    ``before`` and holds ``after``, whether it ran before (``resumed``) and whether its spec changed."""
    if spec_changed and before:
        return "spec changed: restart with the new spec"
    if not before and after:
        return "resume from checkpoint" if resumed else "start"
    if before and not after:
        return "preempt (checkpoint, wait for GPUs)"
    if len(after) > len(before):
        return f"grow {len(before)} -> {len(after)}"
    if len(after) < len(before):
        return f"shrink {len(before)} -> {len(after)}"
    return "move to other slots"
