"""One scheduling tick of the live pipeline, without Dagster: what to cancel, what to launch, and why.

The Dagster sensor (``ones_pipeline.defs.sensor``) gathers the inputs (job specs, the runs the instance
knows, progress read from MLflow, the slot inventory, the cursor), calls ``plan_tick`` and applies the
plan (cancel runs, request runs, store the cursor). ``plan_tick`` is a pipeline of named steps, in the
spirit of blox's round loop::

    current schedule from runs -> job views -> decide -> hold young runs -> diff into cancels and starts
                                                                              (or in-place resizes)

The rule "the runs are the truth" lives here:

- the current schedule is the newest in-flight run of each job (``RunInfo``: its allocation, as launched or
  changed in place since, names its slots and batch);
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ones_pipeline.core import model_memory
from ones_pipeline.core.limits import spec_problem
from ones_pipeline.core.policies import Policy, make_policy
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    ThroughputObs,
    lr_for_batch,
)
from ones_pipeline.scheduler import change_costs
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.scheduler.holds import (
    Slots,
    batch_change,
    hold_young_runs,
    keep_stopped_for_nothing,
    stopped,
    young_runs,
)
from ones_pipeline.scheduler.in_place import CHECKPOINT, IN_PLACE, not_in_place, rank_order, resizes_in_place
from ones_pipeline.scheduler.rationale import describe_change, explain, idle_reasons, waiting_reasons
from ones_pipeline.scheduler.runs import (
    ENDED_BAD,
    Cancel,
    Decision,
    Launch,
    ProgressInfo,
    Resize,
    RunInfo,
    TickPlan,
    slot_seconds,
    spec_hash,
)
from ones_pipeline.scheduler.settings import SchedulerSettings

INFRA_RETRY_FACTOR = 10  # run-worker deaths a job survives, per retry of its own
CANCEL_PENDING_S = 120.0  # a run cancelled this recently is not cancelled (nor its change decided) again
QUARANTINED = "spec quarantined (the scheduler cannot use it)"
CURSOR_VERSION = 2  # 2: the policy state is a file named by ``policy_ref``, no longer in the cursor


@dataclass(frozen=True)
class TickInputs:
    """What one tick sees. ``runs``: every managed run the instance knows (any status)."""

    now: float
    specs: Mapping[str, JobSpec]
    finished: frozenset[str]
    runs: Sequence[RunInfo]
    progress: Mapping[str, ProgressInfo]
    slot_ids: tuple[int, ...]
    cluster: Cluster
    cursor: Mapping[str, Any] = field(default_factory=dict)
    # The policy's saved search state (population, RNG), read from the state directory by the caller from
    # the file the cursor's ``policy_ref`` names (``config.layout.StateLayout.policy_state``); None: none.
    policy_state: Mapping[str, Any] | None = None
    device: str = "cpu"  # what the slots are: "gpu" or "cpu"
    ledgers: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)  # job -> slot ledger rows
    # job -> its events that measure what its changes cost (``change_costs.change_events``; the cursor keeps them)
    change_events: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.slot_ids) != self.cluster.num_gpus:
            raise ValueError(f"{len(self.slot_ids)} slot ids for a cluster of {self.cluster.num_gpus}")


@dataclass
class _State:
    """The cursor's bookkeeping, carried from tick to tick."""

    submit: dict[str, float]
    hashes: dict[str, str]
    failed: dict[str, str]
    launch_epochs: dict[str, float]
    cancelling: dict[str, float] = field(default_factory=dict)  # run id -> when a committed tick cancelled it
    # model -> step times its jobs measured, [GPUs, nodes, per-GPU batch, step s, sync s] rows, newest last
    model_obs: dict[str, list[list[float]]] = field(default_factory=dict)
    # model -> [samples, noise scale]: the noise scale its jobs measured earliest in their training
    model_gns: dict[str, list[float]] = field(default_factory=dict)
    # run id -> [when a committed tick asked it to change in place, its new slot ids]: its slots until its
    # allocation shows them (the apply run writes the request), so later ticks neither decide the change again
    # nor undo it
    resizing: dict[str, list] = field(default_factory=dict)
    # kind of change -> [when, seconds] rows this deployment measured, newest last (``change_costs.remember``)
    change_costs: dict[str, list[list[float]]] = field(default_factory=dict)
    # model -> s its jobs' evaluation points last took (``JobView.epoch_end_s``): a job that has passed none yet
    # is valued by it (a job shorter than an epoch passes only its last)
    model_epoch_end: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_cursor(cls, cursor: Mapping[str, Any]) -> _State:
        return cls(dict(cursor.get("submit", {})), dict(cursor.get("spec_hash", {})), dict(cursor.get("failed", {})),
                   dict(cursor.get("launch_epochs", {})), dict(cursor.get("cancelling", {})),
                   {m: [list(r) for r in rows] for m, rows in cursor.get("model_obs", {}).items()},
                   {m: list(v) for m, v in cursor.get("model_gns", {}).items()},
                   {r: list(v) for r, v in cursor.get("resizing", {}).items()},
                   {k: [list(r) for r in rows] for k, rows in cursor.get("change_costs", {}).items()},
                   {m: float(s) for m, s in cursor.get("model_epoch_end", {}).items()})

    def remember(self, model: str, obs: Sequence[ThroughputObs]) -> None:
        """Keep ``obs`` as the newest step times of ``model`` (``core.model_memory.remember``)."""
        model_memory.remember(self.model_obs, model, obs)

    def prior_obs(self, model: str) -> tuple[ThroughputObs, ...]:
        return model_memory.recalled(self.model_obs, model)

    def remember_noise(self, model: str, samples_done: float, gns: float | None) -> None:
        """Keep ``gns`` when measured earlier in training than ``model``'s kept one (``remember_noise``)."""
        model_memory.remember_noise(self.model_gns, model, samples_done, gns)

    def prior_gns(self, model: str) -> float | None:
        return model_memory.recalled_noise(self.model_gns, model)


