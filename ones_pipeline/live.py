"""One scheduling tick of the live pipeline, without Dagster: what to cancel, what to launch, and why.

The Dagster sensor (``ones_pipeline.defs.sensor``) gathers the inputs (job specs, the runs the instance
knows, progress read from MLflow, the cursor), calls ``plan_tick`` and applies the plan (cancel runs,
request runs, store the cursor). Keeping the decision here makes it testable and benchmarkable
without a Dagster instance, and keeps the rule "the runs are the truth" in one place:

- the current schedule is the newest in-flight run of each job (its tags name its slots and batch);
- a job's next generation is one more than the highest generation any of its runs ever had, so a
  re-evaluated tick produces the same run key and launches nothing twice;
- the policy state travels in the cursor; losing it costs search quality, never a decision already
  applied (the runs carry those).

Slots: the policy works on cluster slots ``0..n-1``; ``slot_ids`` maps them onto GPU ids (or CPU slot
numbers), which is what run tags, ``CUDA_VISIBLE_DEVICES`` and Docker device requests use.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ones_pipeline.core.policy import Policy, make_policy, policy_from_dict
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    ThroughputObs,
    lr_for_batch,
    spec_to_dict,
)

# Run tags (Dagster tag keys: letters, digits, '-', '_', '.', '/').
TAG_MANAGED = "ones/managed"
TAG_JOB = "ones/job"
TAG_GENERATION = "ones/generation"
TAG_SLOTS = "ones/gpus"  # comma-separated slot ids, e.g. "0,1"
TAG_BATCH = "ones/global-batch"
TAG_LR = "ones/lr"
TAG_REASON = "ones/reason"
TAG_PREVIOUS = "ones/previous-gpus"
SLOT_TAG_PREFIX = "ones/gpu-"  # one tag per slot held; dagster.yaml limits each to one run

IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")
ENDED_BAD = ("FAILURE",)


def slot_tag(slot_id: int) -> str:
    return f"{SLOT_TAG_PREFIX}{int(slot_id)}"


def spec_hash(spec: JobSpec) -> str:
    return hashlib.sha256(json.dumps(spec_to_dict(spec), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunInfo:
    """What the sensor needs of one Dagster run of a training job."""

    run_id: str
    job: str
    generation: int
    slot_ids: tuple[int, ...]
    status: str  # DagsterRunStatus value
    global_batch: int = 0
    lr: float = 0.0
    created_s: float = 0.0
    start_s: float | None = None
    end_s: float | None = None

    @classmethod
    def from_tags(cls, run_id: str, status: str, tags: Mapping[str, str], created_s: float = 0.0,
                  start_s: float | None = None, end_s: float | None = None) -> RunInfo | None:
        if tags.get(TAG_MANAGED) != "true" or TAG_JOB not in tags:
            return None
        slots = tuple(int(s) for s in tags.get(TAG_SLOTS, "").split(",") if s.strip())
        return cls(run_id, tags[TAG_JOB], int(tags.get(TAG_GENERATION, 0)), slots, status,
                   int(tags.get(TAG_BATCH, 0)), float(tags.get(TAG_LR, 0.0)), created_s, start_s, end_s)

    @property
    def in_flight(self) -> bool:
        return self.status in IN_FLIGHT

    def held_s(self, now: float) -> float:
        """Seconds it held its slots (so far)."""
        if self.start_s is None:
            return 0.0
        return max((self.end_s if self.end_s is not None else now) - self.start_s, 0.0)


@dataclass(frozen=True)
class ProgressInfo:
    """A job's progress as read from MLflow (``adapters.mlflow_tracker.JobProgress`` fits)."""

    samples_done: float = 0.0
    throughput_obs: tuple[ThroughputObs, ...] = ()
    loss_history: tuple[tuple[float, float], ...] = ()
    accuracy_history: tuple[tuple[float, float], ...] = ()
    restarts: int = 0


@dataclass(frozen=True)
class Launch:
    job: str
    generation: int
    slot_ids: tuple[int, ...]
    global_batch: int
    lr: float
    reason: str
    previous_slot_ids: tuple[int, ...] = ()

    @property
    def run_key(self) -> str:
        return f"{self.job}-g{self.generation}"

    def tags(self) -> dict[str, str]:
        tags = {TAG_MANAGED: "true", TAG_JOB: self.job, TAG_GENERATION: str(self.generation),
                TAG_SLOTS: ",".join(str(s) for s in self.slot_ids), TAG_BATCH: str(self.global_batch),
                TAG_LR: repr(float(self.lr)), TAG_REASON: self.reason[:200],
                TAG_PREVIOUS: ",".join(str(s) for s in self.previous_slot_ids) or "-"}
        tags.update({slot_tag(s): "1" for s in self.slot_ids})
        return tags


