"""Event-driven simulator: replays a workload under a policy with measured ground truth.

One scheduling round every ``interval_s`` (policies see the cluster only at round boundaries, as in
the Pollux authors' simulator). Between rounds each running job advances at its true goodput; a job
whose allocation changed makes no progress for its ``restart_cost_s`` (checkpoint + restart), but
holds its GPUs meanwhile. A job that finishes inside a round frees its GPUs at the next round.

Goodput inside a round: when the job's ground truth says where its efficiency changes
(``truth.next_rate_change``, e.g. the Pollux profiles change gradient statistics at each epoch end) and
``SimConfig.rate_changes_within_round`` is on (default), the round is split at those points and each piece
runs at its own goodput, as the Pollux authors' simulator re-evaluates goodput at every epoch boundary
(``Job.step``). Otherwise the goodput at the start of the round holds for the whole round. With
``SimConfig.whole_second_epochs`` (off by default) the time to each epoch end (``truth.next_epoch_end``)
is rounded to whole seconds, which the Pollux simulator also does; it exists to reproduce that simulator's
numbers and models nothing physical.

Batch: a job trains its allocation's global batch split into per-GPU micro-batches and accumulation
steps by ``truth.split_batch(gpus, batch)`` when the truth has it (the Pollux profiles: the Pollux
simulator's rule), else ceil(batch / GPUs) per GPU with accumulation beyond ``truth.max_local_batch``.

The simulator is policy-agnostic: it only calls ``policy.decide`` and validates what comes back.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ones_pipeline.core import model_memory
from ones_pipeline.core.goodput import GoodputModel, batch_limits, split_for
from ones_pipeline.core.policies import Policy
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
from ones_pipeline.sim.change_costs import ChangeCosts, change_kind
from ones_pipeline.sim.truth import MAX_ARRIVAL_S, SimJob

# A workload that has not finished after this much simulated time is reported as a policy failure.
DEFAULT_MAX_TIME_S = 2 * MAX_ARRIVAL_S  # 60 days


@dataclass(frozen=True)
class SimConfig:
    interval_s: float = 60.0
    restart_cost_s: float | None = None  # None: each job type's own (truth.restart_cost_s)
    # Per job type (JobSpec.model) restart costs; they win over restart_cost_s for those models.
    restart_cost_by_model: Mapping[str, float] = field(default_factory=dict)
    max_time_s: float = DEFAULT_MAX_TIME_S
    # Split rounds where the truth's efficiency changes (truth.next_rate_change); False: one rate per round.
    rate_changes_within_round: bool = True
    # Count the time to each epoch end (truth.next_epoch_end) in whole seconds, as the Pollux authors'
    # simulator does (Job.step rounds it); off: exact times.
    whole_second_epochs: bool = False
    # The gradient noise scale a job reports: measured at the batch it trains with (True, as the Pollux
    # authors' simulator hands its policy), or the base-batch statistics whatever the batch (False; the
    # rule before, kept to measure its effect).
    gns_at_current_batch: bool = True
    # Jobs that have measured nothing yet see the step times earlier jobs of their model measured
    # (``JobView.model_obs``, kept by ``core.model_memory`` as the live scheduler keeps them); False: they
    # see nothing (the rule before, kept to measure its effect).
    model_memory: bool = True
    # Seconds without training per kind of change (start, in-place grow / shrink, checkpoint restart) and the
    # policies whose environment resizes in place (``sim.change_costs``; ``PRESETS["pollux"]``: 30 s for all).
    change_costs: ChangeCosts = ChangeCosts()

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.restart_cost_s is not None and self.restart_cost_s < 0:
            raise ValueError(f"restart_cost_s must be >= 0, got {self.restart_cost_s}")
        bad = {m: c for m, c in self.restart_cost_by_model.items() if not c >= 0}
        if bad:
            raise ValueError(f"restart_cost_by_model values must be >= 0, got {bad}")
        object.__setattr__(self, "restart_cost_by_model", dict(self.restart_cost_by_model))

    def restart_cost_for(self, model: str, truth_cost: float) -> float:
        if model in self.restart_cost_by_model:
            return float(self.restart_cost_by_model[model])
        return float(self.restart_cost_s) if self.restart_cost_s is not None else float(truth_cost)

    def costs_for(self, model: str, truth_cost: float, policy: str) -> dict[str, float]:
        """Seconds per kind of change (``change_costs.KINDS``) for a job of ``model`` under ``policy``."""
        return self.change_costs.costs(self.restart_cost_for(model, truth_cost), policy in self.change_costs.in_place)


@dataclass
class JobRecord:
    """Outcome of one job."""

    name: str
    model: str
    submit_s: float
    first_start_s: float | None = None
    finish_s: float | None = None
    restarts: int = 0  # allocation changes after the first start (preemptions, resizes, moves)
    in_place: int = 0  # ... of which made in place (``change_costs``: grow, shrink)
    gpu_s: float = 0.0  # GPU-seconds held
    run_s: float = 0.0  # wall seconds holding GPUs
    samples: float = 0.0
    requested_gpus: int = 0
    max_gpus: int = 0

    @property
    def jct_s(self) -> float:
        return (self.finish_s if self.finish_s is not None else math.nan) - self.submit_s

    @property
    def wait_s(self) -> float:
        return (self.first_start_s if self.first_start_s is not None else math.nan) - self.submit_s


@dataclass
class SimResult:
    policy: str
    cluster: Cluster
    jobs: list[JobRecord]
    # (time_s, job, num_gpus) every time a job's GPU count changes (0 = released).
    timeline: list[tuple[float, str, int]]
    makespan_s: float
    busy_gpu_s: float
    decide_s: list[float] = field(default_factory=list)  # wall time of each decide call

    @property
    def utilisation(self) -> float:
        span = self.makespan_s - min(j.submit_s for j in self.jobs) if self.jobs else 0.0
        return self.busy_gpu_s / (self.cluster.num_gpus * span) if span > 0 else 0.0


class _Running:
    __slots__ = ("spec", "truth", "status", "progress", "samples", "record", "alloc", "blocked_until",
                 "obs", "loss_hist", "acc_hist", "next_epoch", "max_gpus_seen", "last_change_s",
                 "epochs_at_change", "attained_gpu_s", "initial_loss", "gns", "tuned", "model", "costs", "in_place")

    def __init__(self, job: SimJob, config: SimConfig, policy: str):
        # Seconds per kind of change, and whether its policy's environment resizes in place.
        self.costs = config.costs_for(job.spec.model, job.truth.restart_cost_s, policy)
        self.in_place = policy in config.change_costs.in_place
        self.spec = job.spec
        self.truth = job.truth
        self.model = GoodputModel()  # the job's own goodput model and fits (its batch tuner's, as live)
        self.status = JobStatus.PENDING
        self.progress = 0.0
        self.samples = 0.0
        self.record = JobRecord(job.spec.name, job.spec.model, job.spec.submit_time_s,
                                requested_gpus=job.spec.requested_gpus)
        self.alloc: Allocation | None = None
        self.blocked_until = 0.0
        self.obs: dict[tuple, ThroughputObs] = {}
        self.loss_hist: list[tuple[float, float]] = []
        self.acc_hist: list[tuple[float, float]] = []
        self.next_epoch = 1
        self.max_gpus_seen = 0
        self.last_change_s: float | None = None
        self.epochs_at_change = 0.0
        self.attained_gpu_s = 0.0
        self.initial_loss = float(job.truth.metrics(0.0)[0])
        self.gns: float | None = None  # gradient noise scale the job measured where it last ran
        self.tuned: tuple[int, int] | None = None  # (micro-batch, accum steps) the job chose itself

    def view(self, memory: _ModelMemory | None = None) -> JobView:
        """The policy's view; ``memory``: the model memory (its step times always, its noise scale only while
        the job has measured nothing), as the live tick's views carry it."""
        recall = memory is not None and not self.obs
        return JobView(
            spec=self.spec, status=self.status, submit_time_s=self.spec.submit_time_s,
            samples_done=self.samples, progress_samples=self.progress,
            throughput_obs=tuple(self.obs.values()),
            grad_noise_scale=self.gns,
            loss_history=tuple(self.loss_hist), accuracy_history=tuple(self.acc_hist),
            initial_loss=self.initial_loss, restarts=self.record.restarts,
            attained_gpu_s=self.attained_gpu_s, run_time_s=self.record.run_s,
            last_change_s=self.last_change_s, epochs_at_last_change=self.epochs_at_change,
            max_gpus_seen=self.max_gpus_seen, change_costs=self.costs,
            model_obs=model_memory.recalled(memory.obs, self.spec.model) if memory is not None else (),
            model_gns=model_memory.recalled_noise(memory.noise, self.spec.model) if recall else None,
        )