@dataclass
class _Current:
    """The schedule in force (slot indices) and the run holding each job's allocation."""

    allocations: dict[str, Allocation]
    runs: dict[str, RunInfo]
    by_job: dict[str, list[RunInfo]]


def plan_tick(inputs: TickInputs, settings: SchedulerSettings | None = None) -> TickPlan:
    """Decide one tick: the steps in order, each a function below."""
    settings = settings or SchedulerSettings()
    plan = TickPlan()
    state = _State.from_cursor(inputs.cursor)
    quarantine(inputs, state, plan)
    current = current_schedule(inputs, state, plan)
    for job, events in sorted(inputs.change_events.items()):  # what the changes the jobs' events show cost
        change_costs.remember(state.change_costs, change_costs.measure(job, events, current.by_job.get(job, [])))
    views, spec_changed = job_views(inputs, settings, current, state, plan)
    in_force, new, policy = decide(inputs, settings, current, views, spec_changed, plan)
    runs = {job: run for job, run in current.runs.items() if job in in_force.allocations}
    stopping = stopped(in_force, new, Slots(settings.launcher, inputs.device, inputs.slot_ids),
                       {job: run.status for job, run in runs.items()}, spec_changed)
    young = young_runs(inputs.now, settings.min_hold_s, {job: run.created_s for job, run in runs.items()}, stopping,
                       {job for job, run in runs.items() if run.run_id in state.resizing})  # job -> why it is held
    ending = {job for job in runs if job not in spec_changed and done_training(inputs, job)}  # left to end
    new = keep_stopped_for_nothing(hold_young_runs(new, in_force, young), in_force,
                                   {v.name for v in views} - spec_changed, ending)
    diff_into_cancels_and_starts(inputs, settings, current, new, {v.name for v in views}, spec_changed, state, plan,
                                 views)
    plan.waiting = waiting_reasons(new, [v.name for v in views], inputs.slot_ids, inputs.device)
    plan.idle = idle_reasons(views, inputs.cluster, new, young)
    plan.policy_state = policy.to_dict()
    plan.policy_ref = policy_ref(plan.policy_state)
    plan.cursor = _cursor(inputs, policy, state, [v.name for v in views])
    return plan