@dataclass(frozen=True)
class Cancel:
    run_id: str
    job: str
    generation: int
    reason: str


@dataclass(frozen=True)
class Decision:
    """One line of the decision log: job, slots before -> after, batch, why."""

    time_s: float
    job: str
    before: tuple[int, ...]
    after: tuple[int, ...]
    global_batch: int
    reason: str

    def line(self) -> str:
        fmt = lambda s: "[" + ",".join(map(str, s)) + "]" if s else "-"  # noqa: E731
        batch = f" batch {self.global_batch}" if self.after else ""
        return f"{self.job}: {fmt(self.before)} -> {fmt(self.after)}{batch} ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "job": self.job, "before": list(self.before), "after": list(self.after),
                "global_batch": self.global_batch, "reason": self.reason}


@dataclass
class TickPlan:
    cancels: list[Cancel] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    cursor: dict[str, Any] = field(default_factory=dict)
    newly_failed: dict[str, str] = field(default_factory=dict)  # job -> reason
    decide_s: float = 0.0  # wall time of the policy


def _policy(cursor: Mapping[str, Any], name: str, seed: int, params: Mapping[str, Any]) -> Policy:
    saved = cursor.get("policy")
    if saved and saved.get("name") == name and int(saved.get("seed", -1)) == seed \
            and dict(saved.get("params", {})) == dict(params):
        try:
            return policy_from_dict(saved)
        except (KeyError, TypeError, ValueError):
            pass  # a cursor from another version: start the search afresh
    return make_policy(name, seed=seed, **dict(params))


def _describe(before: Sequence[int], after: Sequence[int], resumed: bool, spec_changed: bool) -> str:
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


def _hold_young_runs(new: Schedule, current: Schedule, young: Mapping[str, RunInfo]) -> Schedule:
    """``new`` with the young runs' jobs kept as they are, and any job whose new allocation needs their
    slots kept as it is too (transitively), so the result stays free of double-booking."""
    held = {j for j in young if new.gpus_of(j) != current.gpus_of(j)
            or (j in new.allocations and new.allocations[j].global_batch != current.allocations[j].global_batch)}
    while True:
        taken = {g for j in held for g in current.gpus_of(j)}
        more = {j for j, a in new.allocations.items() if j not in held and taken.intersection(a.gpus)}
        if not more:
            break
        held |= more
    allocations = {j: a for j, a in new.allocations.items() if j not in held}
    allocations.update({j: current.allocations[j] for j in held if j in current.allocations})
    return Schedule(allocations)


