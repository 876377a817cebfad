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
  seed; generations per round are fixed (deterministic) and optionally bounded by a wall-clock budget.

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
from ones_pipeline.core.placement import schedule_from_counts
from ones_pipeline.core.policies.base import (
    PolicyBase,
    PolicyParams,
    check_bool,
    check_float,
    check_int,
    check_probability,
)
from ones_pipeline.core.policies.ones_goodput import current_goodput, scale_limits, tuned_schedule, tuned_table
from ones_pipeline.core.types import Cluster, JobView, Schedule


@dataclass(frozen=True)
class OnesParams(PolicyParams):
    """Parameters of ``ones`` (defaults tuned on Pollux workloads 1-4, checked on 5-8 and the ONES trace
    with ``benchmarks/tune_ones.py``), checked on construction.

    ``population`` individuals kept between rounds; ``generations`` per decision, stopped early by
    ``time_budget_s`` when given (live sensors; the simulator leaves it off so decisions are
    reproducible); ``crossover_p`` uniform crossover; ``removal_p`` / ``resize_p`` expected job removals /
    resizes (x2, /2; also +1, -1 with ``fine_resize``) per 4 jobs of a child; ``restart_cost_s`` charged
    to every job whose GPU count changes (x ``shrink_cost_factor`` when it shrinks: it will likely grow
    back, a second restart); larger than the 30 s a restart really costs because the fitness credits a
    change with its benefit until the horizon, though the allocation is revisited every round;
    ``immune_epochs``: younger jobs are never removed;
    ``use_efficiency``: goodput (True) or raw throughput (False); ``gpu_time_weight`` x active jobs x
    overload (how far the active jobs' requests exceed the cluster, clipped to [0, 1]) per cluster-second
    of GPU time spent beyond the job's most GPU-efficient size (0: off); ``horizon_s`` of the fitness (see
    ``_Ctx.fitness``); ``batch_factors``: per-GPU batch multiples tried for each count (the best goodput
    wins; only with ``job_batch`` False). ``job_batch``: jobs tune their own batch
    (``Allocation.batch_tuned_by_job``) and the fitness predicts the goodput of the batch each job will
    pick, at the node count of a consolidated placement (of its real placement when its count is
    unchanged); ``max_scale_out``: with ``job_batch``, a job gets at most this multiple of the most GPUs
    it has measured (at least its request; None: no such limit); ``recipe_first``: with ``job_batch``, a
    job that has not measured its throughput and noise scale yet runs its submitted recipe (untuned).
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
    job_batch: bool = True
    max_scale_out: float | None = None
    recipe_first: bool = False
    shrink_cost_factor: float = 1.0

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
            job_batch=check_bool(n, "job_batch", self.job_batch),
            shrink_cost_factor=check_float(n, "shrink_cost_factor", self.shrink_cost_factor, 1.0),
            recipe_first=check_bool(n, "recipe_first", self.recipe_first),
            max_scale_out=(None if self.max_scale_out is None else
                           check_float(n, "max_scale_out", self.max_scale_out, 1.0)),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)


def _caps(cluster: Cluster, jobs: Sequence[JobView]) -> np.ndarray:
    return np.array([min(j.spec.gpu_cap, cluster.num_gpus) for j in jobs], dtype=np.int64)


def _goodput_table(cluster: Cluster, jobs: Sequence[JobView], max_n: int, use_efficiency: bool,
                   batch_factors: Sequence[float] = (1.0,)) -> tuple[np.ndarray, np.ndarray]:
    """Goodput and global batch of each job at 0..max_n GPUs: two (J, max_n + 1) arrays (column 0 unused).

    For each count the global batch is ``factor * per_gpu_batch * n`` (capped by the job's global batch
    cap), for the factor in ``batch_factors`` that gives the most base-equivalent samples/s.
    ``(1.0,)`` is ONES's rule: the per-GPU batch stays as submitted.
    """
    params = estimates.fitted_params(jobs).select(np.s_[:, None, None])  # (J, 1, 1) fields
    gns = estimates.noise_scales(jobs)[:, None, None]  # (J, 1, 1)
    n = np.arange(1, max_n + 1)[None, :, None]  # (1, N, 1)
    nodes = np.ceil(n / max(cluster.gpus_per_node))
    factors = np.asarray(batch_factors, dtype=float)[None, None, :]  # (1, 1, F)
    per_gpu = np.array([j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    cap = np.array([j.spec.global_batch_cap for j in jobs], dtype=float)[:, None, None]
    max_local = np.array([j.spec.max_per_gpu_batch or j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    batch = np.maximum(np.minimum(np.round(per_gpu * factors) * n, cap), 1.0)  # (J, N, F)
    gp = estimates.goodput_of(params, gns, per_gpu, max_local, n, nodes, batch,
                              use_efficiency=use_efficiency)  # (J, N, F)
    best = np.argmax(gp, axis=2)  # (J, N)
    good = np.take_along_axis(gp, best[:, :, None], axis=2)[:, :, 0]
    chosen = np.take_along_axis(batch, best[:, :, None], axis=2)[:, :, 0]
    zeros = np.zeros((len(jobs), 1))
    return np.concatenate([zeros, good], axis=1), np.concatenate([zeros, chosen], axis=1).astype(np.int64)


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

    # -- persistence -------------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        return self.config.to_dict()

    def _extra_state(self) -> dict[str, Any]:
        return {"population": self.population}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.population = {k: [int(x) for x in v] for k, v in state.get("population", {}).items()}

    # -- decision ----------------------------------------------------------------------------------
    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        if not jobs:
            self.population = {}
            return Schedule()
        ctx, batches = self._context(cluster, jobs, current)
        best = self._search(ctx, jobs)  # (J,) GPU counts
        # Place the jobs that finish soonest first (ties: earlier submission).
        order = np.lexsort((ctx.submit, ctx.solo_time(best)))
        schedule = schedule_from_counts(cluster, jobs, best, current, order, batches)
        if not self.config.job_batch:
            return schedule
        return tuned_schedule(cluster, jobs, schedule, current, self.config.recipe_first)

    def _context(self, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> tuple[_Ctx, np.ndarray]:
        """The arrays of this decision, and the global batch of each job at each GPU count (J, N+1)."""
        c = self.config
        J, G = len(jobs), cluster.num_gpus
        caps = _caps(cluster, jobs)
        cur_rate = None
        if c.job_batch:
            caps = scale_limits(jobs, caps, c.max_scale_out)
            table = tuned_table(cluster, jobs, caps, c.use_efficiency, c.recipe_first)  # (J, N+1)
            batches = None
            cur_rate, _ = current_goodput(cluster, jobs, current, c.use_efficiency, c.recipe_first)  # (J,)
        else:
            table, batches = _goodput_table(cluster, jobs, int(caps.max()), c.use_efficiency,
                                            c.batch_factors)  # (J, N+1) each
        remaining = estimates.remaining_work(jobs)  # (J,)
        cur = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        submit = np.array([j.submit_time_s for j in jobs])
        changed_cost = np.full(J, c.restart_cost_s)
        requested = np.array([j.spec.requested_gpus for j in jobs], dtype=np.int64)
        # GPU time is worth more the more the active jobs' requests oversubscribe the cluster.
        overload = float(np.clip(np.minimum(requested, caps).sum() / G - 1.0, 0.0, 1.0))
        ctx = _Ctx(G, caps, table, remaining, cur, changed_cost, submit, requested,
                   c.gpu_time_weight * J * overload, c.horizon_s, cur_rate, c.shrink_cost_factor)
        return ctx, batches

    def _search(self, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        """Evolve the population for this round's generations (or until the time budget); keep it for the
        next round and return its best individual, (J,) GPU counts."""
        c = self.config
        pop = self._initial_population(jobs, ctx)  # (P, J)
        pop = ctx.repair(pop, self._rng)
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
        return pop[int(np.argmin(fit))]

    def _initial_population(self, jobs: Sequence[JobView], ctx: _Ctx) -> np.ndarray:
        P, J = self.config.population, len(jobs)
        pop = np.zeros((P, J), dtype=np.int64)
        rows = 0
        if self.population:
            width = len(next(iter(self.population.values())))
            prev = np.array([self.population.get(j.name, [0] * width) for j in jobs]).T  # (P', J)
            take = min(P - 2, prev.shape[0])
            pop[:take] = prev[:take]
            rows = take
        pop[rows] = ctx.cur
        pop[rows + 1] = ctx.greedy()
        rows += 2
        # Fill the rest with mutated copies of the seeds.
        if rows < P:
            src = pop[self._rng.integers(0, rows, size=P - rows)]
            pop[rows:] = self._mutate(src, ctx, jobs)
        return pop

    def _breed(self, pop: np.ndarray, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        P, J = pop.shape
        rng = self._rng
        a = pop[rng.integers(0, P, size=P)]
        b = pop[rng.integers(0, P, size=P)]
        mask = rng.random((P, J)) < self.config.crossover_p
        return self._mutate(np.where(mask, a, b), ctx, jobs)

    def _mutate(self, pop: np.ndarray, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        rng = self._rng
        c = self.config
        out = pop.copy()
        immune = np.array([j.epochs_done < c.immune_epochs for j in jobs])
        remove = (rng.random(out.shape) < c.removal_p / max(1, out.shape[1]) * 4) & ~immune[None, :]
        out[remove] = 0
        resize = rng.random(out.shape) < c.resize_p / max(1, out.shape[1]) * 4
        # Four resize moves: double, halve, +1, -1 (coarse jumps and fine steps).
        move = rng.integers(0, 4 if c.fine_resize else 2, size=out.shape)
        resized = np.select([move == 0, move == 1, move == 2], [np.maximum(out * 2, 1), out // 2, out + 1],
                            np.maximum(out - 1, 0))
        out = np.where(resize, resized, out)
        return np.minimum(out, ctx.caps[None, :])


class _Ctx:
    """Arrays of one decision: caps, goodput table, remaining work; repair and fitness operators."""

    def __init__(self, G: int, caps: np.ndarray, table: np.ndarray, remaining: np.ndarray, cur: np.ndarray,
                 change_cost: np.ndarray, submit: np.ndarray, requested: np.ndarray,
                 gpu_time_weight: float = 0.0, horizon_s: float = 1800.0, cur_rate: np.ndarray | None = None,
                 shrink_cost_factor: float = 1.0):
        self.gpu_time_weight, self.horizon_s = gpu_time_weight, horizon_s
        self.shrink_cost_factor = shrink_cost_factor
        # Goodput of each job on the GPUs it holds (its real placement), used where its count is unchanged.
        self.cur_rate = cur_rate
        self.G, self.caps, self.table, self.remaining, self.cur = G, caps, table, remaining, cur
        self.change_cost, self.submit = change_cost, submit
        J = len(caps)
        self.idx = np.arange(J)
        # Time alone at 1 GPU: serves as "shortest remaining first" order for queued jobs.
        self.t1 = remaining / np.maximum(table[:, 1], 1e-12)
        self.srt_order = np.lexsort((submit, self.t1))
        # Best count per job: the one minimising solo run time... weighted by GPUs (cheap, efficient).
        n = np.arange(table.shape[1])
        with np.errstate(divide="ignore"):
            run = np.where(n[None, :] > 0, remaining[:, None] / np.maximum(table, 1e-12), np.inf)
        run[n[None, :] > caps[:, None]] = np.inf
        self.run_time = run  # (J, N+1)
        # A queued job is assumed to start on its requested GPUs (capped) once that many are free.
        self.need = np.clip(requested, 1, caps)
        self.t_need = run[self.idx, self.need]
        self.ref_rate = np.maximum(table[self.idx, self.need], 1e-12)
        counts = np.arange(1, table.shape[1])
        self.best_rate_per_gpu = np.maximum((table[:, 1:] / counts[None, :]).max(axis=1), 1e-12)

    def solo_time(self, counts: np.ndarray) -> np.ndarray:
        return self.run_time[self.idx, counts]

    def greedy(self) -> np.ndarray:
        """A seed individual: queued and running jobs get 1 GPU shortest-first, then marginal-gain growth."""
        J = len(self.caps)
        counts = np.zeros(J, dtype=np.int64)
        free = self.G
        for j in self.srt_order:
            if free == 0:
                break
            counts[j] = 1
            free -= 1
        # Grow by doubling where the run time drops the most per added GPU.
        while free > 0:
            nxt = np.minimum(np.maximum(counts * 2, 1), self.caps)
            add = nxt - counts
            ok = (counts > 0) & (add > 0) & (add <= free)
            if not ok.any():
                break
            gain = (self.solo_time(counts) - self.solo_time(nxt)) / np.maximum(add, 1)
            gain[~ok] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] <= 0:
                break
            free -= int(add[j])
            counts[j] = nxt[j]
        return counts

    def repair(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Make every individual feasible (sum <= G, 0 <= n <= cap), then pad the free GPUs.

        Vectorised over the population. Over-full individuals keep jobs shortest-remaining first
        while they fit (the one that overflows shrinks); padding gives queued jobs GPUs
        shortest-remaining first (1 each, or their request), then lets scheduled jobs double while
        that shortens them and GPUs remain.
        """
        order = self.srt_order
        caps_o = self.caps[order][None, :]
        x = np.clip(pop[:, order], 0, caps_o)  # (P, J) in shortest-first order
        cum = np.cumsum(x, axis=1)
        x = np.clip(self.G - (cum - x), 0, x)
        free = self.G - x.sum(axis=1)  # (P,)
        waiting = x == 0
        # Half the individuals give queued jobs 1 GPU each (sharing); the other half their requested
        # count, shortest first, while it fits (run-to-completion). Both shapes stay reachable.
        share = rng.random(x.shape[0]) < 0.5
        want = np.where(share[:, None], 1, self.need[order][None, :]) * waiting
        give = waiting & (np.cumsum(want, axis=1) <= free[:, None])
        x = x + np.where(give, want, 0)
        free = free - np.where(give, want, 0).sum(axis=1)
        run_o = self.run_time[order]  # (J, N+1)
        jo = np.arange(len(order))[None, :]
        for _ in range(2):
            if not (free > 0).any():
                break
            nxt = np.minimum(caps_o, 2 * x)
            better = (x > 0) & (nxt > x) & (run_o[jo, nxt] < run_o[jo, x])
            add = np.where(better, nxt - x, 0)
            accept = better & (np.cumsum(add, axis=1) <= free[:, None])
            x = x + np.where(accept, add, 0)
            free = free - np.where(accept, add, 0).sum(axis=1)
        out = np.empty_like(x)
        out[:, order] = x
        return out

    def fitness(self, pop: np.ndarray) -> np.ndarray:
        """(P,) predicted sum of completion times (s from now) of all jobs; lower is better.

        A job that finishes within the horizon ``H`` counts its predicted finish time. A job still
        running at ``H`` counts ``H`` plus its leftover work at its reference goodput (on its requested
        GPUs): this round's choice only decides how much progress it makes before ``H``, because its
        allocation will be revisited long before it finishes. Without the horizon, shrinking a long job
        would be charged as if it stayed small until the end, and long jobs would hog the cluster.
        """
        P, J = pop.shape
        H = self.horizon_s
        on = pop > 0
        cost = np.where((pop != self.cur[None, :]) & on, self.change_cost[None, :], 0.0)
        # A running job shrunk now will most likely grow back later: a second restart.
        cost = np.where(on & (pop < self.cur[None, :]), cost * self.shrink_cost_factor, cost)
        run = self.run_time[self.idx[None, :], pop]  # (P, J); inf where n = 0
        rate = self.table[self.idx[None, :], np.where(on, pop, self.need[None, :])]  # goodput while running
        if self.cur_rate is not None:
            kept = on & (pop == self.cur[None, :]) & (self.cur_rate[None, :] > 0)
            rate = np.where(kept, self.cur_rate[None, :], rate)
            run = np.where(kept, self.remaining[None, :] / np.maximum(rate, 1e-12), run)
        finish = np.where(on, cost + run, np.inf)
        start = np.where(on, cost, self._queue_start(pop, finish) + self.change_cost[None, :])
        n_eff = np.where(on, pop, self.need[None, :])
        done_by = start + self.remaining[None, :] / np.maximum(rate, 1e-12)
        left = self.remaining[None, :] - rate * np.clip(H - start, 0.0, None)
        late = H + np.maximum(left, 0.0) / self.ref_rate[None, :]
        completion = np.where(done_by <= H, done_by, late)
        total = completion.sum(axis=1)
        if self.gpu_time_weight > 0:
            # Opportunity cost of inefficient scaling within the horizon: GPU-seconds spent beyond
            # what the same progress costs at the job's most GPU-efficient size delay queued and
            # future jobs.
            busy = np.clip(np.minimum(done_by, H) - start, 0.0, None)
            progress = rate * busy
            used = n_eff * (busy + np.where(on, start, 0.0))  # a scheduled job holds GPUs while restarting
            ref = progress / self.best_rate_per_gpu[None, :]
            total = total + self.gpu_time_weight * np.maximum(used - ref, 0.0).sum(axis=1) / self.G
        return total

    def _queue_start(self, pop: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """(P, J) predicted start time of each queued job (undefined where the job is scheduled).

        Queued jobs (shortest first) each wait until enough GPUs have been freed by finishing jobs for
        its requested count. Past the point where every scheduled job has finished, queued jobs share
        the cluster in series (their GPU-time divided by the cluster).
        """
        P, J = pop.shape
        order = self.srt_order
        waiting = (pop == 0)[:, order]  # (P, J) shortest first
        out = np.zeros((P, J))
        if not waiting.any():
            return out
        fo = np.argsort(finish, axis=1)  # scheduled jobs by finish time; queued (inf) last
        f_sorted = np.take_along_axis(finish, fo, axis=1)
        g_sorted = np.take_along_axis(pop, fo, axis=1)
        free0 = self.G - pop.sum(axis=1)
        freed = np.concatenate([free0[:, None], free0[:, None] + np.cumsum(g_sorted, axis=1)], axis=1)  # (P, J+1)
        times = np.concatenate([np.zeros((P, 1)), f_sorted], axis=1)  # (P, J+1)
        need = self.need[order][None, :]
        demand = np.cumsum(np.where(waiting, need, 0), axis=1)  # GPUs the first k queued jobs hold
        # Row-wise searchsorted by offsetting rows into one sorted array.
        span = float(2 * self.G + int(self.need.sum()) + 2)
        offs = np.arange(P)[:, None] * span
        k = np.searchsorted((freed + offs).ravel(), (demand + offs).ravel(), side="left").reshape(P, J)
        k -= np.arange(P)[:, None] * (J + 1)
        over = k > J
        start = np.take_along_axis(times, np.minimum(k, J), axis=1)
        if over.any():
            t_run = self.t_need[order][None, :]
            last = np.max(np.where(np.isfinite(times), times, 0.0), axis=1)[:, None]
            chain = np.cumsum(np.where(waiting & over, need * t_run, 0.0), axis=1) / max(self.G, 1)
            start = np.where(over, last + chain, start)
        start = np.where(np.isfinite(start), start, 0.0)
        out[:, order] = start
        return out
