"""Pollux: goodput-driven co-adaptive scheduling (Qiao et al., OSDI'21), as the Pollux authors' simulator
runs it (petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/pollux.py``; read, not copied).

The scheduler decides only *where* each job runs; every job picks its own batch for the GPUs it holds
(``Allocation.batch_tuned_by_job``: AdaptDL's trainer re-tunes it in-process at every reallocation and
after every epoch, without a restart). What the policy does each round:

* **Jobs** in the order (attained GPU-seconds, submit time): earlier jobs win conflicts in repair.
* **Candidates** are job x node matrices of GPU counts, a population of ``population`` (100) evolved for
  ``generations`` (100) and warm-started from the last round's Pareto front, remapped as the authors'
  ``_adapt_prev_states`` does (``warm_start="positional"``: rows of surviving jobs copied in order of
  appearance, so they may land on other jobs; ``"by_name"``: each job its own row; new jobs start with
  nothing). The first round starts from the current allocation alone.
* **Speedup** of job ``j`` on ``k`` nodes and ``r`` GPUs: its goodput at its best batch there divided by
  its goodput at the fair share (1 node, ceil(GPUs / jobs) GPUs), both from the job's own fitted model
  (``core.goodput``: fitted to the configurations it has run on, its measured gradient noise scale). A job
  that has never run has ``r / fair share``. Speedups are scaled by nodes / GPUs (a node's worth = 1).
* **Restart factor**: a job whose row changes (any node's count, including a first start) has its speedup
  multiplied by ``max(age - restarts x 30, 0) / (age + 30)`` (age = seconds since submit).
* **Fitness**: the power mean with ``p = -1`` of (speedup + 0.001) over all jobs, maximised (a job with
  no GPUs counts 0.001, so the search first runs as many jobs as it can).
* **Operators** (all draws from the policy's generator): binary tournament; single-point crossover over
  jobs (probability 0.9); mutation: with probability 0.1 a job's row is reset to the current allocation,
  with probability 0.1 each of its entries is zeroed with probability 0.1, and on every node with a free
  GPU about one job's entry is raised to a uniform count up to the node size (each job with probability
  1 / jobs, plus 1 / jobs already there for those), so a child differs from its parent in a few jobs;
  repair: at most one multi-node job per node (the earliest keeps it), at
  most ``max_replicas`` GPUs per job (kept on randomly ordered nodes), node capacity (earlier jobs keep
  theirs).
* **Limits**: a job is offered at most ``max(2 x the most GPUs it has run on, 1)`` GPUs, at most 64, at
  most its largest batch / smallest micro-batch; ``pinned_models`` (NCF) get one GPU and a fixed batch.
* **Scale**: a candidate has jobs x nodes cells; where ``population`` candidates would exceed
  ``max_cells`` (20 M) the population shrinks to fit (at least 2), so thousands of GPUs stay in memory.
* **Selection and survival** (``selection="nsga2"``, as the authors with pymoo): NSGA-II on two
  objectives, the fitness and the cluster utility (sum of unpenalised speedups per GPU of the nodes in
  use): binary tournaments by dominance then crowding distance, survival of the best ``population``
  distinct candidates by non-dominated rank then crowding; the candidate with the best fitness is
  applied. ``selection="fitness"``: tournaments and survival by fitness alone.

GPU slots: a job whose row is unchanged keeps its GPUs; a changed job takes, on each node, GPUs it held
there first, then free ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ones_pipeline.core import goodput as gp
from ones_pipeline.core.policies.base import PolicyBase, check_bool, check_float, check_int
from ones_pipeline.core.policies.common import active_views, held_gpus, new_allocation
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule

_ZERO_SPEEDUP = 1e-3  # added to every speedup in the power mean (a job with no GPUs counts this much)


def _order(views: Sequence[JobView]) -> list[JobView]:
    return sorted(views, key=lambda v: (v.attained_gpu_s, v.submit_time_s, v.name))


def speedup_table(views: Sequence[JobView], max_replicas: np.ndarray, fair_replicas: int,
                  model: gp.GoodputModel | None = None) -> np.ndarray:
    """(J, 3, R + 1) speedup of each job on r GPUs (R = max of ``max_replicas``) within one node (index 1)
    and across nodes (index 2; the model tells only whether a job crosses nodes, not how many it spans);
    index 0 and r above the job's limit are 0. See the module docstring."""
    J = len(views)
    R = int(max_replicas.max()) if J else 0
    table = np.zeros((J, 3, R + 1))
    r_all = np.arange(R + 1, dtype=float)
    rows_j, rows_k, rows_r = [], [], []
    for j, v in enumerate(views):
        top = int(max_replicas[j])
        if not v.throughput_obs or v.grad_noise_scale is None:
            table[j, 1, : top + 1] = r_all[: top + 1] / fair_replicas
            table[j, 2, 2: top + 1] = r_all[2: top + 1] / fair_replicas
            continue
        rows_j += [j] * top + [j] * max(top - 1, 0) + [j]
        rows_k += [1] * top + [2] * max(top - 1, 0) + [1]
        rows_r += list(range(1, top + 1)) + list(range(2, top + 1)) + [fair_replicas]  # the base, last
    if rows_j:
        jj = np.array(rows_j)
        kk = np.array(rows_k)
        rr = np.array(rows_r)
        lim = np.array([gp.batch_limits(v.spec) for v in views])  # (J, 4)
        model = model if model is not None else gp.GoodputModel()
        model.fit(tuple(v.throughput_obs) for v in views)  # all new fits in one batch
        params = np.stack([model.fitted(v.throughput_obs) if v.throughput_obs else np.zeros(gp.N_PERF)
                           for v in views])
        gns = np.array([v.grad_noise_scale or 0.0 for v in views])
        good, _, _ = gp.best_batch(params[jj], gns[jj], lim[jj, 0], lim[jj, 1], lim[jj, 2], lim[jj, 3],
                                   kk.astype(float), rr.astype(float))
        last = np.flatnonzero(np.r_[jj[1:] != jj[:-1], True])  # per job, its last row is its base
        base = np.repeat(good[last], np.diff(np.r_[-1, last]))
        ratio = np.where(base > 0, good / np.where(base > 0, base, 1.0), 0.0)
        body = np.ones(len(jj), dtype=bool)
        body[last] = False
        table[jj[body], kk[body], rr[body]] = ratio[body]
    return table


