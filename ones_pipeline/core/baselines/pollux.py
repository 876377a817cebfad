"""Pollux: co-adaptive GPU count and batch size by goodput (Qiao et al., OSDI'21).

Configured as in the Pollux authors' simulator: a genetic search over allocations (population 100, 100
generations per round, warm-started from the previous round), fitness = power mean with p = -1 of each
job's speedup, restart penalty ``(age - restarts * 30) / (age + 30)``, a job offered at most twice the
largest GPU count it has run on, NCF jobs pinned to one GPU, at most one multi-node job per node.

Design choices (the paper leaves them open or this core models less than Pollux's simulator):

* **Genes are GPU counts, not node placements.** The population is one ``(population, jobs)`` int array
  of indices into each job's allowed counts: ``0 .. min(N, gpus_per_node)`` and, beyond one node, whole
  nodes only (``2g, 3g, ...`` for ``g`` GPUs per node, the largest node size). Whole nodes make "at most
  one multi-node job per node" hold by construction and give the speed model an exact node count
  ``ceil(n / g)``. Concrete GPUs are chosen afterwards by ``place_counts`` (largest jobs first, so
  multi-node jobs take the emptiest nodes; unchanged counts keep their GPUs).
* **Speedup baseline = one GPU.** ``speedup(n) = goodput(n, best batch) / goodput(1, best batch)`` (the
  max over batch sizes in both, as in the paper). The paper's fair share is the job's 1/J of the cluster;
  in a loaded cluster that is one GPU or less, and a one-GPU baseline keeps speedups independent of the
  number of jobs, so a job's own speedup changes only with its own allocation.
* **Jobs without GPUs** count with speedup ``idle_speedup`` (default 0.01) instead of 0, which would make
  the power mean with p < 0 zero for every candidate whenever jobs outnumber GPUs. With p = -1 the
  search thus first maximises the number of running jobs, then the harmonic mean of their speedups.
* **Restart penalty** multiplies the speedup of a *running* job whose GPU count would change (age = seconds
  since submit, clipped to [0, 1]); starting a waiting job costs it nothing it would otherwise have.
* **Batch**: for each count, the best global batch on a geometric grid of ``batch_grid_size`` sizes from
  ``per_gpu_batch`` (the base batch) to ``spec.global_batch_cap`` (or ``max_batch_scale`` x the base batch
  when the spec sets no cap), and at least one sample per GPU. A running job whose count is unchanged
  keeps its current batch unless the best one beats it by more than ``batch_change_threshold`` (a batch
  change restarts the job in the simulator and in the live pipeline).
* **Operators** (all draws from the policy's generator): binary tournament selection, uniform crossover,
  mutation of ``mutation_genes`` genes per child on average (a step to the neighbouring count, or a
  uniformly drawn count), repair of over-full candidates by lowering a common per-job GPU ceiling
  ("water level") until they fit, then dropping random jobs if there are more jobs than GPUs, and
  elitist survival of the best ``population`` of parents and children. The starting population always
  holds the current allocation, "one GPU each in submit order" and a greedy candidate (from nothing,
  repeatedly the move up with the steepest objective decrease per added GPU): at thousands of jobs,
  100 generations of a few mutated genes per child cannot fill a cluster from random candidates, and
  the greedy seed keeps the search useful there.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.baselines.common import (
    BaselinePolicy,
    active_views,
    check_float,
    check_int,
    held_gpus,
    new_allocation,
    submit_order,
)
from ones_pipeline.core.placement import place_counts
from ones_pipeline.core.policy import register
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule


@register("pollux")
class PolluxPolicy(BaselinePolicy):
    """Goodput-maximising co-adaptive allocation by genetic search (see the module docstring)."""

    name = "pollux"

    def __init__(self, seed: int = 0, population: int = 100, generations: int = 100, fairness_p: float = -1.0,
                 restart_penalty_s: float = 30.0, idle_speedup: float = 0.01, batch_grid_size: int = 16,
                 max_batch_scale: float = 64.0, batch_change_threshold: float = 0.05, mutation_genes: float = 2.0,
                 pinned_models: Sequence[str] = ("ncf",), time_budget_s: float | None = None) -> None:
        super().__init__(seed)
        self.population = check_int(self.name, "population", population, 2)
        self.generations = check_int(self.name, "generations", generations, 0)
        self.fairness_p = check_float(self.name, "fairness_p", fairness_p, maximum=1.0)
        self.restart_penalty_s = check_float(self.name, "restart_penalty_s", restart_penalty_s, 0.0)
        self.idle_speedup = check_float(self.name, "idle_speedup", idle_speedup, 0.0, 1.0, strict_min=True)
        self.batch_grid_size = check_int(self.name, "batch_grid_size", batch_grid_size, 1)
        self.max_batch_scale = check_float(self.name, "max_batch_scale", max_batch_scale, 1.0)
        self.batch_change_threshold = check_float(self.name, "batch_change_threshold", batch_change_threshold, 0.0)
        self.mutation_genes = check_float(self.name, "mutation_genes", mutation_genes, 0.0)
        if isinstance(pinned_models, (str, bytes)) or not all(isinstance(m, str) for m in pinned_models):
            raise ValueError(f"{self.name}: pinned_models must be a list of model names, got {pinned_models!r}")
        self.pinned_models = tuple(pinned_models)
        self.time_budget_s = (None if time_budget_s is None else
                              check_float(self.name, "time_budget_s", time_budget_s, 0.0, strict_min=True))
        # Warm start: the last round's population (best first) as GPU counts, one column per job name.
        self._pop_jobs: list[str] = []
        self._pop_counts = np.zeros((0, 0), dtype=np.int64)

    def params(self) -> dict[str, Any]:
        return {"population": self.population, "generations": self.generations, "fairness_p": self.fairness_p,
                "restart_penalty_s": self.restart_penalty_s, "idle_speedup": self.idle_speedup,
                "batch_grid_size": self.batch_grid_size, "max_batch_scale": self.max_batch_scale,
                "batch_change_threshold": self.batch_change_threshold, "mutation_genes": self.mutation_genes,
                "pinned_models": list(self.pinned_models), "time_budget_s": self.time_budget_s}

    def _extra_state(self) -> dict[str, Any]:
        return {"population_jobs": list(self._pop_jobs), "population_counts": self._pop_counts.tolist()}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        jobs = [str(j) for j in state.get("population_jobs", [])]
        counts = np.asarray(state.get("population_counts", []), dtype=np.int64)
        if counts.size == 0:
            counts = np.zeros((0, len(jobs)), dtype=np.int64)
        if counts.ndim != 2 or counts.shape[1] != len(jobs) or (counts < 0).any():
            raise ValueError(f"{self.name}: state 'population_counts' must be a list of rows of "
                             f"{len(jobs)} GPU counts >= 0 (one per 'population_jobs'), got shape {counts.shape}")
        self._pop_jobs, self._pop_counts = jobs, counts

    # ----------------------------------------------------------------------------------------------

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = submit_order(active_views(self.name, jobs))
        if not views:
            self._pop_jobs, self._pop_counts = [], np.zeros((0, 0), dtype=np.int64)
            return Schedule({})
        problem = _Problem.build(self, now_s, cluster, views, current)
        pop = self._initial_population(problem)
        pop, cost = self._evolve(problem, pop)
        best = problem.count_of(pop[0])  # (J,)
        self._pop_jobs = [v.name for v in views]
        self._pop_counts = problem.count_of(pop)

        batches = problem.batch_for(best, current)
        placed = place_counts(cluster, [(v.name, int(n)) for v, n in zip(views, best)], problem.held)
        allocations: dict[str, Allocation] = {}
        for j, view in enumerate(views):
            if view.name in placed:
                allocations[view.name] = new_allocation(view, placed[view.name], int(batches[j]), current)
        return Schedule(allocations)

    def _initial_population(self, pb: "_Problem") -> np.ndarray:
        """(population, J) gene indices, best first: the previous population remapped by job name (new
        jobs drawn at random), one GPU each in submit order, the current allocation, the greedy
        candidate, random candidates for the rest; all repaired."""
        P, J = self.population, pb.J
        pop = np.empty((max(P, 3), J), dtype=np.int64)
        rows = 0
        if self._pop_counts.shape[0] and self._pop_jobs:
            old_col = {name: k for k, name in enumerate(self._pop_jobs)}
            prev = self._pop_counts[: max(P - 3, 0)]  # the last round's best rows
            fill = pb.random_genes(prev.shape[0], self._rng)
            for j, name in enumerate(pb.names):
                if name in old_col:
                    fill[:, j] = pb.index_of(np.minimum(prev[:, old_col[name]], pb.max_n[j]), j)
            pop[: prev.shape[0]] = fill
            rows = prev.shape[0]
        ones = np.zeros(J, dtype=np.int64)
        ones[: min(J, pb.capacity)] = 1
        pop[rows] = ones
        pop[rows + 1] = pb.index_of(pb.cur_n)
        pop[rows + 2] = pb.grow_greedily(np.zeros(J, dtype=np.int64))
        rows += 3
        if rows < P:
            pop[rows:] = pb.random_genes(P - rows, self._rng)
        pop = pb.repair(pop, self._rng)
        return pop[np.argsort(pb.cost(pop), kind="stable")[:P]]

    def _evolve(self, pb: "_Problem", pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the generations; returns the population sorted best first and its costs."""
        rng = self._rng
        P, J = pop.shape
        cost = pb.cost(pop)
        order = np.argsort(cost, kind="stable")
        pop, cost = pop[order], cost[order]
        p_mut = min(1.0, self.mutation_genes / J)
        start = time.perf_counter()
        for _ in range(self.generations):
            if self.time_budget_s is not None and time.perf_counter() - start > self.time_budget_s:
                break
            a, b = rng.integers(P, size=(2, 2, P))  # two binary tournaments per child
            mother = np.where(cost[a[0]] <= cost[a[1]], a[0], a[1])
            father = np.where(cost[b[0]] <= cost[b[1]], b[0], b[1])
            child = np.where(rng.random((P, J)) < 0.5, pop[mother], pop[father])  # uniform crossover
            rows, cols = np.nonzero(rng.random((P, J)) < p_mut)
            if rows.size:
                length = pb.length[cols]
                step = np.where(rng.random(rows.size) < 0.5, -1, 1)
                neighbour = np.clip(child[rows, cols] + step, 0, length - 1)
                uniform = (rng.random(rows.size) * length).astype(np.int64)
                child[rows, cols] = np.where(rng.random(rows.size) < 0.7, neighbour, uniform)
            child = pb.repair(child, rng)
            both = np.concatenate([pop, child])
            both_cost = np.concatenate([cost, pb.cost(child)])
            keep = np.argsort(both_cost, kind="stable")[:P]
            pop, cost = both[keep], both_cost[keep]
        return pop, cost