@dataclass
class _ModelMemory:
    """What the jobs of each model measured, kept for the model's next jobs as the live tick keeps it
    (``core.model_memory``): step times per configuration, and the noise scale measured earliest in training."""

    obs: dict[str, list] = field(default_factory=dict)
    noise: dict[str, list[float]] = field(default_factory=dict)

    def remember(self, r: _Running) -> None:
        """What ``r`` has measured, as ``scheduler.tick.job_views`` remembers a job that reports step times."""
        if r.obs:  # a job reports its noise scale with its first step times (``_advance``), never before
            model_memory.remember(self.obs, r.spec.model, r.obs.values())
            model_memory.remember_noise(self.noise, r.spec.model, r.samples, r.gns)


def _split(job: _Running) -> tuple[int, int, int]:
    """(GPUs, per-GPU micro-batch, accumulation steps) of a running job: the truth's own rule
    (``truth.split_batch``) when it has one, else ceil(batch / GPUs) per GPU with accumulation beyond
    ``max_local_batch``."""
    alloc = job.alloc
    n = alloc.num_gpus
    if job.tuned is not None:
        return n, job.tuned[0], job.tuned[1]
    split = getattr(job.truth, "split_batch", None)
    if split is not None:
        micro, accum = split(n, alloc.global_batch)
        return n, int(micro), int(accum)
    local = math.ceil(alloc.global_batch / n)
    accum = max(math.ceil(local / job.truth.max_local_batch) - 1, 0)
    return n, math.ceil(local / (accum + 1)), accum