class PolluxPolicy(PolicyBase):
    """Pollux as its authors simulate it (see the module docstring)."""

    name = "pollux"

    def __init__(self, seed: int = 0, population: int = 100, generations: int = 100, fairness_p: float = -1.0,
                 restart_penalty_s: float = 30.0, max_scale_out: float = 2.0, max_replicas: int = 64,
                 crossover_p: float = 0.9, pinned_models: Sequence[str] = ("ncf",), jobs_tune_batch: bool = True,
                 time_budget_s: float | None = None, max_cells: int = 20_000_000,
                 warm_start: str = "positional", keep: str = "front", selection: str = "nsga2",
                 model: gp.GoodputModel | None = None) -> None:
        super().__init__(seed)
        self.model = model if model is not None else gp.GoodputModel()  # values the jobs; fits kept
        if selection not in ("nsga2", "fitness"):
            raise ValueError(f"{self.name}: selection must be 'nsga2' or 'fitness', got {selection!r}")
        self.selection = selection
        if warm_start not in ("positional", "by_name"):
            raise ValueError(f"{self.name}: warm_start must be 'positional' or 'by_name', got {warm_start!r}")
        if keep not in ("front", "population"):
            raise ValueError(f"{self.name}: keep must be 'front' or 'population', got {keep!r}")
        self.warm_start, self.keep = warm_start, keep
        self.population = check_int(self.name, "population", population, 2)
        self.generations = check_int(self.name, "generations", generations, 0)
        self.fairness_p = check_float(self.name, "fairness_p", fairness_p, maximum=1.0)
        self.restart_penalty_s = check_float(self.name, "restart_penalty_s", restart_penalty_s, 0.0)
        self.max_scale_out = check_float(self.name, "max_scale_out", max_scale_out, 1.0)
        self.max_replicas = check_int(self.name, "max_replicas", max_replicas, 1)
        self.crossover_p = check_float(self.name, "crossover_p", crossover_p, 0.0, 1.0)
        if isinstance(pinned_models, (str, bytes)) or not all(isinstance(m, str) for m in pinned_models):
            raise ValueError(f"{self.name}: pinned_models must be a list of model names, got {pinned_models!r}")
        self.pinned_models = tuple(pinned_models)
        self.jobs_tune_batch = check_bool(self.name, "jobs_tune_batch", jobs_tune_batch)
        self.time_budget_s = (None if time_budget_s is None else
                              check_float(self.name, "time_budget_s", time_budget_s, 0.0, strict_min=True))
        # Warm start: the last round's population, (P, jobs, nodes), one job axis entry per name.
        self.max_cells = check_int(self.name, "max_cells", max_cells, 1)
        self._pop_jobs: list[str] = []
        self._pop = np.zeros((0, 0, 0), dtype=np.int64)

    def params(self) -> dict[str, Any]:
        return {"population": self.population, "generations": self.generations, "fairness_p": self.fairness_p,
                "restart_penalty_s": self.restart_penalty_s, "max_scale_out": self.max_scale_out,
                "max_replicas": self.max_replicas, "crossover_p": self.crossover_p,
                "pinned_models": list(self.pinned_models), "jobs_tune_batch": self.jobs_tune_batch,
                "time_budget_s": self.time_budget_s, "max_cells": self.max_cells,
                "warm_start": self.warm_start, "keep": self.keep, "selection": self.selection}

    def _extra_state(self) -> dict[str, Any]:
        return {"population_jobs": list(self._pop_jobs), "population": self._pop.tolist()}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        jobs = [str(j) for j in state.get("population_jobs", [])]
        pop = np.asarray(state.get("population", []), dtype=np.int64)
        if pop.size == 0:
            pop = np.zeros((0, len(jobs), 0), dtype=np.int64)
        if pop.ndim != 3 or pop.shape[1] != len(jobs) or (pop < 0).any():
            raise ValueError(f"{self.name}: state 'population' must be (candidates x {len(jobs)} jobs x nodes) "
                             f"GPU counts >= 0, got shape {pop.shape}")
        self._pop_jobs, self._pop = jobs, pop

    # ----------------------------------------------------------------------------------------------

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = _order(active_views(self.name, jobs))
        if not views:
            self._pop_jobs, self._pop = [], np.zeros((0, 0, 0), dtype=np.int64)
            return Schedule({})
        pb = _Problem(self, now_s, cluster, views, current)
        pop = pb.repair(self._initial_population(pb), self._rng)
        pop = self._evolve(pb, pop)
        kept = pop if self.keep == "population" else pop[_front(pb.fitness(pop), pb.utility(pop))]
        self._pop_jobs, self._pop = [v.name for v in views], kept
        return pb.schedule(pop[0], current, self.jobs_tune_batch)

    def _initial_population(self, pb: _Problem) -> np.ndarray:
        """(P0, J, N): the candidates kept from last round for this round's jobs, or the current state.

        ``warm_start="positional"`` (the authors' ``_adapt_prev_states``): the rows of the jobs present in
        both rounds are copied in the order they appear, last round's order onto this round's; as jobs are
        re-sorted by attained service every round, a row often lands on another job (repair then fits it).
        ``"by_name"``: each job gets its own row back."""
        if self._pop.shape[0] == 0 or self._pop.shape[2] != pb.N:
            return pb.base[None].copy()
        now = set(pb.names)
        before = set(self._pop_jobs)
        src = [k for k, name in enumerate(self._pop_jobs) if name in now]
        if self.warm_start == "by_name":
            col = {name: k for k, name in enumerate(self._pop_jobs)}
            dst = [j for j, name in enumerate(pb.names) if name in before]
            src = [col[pb.names[j]] for j in dst]
        else:
            dst = [j for j, name in enumerate(pb.names) if name in before]
        pop = np.zeros((self._pop.shape[0], pb.J, pb.N), dtype=np.int64)
        pop[:, dst] = self._pop[:, src]
        return pop

    def _evolve(self, pb: _Problem, pop: np.ndarray) -> np.ndarray:
        """Run the generations; returns the population sorted best fitness first."""
        rng = self._rng
        P = min(self.population, max(2, self.max_cells // max(pb.J * pb.N, 1)))
        nsga = self.selection == "nsga2"

        def objs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return pb.fitness(x), pb.utility(x) if nsga else np.zeros(x.shape[0])

        pop, fit, util, crowd = _survive(pop, *objs(pop), P, nsga)
        start = time.perf_counter()
        for _ in range(self.generations):
            if self.time_budget_s is not None and time.perf_counter() - start > self.time_budget_s:
                break
            n = pop.shape[0]
            pairs = (P + 1) // 2
            a, b = rng.integers(n, size=(2, 2, pairs))  # binary tournaments for both parents
            mother = _tournament(a[0], a[1], fit, util, crowd, rng)
            father = _tournament(b[0], b[1], fit, util, crowd, rng)
            point = rng.integers(pb.J, size=pairs)
            cross = (np.arange(pb.J)[None, :] < point[:, None]) & (rng.random(pairs) < self.crossover_p)[:, None]
            m, f = pop[mother], pop[father]
            c1 = np.where(cross[:, :, None], f, m)
            c2 = np.where(cross[:, :, None], m, f)
            child = np.concatenate([c1, c2])[:P]
            child = pb.repair(pb.mutate(child, rng), rng)
            cf, cu = objs(child)
            pop, fit, util, crowd = _survive(np.concatenate([pop, child]), np.concatenate([fit, cf]),
                                             np.concatenate([util, cu]), P, nsga)
        return pop[np.argsort(-fit, kind="stable")]


def _dominates(fa, ua, fb, ub):
    return (fa >= fb) & (ua >= ub) & ((fa > fb) | (ua > ub))


def _tournament(a: np.ndarray, b: np.ndarray, fit, util, crowd, rng: np.random.Generator) -> np.ndarray:
    """Winners of binary tournaments: the dominating candidate, else the less crowded one, else random.
    With a single objective (utility all 0) this is the fitter one."""
    a_wins = _dominates(fit[a], util[a], fit[b], util[b])
    b_wins = _dominates(fit[b], util[b], fit[a], util[a])
    tie = ~a_wins & ~b_wins
    by_crowd = np.where(crowd[a] > crowd[b], True, np.where(crowd[a] < crowd[b], False, rng.random(a.size) < 0.5))
    return np.where(a_wins | (tie & by_crowd), a, b)


def _nondominated_ranks(fit: np.ndarray, util: np.ndarray) -> np.ndarray:
    """(n,) each candidate's non-dominated front (0: no other candidate dominates it), both objectives
    maximised: 1 + the highest front of the candidates dominating it. With two objectives one pass does it
    (O(n log n), no n x n matrix): taken by fitness, then utility, best first, every candidate's dominators
    come before it, and a front dominates it exactly when that front's best utility so far is higher (or
    equal, held by a candidate of higher fitness); the fronts that dominate a candidate are the first few
    (a dominator's own dominators sit in every front below its own), so a binary search finds its front."""
    f, u = fit.tolist(), util.tolist()
    rank = [0] * len(f)
    top_u: list[float] = []  # per front: the best utility of its candidates so far
    top_f: list[float] = []  # ... and the best fitness among its candidates with that utility
    for i in np.lexsort((-util, -fit)).tolist():
        ui, fi = u[i], f[i]
        lo, hi = 0, len(top_u)
        while lo < hi:  # the first front that does not dominate candidate i
            mid = (lo + hi) // 2
            if top_u[mid] > ui or (top_u[mid] == ui and top_f[mid] > fi):
                lo = mid + 1
            else:
                hi = mid
        rank[i] = lo
        if lo == len(top_u):
            top_u.append(ui)
            top_f.append(fi)
        elif ui > top_u[lo] or (ui == top_u[lo] and fi > top_f[lo]):
            top_u[lo], top_f[lo] = ui, fi
    return np.array(rank, dtype=np.int64)


def _fronts_and_crowding(fit: np.ndarray, util: np.ndarray, needed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rank (0 = non-dominated), crowding distance) of each candidate, NSGA-II style, both maximised.
    Fronts are peeled until ``needed`` candidates are ranked; the rest share the next rank."""
    n = fit.size
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    rank = _nondominated_ranks(fit, util)
    if needed is not None:
        if needed <= 0:
            rank[:] = 0
        else:
            ranked = np.cumsum(np.bincount(rank))  # candidates in fronts 0 .. r
            if ranked[-1] >= needed:
                rank = np.minimum(rank, int(np.argmax(ranked >= needed)) + 1)
    crowd = np.zeros(n)
    for obj in (fit, util):
        o = np.lexsort((obj, rank))  # by front, then objective
        rs, vs = rank[o], obj[o]
        first = np.r_[True, rs[1:] != rs[:-1]]
        last = np.r_[rs[1:] != rs[:-1], True]
        starts = np.flatnonzero(first)
        span = np.repeat(np.maximum.reduceat(vs, starts) - np.minimum.reduceat(vs, starts), np.diff(np.r_[starts, n]))
        gap = np.zeros(n)
        gap[1:-1] = vs[2:] - vs[:-2]
        c = np.where(first | last, np.inf, np.where(span > 0, gap / np.where(span > 0, span, 1.0), 0.0))
        crowd[o] += c
    return rank, crowd


# Fixed odd 64-bit multipliers: a candidate's fingerprint for dropping duplicates (a collision only drops
# one candidate of the population).
_HASH = (np.random.default_rng(20210823).integers(1, 2**62, size=1 << 16, dtype=np.int64) | 1)


def _front(fit: np.ndarray, util: np.ndarray) -> np.ndarray:
    """Indices of the candidates no other candidate beats on both fitness and utility (first = best fit)."""
    ge = (fit[None, :] >= fit[:, None]) & (util[None, :] >= util[:, None])
    gt = (fit[None, :] > fit[:, None]) | (util[None, :] > util[:, None])
    dominated = (ge & gt).any(axis=1)
    idx = np.flatnonzero(~dominated)
    return idx[np.argsort(-fit[idx], kind="stable")]


def _survive(pop: np.ndarray, fit: np.ndarray, util: np.ndarray, size: int, nsga: bool):
    """The ``size`` best distinct candidates and their (fitness, utility, crowding): by non-dominated rank
    then crowding distance (NSGA-II) with ``nsga``, else by fitness."""
    flat = pop.reshape(pop.shape[0], -1)
    width = flat.shape[1]
    weights = _HASH[np.arange(width) % _HASH.size] + np.arange(width) // _HASH.size
    with np.errstate(over="ignore"):
        keys = (flat * weights[None, :]).sum(axis=1)
    order = np.argsort(-fit, kind="stable")
    _, first = np.unique(keys[order], return_index=True)
    uniq = order[np.sort(first)]
    if nsga:
        rank, crowd = _fronts_and_crowding(fit[uniq], util[uniq], size)
        keep = np.lexsort((-crowd, rank))[:size]
    else:
        keep = np.arange(min(size, uniq.size))
        crowd = np.zeros(uniq.size)
    sel = uniq[keep]
    return pop[sel], fit[sel], util[sel], crowd[keep]


class _Problem:
    """One round: jobs x nodes, limits, speedup table, base state; fitness and operators (arrays only)."""

    def __init__(self, policy: PolluxPolicy, now_s: float, cluster: Cluster, views: Sequence[JobView],
                 current: Schedule) -> None:
        self.views = list(views)
        self.model = policy.model
        self.names = [v.name for v in views]
        self.J, self.N, self.G = len(views), cluster.num_nodes, cluster.num_gpus
        self.cluster = cluster
        self.node_cap = np.array(cluster.gpus_per_node, dtype=np.int64)  # (N,)
        node_of = cluster.node_of
        self.base = np.zeros((self.J, self.N), dtype=np.int64)  # (J, N) current GPUs per node
        self.held = held_gpus(cluster, current, self.names)  # GPUs outside the cluster or claimed twice dropped
        for j, v in enumerate(views):
            if v.name in self.held:
                np.add.at(self.base[j], node_of[list(self.held[v.name])], 1)
        self.pinned = np.array([v.spec.model in policy.pinned_models for v in views])
        limit = []
        for v, pinned in zip(views, self.pinned, strict=False):
            _, top, lo_micro, _ = gp.batch_limits(v.spec)
            seen = max((o.num_gpus for o in v.throughput_obs), default=0)
            cap = min(max(int(policy.max_scale_out * seen), 1), policy.max_replicas, int(top // lo_micro),
                      v.spec.gpu_cap, self.G)
            limit.append(1 if pinned else max(cap, 1))
        self.max_replicas = np.array(limit, dtype=np.int64)  # (J,)
        fair = int(math.ceil(self.G / self.J))
        self.speedup = speedup_table(views, self.max_replicas, fair, self.model) * (self.N / self.G)  # (J, 3, R+1)
        age = np.array([max(now_s - v.submit_time_s, 0.0) for v in views])
        restarts = np.array([v.restarts for v in views], dtype=float)
        delay = policy.restart_penalty_s
        self.factor = np.maximum(age - restarts * delay, 0.0) / (age + delay) if delay > 0 else np.ones(self.J)
        self.p = policy.fairness_p
        self._jobs = np.arange(self.J)

    # ---------------------------------------------------------------- fitness
    def fitness(self, pop: np.ndarray) -> np.ndarray:
        """(P,) power mean of (restart-penalised, scaled) speedups + 0.001: maximised."""
        k = np.minimum(np.count_nonzero(pop, axis=2), 2)  # (P, J) 0, 1 or several nodes
        r = pop.sum(axis=2)  # (P, J) GPUs
        s = self.speedup[self._jobs[None, :], k, np.minimum(r, self.speedup.shape[2] - 1)]
        s = np.where(r < self.speedup.shape[2], s, 0.0)
        changed = (pop != self.base[None]).any(axis=2)
        s = np.where(changed, s * self.factor[None, :], s) + _ZERO_SPEEDUP
        if self.p == 0:
            return np.exp(np.log(s).mean(axis=1))
        return (s ** self.p).mean(axis=1) ** (1.0 / self.p)

    def utility(self, pop: np.ndarray) -> np.ndarray:
        """(P,) cluster utility (the authors' second objective): sum of speedups per GPU of the nodes in use."""
        k = np.minimum(np.count_nonzero(pop, axis=2), 2)
        r = pop.sum(axis=2)
        s = self.speedup[self._jobs[None, :], k, np.minimum(r, self.speedup.shape[2] - 1)] * (self.G / self.N)
        in_use = (pop.sum(axis=1) > 0) @ self.node_cap  # (P,)
        return np.where(in_use > 0, s.sum(axis=1) / np.maximum(in_use, 1), 0.0)

    # ---------------------------------------------------------------- operators
    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """(P, J, N) mutated copies (see the module docstring)."""
        P, J, N = pop.shape
        reset = rng.random((P, J)) < 0.1
        out = np.where(reset[:, :, None], self.base[None], pop)
        zero_p = np.where(rng.random((P, J)) < 0.1, 0.1, 0.0)
        out = np.where(rng.random((P, J, N)) < zero_p[:, :, None], 0, out)
        free = self.node_cap[None, :] - out.sum(axis=1)  # (P, N)
        has_free = np.broadcast_to((free >= 1)[:, None, :], out.shape)  # (P, J, N)
        prob1 = has_free / np.maximum(has_free.sum(axis=1, keepdims=True), 1)  # 1 / jobs that fit there
        own = has_free & (out > 0)
        prob2 = own / np.maximum(own.sum(axis=1, keepdims=True), 1)  # 1 / jobs already there
        hit = rng.random(out.shape) < prob1 + prob2 - prob1 * prob2
        hi = np.broadcast_to(self.node_cap[None, None, :], out.shape)
        draw = out + np.floor(rng.random(out.shape) * (hi - out + 1)).astype(np.int64)
        return np.where(hit, np.minimum(draw, hi), out)

    def repair(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Feasible copies: one multi-node job per node, per-job GPU limits, node capacities."""
        pop = pop.copy()
        P, J, N = pop.shape
        multi = np.count_nonzero(pop, axis=2) > 1  # (P, J)
        on = (pop > 0) & multi[:, :, None]
        pop[np.cumsum(on, axis=1) > 1] = 0  # later multi-node jobs leave a node already shared by one
        # Per-job GPU limit, kept on randomly ordered nodes (only rows over their limit change).
        over = pop.sum(axis=2) > self.max_replicas[None, :]  # (P, J)
        if over.any():
            rows = pop[over]  # (R, N)
            limit = np.broadcast_to(self.max_replicas[None, :], over.shape)[over]  # (R,)
            shuffle = np.argsort(rng.random(rows.shape), axis=1)
            shuffled = np.take_along_axis(rows, shuffle, axis=1)
            capped = np.minimum(np.cumsum(shuffled, axis=1), limit[:, None])
            shuffled = np.diff(capped, axis=1, prepend=0)
            pop[over] = np.take_along_axis(shuffled, np.argsort(shuffle, axis=1), axis=1)
        # Node capacity: earlier jobs keep theirs.
        filled = np.minimum(np.cumsum(pop, axis=1), self.node_cap[None, None, :])
        return np.diff(filled, axis=1, prepend=0)

    # ---------------------------------------------------------------- result
    def schedule(self, state: np.ndarray, current: Schedule, tune_batch: bool) -> Schedule:
        """Concrete GPUs for the chosen (J, N) state: unchanged rows keep their GPUs."""
        cluster = self.cluster
        node_of = cluster.node_of
        free = np.ones(cluster.num_gpus, dtype=bool)
        gpus: dict[int, list[int]] = {}
        changed = []
        for j, name in enumerate(self.names):
            if not state[j].any():
                continue
            if name in self.held and (state[j] == self.base[j]).all():
                gpus[j] = list(self.held[name])
                free[gpus[j]] = False
            else:
                changed.append(j)
        for j in changed:
            held = set(self.held.get(self.names[j], ()))
            mine: list[int] = []
            for node in np.flatnonzero(state[j]):
                slots = np.flatnonzero(free & (node_of == node))
                slots = sorted(slots, key=lambda g: (g not in held, g))[: int(state[j, node])]
                mine.extend(int(g) for g in slots)
                free[slots] = False
            gpus[j] = mine
        out: dict[str, Allocation] = {}
        for j, slots in gpus.items():
            v = self.views[j]
            alloc = current.allocations.get(v.name)
            n = len(slots)
            tuned = tune_batch and not self.pinned[j]
            if alloc is not None and sorted(alloc.gpus) == sorted(slots):
                batch = alloc.global_batch
            elif tuned:
                k = int(np.count_nonzero(state[j]))
                micro, accum = self.model.batch(v.spec, tuple(v.throughput_obs), v.grad_noise_scale, k, n)
                batch = n * micro * (accum + 1)
            else:
                batch = v.spec.per_gpu_batch * v.spec.requested_gpus
            new = new_allocation(v, slots, int(batch), current)
            out[v.name] = replace(new, batch_tuned_by_job=tuned) if new.batch_tuned_by_job != tuned else new
        return Schedule(out)
