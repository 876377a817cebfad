"""A tight lower bound on mean JCT: Lagrangian relaxation of the cluster's GPU capacity, per round.

The problem the simulator poses: in every round ``t`` (``interval_s`` long) each job holds ``n_jt`` GPUs,
``sum_j n_jt <= G``; a job advances at its ground-truth goodput at that many GPUs, every change of its
allocation (first start, resize, resume) holds the GPUs for its dead time without progress, and its JCT
is when it reaches its total progress less its submission. Minimise the sum of JCTs.

**Relaxation.** Price the capacity of each round at ``lambda_t >= 0``. For any such prices,

    L(lambda) = sum_j min over j's schedules of [JCT_j + sum_t lambda_t n_jt]  -  G sum_t lambda_t

is at most the optimum (weak duality: a feasible schedule's priced terms sum to at most ``G sum lambda``),
so every ``lambda`` gives a bound and the largest one found is reported, whenever the search stops. Each
job's minimum is a shortest path over its own schedules (Dantzig-Wolfe: the jobs are the blocks, capacity
the linking constraint; Geoffrion 1974, Lagrangean relaxation; Desrosiers & Luebbecke 2005, column
generation). Prices: first ``f x interval x (jobs in the system) / G`` (an extra GPU-round saves about
1/G round to every job in the system) for two scales ``f``, counted under a feasible start (jobs shortest
first, each the best schedule in the GPUs left); then projected subgradient steps from the best prices
(Polyak's length towards the master LP's value), and every third step the duals of the master LP over
all schedules found (HiGHS via ``scipy.optimize.linprog``), smoothed half-way towards the best prices
(Wentges 1997).
The master LP's value (``lp_s``) estimates where the relaxation's optimum lies; it is not a
bound (the feasible start's columns pay no dead time on resizes).

**Each job's schedules are relaxed further, always optimistically, so the bound stays valid:**

* At ``n`` GPUs the job runs at ``r(n, p)``: the best goodput over placements (``job_paths.placements_of``:
  more nodes can be faster in the profiles) and over batches and accumulation (a geometric grid from M0 to
  the largest batch, plus the workload's own batches, split as the simulator splits them) at progress ``p``,
  never slower than at fewer GPUs. Efficiency is piecewise constant between the truth's rate changes
  (``next_rate_change``: epoch ends), so within a round the job follows the flow ``dp/dt = r(n, p)``, cut
  where the rate changes, as the simulator does; any real configuration runs no faster at each ``p``, so
  it reaches no further (a 1-D flow is order preserving: starting behind, or slower, never gets ahead).
* Progress lives on a grid uniform in the time the job would need at its fastest rate; after each round
  it is rounded **up** to the next grid point (the job is credited at least what it did), and a job
  rounded up to its total has finished at the round's end (it really finishes later).
* Changes of GPU count: where the state fits (``HELD_STATES``) the programme keeps the GPUs held, and
  every change of count costs a dead time: the least any change costs under any policy's environment
  (``ChangeCosts.least_change``, the first start's cost if less; in-place grows and shrinks are cheaper than
  restarts where a policy resizes in place), so the bound holds for every policy (a change of batch or of
  GPUs at the same count is free); otherwise (the longest jobs) only the first start pays its ``start`` cost,
  its rounds wholly inside the dead time free of price.
* Prices beyond the job's horizon are dropped (they are >= 0): a schedule still running there is valued
  at the time elapsed plus its run time alone at the fastest rate. The horizon doubles whenever the best
  schedule reaches it. Prices past the feasible start's makespan are 0.
* Within a round a job that finishes pays the whole round's price (the simulator frees GPUs at the next
  round) and its JCT counts to the moment it finishes.

**Each job's completion counts as at least its end alone** (``JobModel.floor``: ``sim.bound``'s part (a),
from the first round it can start in, after its start's dead time, at its fastest rate throughout). No real
schedule ends the job sooner, so its JCT equals ``max(JCT, floor)`` and the relaxed minimum, which only
lowers the JCT (the grid's rounding up can end a path before ``floor``), stays at most the real one. At zero
prices every job's minimum is then at least its ``floor``: the bound there is at least the fast bound's
part (a), without evaluating it, and the bound reported is the larger of it and the best the prices tried give
(the search itself steps from the best prices it has evaluated).
The fast bound's rank-by-rank SRPT part is not folded in (its per-rank constraint rewards late completions,
which the optimistic paths cannot be charged for validly); the larger of the two bounds is reported.

The shortest path is a dynamic programme over (progress grid point, GPUs held, round): ``V(k, h, t)`` =
the least of pausing (``V(k, 0, t+1)``), changing to ``n != h`` and keeping ``h`` (waiting costs nothing
extra while paused: its time is counted at the end), swept from the last grid point down, one numpy array
over GPU counts x rounds per point.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.job_paths import JobModel, cheapest, job_models
from ones_pipeline.sim.truth import SimJob


@dataclass(frozen=True)
class TightBound:
    """``lagrangian_s``: the Lagrangian bound (mean JCT, s); ``fast_s``: ``sim.bound``'s; ``mean_jct_s`` the
    larger, ``binds`` which one it is; ``lp_s``: the last master LP's mean JCT (not a bound: the optimum of
    the relaxation lies between the two); ``iterations`` of column generation in ``seconds``."""

    lagrangian_s: float
    fast_s: float
    lp_s: float
    iterations: int
    seconds: float
    jobs: int

    @property
    def mean_jct_s(self) -> float:
        return max(self.lagrangian_s, self.fast_s)

    @property
    def binds(self) -> str:
        return "tight" if self.lagrangian_s > self.fast_s else "fast"

    def to_dict(self) -> dict[str, float | str]:
        return {"mean_jct_s": self.mean_jct_s, "tight_mean_jct_s": self.lagrangian_s,
                "fast_mean_jct_s": self.fast_s, "binds": self.binds, "lp_mean_jct_s": self.lp_s,
                "iterations": self.iterations, "seconds": self.seconds, "jobs": self.jobs}


def tight_bound(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig | None = None,
                time_budget_s: float = 90.0, cell_s: float = 4.0, max_points: int = 4000,
                max_iterations: int = 200, tol: float = 1e-4,
                progress: Callable[[int, float, float], None] | None = None) -> TightBound:
    """The Lagrangian bound of the module docstring on ``workload``; the search stops after
    ``time_budget_s`` seconds of this process's CPU time (setup included; the wall time is larger on a loaded
    machine), ``max_iterations``, or when the bound is within ``tol`` (relative) of the LP.
    ``cell_s``: the progress grid's cell, in seconds at the job's fastest rate (finer: tighter and slower;
    at most ``max_points`` per job). ``progress(iteration, best bound, LP value)`` after each iteration."""
    config = config if config is not None else SimConfig()
    if not workload:
        raise ValueError("workload has no jobs")
    t_start, cpu_start = time.perf_counter(), time.process_time()
    interval = config.interval_s
    fast = lower_bound(workload, cluster, config)
    models = job_models(workload, cluster, config, cell_s, max_points)
    G = cluster.num_gpus
    cols, T, greedy, in_system = _feasible_start(models, interval, G)
    limits = [max(T - m.release + 1, 1) for m in models]
    # At zero prices every job's minimum is at least its end alone (``JobModel.floor``), so the bound there is
    # at least their mean, the fast bound's part (a): the bound reported whatever prices the search tries.
    at_zero = float(np.mean([m.floor for m in models]))
    best, centre, upper, it, step = -math.inf, np.zeros(T), greedy, 0, 1.0
    trials = [f * interval * in_system / G for f in (0.15, 0.3)]
    prices = np.zeros(T)
    while True:
        it += 1
        if trials:
            prices = trials.pop(0)
        total, used = _evaluate(models, prices, interval, limits, cols)
        bound = (total - G * prices.sum()) / len(models)
        if bound > best:
            best, centre, best_used = bound, prices, used
        elif not trials and (it - 1) % 3:
            step /= 2  # the subgradient step overshot: a shorter one next time
        elapsed = time.process_time() - cpu_start
        if progress is not None:
            progress(it, max(best, at_zero), upper)
        if it >= max_iterations or elapsed > time_budget_s or (upper - max(best, at_zero)) <= tol * upper:
            break
        if trials:
            continue
        # The master LP over the columns found: its value is a target (>= the best bound), its duals a proposal.
        lp_val, duals = _master(cols, len(models), T, G, interval * len(models), 1)
        upper = min(upper, lp_val)
        if (upper - max(best, at_zero)) <= tol * upper:
            break
        if it % 3 == 0:  # the LP's prices, smoothed towards the best so far (Wentges 1997)
            prices = 0.5 * centre + 0.5 * duals
        else:  # a subgradient step from the best prices, Polyak's length towards the target
            g = best_used - G
            norm = float(g @ g)
            if norm == 0:
                break
            gap = max(upper - best, 0.01 * abs(best))  # the LP over mixed columns may dip below the bound
            prices = np.maximum(centre + step * gap * len(models) / norm * g, 0.0)
    return TightBound(max(best, at_zero), fast.mean_jct_s, upper, it, time.perf_counter() - t_start, len(models))


def _feasible_start(models: list[JobModel], interval: float, G: int):
    """A feasible start for the master and the rounds the prices cover: jobs shortest first (at their fastest),
    each the best schedule in the GPUs left; prices past its makespan ``T`` are 0 (any prices >= 0 give a
    bound). (columns, T, its mean JCT, jobs in the system per round)."""
    last = max(m.release for m in models)
    span = last + sum(math.ceil((m.rates.fast_clock[-1] + m.cost) / interval) + 1 for m in models) + 1
    free = np.full(span, float(G))
    cols: list[tuple[int, float, dict[int, int]]] = []
    for j in sorted(range(len(models)), key=lambda j: (models[j].rates.fast_clock[-1], j)):
        _, jct, use = cheapest(models[j], np.zeros(span), interval, span - models[j].release, free, held=False)
        for t, n in use.items():
            free[t] -= n
        cols.append((j, jct, use))
    T = int(np.nonzero(free < G)[0].max()) + 1
    ends = np.zeros(len(models))
    for j, jct, _ in cols:
        ends[j] = models[j].submit + jct
    submit = np.array([m.submit for m in models])
    at = interval * np.arange(T)
    in_system = ((submit[None, :] <= at[:, None] + interval) & (ends[None, :] > at[:, None])).sum(axis=1)
    return cols, T, sum(jct for _, jct, _ in cols) / len(models), in_system


def _evaluate(models: list[JobModel], prices: np.ndarray, interval: float, limits: list[int], cols: list):
    """Every job's cheapest schedule at ``prices`` (appended to ``cols``): (sum of their values, GPUs used per
    round, over the rounds of ``prices``)."""
    T = len(prices)
    total, used = 0.0, np.zeros(T)
    for j, m in enumerate(models):
        val, jct, use = cheapest(m, prices, interval, limits[j])
        total += val
        cols.append((j, jct, use))
        for t, n in use.items():
            if t < T:
                used[t] += n
    return total, used


def _master(cols, jobs: int, T: int, G: int, big: float, block: int) -> tuple[float, np.ndarray]:
    """The master LP over the columns: min sum of JCTs, each job a convex combination of its columns,
    GPU-rounds per block of ``block`` rounds <= G x its rounds + overflow (cost ``big`` per GPU-round; summing
    over a block relaxes the capacity further). (mean JCT, prices per round: the block's dual)."""
    nc = len(cols)
    nb = -(-T // block)
    rows, cidx, vals = [], [], []
    for c, (_, _, use) in enumerate(cols):
        for t, n in use.items():
            if t < T:
                rows.append(t // block)
                cidx.append(c)
                vals.append(float(n))
    rows += list(range(nb))
    cidx += list(range(nc, nc + nb))
    vals += [-1.0] * nb
    A_ub = coo_matrix((vals, (rows, cidx)), shape=(nb, nc + nb)).tocsr()
    A_eq = coo_matrix(([1.0] * nc, ([j for j, _, _ in cols], list(range(nc)))), shape=(jobs, nc + nb)).tocsr()
    cost = np.concatenate([[jct for _, jct, _ in cols], np.full(nb, big)])
    cap = np.full(nb, float(G * block))
    cap[-1] = G * (T - (nb - 1) * block)
    res = linprog(cost, A_ub=A_ub, b_ub=cap, A_eq=A_eq, b_eq=np.ones(jobs), bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"tight bound: master LP failed: {res.message}")
    duals = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    return float(res.fun) / jobs, np.repeat(duals, block)[:T]