def _batch(job: _Running) -> int:
    """Global batch a running job really trains with (GPUs x micro-batch x micro-steps)."""
    n, micro, accum = _split(job)
    return n * micro * (accum + 1)


def _rate(job: _Running, cluster: Cluster, at_progress: float | None = None,
          others: int = 0) -> tuple[float, float, ThroughputObs]:
    """(base-equivalent samples/s, raw samples/s, observation) of a running job, with the efficiency
    at ``at_progress`` (default: its progress now); ``others``: GPUs other jobs hold on its nodes, for a truth
    whose step time depends on them (``step_time_among``: processes sharing a host's cores)."""
    alloc = job.alloc
    n, micro, accum = _split(job)
    placement = cluster.placement(alloc.gpus)
    among = getattr(job.truth, "step_time_among", None)
    step, sync = among(placement, micro, others) if among is not None else job.truth.step_time(placement, micro)
    total_step = step + accum * (step - sync)
    batch = n * micro * (accum + 1)
    raw = batch / total_step
    eff = float(job.truth.efficiency(job.progress if at_progress is None else at_progress, batch))
    obs = ThroughputObs(n, len(placement), micro, float(step), float(sync))
    return raw * eff, raw, obs


def _retune(job: _Running, cluster: Cluster) -> None:
    """A job that tunes its own batch (``Allocation.batch_tuned_by_job``) picks its goodput-optimal batch
    for the GPUs it holds from what it has measured (``core.goodput.job_batch``), without a restart."""
    alloc = job.alloc
    if alloc is None or not alloc.batch_tuned_by_job:
        job.tuned = None
        return
    placement = cluster.placement(alloc.gpus)
    n = alloc.num_gpus
    micro, accum = job.model.batch(job.spec, tuple(job.obs.values()), job.gns, len(placement), n)
    if not job.obs and n * micro * (accum + 1) != alloc.global_batch:
        # Nothing measured yet: the job trains at the batch it was started with, as the live trainer does
        # (``train.batch_tuning``: it re-tunes from its own step times only), e.g. one a policy picked from
        # what its model's earlier jobs measured (``ones_goodput.memory_views``).
        m0, top, _, hi_micro = batch_limits(job.spec)
        m, a = split_for(min(float(alloc.global_batch), top), n, hi_micro, m0)
        micro, accum = int(m), int(a)
    job.tuned = (micro, accum)
    batch = n * micro * (accum + 1)
    if batch != alloc.global_batch:
        job.alloc = replace(alloc, global_batch=batch, lr=lr_for_batch(job.spec, batch))


