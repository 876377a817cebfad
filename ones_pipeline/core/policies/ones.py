"""ONES, improved (the default policy ``ones``): the evolutionary batch-size orchestration of Bian et al.
(SC'21) with its weaknesses fixed. ``ones_paper.py`` has the faithful prototype (``ones-paper``).

The search keeps the prototype's shape (a population surviving between rounds, crossover, job removal
and resizing, repair, truncation selection), but:

* fitness is the predicted sum of completion times of **all** active jobs (``ones_fitness``): a scheduled
  job finishes after its churn charge (when its count changes) plus remaining work / goodput; a queued
  job waits until enough GPUs free up (jobs served shortest-remaining first), then runs; a job still
  running at the horizon is valued by the lower bound's relaxations blended with its own leftover;
* jobs tune their own batch (``Allocation.batch_tuned_by_job``, as under Pollux), and the fitness predicts
  the goodput of the batch each job will pick (``ones_goodput``: Pollux's fitted step-time model and the
  job's noise scale, ``core.goodput.job_batch``) at the node count of its placement; a batch change alone
  costs no restart; a job that has measured nothing is valued (and started) as its model's earlier jobs
  measured, and a measured one where it has not run by them too (``core.model_memory``);
* the population is one ``(population, jobs)`` array of GPU counts, evaluated vectorised, warm-started
  from the previous round's population (remapped by job name), the current schedule and a greedy
  seed; generations per round are fixed (deterministic) and optionally bounded by a wall-clock budget;
* a change is charged by what that kind of change costs the job where it runs (``JobView.change_costs``:
  a start, a grow or shrink in place, a restart through a checkpoint; ``change_charge``), and a job this
  policy changed keeps its count for a hold in proportion to what its next change would cost, so that it
  is not started, stopped and started again on consecutive rounds.

The parameters are ``OnesParams``, checked in one place; ``OnesPolicy(seed=..., **params)`` takes them as
keywords. What the options deleted from it taught is in docs/ones_policy.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.goodput import GoodputModel
from ones_pipeline.core.placement import schedule_from_counts
from ones_pipeline.core.policies.base import PolicyBase, PolicyParams, check_float, check_int, check_probability
from ones_pipeline.core.policies.ones_fitness import DecisionInputs, FitnessWeights, OnesContext
from ones_pipeline.core.policies.ones_goodput import (
    GoodputRows,
    current_goodput,
    memory_filled_views,
    memory_views,
    scale_limits,
    tuned_schedule,
    tuned_table,
)
from ones_pipeline.core.types import Cluster, JobStatus, JobView, Schedule

# The churn charge of a change (``change_charge``): CHARGE_PER_COST x what that kind of change costs the job,
# at most; CHARGE_SHARE_OF_LEFT x the job's predicted time left where that is less, but never less than the
# cost itself. More than the cost, because the fitness credits a change with its benefit until the horizon
# though the allocation is revisited every round: 4 x the Pollux simulator's 30 s per change is the 120 s that
# was tuned there (docs/ones_policy.md, "What a change is charged"). One rule for every kind and environment.
CHARGE_PER_COST = 4.0
CHARGE_SHARE_OF_LEFT = 0.5
# What a change is assumed to cost where the environment has measured nothing (``JobView.change_costs``
# empty, or a kind missing): the Pollux simulator's cost of every reallocation.
UNKNOWN_CHANGE_COST_S = 30.0
# The default hold, in multiples of the most the job's cheapest next change is charged: a job ones changed
# keeps its count somewhat longer than that (150 s where every change costs 30 s, tuned in the simulator).
HOLD_PER_CHARGE = 1.25
# The search's operators, per child: uniform crossover with probability CROSSOVER_P per job; expected job
# removals REMOVAL_P and resizes (x2 or /2, equally likely) RESIZE_P per 4 jobs.
CROSSOVER_P, REMOVAL_P, RESIZE_P = 0.5, 0.1, 0.2


@dataclass(frozen=True)
class OnesParams(PolicyParams):
    """Parameters of ``ones``, checked on construction (defaults tuned on Pollux workloads 1-4, checked on
    5-8, other loads and the ONES trace; docs/ones_policy.md).

    ``population`` individuals kept between rounds; ``generations`` per decision, stopped early by
    ``time_budget_s`` when given (live sensors; the simulator leaves it off so decisions are reproducible).
    A change of a job's GPU count is charged ``change_charge`` of what that kind of change costs it
    (``JobView.change_costs``), no option. ``gpu_time_weight`` x active jobs x overload (how far the active
    jobs' requests exceed the cluster, clipped to [0, 1]) per cluster-second of GPU time spent beyond the
    job's most GPU-efficient size (0: off). ``horizon_s`` of the fitness (``OnesContext.fitness``); a job still
    running there counts (1 - ``tail_chain_plain``) x the lower bound's relaxations applied to its leftover
    (``OnesContext._chain_tail``) plus ``tail_chain_plain`` x its leftover at its request's goodput.
    ``min_hold_s``: a running job whose GPU count this policy changed (or which it started) less than this
    long ago keeps that count (``DecisionInputs.locked``); null (the default): ``HOLD_PER_CHARGE`` x the most
    its cheapest next change (grow, shrink or restart) is charged (``hold_s``). ``wait_weight`` k (null:
    off): each job's completion term counts ``1 + waited / (k x left)`` times, ``waited`` the time since its
    submission that it has held no GPUs and ``left`` its predicted time left at its requested count, so that
    a job kept waiting long against its own size is not deferred again and again for jobs that would finish
    sooner.
    """

    policy = "ones"

    population: int = 24
    generations: int = 30
    time_budget_s: float | None = None
    gpu_time_weight: float = 0.5
    horizon_s: float = 1800.0
    tail_chain_plain: float = 0.3
    min_hold_s: float | None = None
    wait_weight: float | None = 1.0

    def hold_s(self, costs: Mapping[str, float] | None = None) -> float:
        """The hold of a job whose changes cost ``costs`` (``JobView.change_costs``): ``min_hold_s``, or when
        that is null ``HOLD_PER_CHARGE`` x the most its cheapest next change is charged."""
        if self.min_hold_s is not None:
            return self.min_hold_s
        c = kind_costs(costs)
        return HOLD_PER_CHARGE * CHARGE_PER_COST * min(c["grow"], c["shrink"], c["restart"])

    def __post_init__(self) -> None:
        n = self.policy
        checked = dict(
            population=check_int(n, "population", self.population, 2),
            generations=check_int(n, "generations", self.generations, 0),
            time_budget_s=(None if self.time_budget_s is None else
                           check_float(n, "time_budget_s", self.time_budget_s, 0.0, strict_min=True)),
            gpu_time_weight=check_float(n, "gpu_time_weight", self.gpu_time_weight, 0.0),
            horizon_s=check_float(n, "horizon_s", self.horizon_s, 0.0, strict_min=True),
            tail_chain_plain=check_probability(n, "tail_chain_plain", self.tail_chain_plain),
            min_hold_s=None if self.min_hold_s is None else check_float(n, "min_hold_s", self.min_hold_s, 0.0),
            wait_weight=(None if self.wait_weight is None else
                         check_float(n, "wait_weight", self.wait_weight, 0.0, strict_min=True)),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def kind_costs(costs: Mapping[str, float] | None) -> dict[str, float]:
    """Seconds per kind of change (start, grow, shrink, restart) from ``JobView.change_costs``, each kind it
    does not give ``UNKNOWN_CHANGE_COST_S``."""
    costs = costs or {}
    return {k: float(costs.get(k, UNKNOWN_CHANGE_COST_S)) for k in ("start", "grow", "shrink", "restart")}


def change_charge(cost_s, time_left_s):
    """The churn charge of a change that costs ``cost_s`` to a job with ``time_left_s`` predicted left (scalars
    or arrays): ``CHARGE_SHARE_OF_LEFT`` x the time left, within [``cost_s``, ``CHARGE_PER_COST`` x ``cost_s``]
    (a short job's change is not charged as much as an hour-long job's). The scheduler's reasons quote it."""
    cost = np.asarray(cost_s, dtype=float)
    left = np.asarray(time_left_s, dtype=float)
    left = np.where(np.isfinite(left), left, np.inf)
    return np.clip(CHARGE_SHARE_OF_LEFT * left, cost, CHARGE_PER_COST * cost)


def as_requested(jobs: Sequence[JobView], table: np.ndarray) -> np.ndarray:
    """(J, N+1) ``table``, but a job nobody has timed is taken to scale as its user requested: linearly up to
    its requested GPUs (its one-GPU goodput times the count), beyond them by the prior's own gain. The generic
    prior prices the all-reduce of an unknown model pessimistically, so on it an unmeasured job was worth no
    more on 16 GPUs than on 4: on the ONES trace the first two jobs, requesting 16 each, started on 4 of an
    empty cluster's 64 GPUs and took twice FIFO's time. Its user's request is the one thing known of how it
    scales. Once it has timed steps (or its model's earlier jobs have), those decide."""
    out = table
    for i, j in enumerate(jobs):
        if not j.throughput_obs:
            if out is table:
                out = table.copy()
            n, req = np.arange(table.shape[1]), min(max(j.spec.requested_gpus, 1), table.shape[1] - 1)
            if table[i, req] > 0:  # beyond the request, the prior's own gain from more GPUs
                out[i] = np.where(n <= req, table[i, 1] * n, table[i] * (table[i, 1] * req / table[i, req]))
                out[i] = np.where(table[i] > 0, out[i], 0.0)
    return out


def unmeasured_as_short(jobs: Sequence[JobView], remaining: np.ndarray, one_gpu_rate: np.ndarray) -> np.ndarray:
    """(J,) ``remaining`` work, but a job with no step times (its own or its model's earlier jobs') valued as
    finishing within its start-up on one GPU (at least ``UNKNOWN_CHANGE_COST_S``: a start that costs nothing
    still takes its first steps to be timed): how long it will train is unknown until its first steps are
    measured, which takes about a start-up, and then the next decision values it by them. A job of unknown
    size is started before jobs known to be longer (as the least-attained-service rule would): a prior that
    guesses its size orders it arbitrarily (live, a 42 s job was predicted at 3.3 min on the generic prior
    and waited 3 minutes behind a 2.5 min one)."""
    unknown = np.array([not j.throughput_obs for j in jobs], dtype=bool)
    if not unknown.any():
        return remaining
    start = np.array([kind_costs(j.change_costs)["start"] for j in jobs])
    probe = np.maximum(start, UNKNOWN_CHANGE_COST_S) * np.maximum(one_gpu_rate, 1e-12)
    return np.where(unknown, np.minimum(remaining, probe), remaining)


def _charges(jobs: Sequence[JobView], table: np.ndarray, remaining: np.ndarray, cur: np.ndarray, need: np.ndarray,
             cur_rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(J, N+1) the churn charge of giving each job n GPUs (``change_charge`` of that kind of change), from its
    predicted time left at its current count (on its real placement), or its requested one when queued; 0
    where its count stays; column 0: the charge of its start after it waits. The charge exists so that long
    jobs are not resized round after round; a job with two minutes left that pays two minutes for any change
    is never moved for the short jobs queued behind it (seen in the live A/B mix: ones kept a long job on
    both slots while five short ones queued, 1.57x fifo's mean JCT in the simulator). And (J, N+1) what a
    running job's grow to n loses to the grow's delay (``_lagged``)."""
    J, width = table.shape
    n = np.where(cur > 0, cur, np.maximum(need, 1))
    rate = table[np.arange(J), np.minimum(n, width - 1)]
    rate = np.where((cur > 0) & (cur_rate > 0), cur_rate, rate)
    left = remaining / np.maximum(rate, 1e-12)
    costs = [kind_costs(j.change_costs) for j in jobs]
    charge = {k: change_charge([c[k] for c in costs], left) for k in ("start", "grow", "shrink", "restart")}
    # a queued job starts, or restarts from its checkpoint when it has run before
    started = np.array([j.max_gpus_seen > 0 or j.status is JobStatus.PAUSED for j in jobs], dtype=bool)
    resume = np.where(started, charge["restart"], charge["start"])[:, None]
    n, held = np.arange(width)[None, :], cur[:, None]
    running = np.where(n == 0, charge["restart"][:, None], np.where(
        n > held, charge["grow"][:, None], np.where(n < held, charge["shrink"][:, None], 0.0)))
    return np.where(held > 0, running, resume), np.where((held > 0) & (n > held), _lagged(jobs, table, left, rate), 0.0)


def _lagged(jobs: Sequence[JobView], table: np.ndarray, left: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """(J, N+1) what a grow in place loses to its delay (``JobView.change_costs["lag"]``, measured live from the
    decision to the change made; none in the simulator, which makes a change when it is decided): the job trains
    that long at the rate it has, so it finishes ``min(lag, left) x (1 - rate / rate at n)`` later than at once
    on n. A job that finishes before its grow lands gains nothing from it (live, a job 7 s from its end was grown
    while a long one was stopped to free the slot; the job had finished before the slot was free)."""
    lag = np.array([float((j.change_costs or {}).get("lag", 0.0)) for j in jobs])
    if not lag.any():
        return np.zeros_like(table)
    with np.errstate(divide="ignore", invalid="ignore"):
        slower = np.where(table > 0, 1.0 - rate[:, None] / table, 0.0)
    return np.minimum(lag, left)[:, None] * np.clip(slower, 0.0, 1.0)


class OnesPolicy(PolicyBase):
    """Improved ONES (default): predicted-mean-JCT fitness over all jobs, goodput, vectorised search.

    ``OnesPolicy(seed=0, **params)`` takes the keywords of ``OnesParams``; ``config`` holds them.
    """

    name = "ones"

    def __init__(self, seed: int = 0, model: GoodputModel | None = None, **params: Any) -> None:
        super().__init__(seed)
        self.config = OnesParams.from_dict(params)
        self.population: dict[str, list[int]] = {}  # job name -> counts, one per individual
        self.last_generations = 0
        self.changed_at: dict[str, float] = {}  # job name -> when this policy last changed its GPU count
        self._rows = GoodputRows()  # measured jobs' goodput rows, kept between decisions
        self.model = model if model is not None else GoodputModel()  # values the jobs; fits kept between decisions

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
        # A job that has measured nothing is valued and started as its model's earlier jobs measured; a
        # measured one is also valued by them where it has not run itself (it tunes on its own steps only).
        started = memory_views(jobs)
        jobs = memory_filled_views(started)
        ctx = self.context(cluster, jobs, current, now_s)
        pop, fit = self._search(ctx, jobs)  # (P, J) GPU counts, (P,) their fitness
        best = _alone(ctx, pop[int(np.argmin(fit))])
        self.changed_at = {j.name: float(now_s) if best[i] != ctx.cur[i] else self.changed_at[j.name]
                           for i, j in enumerate(jobs) if best[i] != ctx.cur[i] or j.name in self.changed_at}
        schedule = schedule_from_counts(cluster, jobs, best, current, _order(ctx, best))
        return tuned_schedule(cluster, started, schedule, current, self.model)

    def context(self, cluster: Cluster, jobs: Sequence[JobView], current: Schedule, now_s: float) -> OnesContext:
        """What a decision at ``now_s`` searches over (``OnesContext``: caps, goodput table, remaining work,
        churn charges, wait weights, the jobs the hold keeps), for ``jobs`` as the policy values them (``decide``
        passes the model memory's views). Reads this policy's state (when it changed each job), changes none
        of it but its memo of goodput rows."""
        c = self.config
        J, G = len(jobs), cluster.num_gpus
        caps = scale_limits(jobs, np.array([min(j.spec.gpu_cap, G) for j in jobs], dtype=np.int64))
        table = as_requested(jobs, tuned_table(cluster, jobs, caps, self._rows, self.model))  # (J, N+1)
        cur_rate, _ = current_goodput(cluster, jobs, current, table, self.model)  # (J,)
        remaining = unmeasured_as_short(jobs, estimates.remaining_work(jobs), table[:, 1])  # (J,)
        # Rates over each job's whole time left, its evaluation points included (measured live; none simulated):
        # they take as long on any count.
        fixed = estimates.evaluation_time(jobs, remaining)
        table = estimates.with_fixed_time(table, remaining, fixed)
        cur_rate = estimates.with_fixed_time(cur_rate, remaining, fixed)
        cur = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        submit = np.array([j.submit_time_s for j in jobs])
        charges, lagged = _charges(jobs, table, remaining, cur, np.minimum(
            np.array([max(j.spec.requested_gpus, 1) for j in jobs]), caps), cur_rate)
        requested = np.array([j.spec.requested_gpus for j in jobs], dtype=np.int64)
        # GPU time is worth more the more the active jobs' requests oversubscribe the cluster.
        overload = float(np.clip(np.minimum(requested, caps).sum() / G - 1.0, 0.0, 1.0))
        waited = None  # the longer a job has waited, against its time left, the more it counts
        if c.wait_weight is not None:
            waited = np.maximum(now_s - submit - np.array([j.run_time_s for j in jobs]), 0.0)
        locked = None  # jobs changed less than the hold ago keep their count
        hold_s = np.array([c.hold_s(j.change_costs) for j in jobs])
        if (hold_s > 0).any():
            since = now_s - np.array([self.changed_at.get(j.name, -np.inf) for j in jobs])
            locked = (since < hold_s) & (cur > 0) & (cur <= caps)
        inputs = DecisionInputs(gpus=G, caps=caps, goodput=table, remaining=remaining, held=cur,
                                change_cost=charges, submit=submit, requested=requested, held_goodput=cur_rate,
                                waited_s=waited, locked=locked, grow_lag=lagged if lagged.any() else None)
        weights = FitnessWeights(horizon_s=c.horizon_s, tail_chain_plain=c.tail_chain_plain,
                                 gpu_time_weight=c.gpu_time_weight * J * overload, wait_weight=c.wait_weight or 1.0)
        return OnesContext(inputs, weights)

    def _search(self, ctx: OnesContext, jobs: Sequence[JobView]) -> tuple[np.ndarray, np.ndarray]:
        """Evolve the population for this round's generations (or until the time budget); keep it for the
        next round and return it, (P, J) GPU counts sorted fittest first, and its fitness (P,)."""
        c = self.config
        pop = self._initial_population(jobs, ctx)  # (P, J), feasible
        fit = ctx.fitness(pop)
        deadline = time.perf_counter() + c.time_budget_s if c.time_budget_s else None
        gens = 0
        for _ in range(c.generations):
            if deadline is not None and time.perf_counter() > deadline:
                break
            children = self._breed(pop, ctx)
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

    def _initial_population(self, jobs: Sequence[JobView], ctx: OnesContext) -> np.ndarray:
        """(P, J) the previous round's individuals, the current schedule, the greedy seed and mutated
        copies of them, repaired."""
        P, J = self.config.population, len(jobs)
        pop = np.zeros((P, J), dtype=np.int64)
        rows = 0
        if self.population:
            width = len(next(iter(self.population.values())))
            prev = np.array([self.population.get(j.name, [0] * width) for j in jobs]).T  # (P', J)
            take = min(max(P - 2, 0), prev.shape[0])
            pop[:take] = prev[:take]
            rows = take
        seeds = [ctx.cur, ctx.greedy()][:P - rows]
        pop[rows:rows + len(seeds)] = seeds
        rows += len(seeds)
        if rows < P:  # the rest: mutated copies of the seeds
            src = pop[self._rng.integers(0, rows, size=P - rows)]
            pop[rows:] = self._mutate(src, ctx)
        return ctx.repair(pop, self._rng)

    def _breed(self, pop: np.ndarray, ctx: OnesContext) -> np.ndarray:
        P, J = pop.shape
        rng = self._rng
        a = pop[rng.integers(0, P, size=P)]
        b = pop[rng.integers(0, P, size=P)]
        mask = rng.random((P, J)) < CROSSOVER_P
        return self._mutate(np.where(mask, a, b), ctx)

    def _mutate(self, pop: np.ndarray, ctx: OnesContext) -> np.ndarray:
        rng = self._rng
        out = pop.copy()
        out[rng.random(out.shape) < REMOVAL_P / max(1, out.shape[1]) * 4] = 0
        resize = rng.random(out.shape) < RESIZE_P / max(1, out.shape[1]) * 4
        double = rng.integers(0, 2, size=out.shape) == 0  # x2 (at least 1) or /2
        resized = np.where(double, np.maximum(out * 2, 1), out // 2)
        return np.minimum(np.where(resize, resized, out), ctx.caps[None, :])


def _alone(ctx: OnesContext, best: np.ndarray) -> np.ndarray:
    """``best``, but a job alone on the cluster is never shrunk: the GPUs it gave up would stay idle, and no
    other job is served sooner (the fitness may still prefer fewer where its goodput model has the job faster
    on fewer, or where the repair's padding changed the count it holds). Its hold and cap still apply."""
    if len(best) != 1 or best[0] >= ctx.cur[0] or ctx.cur[0] > ctx.caps[0]:
        return best
    return ctx.cur.copy()


def _order(ctx: OnesContext, counts: np.ndarray) -> np.ndarray:
    """The order ``decide`` places jobs in: soonest to finish first (ties: earlier submission)."""
    return np.lexsort((ctx.submit, ctx.solo_time(counts)))
