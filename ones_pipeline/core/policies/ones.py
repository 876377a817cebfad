"""ONES, improved (the default policy ``ones``): the evolutionary batch-size orchestration of Bian et al.
(SC'21) with its weaknesses fixed. ``ones_paper.py`` has the faithful prototype (``ones-paper``).

The search keeps the prototype's shape (a population surviving between rounds, crossover, job removal
and resizing, repair, truncation selection), but:

* fitness is the predicted sum of completion times of **all** active jobs: a scheduled job finishes
  after its restart/resize cost (when its allocation changes) plus remaining work / goodput; a queued
  job waits until enough GPUs free up (jobs served shortest-remaining first), then runs;
* jobs tune their own batch (``Allocation.batch_tuned_by_job``, as under Pollux), and the fitness predicts
  the goodput of the batch each job will pick (``ones_goodput``: Pollux's fitted step-time model and the
  job's noise scale, ``core.goodput.job_batch``) at the node count of its placement; a batch change alone
  costs no restart (``job_batch`` False: the older rule, the better of 1x and 2x the per-GPU batch from
  ``core.throughput``);
* the population is one ``(population, jobs)`` array of GPU counts, evaluated vectorised, warm-started
  from the previous round's population (remapped by job name), the current schedule and a greedy
  seed (optionally a second one, GPU-by-GPU marginal gain on the fitness, and a mutation that moves
  single GPUs between jobs: both off by default, see ``OnesParams``); generations per round are fixed
  (deterministic) and optionally bounded by a wall-clock budget.

The parameters are ``OnesParams``, checked in one place; ``OnesPolicy(seed=..., **params)`` takes them as
keywords.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.placement import free_mask, place_consolidated, place_counts, schedule_from_counts
from ones_pipeline.core.policies.base import (
    PolicyBase,
    PolicyParams,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_probability,
)
from ones_pipeline.core.policies.ones_fitness import OnesContext as _Ctx
from ones_pipeline.core.policies.ones_fitness import fitted_variants
from ones_pipeline.core.policies.ones_fitness import keep_unless_better as _keep_unless_better
from ones_pipeline.core.policies.ones_fitness import transfer as _transfer
from ones_pipeline.core.policies.ones_goodput import (
    current_goodput,
    fixed_batch_table,
    memory_filled_views,
    memory_views,
    placed_goodput,
    pooled_views,
    scale_limits,
    tuned_schedule,
    tuned_table,
)
from ones_pipeline.core.types import Cluster, JobView, Schedule

# The default hold, in multiples of the churn charge ``restart_cost_s``: a job ones changed keeps its count
# somewhat longer than the most a change is charged (150 s at the 120 s default, tuned in the simulator).
HOLD_PER_CHARGE = 1.25


@dataclass(frozen=True)
class OnesParams(PolicyParams):
    """Parameters of ``ones`` (defaults tuned on Pollux workloads 1-4, checked on 5-8 and the ONES trace
    with ``benchmarks/tune_ones.py``), checked on construction.

    ``population`` individuals kept between rounds; ``generations`` per decision, stopped early by
    ``time_budget_s`` when given (live sensors; the simulator leaves it off so decisions are
    reproducible); ``crossover_p`` uniform crossover; ``removal_p`` / ``resize_p`` expected job removals /
    resizes (x2, /2; also +1, -1 with ``fine_resize``) per 4 jobs of a child; ``transfer_p`` the
    probability that a child also moves one GPU from one of its jobs to another (total unchanged);
    ``marginal_seed``: a third seed individual, GPUs handed out by marginal gain on the fitness
    (``OnesContext.marginal_greedy``). Both find the fitness's optimum more often (docs/ones_policy.md)
    but are off: the simulated mean JCT got worse with them (the odd counts they reach fragment the
    nodes, which the fitness does not model). ``restart_cost_s`` charged
    to every job whose GPU count changes (x ``shrink_cost_factor`` when it shrinks: it will likely grow
    back, a second restart); larger than the 30 s a restart really costs because the fitness credits a
    change with its benefit until the horizon, though the allocation is revisited every round; but at
    most ``restart_cost_fraction`` of the job's predicted time left and at least ``restart_cost_floor_s``
    (``_change_costs``: a short job's change is not charged as much as an hour-long job's);
    ``immune_epochs``: younger jobs are never removed;
    ``use_efficiency``: goodput (True) or raw throughput (False); ``gpu_time_weight`` x active jobs x
    overload (how far the active jobs' requests exceed the cluster, clipped to [0, 1]) per cluster-second
    of GPU time spent beyond the job's most GPU-efficient size (0: off); ``horizon_s`` of the fitness (see
    ``OnesContext.fitness``); ``batch_factors``: per-GPU batch multiples tried for each count (the best goodput
    wins; only with ``job_batch`` False). ``job_batch``: jobs tune their own batch
    (``Allocation.batch_tuned_by_job``) and the fitness predicts the goodput of the batch each job will
    pick, at the node count of a consolidated placement (of its real placement when its count is
    unchanged); ``max_scale_out``: with ``job_batch``, a job gets at most this multiple of the most GPUs
    it has measured (at least its request; None: no such limit); ``recipe_first``: with ``job_batch``, a
    job that has not measured its throughput and noise scale yet runs its submitted recipe (untuned).
    ``placement_rescore`` (with ``job_batch``; 0: off): after the search, the fittest this many distinct
    individuals are placed as the decision would place them (``place_counts``) and re-scored with each
    job's goodput on the nodes it really gets; the best of them is taken (the search assumes
    consolidated placements, which a fragmented cluster may not give). ``consolidate_moves``: a growing
    job moves to a fresh placement when that spans fewer nodes (``place_counts``'s ``consolidate``).
    ``unmeasured_gpus`` (null, ``"request"`` or a count): a job that has measured no step time gets at most that.
    ``tail_srpt``: a job still running at the horizon finishes no earlier than the cluster can serve the late
    jobs' leftover GPU-time least first (``OnesContext._srpt_tail``; ``job_costs`` then approximate).
    ``tail_chain`` (default on; not with ``tail_srpt``): a job still running at the horizon finishes its
    leftover no earlier than alone at its fastest goodput, nor than its place in a least-first queue of the
    late jobs' leftover GPU-time at their most GPU-efficient size on the whole cluster
    (``OnesContext._chain_tail``: the lower bound's two relaxations, applied at the horizon); its terms
    depend on one another too. ``tail_chain_plain`` a in [0, 1] (with ``tail_chain``; default 0.3): a late
    job's leftover counts (1 - a) x the chain's estimate plus a x the plain one (its leftover at its
    request's goodput), so the progress of the late job with the most left keeps a share of its plain value
    and it is not deferred without end. ``keep_unless_better``: after the search, changes to running jobs'
    counts are undone one at a time while the fitness stays no worse.
    ``hesrpt`` (null, a speedup exponent p in [0, 0.98], or "auto": each job's own from its goodput table):
    the fitness weighs jobs by heSRPT's marginal values (Berg et al. 2020: the optimal sharing of a cluster
    among jobs that all speed up as ``n ** p``), so that the jobs with the least work left count the most;
    ``hesrpt_scope`` "all": a weighted sum of every job's completion time (``OnesContext.job_weights``);
    "late": only the leftover of jobs still running at the horizon is weighted (``_late_weights``);
    ``hesrpt_floor`` (scope "all"): no job's weight below that fraction of the largest (the tail).
    ``min_hold_s`` (0: off): a running job whose GPU count this policy changed (or which it started) less than
    this long ago keeps that count (``OnesContext.lock``), so that a job is not started, stopped and started
    again on consecutive rounds, paying a restart each time. Null (the default): ``HOLD_PER_CHARGE`` x
    ``restart_cost_s`` (``hold_s``): 150 s with the simulator's 120 s charge; 12.5 s where a deployment
    charges the 10 s its restarts really cost, so the hold follows what a change costs where it runs.
    ``wait_weight`` k (default 1; null: off): each job's completion term counts ``1 + waited / (k x left)`` times,
    ``waited`` the time since its submission that it has held no GPUs (queued or paused) and ``left`` its
    predicted time left at its requested count, so that a job kept waiting long against its own size is not
    deferred again and again for jobs that would finish sooner (the tail of an overloaded trace).
    ``pool_model_obs`` (default false): each measured job is valued by the step times of every active job of
    its model (one per configuration, ``ones_goodput.pooled_views``), not its own alone; "all": an unmeasured
    job too, with the noise scale of its model's least-progressed measured job.
    ``start_from_memory`` (default on; with ``job_batch``): a job that has measured nothing is valued, and
    started (``"batch"``: only started) as its model's earlier jobs measured (``memory_views``), not at its least batch.
    ``fill_from_memory`` (default on; with ``job_batch``): a measured job is valued by its own step times plus
    those its model's earlier jobs measured in configurations it has not run in (``memory_filled_views``).
    ``start_on_freed`` (with ``job_batch``): a job the fitness starts now is valued at the table's goodput times
    how well the GPUs it can get are placed (``OnesContext.freed_quality``: the free ones, and those of the jobs
    the individual stops or shrinks at their real goodput over the table's), as kept jobs are valued on their
    real placement; without it a job on split GPUs is swapped for an identical queued one, which gets the same
    GPUs, round after round (``benchmarks/ones_swaps.py``).
    """

    policy = "ones"

    population: int = 24
    generations: int = 30
    time_budget_s: float | None = None
    crossover_p: float = 0.5
    removal_p: float = 0.1
    resize_p: float = 0.2
    restart_cost_s: float = 120.0
    immune_epochs: float = 0.0
    use_efficiency: bool = True
    gpu_time_weight: float = 0.5
    horizon_s: float = 1800.0
    batch_factors: tuple[float, ...] = (1.0, 2.0)
    fine_resize: bool = False
    transfer_p: float = 0.0
    marginal_seed: bool = False
    job_batch: bool = True
    max_scale_out: float | None = None
    recipe_first: bool = False
    shrink_cost_factor: float = 1.0
    restart_cost_fraction: float = 0.5
    restart_cost_floor_s: float = 30.0
    placement_rescore: int = 0
    consolidate_moves: bool = False
    unmeasured_gpus: int | str | None = None
    tail_srpt: bool = False
    keep_unless_better: bool = False
    hesrpt: float | str | None = None
    hesrpt_scope: str = "all"
    hesrpt_floor: float = 0.0
    min_hold_s: float | None = None
    tail_chain: bool = True
    tail_chain_plain: float = 0.3
    wait_weight: float | None = 1.0
    pool_model_obs: bool | str = False
    start_from_memory: bool | str = True
    fill_from_memory: bool = True
    start_on_freed: bool = False

    @property
    def hold_s(self) -> float:
        """The hold in effect: ``min_hold_s``, or ``HOLD_PER_CHARGE`` x ``restart_cost_s`` when that is null."""
        return HOLD_PER_CHARGE * self.restart_cost_s if self.min_hold_s is None else self.min_hold_s

    def change_cost(self, time_left_s):
        """The churn charge of changing a job with ``time_left_s`` predicted left (scalar or array):
        ``restart_cost_s``, or with ``restart_cost_fraction`` that fraction of the time left, clipped to
        [``restart_cost_floor_s``, ``restart_cost_s``]. The scheduler's reasons quote the same figure."""
        left = np.asarray(time_left_s, dtype=float)
        if self.restart_cost_fraction <= 0:
            return np.full(left.shape, self.restart_cost_s)
        left = np.where(np.isfinite(left), left, np.inf)
        return np.clip(self.restart_cost_fraction * left, min(self.restart_cost_floor_s, self.restart_cost_s),
                       self.restart_cost_s)

    def __post_init__(self) -> None:
        n = self.policy
        factors = self.batch_factors
        if isinstance(factors, (str, bytes)) or not hasattr(factors, "__iter__") or not len(factors):
            raise ValueError(f"{n}: batch_factors must be a non-empty list of numbers > 0, got {factors!r}")
        checked = dict(
            population=check_int(n, "population", self.population, 2),
            generations=check_int(n, "generations", self.generations, 0),
            time_budget_s=(None if self.time_budget_s is None else
                           check_float(n, "time_budget_s", self.time_budget_s, 0.0, strict_min=True)),
            crossover_p=check_probability(n, "crossover_p", self.crossover_p),
            removal_p=check_probability(n, "removal_p", self.removal_p),
            resize_p=check_probability(n, "resize_p", self.resize_p),
            restart_cost_s=check_float(n, "restart_cost_s", self.restart_cost_s, 0.0),
            immune_epochs=check_float(n, "immune_epochs", self.immune_epochs, 0.0),
            use_efficiency=check_bool(n, "use_efficiency", self.use_efficiency),
            gpu_time_weight=check_float(n, "gpu_time_weight", self.gpu_time_weight, 0.0),
            horizon_s=check_float(n, "horizon_s", self.horizon_s, 0.0, strict_min=True),
            batch_factors=tuple(check_float(n, "batch_factors[]", f, 0.0, strict_min=True) for f in factors),
            fine_resize=check_bool(n, "fine_resize", self.fine_resize),
            transfer_p=check_probability(n, "transfer_p", self.transfer_p),
            marginal_seed=check_bool(n, "marginal_seed", self.marginal_seed),
            job_batch=check_bool(n, "job_batch", self.job_batch),
            shrink_cost_factor=check_float(n, "shrink_cost_factor", self.shrink_cost_factor, 1.0),
            restart_cost_fraction=check_float(n, "restart_cost_fraction", self.restart_cost_fraction, 0.0),
            restart_cost_floor_s=check_float(n, "restart_cost_floor_s", self.restart_cost_floor_s, 0.0),
            recipe_first=check_bool(n, "recipe_first", self.recipe_first),
            placement_rescore=check_int(n, "placement_rescore", self.placement_rescore, 0),
            consolidate_moves=check_bool(n, "consolidate_moves", self.consolidate_moves),
            max_scale_out=(None if self.max_scale_out is None else
                           check_float(n, "max_scale_out", self.max_scale_out, 1.0)),
            unmeasured_gpus=_check_unmeasured(n, self.unmeasured_gpus),
            tail_srpt=check_bool(n, "tail_srpt", self.tail_srpt),
            keep_unless_better=check_bool(n, "keep_unless_better", self.keep_unless_better),
            hesrpt=(self.hesrpt if self.hesrpt in (None, "auto") else check_float(n, "hesrpt", self.hesrpt, 0.0, 0.98)),
            hesrpt_scope=check_choice(n, "hesrpt_scope", self.hesrpt_scope, ("all", "late")),
            hesrpt_floor=check_float(n, "hesrpt_floor", self.hesrpt_floor, 0.0, 1.0),
            min_hold_s=None if self.min_hold_s is None else check_float(n, "min_hold_s", self.min_hold_s, 0.0),
            tail_chain=check_bool(n, "tail_chain", self.tail_chain),
            tail_chain_plain=check_float(n, "tail_chain_plain", self.tail_chain_plain, 0.0, 1.0),
            wait_weight=(None if self.wait_weight is None else
                         check_float(n, "wait_weight", self.wait_weight, 0.0, strict_min=True)),
            pool_model_obs=(self.pool_model_obs if self.pool_model_obs == "all"
                            else check_bool(n, "pool_model_obs", self.pool_model_obs)),
            start_from_memory=(self.start_from_memory if self.start_from_memory == "batch"
                               else check_bool(n, "start_from_memory", self.start_from_memory)),
            fill_from_memory=check_bool(n, "fill_from_memory", self.fill_from_memory),
            start_on_freed=check_bool(n, "start_on_freed", self.start_on_freed),
        )
        if checked["tail_chain"] and checked["tail_srpt"]:
            raise ValueError(f"{n}: tail_chain (on by default) and tail_srpt are two models of the jobs still "
                             "running at the horizon; set at most one of them to true (tail_srpt needs "
                             "tail_chain: false)")
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def _check_unmeasured(policy: str, value: Any) -> int | str | None:
    if value is None or value == "request":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{policy}: unmeasured_gpus must be null, \"request\" or an integer >= 1, got {value!r}")
    return value


def _change_costs(c: OnesParams, table: np.ndarray, remaining: np.ndarray, cur: np.ndarray, need: np.ndarray,
                  cur_rate: np.ndarray | None) -> np.ndarray:
    """(J,) the churn charge of changing each job's count: ``restart_cost_s``; with ``restart_cost_fraction``
    f > 0, at most f x the job's predicted time left (at its current count, or its requested one when
    queued) and at least ``restart_cost_floor_s``. The charge exists so that long jobs are not resized
    round after round; a job with two minutes left that pays two minutes for any change is never moved
    for the short jobs queued behind it (seen in the live A/B mix: ones kept a long job on both slots
    while five short ones queued, 1.57x fifo's mean JCT in the simulator)."""
    full = np.full(len(cur), c.restart_cost_s)
    if c.restart_cost_fraction <= 0:
        return full
    n = np.where(cur > 0, cur, np.maximum(need, 1))
    rate = table[np.arange(len(cur)), np.minimum(n, table.shape[1] - 1)]
    if cur_rate is not None:
        rate = np.where((cur > 0) & (cur_rate > 0), cur_rate, rate)
    return c.change_cost(remaining / np.maximum(rate, 1e-12))


def _caps(cluster: Cluster, jobs: Sequence[JobView]) -> np.ndarray:
    return np.array([min(j.spec.gpu_cap, cluster.num_gpus) for j in jobs], dtype=np.int64)


class OnesPolicy(PolicyBase):
    """Improved ONES (default): predicted-mean-JCT fitness over all jobs, goodput, vectorised search.

    ``OnesPolicy(seed=0, **params)`` takes the keywords of ``OnesParams``; ``config`` holds them.
    """

    name = "ones"

    def __init__(self, seed: int = 0, **params: Any) -> None:
        super().__init__(seed)
        self.config = OnesParams.from_dict(params)
        self.population: dict[str, list[int]] = {}  # job name -> counts, one per individual
        self.last_generations = 0
        self.changed_at: dict[str, float] = {}  # job name -> when this policy last changed its GPU count

    # -- persistence -------------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        return self.config.to_dict()

    def _extra_state(self) -> dict[str, Any]:
        return {"population": self.population, "changed_at": self.changed_at}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.population = {k: [int(x) for x in v] for k, v in state.get("population", {}).items()}
        self.changed_at = {k: float(v) for k, v in state.get("changed_at", {}).items()}

    # -- decision ----------------------------------------------------------------------------------
    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        if not jobs:
            self.population = {}
            return Schedule()
        started = memory_views(jobs) if self.config.start_from_memory and self.config.job_batch else jobs
        jobs = jobs if self.config.start_from_memory == "batch" else started  # "batch": started by it, not valued
        if self.config.fill_from_memory and self.config.job_batch:  # valued, not started, by what others measured
            jobs = memory_filled_views(jobs)
        ctx, batches = self._context(cluster, jobs, current, now_s)
        if (hold_s := self.config.hold_s) > 0:  # jobs changed less than the hold ago keep their count
            since = now_s - np.array([self.changed_at.get(j.name, -np.inf) for j in jobs])
            ctx.lock = (since < hold_s) & (ctx.cur > 0) & (ctx.cur <= ctx.caps)
        pop, fit = self._search(ctx, jobs)  # (P, J) GPU counts, (P,) their fitness
        best = pop[int(np.argmin(fit))]
        if self.config.placement_rescore > 0 and self.config.job_batch:
            best = self._placement_rescore(cluster, jobs, current, ctx, pop, fit)
        if self.config.keep_unless_better:  # last, so that no later step puts back what it undid
            best = _keep_unless_better(ctx, best)
        self.changed_at = {j.name: float(now_s) if best[i] != ctx.cur[i] else self.changed_at[j.name]
                           for i, j in enumerate(jobs) if best[i] != ctx.cur[i] or j.name in self.changed_at}
        schedule = schedule_from_counts(cluster, jobs, best, current, _order(ctx, best), batches,
                                        self.config.consolidate_moves)
        if not self.config.job_batch:
            return schedule
        return tuned_schedule(cluster, started, schedule, current, self.config.recipe_first)

    def _context(self, cluster: Cluster, jobs: Sequence[JobView], current: Schedule,
                 now_s: float) -> tuple[_Ctx, np.ndarray]:
        """The arrays of this decision at ``now_s``, and the global batch of each job at each GPU count (J, N+1)."""
        c = self.config
        J, G = len(jobs), cluster.num_gpus
        caps = _caps(cluster, jobs)
        cur_rate = None
        if c.job_batch:
            if c.pool_model_obs:  # the scheduler's estimates only: each job still tunes its batch on its own steps
                jobs = pooled_views(jobs, new_jobs=c.pool_model_obs == "all")
            caps = scale_limits(jobs, caps, c.max_scale_out, c.unmeasured_gpus)
            table = tuned_table(cluster, jobs, caps, c.use_efficiency, c.recipe_first)  # (J, N+1)
            batches = None
            cur_rate, _ = current_goodput(cluster, jobs, current, c.use_efficiency, c.recipe_first, table)  # (J,)
        else:
            table, batches = fixed_batch_table(cluster, jobs, int(caps.max()), c.use_efficiency,
                                               c.batch_factors)  # (J, N+1) each
        remaining = estimates.remaining_work(jobs)  # (J,)
        cur = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        submit = np.array([j.submit_time_s for j in jobs])
        changed_cost = _change_costs(c, table, remaining, cur, np.minimum(
            np.array([max(j.spec.requested_gpus, 1) for j in jobs]), caps), cur_rate)
        requested = np.array([j.spec.requested_gpus for j in jobs], dtype=np.int64)
        # GPU time is worth more the more the active jobs' requests oversubscribe the cluster.
        overload = float(np.clip(np.minimum(requested, caps).sum() / G - 1.0, 0.0, 1.0))
        ctx = _Ctx(G, caps, table, remaining, cur, changed_cost, submit, requested,
                   c.gpu_time_weight * J * overload, c.horizon_s, cur_rate, c.shrink_cost_factor, c.tail_srpt,
                   c.hesrpt, c.hesrpt_scope, c.hesrpt_floor, c.tail_chain, c.tail_chain_plain,
                   c.start_on_freed and c.job_batch)
        if c.wait_weight is not None:  # the longer a job has waited, against its time left, the more it counts
            waited = np.maximum(now_s - submit - np.array([j.run_time_s for j in jobs]), 0.0)
            ctx.wait_weights = 1.0 + waited / (c.wait_weight * np.maximum(ctx.t_need, 1.0))
        return ctx, batches

    def _search(self, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        """Evolve the population for this round's generations (or until the time budget); keep it for the
        next round and return it, (P, J) GPU counts sorted fittest first, and its fitness (P,)."""
        c = self.config
        # Jobs younger than ``immune_epochs`` are never removed (none when it is 0: epochs are >= 0).
        ctx.immune = (np.array([j.epochs_done < c.immune_epochs for j in jobs], dtype=bool) if c.immune_epochs > 0
                      else np.zeros(len(jobs), dtype=bool))
        pop = self._initial_population(jobs, ctx)  # (P, J), feasible
        fit = ctx.fitness(pop)
        deadline = time.perf_counter() + c.time_budget_s if c.time_budget_s else None
        gens = 0
        for _ in range(c.generations):
            if deadline is not None and time.perf_counter() > deadline:
                break
            children = self._breed(pop, ctx, jobs)
            children = ctx.repair(children, self._rng)
            cfit = ctx.fitness(children)
            allpop = np.concatenate([pop, children])
            allfit = np.concatenate([fit, cfit])
            # Truncation selection, ties broken towards the earlier (incumbent) individual.
            keep = np.argsort(allfit, kind="stable")[:c.population]
            pop, fit = allpop[keep], allfit[keep]
            gens += 1
        self.last_generations = gens
        self.population = {j.name: pop[:, i].tolist() for i, j in enumerate(jobs)}
        return pop, fit

    def _placement_rescore(self, cluster: Cluster, jobs: Sequence[JobView], current: Schedule, ctx: _Ctx,
                           pop: np.ndarray, fit: np.ndarray) -> np.ndarray:
        """(J,) the best candidate once each is placed as ``decide`` places it and its jobs are valued on
        the nodes they really get (the search's fitness assumes ``ceil(n / node size)`` nodes for a job
        whose count changes). Candidates: the ``placement_rescore`` fittest distinct individuals of
        ``pop`` and variants of the fittest (``ones_fitness.fitted_variants``). Not the current schedule when the search
        dropped it: the fitness starts a queued job on free GPUs at once, so keeping GPUs idle looks free."""
        c = self.config
        ranked = pop[np.argsort(fit, kind="stable")]
        _, first = np.unique(ranked, axis=0, return_index=True)
        top = ranked[np.sort(first)[:c.placement_rescore]]  # (K, J), fittest first
        held = {j.name: current.gpus_of(j.name) for j in jobs}
        placed_top = self._placed(cluster, jobs, ctx, top[0], held)
        variants = fitted_variants(max(cluster.gpus_per_node), ctx, top[0], placed_top)
        cands = np.concatenate([top, variants])
        _, first = np.unique(cands, axis=0, return_index=True)
        cands = cands[np.sort(first)]
        placed = [self._placed(cluster, jobs, ctx, row, held) for row in cands]
        nodes = np.array([[len(p) for p in row] for row in placed])
        reps = np.array([[sum(p) for p in row] for row in placed])
        rate = placed_goodput(cluster, jobs, reps, nodes, ctx.table, c.use_efficiency, c.recipe_first)
        return cands[int(np.argmin(ctx.fitness(cands, rate)))]

    def _placed(self, cluster: Cluster, jobs: Sequence[JobView], ctx: _Ctx, counts: np.ndarray,
                held: Mapping[str, Sequence[int]]) -> list[tuple[int, ...]]:
        """GPUs per node (largest first) of each job when ``counts`` is placed as ``decide`` places it;
        a queued job that the fitness starts now (its requested count fits in the GPUs left free, queued
        jobs shortest first) on the free GPUs it would get, other queued jobs ``()``."""
        wanted = [(jobs[i].name, int(counts[i])) for i in _order(ctx, counts)]
        placed = place_counts(cluster, wanted, held, self.config.consolidate_moves)
        free = free_mask(cluster, [g for gpus in placed.values() for g in gpus])
        out = [cluster.placement(placed.get(j.name, ())) for j in jobs]
        for i in ctx.srt_order:
            if counts[i] > 0:
                continue
            gpus = place_consolidated(cluster, free, int(ctx.need[i]))
            if gpus is None:
                break
            free[gpus] = False
            out[i] = cluster.placement(gpus)
        return out

    def _initial_population(self, jobs: Sequence[JobView], ctx: _Ctx) -> np.ndarray:
        """(P, J) the previous round's individuals, the current schedule, the greedy seed(s) and mutated
        copies of them, repaired; the marginal-gain seed (``marginal_seed``) is kept as built (feasible,
        and the repair's padding would grow jobs it left small on purpose)."""
        P, J = self.config.population, len(jobs)
        pop = np.zeros((P, J), dtype=np.int64)
        rows = 0
        if self.population:
            width = len(next(iter(self.population.values())))
            prev = np.array([self.population.get(j.name, [0] * width) for j in jobs]).T  # (P', J)
            take = min(max(P - 3 if self.config.marginal_seed else P - 2, 0), prev.shape[0])
            pop[:take] = prev[:take]
            rows = take
        seeds = [ctx.cur, ctx.greedy()] + ([ctx.marginal_greedy()] if self.config.marginal_seed else [])
        seeds = seeds[:P - rows]
        pop[rows:rows + len(seeds)] = seeds
        as_built = np.zeros(P, dtype=bool)
        as_built[rows + 2:rows + len(seeds)] = True
        rows += len(seeds)
        # Fill the rest with mutated copies of the seeds.
        if rows < P:
            src = pop[self._rng.integers(0, rows, size=P - rows)]
            pop[rows:] = self._mutate(src, ctx)
        return np.where(as_built[:, None], pop, ctx.repair(pop, self._rng))

    def _breed(self, pop: np.ndarray, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        P, J = pop.shape
        rng = self._rng
        a = pop[rng.integers(0, P, size=P)]
        b = pop[rng.integers(0, P, size=P)]
        mask = rng.random((P, J)) < self.config.crossover_p
        return self._mutate(np.where(mask, a, b), ctx)

    def _mutate(self, pop: np.ndarray, ctx: _Ctx) -> np.ndarray:
        rng = self._rng
        c = self.config
        out = pop.copy()
        remove = (rng.random(out.shape) < c.removal_p / max(1, out.shape[1]) * 4) & ~ctx.immune[None, :]
        out[remove] = 0
        resize = rng.random(out.shape) < c.resize_p / max(1, out.shape[1]) * 4
        # Four resize moves: double, halve, +1, -1 (coarse jumps and fine steps).
        move = rng.integers(0, 4 if c.fine_resize else 2, size=out.shape)
        resized = np.select([move == 0, move == 1, move == 2], [np.maximum(out * 2, 1), out // 2, out + 1],
                            np.maximum(out - 1, 0))
        out = np.minimum(np.where(resize, resized, out), ctx.caps[None, :])
        return _transfer(out, ctx.caps, rng, c.transfer_p)


def _order(ctx: _Ctx, counts: np.ndarray) -> np.ndarray:
    """The order ``decide`` places jobs in: soonest to finish first (ties: earlier submission)."""
    return np.lexsort((ctx.submit, ctx.solo_time(counts)))