def simulate(
    workload: Sequence[SimJob],
    policy: Policy,
    cluster: Cluster,
    config: SimConfig = SimConfig(),
    on_round: Callable[[float, int, int], None] | None = None,
) -> SimResult:
    """Run ``workload`` under ``policy`` until every job finishes.

    ``on_round(now_s, finished, total)`` is called after each round (progress bars).
    Raises RuntimeError if the policy returns an infeasible schedule or the workload does not
    finish within ``config.max_time_s``.
    """
    if not workload:
        raise ValueError("workload has no jobs")
    names = [j.spec.name for j in workload]
    if len(set(names)) != len(names):
        raise ValueError("workload has duplicate job names")
    jobs = sorted((_Running(j, config, policy.name) for j in workload),
                  key=lambda r: (r.spec.submit_time_s, r.spec.name))
    specs = {r.spec.name: r.spec for r in jobs}
    interval = config.interval_s
    next_arrival = 0
    active: list[_Running] = []
    finished = 0
    timeline: list[tuple[float, str, int]] = []
    busy_gpu_s = 0.0
    decide_s: list[float] = []
    schedule = Schedule()
    memory = _ModelMemory() if config.model_memory else None
    now = math.floor(jobs[0].spec.submit_time_s / interval) * interval

    while finished < len(jobs):
        if now > config.max_time_s:
            left = [r.spec.name for r in active]
            raise RuntimeError(
                f"policy {policy.name}: {len(left)} jobs unfinished after {config.max_time_s:.0f} s "
                f"simulated (e.g. {left[:5]})"
            )
        while next_arrival < len(jobs) and jobs[next_arrival].spec.submit_time_s <= now:
            active.append(jobs[next_arrival])
            next_arrival += 1
        if not active:
            now = math.floor(jobs[next_arrival].spec.submit_time_s / interval) * interval
            if jobs[next_arrival].spec.submit_time_s > now:
                now += interval
            continue
        new_schedule = _decide(policy, now, cluster, active, schedule, specs, decide_s, memory)
        _apply(active, new_schedule, now, cluster, config, timeline)
        end = now + interval
        active, done, busy_gpu_s = _run_round(active, now, end, cluster, config, timeline, busy_gpu_s, memory)
        finished += done
        schedule = Schedule({r.spec.name: r.alloc for r in active if r.alloc is not None})
        now = end
        if on_round is not None:
            on_round(now, finished, len(jobs))

    records = [r.record for r in jobs]
    makespan = max(r.finish_s for r in records)
    return SimResult(policy.name, cluster, records, timeline, makespan, busy_gpu_s, decide_s)