def plan_tick(*, now: float, specs: Mapping[str, JobSpec], finished: set[str] | frozenset[str],
              runs: Sequence[RunInfo], progress: Mapping[str, ProgressInfo], slot_ids: Sequence[int],
              cluster: Cluster, cursor: Mapping[str, Any], policy_name: str = "ones", policy_seed: int = 0,
              policy_params: Mapping[str, Any] | None = None, max_retries: int = 3,
              retry_backoff_s: float = 30.0, min_hold_s: float = 0.0) -> TickPlan:
    """Decide one tick. ``runs``: every managed run the instance knows (any status).

    ``min_hold_s``: a run younger than this keeps its allocation (a change would throw away its start-up
    before it trained); the policy's other changes stand unless they need its slots.
    """
    slot_ids = tuple(int(s) for s in slot_ids)
    if len(slot_ids) != cluster.num_gpus:
        raise ValueError(f"{len(slot_ids)} slot ids for a cluster of {cluster.num_gpus}")
    index_of = {s: i for i, s in enumerate(slot_ids)}
    cursor = dict(cursor)
    submit: dict[str, float] = dict(cursor.get("submit", {}))
    hashes: dict[str, str] = dict(cursor.get("spec_hash", {}))
    failed: dict[str, str] = dict(cursor.get("failed", {}))
    launch_epochs: dict[str, float] = dict(cursor.get("launch_epochs", {}))
    plan = TickPlan()

    by_job: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_job.setdefault(r.job, []).append(r)
    for rs in by_job.values():
        rs.sort(key=lambda r: (r.generation, r.created_s))

    # The schedule in force: each job's newest in-flight run; older in-flight runs are stale.
    current: dict[str, Allocation] = {}
    current_run: dict[str, RunInfo] = {}
    for job, rs in by_job.items():
        live = [r for r in rs if r.in_flight]
        if not live:
            continue
        newest = live[-1]
        for stale in live[:-1]:
            plan.cancels.append(Cancel(stale.run_id, job, stale.generation, "superseded by a newer generation"))
        if job in finished or job not in specs or job in failed:
            why = "finished" if job in finished else "spec removed" if job not in specs else "job failed"
            plan.cancels.append(Cancel(newest.run_id, job, newest.generation, why))
            continue
        slots = [index_of[s] for s in newest.slot_ids if s in index_of]
        if len(slots) != len(newest.slot_ids) or not slots:
            plan.cancels.append(Cancel(newest.run_id, job, newest.generation, "holds slots outside the inventory"))
            continue
        current[job] = Allocation(job, tuple(slots), max(newest.global_batch, 1), newest.lr, newest.generation)
        current_run[job] = newest

    # Active jobs: submitted, not finished, not failed, not backing off after a failure.
    views: list[JobView] = []
    spec_changed: set[str] = set()
    for job, spec in specs.items():
        if job in finished or job in failed:
            continue
        submit.setdefault(job, now)
        h = spec_hash(spec)
        if hashes.get(job) not in (None, h) and job in current:
            spec_changed.add(job)
        hashes[job] = h
        rs = by_job.get(job, [])
        failures = [r for r in rs if r.status in ENDED_BAD]
        if job not in current and failures:
            last = failures[-1]
            if len(failures) > max_retries:
                failed[job] = f"{len(failures)} failed runs (last {last.run_id}); retries exhausted ({max_retries})"
                plan.newly_failed[job] = failed[job]
                continue
            ended_s = last.end_s or last.created_s
            if now - ended_s < retry_backoff_s * 2 ** (len(failures) - 1):
                continue
        pr = progress.get(job, ProgressInfo())
        ran = [r for r in rs if r.start_s is not None]
        status = JobStatus.RUNNING if job in current else JobStatus.PAUSED if ran else JobStatus.PENDING
        cur = current_run.get(job)
        views.append(JobView(
            spec=spec, status=status, submit_time_s=submit[job], samples_done=pr.samples_done,
            progress_samples=pr.samples_done, throughput_obs=pr.throughput_obs, loss_history=pr.loss_history,
            accuracy_history=pr.accuracy_history, initial_loss=pr.loss_history[0][1] if pr.loss_history else None,
            restarts=max(pr.restarts, len(ran) - 1, 0),
            attained_gpu_s=sum(r.held_s(now) * len(r.slot_ids) for r in ran),
            run_time_s=sum(r.held_s(now) for r in ran),
            last_change_s=(cur.start_s or cur.created_s) if cur else None,
            epochs_at_last_change=launch_epochs.get(job, 0.0),
            max_gpus_seen=max((len(r.slot_ids) for r in ran), default=0)))
    # Jobs no longer active drop out of the schedule handed to the policy.
    active = {v.name for v in views}
    in_force = Schedule({j: a for j, a in current.items() if j in active and j not in spec_changed})

    params = dict(policy_params or {})
    policy = _policy(cursor, policy_name, policy_seed, params)
    t0 = time.perf_counter()
    new = policy.decide(now, cluster, views, in_force) if views else Schedule({})
    plan.decide_s = time.perf_counter() - t0
    new.validate(cluster, {v.name: v.spec for v in views})
    new = _hold_young_runs(new, in_force, {j: r for j, r in current_run.items() if j in in_force.allocations
                                           and now - r.created_s < min_hold_s})

    # Diff: cancel what changes, launch the new allocations with the next generation.
    for job in sorted(set(current) | set(new.allocations)):
        if job not in active:
            continue
        before = current.get(job)
        after = new.allocations.get(job)
        before_ids = tuple(slot_ids[i] for i in before.gpus) if before else ()
        after_ids = tuple(slot_ids[i] for i in after.gpus) if after else ()
        changed = job in spec_changed or before_ids != after_ids or (
            before is not None and after is not None and before.global_batch != after.global_batch)
        if not changed:
            continue
        reason = _describe(before_ids, after_ids, bool(by_job.get(job)), job in spec_changed)
        if before is not None:
            run = current_run[job]
            plan.cancels.append(Cancel(run.run_id, job, run.generation, reason))
        batch = 0
        if after is not None:
            spec = specs[job]
            batch = min(int(after.global_batch), spec.global_batch_cap)
            generation = max((r.generation for r in by_job.get(job, [])), default=-1) + 1
            lr = after.lr if after.lr > 0 else lr_for_batch(spec, batch)
            plan.launches.append(Launch(job, generation, after_ids, batch, lr, f"{policy_name}: {reason}", before_ids))
            pr = progress.get(job)
            launch_epochs[job] = (pr.samples_done / spec.dataset_size) if pr else 0.0
        plan.decisions.append(Decision(now, job, before_ids, after_ids, batch, reason))

    live_jobs = set(specs) | set(finished)
    plan.cursor = {
        "version": 1,
        "policy": policy.to_dict(),
        "submit": {j: t for j, t in submit.items() if j in live_jobs},
        "spec_hash": {j: h for j, h in hashes.items() if j in specs},
        "failed": failed,
        "launch_epochs": {j: e for j, e in launch_epochs.items() if j in specs},
    }
    return plan