class _Problem:
    """One round's search problem: per-job allowed counts, speedup and objective tables (arrays only)."""

    def __init__(self) -> None:  # filled by build()
        pass

    @classmethod
    def build(cls, policy: PolluxPolicy, now_s: float, cluster: Cluster, views: Sequence[JobView],
              current: Schedule) -> "_Problem":
        pb = cls()
        J = len(views)
        pb.J, pb.names, pb.views = J, [v.name for v in views], list(views)
        pb.capacity = cluster.num_gpus
        pb.gpn = g = max(cluster.gpus_per_node)
        pb.held = held_gpus(cluster, current, pb.names)
        pb.cur_n = np.array([len(pb.held.get(v.name, ())) for v in views], dtype=np.int64)  # (J,)
        # Largest count offered: 2x the largest seen (at least 1), gpu_cap, cluster, 1 sample per GPU.
        max_n = np.array([1 if v.spec.model in policy.pinned_models else
                          max(1, min(2 * v.max_gpus_seen, v.spec.gpu_cap, cluster.num_gpus, v.spec.global_batch_cap))
                          for v in views], dtype=np.int64)
        pb.max_n = max_n  # (J,)
        pb.length = np.where(max_n <= g, max_n + 1, g + max_n // g)  # (J,) allowed counts incl. 0
        L = int(pb.length.max())
        idx = np.arange(L)
        counts = np.broadcast_to(np.where(idx <= g, idx, (idx - g + 1) * g), (J, L))  # (J, L)
        valid = idx[None, :] < pb.length[:, None]  # (J, L)
        n = np.where(valid, counts, 1).astype(float)  # (J, L) GPU count, 1 where padded

        # Goodput at every count for every batch on the grid: (J, L, G).
        params = estimates.fitted_params(views)  # (J, 6)
        gns = estimates.noise_scales(views)  # (J,)
        base = np.array([v.spec.per_gpu_batch for v in views], dtype=float)  # (J,)
        upper = np.array([v.spec.global_batch_cap if (v.spec.max_lr is not None or v.spec.max_global_batch is not None)
                          else v.spec.per_gpu_batch * policy.max_batch_scale for v in views], dtype=float)
        max_local = np.array([v.spec.max_per_gpu_batch or np.inf for v in views], dtype=float)
        G = policy.batch_grid_size
        frac = np.linspace(0.0, 1.0, G) if G > 1 else np.zeros(1)
        grid = np.floor(base[:, None] * (upper / base)[:, None] ** frac[None, :])  # (J, G)
        batch = np.maximum(grid[:, None, :], n[:, :, None])  # (J, L, G) at least one sample per GPU
        nodes = np.ceil(n / g)[:, :, None]
        good = estimates.goodput_of(params[:, None, None, :], gns[:, None, None], base[:, None, None],
                                    max_local[:, None, None], n[:, :, None], nodes, batch)  # (J, L, G)
        best_g = np.argmax(good, axis=2)  # (J, L)
        best = np.take_along_axis(good, best_g[:, :, None], axis=2)[:, :, 0]  # (J, L)
        pb.best_batch = np.take_along_axis(batch, best_g[:, :, None], axis=2)[:, :, 0].astype(np.int64)
        pb.best_goodput = best
        pb.params, pb.gns, pb.base, pb.max_local = params, gns, base, max_local

        speedup = np.where(valid, best / best[:, 1:2], 0.0)  # (J, L) over one GPU at its best batch
        speedup[:, 0] = 0.0
        # Restart penalty for running jobs whose count would change.
        age = np.array([max(now_s - v.submit_time_s, 0.0) for v in views])
        restarts = np.array([v.restarts for v in views], dtype=float)
        delta = policy.restart_penalty_s
        factor = np.clip((age - restarts * delta) / (age + delta), 0.0, 1.0) if delta > 0 else np.ones(J)
        cur_idx = pb.index_of(pb.cur_n)
        conforming = pb.count_of(cur_idx) == pb.cur_n
        changed = (idx[None, :] != cur_idx[:, None]) | ~conforming[:, None]
        penalised = (pb.cur_n > 0)[:, None] & changed & (idx[None, :] > 0)
        speedup = np.where(penalised, speedup * factor[:, None], speedup)
        pb.speedup = speedup

        s = np.maximum(speedup, policy.idle_speedup)
        p = policy.fairness_p
        if p < 0:
            obj = s ** p
        elif p == 0:
            obj = -np.log(s)
        else:
            obj = -(s ** p)
        pb.objective = np.where(valid, obj, np.inf)  # (J, L) cost of each gene value; lower is better
        pb.fairness_p, pb.idle_speedup = p, policy.idle_speedup
        pb.batch_change_threshold = policy.batch_change_threshold
        pb._cols = np.arange(J)
        return pb

    # Gene index <-> GPU count.
    def count_of(self, idx: np.ndarray) -> np.ndarray:
        g = self.gpn
        return np.where(idx <= g, idx, (idx - g + 1) * g)

    def index_of(self, count: np.ndarray, j: int | None = None) -> np.ndarray:
        """Index of the largest allowed count <= ``count`` (per job, or for job ``j``)."""
        g = self.gpn
        max_n = self.max_n if j is None else self.max_n[j]
        c = np.minimum(np.asarray(count, dtype=np.int64), max_n)
        return np.where(c <= g, c, g + c // g - 1)

    def random_genes(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """(rows, J) uniformly drawn gene indices (not yet repaired)."""
        return (rng.random((rows, self.J)) * self.length[None, :]).astype(np.int64)

    def cost(self, pop: np.ndarray) -> np.ndarray:
        """(P,) sum of per-job objective terms (minimised)."""
        return self.objective[self._cols[None, :], pop].sum(axis=1)

    def fitness(self, pop: np.ndarray) -> np.ndarray:
        """(P,) power mean of the (floored) speedups, the quantity the search maximises."""
        s = np.maximum(self.speedup[self._cols[None, :], pop], self.idle_speedup)
        p = self.fairness_p
        if p == 0:
            return np.exp(np.log(s).mean(axis=1))
        return (s ** p).mean(axis=1) ** (1.0 / p)

    def repair(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Make every candidate fit the cluster: lower a per-candidate ceiling on each job's count until
        the total fits, then, where even one GPU each is too many, drop random jobs."""
        cnt = self.count_of(pop)
        over = cnt.sum(axis=1) > self.capacity
        if not over.any():
            return pop
        sub = cnt[over]  # (R, J)
        g, cap = self.gpn, self.capacity

        def floor_allowed(x: np.ndarray) -> np.ndarray:
            return np.where(x > g, (x // g) * g, x)

        lo = np.ones(sub.shape[0], dtype=np.int64)
        hi = np.maximum(sub.max(axis=1), 1)
        while (lo < hi).any():
            mid = (lo + hi + 1) // 2
            fits = floor_allowed(np.minimum(sub, mid[:, None])).sum(axis=1) <= cap
            lo = np.where(fits, mid, lo)
            hi = np.where(fits, hi, mid - 1)
        sub = floor_allowed(np.minimum(sub, lo[:, None]))
        still = sub.sum(axis=1) > cap  # more running jobs than GPUs: keep a random `cap` of them
        if still.any():
            s = sub[still]
            keys = rng.random(s.shape)
            keys[s == 0] = 2.0
            rank = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
            s[rank >= cap] = 0
            sub[still] = s
        out = pop.copy()
        out[over] = self.index_of(sub)
        return out

    def grow_greedily(self, genes: np.ndarray) -> np.ndarray:
        """(J,) the feasible candidate ``genes`` grown while GPUs remain: each time the job whose best
        move up (to any larger allowed count, so a penalised path back to its current count is seen
        whole) lowers the objective most per added GPU."""
        genes = genes.copy()
        free = self.capacity - int(self.count_of(genes).sum())
        all_counts = self.count_of(np.arange(self.objective.shape[1]))  # (L,)
        heap: list[tuple[float, int, int]] = []

        def push(j: int) -> None:
            i = int(genes[j])
            up = np.arange(i + 1, int(self.length[j]))
            if up.size == 0:
                return
            extra = all_counts[up] - all_counts[i]
            per_gpu = (self.objective[j, up] - self.objective[j, i]) / extra
            ok = extra <= free
            if ok.any():
                k = int(np.argmin(np.where(ok, per_gpu, np.inf)))
                if per_gpu[k] < 0:
                    heapq.heappush(heap, (float(per_gpu[k]), j, int(up[k])))

        for j in range(self.J):
            push(j)
        while heap and free > 0:
            _, j, target = heapq.heappop(heap)
            extra = int(all_counts[target] - all_counts[genes[j]])
            if extra > free:
                push(j)  # re-evaluate with the GPUs left
                continue
            genes[j] = target
            free -= extra
            push(j)
        return genes

    def batch_for(self, counts: np.ndarray, current: Schedule) -> np.ndarray:
        """(J,) global batch for the chosen counts (0 where no GPU), with hysteresis for running jobs."""
        idx = self.index_of(counts)
        out = self.best_batch[self._cols, idx].copy()
        for j, view in enumerate(self.views):
            n = int(counts[j])
            old = current.allocations.get(view.name)
            if n == 0 or old is None or n != self.cur_n[j] or n != old.num_gpus:
                continue
            keep = estimates.goodput_of(self.params[j], self.gns[j], self.base[j], self.max_local[j], n,
                                        np.ceil(n / self.gpn), max(old.global_batch, n))
            if self.best_goodput[j, idx[j]] <= float(keep) * (1.0 + self.batch_change_threshold):
                out[j] = old.global_batch
        return np.where(counts > 0, out, 0)
