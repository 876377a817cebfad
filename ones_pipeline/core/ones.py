"""ONES: online evolutionary batch-size orchestration (Bian et al., SC'21), faithful and improved.

``ones-paper`` follows the SC'21 prototype: an individual is one slot per GPU holding a job index
or nothing; a population of 16 survives between rounds; each round breeds 32 children by uniform
crossover (p = 0.5) and job-removal mutation (p = 0.3; jobs younger than 2 epochs are immune),
repairs them ("pad": queued jobs get 1 GPU first-come-first-served, then running jobs grow towards
their cap shortest-remaining-time first) and keeps the best 16 of 48 by fitness
``sum_j n_j * remaining_j / throughput_j(n_j)`` (remaining GPU-time, lower is better), with
throughput extrapolated linearly from what was measured. Per-job size caps start at the request and
double each time a job has spent a whole epoch at its cap, up to 4x the request; when jobs wait and
the cluster is full, the largest long-running job is halved; a job is reconfigured at most once per
epoch. The chosen individual is placed on GPUs displacing as few running jobs as possible.

``ones`` (the default) keeps that search but fixes its weaknesses:

* fitness is the predicted sum of completion times of **all** active jobs: a scheduled job finishes
  after its restart/resize cost (when its allocation changes) plus remaining work / goodput; a queued
  job waits until enough GPUs free up (jobs served shortest-remaining first), then runs;
* goodput (throughput x statistical efficiency of the larger batch) from the fitted step-time model
  (compute + all-reduce + crossing nodes) instead of linear extrapolation;
* the population is one ``(population, jobs)`` array of GPU counts, evaluated vectorised, warm-started
  from the previous round's population (remapped by job name), the current schedule and a greedy
  seed; generations per round are fixed (deterministic) and optionally bounded by a wall-clock budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.placement import place_counts
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule, lr_for_batch


def _schedule_from_counts(cluster: Cluster, jobs: Sequence[JobView], counts: np.ndarray,
                          current: Schedule, order: Sequence[int], batches: np.ndarray | None = None) -> Schedule:
    """Place the counts; a job keeping its count keeps its allocation (a batch change alone would
    cost a restart), others get ``batches[j, n]`` (default: ONES's rule)."""
    wanted = [(jobs[i].name, int(counts[i])) for i in order]
    gpus = place_counts(cluster, wanted, {j.name: current.gpus_of(j.name) for j in jobs})
    index = {j.name: i for i, j in enumerate(jobs)}
    allocs = {}
    for j in jobs:
        if j.name not in gpus:
            continue
        old = current.allocations.get(j.name)
        if old is not None and old.gpus == gpus[j.name]:
            allocs[j.name] = old
        elif batches is None:
            allocs[j.name] = Allocation.for_spec(j.spec, gpus[j.name])
        else:
            batch = int(batches[index[j.name], len(gpus[j.name])])
            allocs[j.name] = Allocation(j.name, gpus[j.name], batch, lr_for_batch(j.spec, batch))
    return Schedule(allocs)


def _caps(cluster: Cluster, jobs: Sequence[JobView]) -> np.ndarray:
    return np.array([min(j.spec.gpu_cap, cluster.num_gpus) for j in jobs], dtype=np.int64)


def _goodput_table(cluster: Cluster, jobs: Sequence[JobView], max_n: int, use_efficiency: bool,
                   batch_factors: Sequence[float] = (1.0,)) -> tuple[np.ndarray, np.ndarray]:
    """Goodput and global batch of each job at 0..max_n GPUs: two (J, max_n + 1) arrays (column 0 unused).

    For each count the global batch is ``factor * per_gpu_batch * n`` (capped by the job's global batch
    cap), for the factor in ``batch_factors`` that gives the most base-equivalent samples/s.
    ``(1.0,)`` is ONES's rule: the per-GPU batch stays as submitted.
    """
    params = estimates.fitted_params(jobs)  # (J, 6)
    gns = estimates.noise_scales(jobs)[:, None, None]  # (J, 1, 1)
    n = np.arange(1, max_n + 1)[None, :, None]  # (1, N, 1)
    nodes = np.ceil(n / max(cluster.gpus_per_node))
    factors = np.asarray(batch_factors, dtype=float)[None, None, :]  # (1, 1, F)
    per_gpu = np.array([j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    cap = np.array([j.spec.global_batch_cap for j in jobs], dtype=float)[:, None, None]
    max_local = np.array([j.spec.max_per_gpu_batch or j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    batch = np.maximum(np.minimum(np.round(per_gpu * factors) * n, cap), 1.0)  # (J, N, F)
    gp = estimates.goodput_of(params[:, None, None, :], gns, per_gpu, max_local, n, nodes, batch,
                              use_efficiency=use_efficiency)  # (J, N, F)
    best = np.argmax(gp, axis=2)  # (J, N)
    good = np.take_along_axis(gp, best[:, :, None], axis=2)[:, :, 0]
    chosen = np.take_along_axis(batch, best[:, :, None], axis=2)[:, :, 0]
    zeros = np.zeros((len(jobs), 1))
    return np.concatenate([zeros, good], axis=1), np.concatenate([zeros, chosen], axis=1).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# Improved ONES
# --------------------------------------------------------------------------------------------------


class OnesPolicy:
    """Improved ONES (default): predicted-mean-JCT fitness over all jobs, goodput, vectorised search.

    Parameters (defaults tuned on Pollux workloads 1-4, checked on 5-8 and the ONES trace with
    ``benchmarks/tune_ones.py``): ``population`` individuals kept between rounds; ``generations`` per
    decision, stopped early by ``time_budget_s`` when given (live sensors; the simulator leaves it off so
    decisions are reproducible); ``crossover_p`` uniform crossover; ``removal_p`` / ``resize_p`` expected
    job removals / resizes (x2, /2; also +1, -1 with ``fine_resize``) per 4 jobs of a child;
    ``immune_epochs``: younger jobs are never removed; ``restart_cost_s`` charged to every job whose GPU
    count changes; ``horizon_s`` of the fitness (see ``_Ctx.fitness``); ``gpu_time_weight`` x active jobs x
    overload (how far the active jobs' requests exceed the cluster, clipped to [0, 1]) per cluster-second
    of GPU time spent beyond the job's most GPU-efficient size (0: off); ``batch_factors``: per-GPU batch
    multiples tried for each count (the best goodput wins); ``use_efficiency``: goodput (True) or raw
    throughput (False).
    """

    name = "ones"

    def __init__(self, seed: int = 0, population: int = 24, generations: int = 30,
                 time_budget_s: float | None = None, crossover_p: float = 0.5, removal_p: float = 0.1,
                 resize_p: float = 0.2, restart_cost_s: float = 30.0, immune_epochs: float = 0.0,
                 use_efficiency: bool = True, gpu_time_weight: float = 0.5, horizon_s: float = 1800.0,
                 batch_factors: Sequence[float] = (1.0, 2.0), fine_resize: bool = False):
        if population < 2:
            raise ValueError(f"ones: population must be >= 2, got {population}")
        if generations < 0:
            raise ValueError(f"ones: generations must be >= 0, got {generations}")
        if time_budget_s is not None and time_budget_s <= 0:
            raise ValueError(f"ones: time_budget_s must be > 0 or None, got {time_budget_s}")
        for pname, p in (("crossover_p", crossover_p), ("removal_p", removal_p), ("resize_p", resize_p)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"ones: {pname} must be in [0, 1], got {p}")
        if restart_cost_s < 0:
            raise ValueError(f"ones: restart_cost_s must be >= 0, got {restart_cost_s}")
        self.seed = seed
        self.params = dict(population=population, generations=generations, time_budget_s=time_budget_s,
                           crossover_p=crossover_p, removal_p=removal_p, resize_p=resize_p,
                           restart_cost_s=restart_cost_s, immune_epochs=immune_epochs,
                           use_efficiency=use_efficiency, gpu_time_weight=gpu_time_weight,
                           horizon_s=horizon_s, batch_factors=[float(f) for f in batch_factors],
                           fine_resize=bool(fine_resize))
        if not batch_factors or min(batch_factors) <= 0:
            raise ValueError(f"ones: batch_factors must be positive numbers, got {list(batch_factors)}")
        if not horizon_s > 0:
            raise ValueError(f"ones: horizon_s must be > 0, got {horizon_s}")
        if gpu_time_weight < 0:
            raise ValueError(f"ones: gpu_time_weight must be >= 0, got {gpu_time_weight}")
        self.rng = np.random.default_rng(seed)
        self.population: dict[str, list[int]] = {}  # job name -> counts, one per individual
        self.last_generations = 0

    # -- persistence -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "params": dict(self.params),
                "state": {"rng": self.rng.bit_generator.state, "population": self.population}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        self.population = {k: [int(x) for x in v] for k, v in state.get("population", {}).items()}

    # -- decision ----------------------------------------------------------------------------------
    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        if not jobs:
            self.population = {}
            return Schedule()
        p = self.params
        J, G, P = len(jobs), cluster.num_gpus, p["population"]
        caps = _caps(cluster, jobs)
        table, batches = _goodput_table(cluster, jobs, int(caps.max()), p["use_efficiency"],
                                        p["batch_factors"])  # (J, N+1) each
        remaining = estimates.remaining_work(jobs)  # (J,)
        cur = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        submit = np.array([j.submit_time_s for j in jobs])
        changed_cost = np.full(J, p["restart_cost_s"])
        requested = np.array([j.spec.requested_gpus for j in jobs], dtype=np.int64)
        # GPU time is worth more the more the active jobs' requests oversubscribe the cluster.
        overload = float(np.clip(np.minimum(requested, caps).sum() / G - 1.0, 0.0, 1.0))
        ctx = _Ctx(G, caps, table, remaining, cur, changed_cost, submit, requested,
                   p["gpu_time_weight"] * J * overload, p["horizon_s"])

        pop = self._initial_population(jobs, ctx)  # (P, J)
        pop = ctx.repair(pop, self.rng)
        fit = ctx.fitness(pop)
        deadline = time.perf_counter() + p["time_budget_s"] if p["time_budget_s"] else None
        gens = 0
        for _ in range(p["generations"]):
            if deadline is not None and time.perf_counter() > deadline:
                break
            children = self._breed(pop, ctx, jobs)
            children = ctx.repair(children, self.rng)
            cfit = ctx.fitness(children)
            allpop = np.concatenate([pop, children])
            allfit = np.concatenate([fit, cfit])
            # Truncation selection, ties broken towards the earlier (incumbent) individual.
            keep = np.argsort(allfit, kind="stable")[:P]
            pop, fit = allpop[keep], allfit[keep]
            gens += 1
        self.last_generations = gens
        best = pop[int(np.argmin(fit))]
        self.population = {j.name: pop[:, i].tolist() for i, j in enumerate(jobs)}
        # Place the jobs that finish soonest first (ties: earlier submission).
        order = np.lexsort((submit, ctx.solo_time(best)))
        return _schedule_from_counts(cluster, jobs, best, current, order, batches)

    def _initial_population(self, jobs: Sequence[JobView], ctx: _Ctx) -> np.ndarray:
        P, J = self.params["population"], len(jobs)
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
            src = pop[self.rng.integers(0, rows, size=P - rows)]
            pop[rows:] = self._mutate(src, ctx, jobs)
        return pop

    def _breed(self, pop: np.ndarray, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        P, J = pop.shape
        rng = self.rng
        a = pop[rng.integers(0, P, size=P)]
        b = pop[rng.integers(0, P, size=P)]
        mask = rng.random((P, J)) < self.params["crossover_p"]
        return self._mutate(np.where(mask, a, b), ctx, jobs)

    def _mutate(self, pop: np.ndarray, ctx: _Ctx, jobs: Sequence[JobView]) -> np.ndarray:
        rng = self.rng
        p = self.params
        out = pop.copy()
        immune = np.array([j.epochs_done < p["immune_epochs"] for j in jobs])
        remove = (rng.random(out.shape) < p["removal_p"] / max(1, out.shape[1]) * 4) & ~immune[None, :]
        out[remove] = 0
        resize = rng.random(out.shape) < p["resize_p"] / max(1, out.shape[1]) * 4
        # Four resize moves: double, halve, +1, -1 (coarse jumps and fine steps).
        move = rng.integers(0, 4 if p["fine_resize"] else 2, size=out.shape)
        resized = np.select([move == 0, move == 1, move == 2], [np.maximum(out * 2, 1), out // 2, out + 1],
                            np.maximum(out - 1, 0))
        out = np.where(resize, resized, out)
        return np.minimum(out, ctx.caps[None, :])


class _Ctx:
    """Arrays of one decision: caps, goodput table, remaining work; repair and fitness operators."""

    def __init__(self, G: int, caps: np.ndarray, table: np.ndarray, remaining: np.ndarray, cur: np.ndarray,
                 change_cost: np.ndarray, submit: np.ndarray, requested: np.ndarray,
                 gpu_time_weight: float = 0.0, horizon_s: float = 1800.0):
        self.gpu_time_weight, self.horizon_s = gpu_time_weight, horizon_s
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
        run = self.run_time[self.idx[None, :], pop]  # (P, J); inf where n = 0
        finish = np.where(on, cost + run, np.inf)
        start = np.where(on, cost, self._queue_start(pop, finish) + self.change_cost[None, :])
        n_eff = np.where(on, pop, self.need[None, :])
        rate = self.table[self.idx[None, :], n_eff]  # goodput while running
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


# --------------------------------------------------------------------------------------------------
# Faithful ONES (SC'21 prototype)
# --------------------------------------------------------------------------------------------------


class OnesPaperPolicy:
    """The SC'21 prototype's search: slot encoding, population 16, truncation 16 of 48."""

    name = "ones-paper"

    def __init__(self, seed: int = 0, population: int = 16, children: int = 32, crossover_p: float = 0.5,
                 removal_p: float = 0.3, immune_epochs: float = 2.0, max_scale: int = 4,
                 long_running_epochs: float = 2.0):
        if population < 2 or children < 1:
            raise ValueError(f"ones-paper: need population >= 2 and children >= 1, got {population}, {children}")
        for pname, p in (("crossover_p", crossover_p), ("removal_p", removal_p)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"ones-paper: {pname} must be in [0, 1], got {p}")
        if max_scale < 1:
            raise ValueError(f"ones-paper: max_scale must be >= 1, got {max_scale}")
        self.seed = seed
        self.params = dict(population=population, children=children, crossover_p=crossover_p,
                           removal_p=removal_p, immune_epochs=immune_epochs, max_scale=max_scale,
                           long_running_epochs=long_running_epochs)
        self.rng = np.random.default_rng(seed)
        self.population: list[list[str | None]] = []  # individuals as job names per slot
        self.caps: dict[str, int] = {}  # current per-job size cap
        self.cap_epoch: dict[str, float] = {}  # epochs done when the job reached its cap

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "params": dict(self.params),
                "state": {"rng": self.rng.bit_generator.state, "population": self.population,
                          "caps": self.caps, "cap_epoch": self.cap_epoch}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        self.population = [list(ind) for ind in state.get("population", [])]
        self.caps = {k: int(v) for k, v in state.get("caps", {}).items()}
        self.cap_epoch = {k: float(v) for k, v in state.get("cap_epoch", {}).items()}

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        if not jobs:
            self.population, self.caps, self.cap_epoch = [], {}, {}
            return Schedule()
        p = self.params
        G, J = cluster.num_gpus, len(jobs)
        index = {j.name: i for i, j in enumerate(jobs)}
        cur_counts = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        caps = self._update_caps(cluster, jobs, cur_counts)
        thr = self._throughput_table(jobs, int(caps.max()))  # (J, N+1) samples/s by linear extrapolation
        remaining = estimates.remaining_work(jobs)
        epochs = np.array([j.epochs_done for j in jobs])
        immune = epochs < p["immune_epochs"]
        # At most one reconfiguration per epoch: such running jobs are frozen at their current slots.
        frozen = np.array([
            cur_counts[i] > 0 and j.last_change_s is not None and j.epochs_done - j.epochs_at_last_change < 1.0
            for i, j in enumerate(jobs)
        ])
        cur_slots = current.slot_array(cluster, index)  # (G,)
        # Remaining-time order for padding (shortest first), FCFS for new jobs.
        t_rem = remaining / np.maximum(thr[:, 1], 1e-12)
        srt = np.lexsort((np.array([j.submit_time_s for j in jobs]), t_rem))
        fcfs = np.argsort([j.submit_time_s for j in jobs], kind="stable")

        pop = [np.array([index.get(x, -1) if x is not None else -1 for x in ind], dtype=np.int64)
               for ind in self.population if len(ind) == G]
        if not pop:
            pop = [cur_slots.copy()]
        while len(pop) < p["population"]:
            pop.append(pop[len(pop) % max(1, len(pop))].copy())
        pop = np.stack(pop[: p["population"]])  # (P, G)
        ctx = dict(G=G, caps=caps, frozen=frozen, cur_slots=cur_slots, srt=srt, fcfs=fcfs, thr=thr)
        pop = np.stack([self._repair(ind, ctx) for ind in pop])
        children = []
        for _ in range(p["children"]):
            a, b = pop[self.rng.integers(0, len(pop), size=2)]
            child = np.where(self.rng.random(G) < p["crossover_p"], a, b)
            present = np.unique(child[child >= 0])
            drop = present[(self.rng.random(present.size) < p["removal_p"]) & ~immune[present]]
            child[np.isin(child, drop)] = -1
            children.append(self._repair(child, ctx))
        allpop = np.concatenate([pop, np.stack(children)])
        fit = np.array([self._fitness(ind, thr, remaining) for ind in allpop])
        keep = np.argsort(fit, kind="stable")[: p["population"]]
        pop = allpop[keep]
        best = pop[0]
        counts = np.bincount(best[best >= 0], minlength=J)
        counts = self._scale_down_largest(counts, jobs, cur_counts, epochs, frozen)
        self.population = [[jobs[x].name if x >= 0 else None for x in ind] for ind in pop]
        order = np.lexsort((np.array([j.submit_time_s for j in jobs]), -counts))
        return _schedule_from_counts(cluster, jobs, counts, current, order)

    def _update_caps(self, cluster: Cluster, jobs: Sequence[JobView], cur: np.ndarray) -> np.ndarray:
        """Per-job caps: start at the request; double after a whole epoch at the cap; at most 4x."""
        G = cluster.num_gpus
        live = {j.name for j in jobs}
        self.caps = {k: v for k, v in self.caps.items() if k in live}
        self.cap_epoch = {k: v for k, v in self.cap_epoch.items() if k in live}
        out = np.empty(len(jobs), dtype=np.int64)
        for i, j in enumerate(jobs):
            hard = min(j.spec.gpu_cap, self.params["max_scale"] * j.spec.requested_gpus, G)
            cap = min(self.caps.get(j.name, j.spec.requested_gpus), hard)
            if cur[i] >= cap:
                since = self.cap_epoch.setdefault(j.name, j.epochs_done)
                if j.epochs_done - since >= 1.0 and cap < hard:
                    cap = min(2 * cap, hard)
                    self.cap_epoch[j.name] = j.epochs_done
            else:
                self.cap_epoch.pop(j.name, None)
            self.caps[j.name] = max(cap, 1)
            out[i] = max(cap, 1)
        return out

    @staticmethod
    def _throughput_table(jobs: Sequence[JobView], max_n: int) -> np.ndarray:
        """(J, max_n + 1) samples/s: measured where seen, else linear in GPUs from the nearest seen count."""
        params = estimates.fitted_params(jobs)
        out = np.zeros((len(jobs), max_n + 1))
        n = np.arange(1, max_n + 1)
        for i, j in enumerate(jobs):
            seen: dict[int, float] = {}
            for o in j.throughput_obs:
                seen[o.num_gpus] = o.num_gpus * o.per_gpu_batch / o.step_time_s
            if not seen:
                per_gpu = float(estimates.goodput_of(params[i], 0.0, j.spec.per_gpu_batch,
                                                     j.spec.max_per_gpu_batch or j.spec.per_gpu_batch, 1, 1,
                                                     j.spec.per_gpu_batch, use_efficiency=False))
                seen = {1: per_gpu}
            ks = np.array(sorted(seen))
            nearest = ks[np.argmin(np.abs(ks[None, :] - n[:, None]), axis=1)]
            out[i, 1:] = np.array([seen[k] for k in nearest]) * n / nearest
        return out

    @staticmethod
    def _fitness(ind: np.ndarray, thr: np.ndarray, remaining: np.ndarray) -> float:
        counts = np.bincount(ind[ind >= 0], minlength=thr.shape[0])
        on = np.flatnonzero(counts)
        return float(np.sum(counts[on] * remaining[on] / np.maximum(thr[on, counts[on]], 1e-12)))

    def _repair(self, ind: np.ndarray, ctx: dict) -> np.ndarray:
        """Feasible individual: frozen jobs on their slots, caps respected, then pad free slots."""
        ind = ind.copy()
        caps, frozen, cur_slots = ctx["caps"], ctx["frozen"], ctx["cur_slots"]
        J = len(caps)
        # Frozen jobs keep exactly their current slots.
        frozen_slots = (cur_slots >= 0) & frozen[np.maximum(cur_slots, 0)]
        ind[np.isin(ind, np.flatnonzero(frozen)) & ~frozen_slots] = -1
        ind[frozen_slots] = cur_slots[frozen_slots]
        # Caps: drop slots beyond the cap (keep the first ones).
        for j in np.unique(ind[ind >= 0]):
            slots = np.flatnonzero(ind == j)
            if slots.size > caps[j]:
                ind[slots[caps[j]:]] = -1
        counts = np.bincount(ind[ind >= 0], minlength=J)
        free = np.flatnonzero(ind < 0)
        # Pad 1: jobs holding nothing get one GPU, first come first served.
        k = 0
        for j in ctx["fcfs"]:
            if k >= free.size:
                break
            if counts[j] == 0:
                ind[free[k]] = j
                counts[j] = 1
                k += 1
        # Pad 2: jobs grow towards their cap, shortest remaining time first.
        for j in ctx["srt"]:
            if k >= free.size:
                break
            if frozen[j] or counts[j] == 0:
                continue
            add = min(caps[j] - counts[j], free.size - k)
            if add > 0:
                ind[free[k:k + add]] = j
                counts[j] += add
                k += add
        return ind

    def _scale_down_largest(self, counts: np.ndarray, jobs: Sequence[JobView], cur: np.ndarray,
                            epochs: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """If jobs still wait, halve the largest long-running job to make room (one per round)."""
        waiting = counts == 0
        if not waiting.any():
            return counts
        long_running = (cur > 1) & (counts > 1) & (epochs >= self.params["long_running_epochs"]) & ~frozen
        if not long_running.any():
            return counts
        j = int(np.argmax(np.where(long_running, counts, -1)))
        freed = counts[j] - counts[j] // 2
        counts = counts.copy()
        counts[j] //= 2
        for w in np.flatnonzero(waiting)[np.argsort([jobs[w].submit_time_s for w in np.flatnonzero(waiting)],
                                                    kind="stable")][:freed]:
            counts[w] = 1
        return counts