def _decide(policy: Policy, now: float, cluster: Cluster, active: Sequence[_Running], schedule: Schedule,
            specs: Mapping[str, JobSpec], decide_s: list[float], memory: _ModelMemory | None = None) -> Schedule:
    """The policy's schedule for this round (its wall time appended to ``decide_s``), checked: only active
    jobs, no GPU twice, caps respected; RuntimeError otherwise. ``memory`` (model memory, or None): first
    updated with every active job's step times and noise scale, as the live scheduler's tick does."""
    if memory is not None:
        for r in active:
            memory.remember(r)
    views = [r.view(memory) for r in active]
    t0 = _time.perf_counter()
    new_schedule = policy.decide(now, cluster, views, schedule)
    decide_s.append(_time.perf_counter() - t0)
    active_names = {r.spec.name for r in active}
    unknown = set(new_schedule.allocations) - active_names
    if unknown:
        raise RuntimeError(f"policy {policy.name} allocated GPUs to inactive jobs {sorted(unknown)[:5]}")
    try:
        new_schedule.validate(cluster, specs)
    except ValueError as exc:
        raise RuntimeError(f"policy {policy.name} returned an infeasible schedule at t={now}: {exc}") from exc
    return new_schedule


def _apply(active: Sequence[_Running], new_schedule: Schedule, now: float, cluster: Cluster, config: SimConfig,
           timeline: list[tuple[float, str, int]]) -> None:
    """Give every active job its new allocation: a changed one (started, resized, moved, resumed) pays the
    cost of its kind of change (``change_costs``) and is recorded in ``timeline``, as is a preempted one; a
    job tuning its own batch re-tunes."""
    for r in active:
        old, new = r.alloc, new_schedule.allocations.get(r.spec.name)
        if old is not None and new is not None and old.gpus == new.gpus and (
                old.global_batch == new.global_batch or (old.batch_tuned_by_job and new.batch_tuned_by_job)):
            if new.batch_tuned_by_job:
                _retune(r, cluster)  # re-tuned at every round (what it measured last round is in)
            else:
                r.alloc = new
            continue
        if old is None and new is None:
            continue
        if new is not None:
            kind = change_kind(old.gpus if old else (), new.gpus, r.record.first_start_s is not None, r.in_place)
            if r.record.first_start_s is None:
                r.record.first_start_s = now
            else:  # a resize, a move, or a resume after preemption
                r.record.restarts += 1
                r.record.in_place += kind in ("grow", "shrink")
            r.blocked_until = now + r.costs[kind]
            r.status = JobStatus.RUNNING
            r.max_gpus_seen = max(r.max_gpus_seen, new.num_gpus)
        else:
            r.status = JobStatus.PAUSED
        r.alloc = new
        _retune(r, cluster)
        r.last_change_s = now
        r.epochs_at_change = r.samples / r.spec.dataset_size
        timeline.append((now, r.spec.name, new.num_gpus if new else 0))


def _run_round(active: Sequence[_Running], now: float, end: float, cluster: Cluster, config: SimConfig,
               timeline: list[tuple[float, str, int]], busy_gpu_s: float,
               memory: _ModelMemory | None = None) -> tuple[list[_Running], int, float]:
    """Advance every running job from ``now`` to ``end``: ``(jobs still active, jobs that finished, busy
    GPU-seconds so far)``, the busy GPU-seconds added job by job to ``busy_gpu_s``; finished jobs are
    recorded in ``timeline`` and, with ``memory``, remembered for their model's next jobs."""
    still: list[_Running] = []
    finished = 0
    holders = [r for r in active if r.alloc is not None]
    for r in active:
        if r.alloc is None:
            still.append(r)
            continue
        start = max(now, r.blocked_until)
        others = _others_on_nodes(r, holders, cluster) if hasattr(r.truth, "step_time_among") else 0
        held_until = _advance(r, cluster, start, end, config, others) if start < end else end
        held = held_until - now
        n = r.alloc.num_gpus
        r.record.gpu_s += n * held
        r.record.run_s += held
        r.attained_gpu_s += n * held
        busy_gpu_s += n * held
        if r.progress >= r.truth.total_progress * (1 - 1e-12):
            r.record.finish_s = held_until
            r.record.samples = r.samples
            r.record.max_gpus = r.max_gpus_seen
            r.status = JobStatus.FINISHED
            timeline.append((held_until, r.spec.name, 0))
            finished += 1
            if memory is not None:  # what it measured since the last decision, as the live tick reads a job
                memory.remember(r)  # that finished since its last tick (``scheduler.tick.progress_wanted``)
        else:
            still.append(r)
    return still, finished, busy_gpu_s