def quarantine(inputs: TickInputs, state: _State, plan: TickPlan) -> None:
    """The tick's boundary: a spec with a number outside its range (``core.limits.spec_problem``: NaN, inf,
    1e20 GPUs; the loaders refuse these, this holds for a spec from any source) would make the policy fail
    for every job, so its job is marked failed with the reason and the others are scheduled. A quarantined
    job whose spec changes since is looked at again."""
    for job, spec in inputs.specs.items():
        if job in inputs.finished:
            continue
        h = spec_hash(spec)
        if state.failed.get(job, "").startswith(QUARANTINED) and state.hashes.get(job) != h:
            del state.failed[job]  # its file changed: judged afresh below
        problem = spec_problem(spec)
        if problem is None or job in state.failed:
            continue
        state.failed[job] = plan.newly_failed[job] = f"{QUARANTINED}: {problem}"
        state.hashes[job] = h
    plan.quarantined = {j: why for j, why in state.failed.items() if why.startswith(QUARANTINED) and j in inputs.specs}


def progress_wanted(specs: Mapping[str, Any], finished: Iterable[str], cursor: Mapping[str, Any]) -> set[str]:
    """The jobs whose progress a tick reads from MLflow: every unfinished job, and the jobs the last tick's
    policy saw that have finished since (cursor ``viewed``), so that the step times they measured after
    that tick (a short job re-tunes its batch several times in one tick) are remembered for their model's
    next jobs (``job_views``) before they leave the view."""
    return (set(specs) - set(finished)) | (set(finished) & set(cursor.get("viewed", ())) & set(specs))


def _cancel_pending(inputs: TickInputs, state: _State, run_id: str) -> bool:
    """True when a tick cancelled ``run_id`` less than ``CANCEL_PENDING_S`` ago: its apply run is on it (the
    step checkpoints, the run ends), so later ticks neither cancel it again nor record the decision again."""
    return inputs.now - state.cancelling.get(run_id, -float("inf")) < CANCEL_PENDING_S


def _add_cancel(inputs: TickInputs, state: _State, plan: TickPlan, run: RunInfo, reason: str) -> None:
    if not _cancel_pending(inputs, state, run.run_id):
        plan.cancels.append(Cancel(run.run_id, run.job, run.generation, reason))
        state.cancelling[run.run_id] = round(inputs.now, 2)


def current_schedule(inputs: TickInputs, state: _State, plan: TickPlan) -> _Current:
    """Each job's newest in-flight run is its allocation; older in-flight runs, runs of finished, removed or
    failed jobs, and runs on slots outside the inventory are cancelled."""
    index_of = {s: i for i, s in enumerate(inputs.slot_ids)}
    by_job: dict[str, list[RunInfo]] = {}
    for r in inputs.runs:
        by_job.setdefault(r.job, []).append(r)
    for rs in by_job.values():
        rs.sort(key=lambda r: (r.generation, r.created_s))
    allocations: dict[str, Allocation] = {}
    runs: dict[str, RunInfo] = {}
    for job, rs in by_job.items():
        live = [r for r in rs if r.in_flight]
        if not live:
            continue
        newest = live[-1]
        for stale in live[:-1]:
            _add_cancel(inputs, state, plan, stale, "superseded by a newer generation")
        if job in inputs.finished or job not in inputs.specs or job in state.failed:
            why = "finished" if job in inputs.finished else "spec removed" if job not in inputs.specs else "job failed"
            _add_cancel(inputs, state, plan, newest, why)
            continue
        slot_ids = _pending_slots(inputs, state, newest)
        slots = [index_of[s] for s in slot_ids if s in index_of]
        if len(slots) != len(slot_ids) or not slots:
            _add_cancel(inputs, state, plan, newest, "holds slots outside the inventory")
            continue
        batch = max(newest.global_batch, 1)
        # The LR follows the batch by the core rule (the run's allocation was made with it).
        allocations[job] = Allocation(job, tuple(slots), batch, lr_for_batch(inputs.specs[job], batch))
        runs[job] = newest
    return _Current(allocations, runs, by_job)


def _pending_slots(inputs: TickInputs, state: _State, run: RunInfo) -> tuple[int, ...]:
    """The run's slots: those an in-place change a committed tick asked for, until its allocation shows them (or
    the request is older than ``CANCEL_PENDING_S``: its apply run did not carry it out), else its allocation's."""
    asked = state.resizing.get(run.run_id)
    if asked is None or tuple(asked[1]) == run.slot_ids or inputs.now - asked[0] >= CANCEL_PENDING_S:
        state.resizing.pop(run.run_id, None)
        return run.slot_ids
    return tuple(int(s) for s in asked[1])


def job_views(inputs: TickInputs, settings: SchedulerSettings, current: _Current, state: _State,
              plan: TickPlan) -> tuple[list[JobView], set[str]]:
    """The policy's view of every active job (submitted, not finished, not failed, not backing off after a
    failure), and the running jobs whose spec file changed."""
    views: list[JobView] = []
    spec_changed: set[str] = set()
    # what each kind of change costs here: measured, else the prior; a restart where the launcher cannot resize
    costs = change_costs.costs(state.change_costs, resizes_in_place(settings.launcher, inputs.device))
    for job, pr in inputs.progress.items():  # remembered for later jobs of the same model
        if pr.throughput_obs and job in inputs.specs:
            state.remember(inputs.specs[job].model, pr.throughput_obs)
            state.remember_noise(inputs.specs[job].model, pr.samples_done, pr.grad_noise_scale)
        if pr.epoch_end_s and job in inputs.specs:
            state.model_epoch_end[inputs.specs[job].model] = float(pr.epoch_end_s)
    for job, spec in inputs.specs.items():
        if job in inputs.finished or job in state.failed:
            continue
        state.submit.setdefault(job, round(inputs.now, 2))  # first seen; 10 ms is plenty (the cursor shows it)
        h = spec_hash(spec)
        if state.hashes.get(job) not in (None, h) and job in current.allocations:
            spec_changed.add(job)
        state.hashes[job] = h
        rs = current.by_job.get(job, [])
        if job not in current.allocations and _backing_off(inputs.now, job, rs, settings, state, plan):
            continue
        views.append(_view(inputs, job, spec, rs, current, state, costs))
    return views, spec_changed


def _backing_off(now: float, job: str, runs: Sequence[RunInfo], settings: SchedulerSettings, state: _State,
                 plan: TickPlan) -> bool:
    """True while a job that failed waits out its backoff, or once its retries are exhausted (marked failed).
    A failure of the machinery (its run worker killed or restarted: ``RunInfo.infra_failure``) waits the
    base backoff but uses up no retry; only ``INFRA_RETRY_FACTOR`` times as many of those end the job."""
    failures = [r for r in runs if r.status in ENDED_BAD]
    if not failures:
        return False
    last = failures[-1]
    own = [r for r in failures if not r.infra_failure]
    infra_limit = INFRA_RETRY_FACTOR * max(settings.max_retries, 1)
    exhausted = ((len(own), "failed runs", settings.max_retries) if len(own) > settings.max_retries else
                 (len(failures) - len(own), "runs whose run worker died", infra_limit)
                 if len(failures) - len(own) > infra_limit else None)
    if exhausted is not None:
        count, kind, limit = exhausted
        state.failed[job] = f"{count} {kind} (last {last.run_id}); retries exhausted ({limit})"
        plan.newly_failed[job] = state.failed[job]
        return True
    ended_s = last.end_s or last.created_s
    return now - ended_s < settings.retry_backoff_s * 2 ** max(len(own) - 1, 0)


def _view(inputs: TickInputs, job: str, spec: JobSpec, runs: Sequence[RunInfo], current: _Current,
          state: _State, costs: Mapping[str, float]) -> JobView:
    pr = inputs.progress.get(job, ProgressInfo())
    ran = [r for r in runs if r.start_s is not None]
    status = JobStatus.RUNNING if job in current.allocations else JobStatus.PAUSED if ran else JobStatus.PENDING
    cur = current.runs.get(job)
    now = inputs.now
    return JobView(
        spec=spec, status=status, submit_time_s=state.submit[job], samples_done=pr.samples_done,
        progress_samples=pr.samples_done, throughput_obs=pr.throughput_obs, loss_history=pr.loss_history,
        accuracy_history=pr.accuracy_history, initial_loss=pr.loss_history[0][1] if pr.loss_history else None,
        grad_noise_scale=pr.grad_noise_scale, epoch_end_s=pr.epoch_end_s or state.model_epoch_end.get(spec.model, 0.0),
        restarts=max(pr.restarts, len(ran) - 1, 0),
        attained_gpu_s=sum(slot_seconds(r, inputs.ledgers.get(job, ()), now) for r in ran),  # in-place changes too
        run_time_s=sum(r.held_s(now) for r in ran),
        last_change_s=max(cur.start_s or cur.created_s, cur.resized_s or 0.0) if cur else None,
        epochs_at_last_change=state.launch_epochs.get(job, 0.0),
        max_gpus_seen=max((len(r.slot_ids) for r in ran), default=0),
        model_obs=state.prior_obs(spec.model),
        model_gns=None if pr.throughput_obs else state.prior_gns(spec.model), change_costs=dict(costs))