def _others_on_nodes(r: _Running, holders: Sequence[_Running], cluster: Cluster) -> int:
    """GPUs the other jobs holding GPUs this round (starting ones too) hold on ``r``'s nodes."""
    nodes = {int(cluster.node_of[g]) for g in r.alloc.gpus}
    return sum(int(cluster.node_of[g]) in nodes for o in holders if o is not r for g in o.alloc.gpus)


def _advance(r: _Running, cluster: Cluster, start: float, end: float, config: SimConfig, others: int = 0) -> float:
    """Train running job ``r`` from ``start`` to ``end`` (or to its completion); return when it stops
    holding its GPUs (``end``, or its completion time).

    The round is cut into pieces at the points where the job's goodput changes
    (``truth.next_rate_change``, with ``config.rate_changes_within_round``) and, with
    ``config.whole_second_epochs``, at its epoch ends (``truth.next_epoch_end``); without either the
    goodput at ``start`` holds until ``end``.
    """
    changes = getattr(r.truth, "next_rate_change", None) if config.rate_changes_within_round else None
    adaptive = r.alloc.batch_tuned_by_job
    # Epoch ends cut the round when they are counted in whole seconds, and where a job re-tunes its batch.
    epoch_end = getattr(r.truth, "next_epoch_end", None) if (config.whole_second_epochs or adaptive) else None
    total = r.truth.total_progress
    t = anchor = start
    progress0, samples0 = r.progress, r.samples
    while t < end:
        goal = total  # progress at which this piece ends: completion, a rate change or an epoch end
        nxt = changes(r.progress, _batch(r)) if changes is not None else None
        if nxt is not None:
            goal = min(goal, nxt)
        ee = epoch_end(r.progress) if epoch_end is not None else None
        if ee is not None:
            goal = min(goal, ee)
        # Piecewise-constant efficiency: the rate in force on (progress, goal], i.e. at its middle.
        at = 0.5 * (r.progress + goal) if nxt is not None else None
        rate, raw, obs = _rate(r, cluster, at, others)
        key = (obs.num_gpus, obs.num_nodes, obs.per_gpu_batch)
        if key not in r.obs:  # a job profiles each configuration once, the first time it runs on it
            r.obs[key] = obs
        # What the job's gradient-statistics monitor reports: the noise scale at its batch, now.
        r.gns = float(r.truth.grad_noise_scale(r.progress if at is None else at,
                                               _batch(r) if config.gns_at_current_batch else None))
        remaining = goal - r.progress
        dt = end - t
        if rate * dt < remaining:  # the round ends first
            r.progress += rate * dt
            r.samples += raw * dt
            break
        dt = remaining / rate
        r.progress = goal if (nxt is not None or ee is not None) else r.progress + rate * dt
        r.samples += raw * dt
        t += dt
        if ee is not None and goal >= ee and config.whole_second_epochs:
            # Pollux simulator (Job.step): the time from the last event to an epoch end is whole seconds.
            t = anchor = min(anchor + round(t - anchor), end)
        if goal >= total:
            _record_epochs(r, progress0, samples0)
            return t
        if adaptive and ee is not None and goal >= ee:
            _retune(r, cluster)  # AdaptDL re-tunes the batch after every epoch
    _record_epochs(r, progress0, samples0)
    return end


def _record_epochs(r: _Running, progress0: float, samples0: float) -> None:
    """Append (samples, loss/accuracy) at every epoch end crossed since (progress0, samples0): the
    evaluation a live job logs each epoch. Progress at an epoch end is interpolated linearly in samples."""
    size = r.spec.dataset_size
    while r.next_epoch * size <= r.samples:
        at = r.next_epoch * size
        frac = (at - samples0) / (r.samples - samples0) if r.samples > samples0 else 1.0
        loss, acc = r.truth.metrics(progress0 + frac * (r.progress - progress0))
        r.loss_hist.append((float(at), float(loss)))
        r.acc_hist.append((float(at), float(acc)))
        r.next_epoch += 1