def policy_ref(state: Mapping[str, Any]) -> str:
    """The name of a saved policy state: a hash of its content (the cursor holds only this)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _policy(saved: Mapping[str, Any] | None, settings: SchedulerSettings) -> Policy:
    """The configured policy, carrying on a saved search state when that was made by the same policy with
    the same (complete, defaults included) parameters and seed."""
    policy = make_policy(settings.policy, seed=settings.seed, **dict(settings.params))
    mine = policy.to_dict()
    if saved and saved.get("name") == mine["name"] and saved.get("seed") == mine["seed"] \
            and dict(saved.get("params", {})) == dict(mine["params"]):
        try:
            policy.load_state(saved.get("state", {}))
        except (KeyError, TypeError, ValueError):
            policy = make_policy(settings.policy, seed=settings.seed, **dict(settings.params))  # another version
    return policy


def decide(inputs: TickInputs, settings: SchedulerSettings, current: _Current, views: Sequence[JobView],
           spec_changed: set[str], plan: TickPlan) -> tuple[Schedule, Schedule, Policy]:
    """The policy's new schedule, validated; also the schedule handed to it (active jobs whose spec did not
    change) and the policy (its state goes into the cursor)."""
    active = {v.name for v in views}
    in_force = Schedule({j: a for j, a in current.allocations.items() if j in active and j not in spec_changed})
    saved = inputs.policy_state if inputs.policy_state is not None else inputs.cursor.get("policy")  # pre-v2 cursors
    policy = _policy(saved, settings)
    t0 = time.perf_counter()
    new = policy.decide(inputs.now, inputs.cluster, views, in_force) if views else Schedule({})
    plan.decide_s = time.perf_counter() - t0
    new.validate(inputs.cluster, {v.name: v.spec for v in views})
    return in_force, new, policy


def done_training(inputs: TickInputs, job: str) -> bool:
    """MLflow shows the job's whole sample budget trained (an epochs or samples rule): its run is ending and
    will materialize; a new allocation would pay a start-up to train nothing."""
    spec, pr = inputs.specs.get(job), inputs.progress.get(job)
    total = spec.stopping.total_samples(spec.dataset_size) if spec is not None else None
    return pr is not None and total is not None and pr.samples_done >= total - 1e-9


def _changed_jobs(inputs: TickInputs, current: _Current, new: Schedule, active: set[str],
                  spec_changed: set[str]) -> list[str]:
    """Active jobs whose slots or batch change, or whose running spec changed, in name order; a running job
    that has trained its whole budget is left to end (``done_training``)."""
    ids = inputs.slot_ids
    out = []
    for job in sorted(set(current.allocations) | set(new.allocations)):
        if job not in active or (job in current.allocations and job not in spec_changed
                                 and done_training(inputs, job)):
            continue
        before, after = current.allocations.get(job), new.allocations.get(job)
        before_ids = tuple(ids[i] for i in before.gpus) if before else ()
        after_ids = tuple(ids[i] for i in after.gpus) if after else ()
        if job in spec_changed or sorted(before_ids) != sorted(after_ids) or batch_change(before, after):
            out.append(job)
    return out


def diff_into_cancels_and_starts(inputs: TickInputs, settings: SchedulerSettings, current: _Current, new: Schedule,
                                 active: set[str], spec_changed: set[str], state: _State, plan: TickPlan,
                                 views: Sequence[JobView] = ()) -> None:
    """Change the slots of a running job in place where its launcher can (``scheduler.in_place``: a ``Resize``
    of its run, same generation); otherwise cancel its run and launch its new allocation as the next
    generation; one decision record per change, with its path and the numbers behind it (``rationale``)."""
    ids = inputs.slot_ids
    changed_jobs = _changed_jobs(inputs, current, new, active, spec_changed)

    def slot_ids(alloc: Allocation | None) -> tuple[int, ...]:
        return tuple(ids[i] for i in alloc.gpus) if alloc else ()

    blocked = {job: not_in_place(settings.launcher, inputs.device, slot_ids(current.allocations[job]),
                                 slot_ids(new.allocations[job]), current.runs[job].status) for job in changed_jobs
               if job in current.allocations and job in new.allocations and job not in spec_changed}
    whys = explain(views, inputs.cluster, Schedule(dict(current.allocations)), new, changed_jobs,
                   {j: b is None for j, b in blocked.items()}) if views else {}
    for job in changed_jobs:
        before, after = current.allocations.get(job), new.allocations.get(job)
        run = current.runs.get(job)
        if before is not None and _cancel_pending(inputs, state, run.run_id):
            continue  # an earlier tick's apply run is cancelling it (and launched the next generation): not again
        before_ids, after_ids = slot_ids(before), slot_ids(after)
        reason = describe_change(before_ids, after_ids, bool(current.by_job.get(job)), job in spec_changed)
        path = CHECKPOINT if before is not None else ""
        if job in blocked:
            path = CHECKPOINT if blocked[job] else IN_PLACE
            reason += " in place" if not blocked[job] else f" through a checkpoint ({blocked[job]})"
            if not blocked[job]:
                after_ids = rank_order(inputs.device, before_ids, after_ids)
        why = whys.get(job)
        if why is not None and why.text():
            reason = f"{reason}: {why.text()}"
        batch = _start_batch(inputs.specs[job], after, len(after_ids)) if after is not None else 0
        if path == IN_PLACE:
            lr = after.lr if batch == after.global_batch else lr_for_batch(inputs.specs[job], batch)
            plan.resizes.append(Resize(run.run_id, job, run.generation, before_ids, after_ids, batch, float(lr),
                                       inputs.device, f"{settings.policy}: {reason}", round(inputs.now, 3)))
            state.resizing[run.run_id] = [round(inputs.now, 2), list(after_ids)]
        else:
            if before is not None:
                _add_cancel(inputs, state, plan, run, reason)
            if after is not None:
                spec = inputs.specs[job]
                generation = max((r.generation for r in current.by_job.get(job, [])), default=-1) + 1
                allocation = RunAllocation.make(spec, after_ids, inputs.device, batch, generation,
                                                state.submit[job], lr=after.lr if batch == after.global_batch
                                                else None, tune_batch=after.batch_tuned_by_job)
                plan.launches.append(Launch(allocation, f"{settings.policy}: {reason}", before_ids))
                pr = inputs.progress.get(job)
                state.launch_epochs[job] = round(pr.samples_done / spec.dataset_size, 3) if pr else 0.0
        tuned = after is not None and after.batch_tuned_by_job
        gns = next((v.grad_noise_scale for v in views if v.name == job), None) if tuned else None
        plan.decisions.append(Decision(inputs.now, job, before_ids, after_ids, batch, reason,
                                       why.to_dict() if why is not None else None, tuned, gns, path))


def _start_batch(spec: JobSpec, after: Allocation, n: int) -> int:
    """The global batch a generation (or an in-place change) starts with: the policy's, within the cap and,
    per process, within max_per_gpu_batch (a user's script on ``batches()`` cannot accumulate gradients; one
    on ``steps()``, the built-in ones, re-tunes above it in-process)."""
    batch = min(int(after.global_batch), spec.global_batch_cap)
    return min(batch, spec.max_per_gpu_batch * n) if spec.max_per_gpu_batch is not None else batch


def _cursor(inputs: TickInputs, policy: Policy, state: _State, viewed: Sequence[str] = ()) -> dict[str, Any]:
    live_jobs = set(inputs.specs) | set(inputs.finished)
    return {
        "version": CURSOR_VERSION,
        "submit": {j: t for j, t in state.submit.items() if j in live_jobs},
        "spec_hash": {j: h for j, h in state.hashes.items() if j in inputs.specs},
        "failed": state.failed,
        "launch_epochs": {j: e for j, e in state.launch_epochs.items() if j in inputs.specs},
        "cancelling": {r: t for r, t in state.cancelling.items() if inputs.now - t < CANCEL_PENDING_S},
        "model_obs": state.model_obs,
        "model_gns": state.model_gns,
        "resizing": {r: v for r, v in state.resizing.items() if inputs.now - v[0] < CANCEL_PENDING_S},
        "change_costs": state.change_costs,  # what each kind of change measured here (``measure_changes``)
        "model_epoch_end": state.model_epoch_end,
        "viewed": sorted(viewed),  # jobs this tick's policy saw: the next tick reads the finished ones' progress
    }
