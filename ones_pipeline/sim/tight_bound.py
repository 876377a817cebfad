"""A tight lower bound on mean JCT: Lagrangian relaxation of the cluster's GPU capacity, per round.

The problem the simulator poses: in every round ``t`` (``interval_s`` long) each job holds ``n_jt`` GPUs,
``sum_j n_jt <= G``; a job advances at its ground-truth goodput at that many GPUs, pays its restart cost
at its first start (and at every change), and its JCT is when it reaches its total progress less its
submission. Minimise the sum of JCTs.

**Relaxation.** Price the capacity of each round at ``lambda_t >= 0``. For any such prices,

    L(lambda) = sum_j min over j's schedules of [JCT_j + sum_t lambda_t n_jt]  -  G sum_t lambda_t

is at most the optimum (weak duality: a feasible schedule's priced terms sum to at most ``G sum lambda``),
so every ``lambda`` gives a bound and the largest one found is reported. Each job's minimum is a
shortest path over its own schedules (Dantzig-Wolfe: the jobs are the blocks, capacity the linking
constraint; Geoffrion 1974, Lagrangean relaxation; Desrosiers & Luebbecke 2005, column generation).
Prices come from column generation: the master LP over the schedules found so far (each job a convex
combination of its columns, capacity per round, overflow at a large cost so it is always feasible),
solved by HiGHS (``scipy.optimize.linprog``); its capacity duals are the next prices.

**Each job's schedules are relaxed further, always optimistically, so the bound stays valid:**

* A change of GPU count after the first start costs nothing (the simulator charges ``restart_cost_s``),
  and so does a pause. The first start pays its dead time; rounds wholly inside it are free of price.
* At ``n`` GPUs the job runs at ``r(n, p)``: the best goodput over batches and accumulation (a geometric
  grid from M0 to the largest batch, plus the workload's own batches, split as the simulator splits them)
  on the fewest nodes, at progress ``p`` (``sim.bound``'s rate model, per GPU count). Efficiency is
  piecewise constant between the truth's rate changes (``next_rate_change``: epoch ends), so within a round
  the job follows the flow ``dp/dt = r(n, p)``, cut where the rate changes, as the simulator does; any
  real configuration runs no faster at each ``p``, so it reaches no further (a 1-D flow is order
  preserving: starting behind, or slower, never gets ahead).
* Progress lives on a grid uniform in the time the job would need at its fastest rate; after each round
  it is rounded **up** to the next grid point (the job is credited at least what it did), and a job
  rounded up to its total has finished at the round's end (it really finishes later).
* Prices beyond the job's horizon are dropped (they are >= 0): a schedule still running there is valued
  at the time elapsed plus its run time alone at the fastest rate. The horizon doubles whenever the best
  schedule reaches it.
* Within a round a job that finishes pays the whole round's price (the simulator frees GPUs at the next
  round) and its JCT counts to the moment it finishes.

The shortest path is a dynamic programme over (progress grid point, round): ``V(k, t) = min(V(k, t+1),
min_n [lambda_t n + V(next(k, n), t+1)])`` (waiting costs nothing extra: its time is counted at the end),
swept from the last grid point down, one numpy vector over rounds per grid point.
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
from ones_pipeline.sim.bound import _batch_grid, _config_rate, _placements, lower_bound
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.truth import SimJob

# Largest (grid points x GPU counts x rounds) for which a job's programme keeps the GPUs it holds in its state
# (every change costs its dead time); above it (the longest jobs) changes after the first start are free.
HELD_STATES = 20_000_000


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


class _Rates:
    """``r(n, p)`` of one job type: progress cuts ``x`` (the truth's rate changes), rate per GPU count and
    piece ``rate[n, i]`` (row 0: no GPUs), and the time to reach each cut at each count ``clock[n, i]``."""

    def __init__(self, job: SimJob, cluster: Cluster, batches: set[int], grid: int = 24, pieces: int = 200):
        spec, truth = job.spec, job.truth
        n_max = max(1, min(spec.gpu_cap, cluster.num_gpus))
        placements = _placements(cluster, n_max)
        all_b = sorted(_batch_grid(spec, grid) | batches)
        configs: list[list[tuple[int, float]]] = []
        for pl in placements:
            best: dict[int, float] = {}
            for b in all_b:
                rated = _config_rate(truth, pl, b)
                if rated is not None and rated[1] > best.get(rated[0], 0.0):
                    best[rated[0]] = rated[1]
            configs.append(sorted(best.items()))
        total = float(truth.total_progress)
        changes = getattr(truth, "next_rate_change", None)
        cuts = {0.0, total}
        distinct = sorted({b for c in configs for b, _ in c})
        if changes is not None:
            for b in distinct:
                p = 0.0
                while True:
                    nxt = changes(p, b)
                    if nxt is None or not math.isfinite(nxt) or nxt >= total:
                        break
                    cuts.add(float(nxt))
                    p = nxt
        else:
            cuts.update(np.linspace(0.0, total, pieces + 1).tolist())
        x = np.array(sorted(cuts))
        x = x[np.concatenate(([True], np.diff(x) > 0))]
        exact = changes is not None
        # Efficiency per distinct batch per piece: exact at the piece's middle, else the better end.
        at = [0.5 * (x[:-1] + x[1:])] if exact else [x[:-1], x[1:]]
        eff = {b: np.max([[truth.efficiency(float(p), b) for p in pts] for pts in at], axis=0) for b in distinct}
        rate = np.zeros((n_max + 1, len(x) - 1))
        for n, cfg in enumerate(configs, start=1):
            for b, thr in cfg:
                np.maximum(rate[n], thr * eff[b], out=rate[n])
        # A job may leave GPUs idle: n GPUs run at least as fast as fewer (optimistic, so still valid).
        rate = np.maximum.accumulate(rate, axis=0)
        self.x, self.rate, self.total, self.n_max = x, rate, total, n_max
        width = np.diff(x)
        with np.errstate(divide="ignore"):
            per = np.where(rate > 0, width / np.where(rate > 0, rate, 1.0), np.inf)
        self.clock = np.concatenate([np.zeros((n_max + 1, 1)), np.cumsum(per, axis=1)], axis=1)
        fast = rate[1:].max(axis=0)
        self.fast_clock = np.concatenate([[0.0], np.cumsum(width / fast)])

    def time_at(self, n: int, p: np.ndarray) -> np.ndarray:
        """Seconds at ``n`` GPUs from progress 0 to ``p``."""
        return np.interp(p, self.x, self.clock[n])

    def reach(self, n: int, t: np.ndarray) -> np.ndarray:
        """Progress reached after ``t`` seconds at ``n`` GPUs from progress 0."""
        return np.interp(t, self.clock[n], self.x)


@dataclass
class _JobModel:
    """One job's relaxed schedules, given its rates: grid, transitions, first start."""

    rates: _Rates
    submit: float
    release: int  # first round it can start in
    cost: float  # restart cost of its first start
    grid: np.ndarray  # progress grid points, the last = total
    nxt: np.ndarray  # (n_max, P) next grid index after a round at n = 1..n_max from grid point k; -1: finishes
    tau: np.ndarray  # (n_max, P) seconds into the round at which it finishes (where nxt == -1)
    nxt0: np.ndarray  # (n_max,) the same for the first start (after the dead time), from progress 0
    tau0: np.ndarray
    rest: np.ndarray  # (P,) seconds from grid point k to the end at the fastest rate
    horizon: int
    # After a change of GPU count (``cost`` < a round): the round's ``interval - cost`` productive seconds,
    # from every grid point; ``taud`` counts the dead time too. None where the cost is a round or more.
    nxtd: np.ndarray | None = None
    taud: np.ndarray | None = None


def _job_model(job: SimJob, rates: _Rates, config: SimConfig, cell_s: float, max_points: int) -> _JobModel:
    interval = config.interval_s
    s = job.spec
    cost = config.restart_cost_for(s.model, job.truth.restart_cost_s)
    release = math.ceil(s.submit_time_s / interval - 1e-9)
    fast_total = rates.fast_clock[-1]
    points = int(min(max_points, max(8, math.ceil(fast_total / cell_s))))
    grid = np.interp(np.linspace(0.0, fast_total, points + 1), rates.fast_clock, rates.x)
    grid[-1] = rates.total
    n_max = rates.n_max
    nxt = np.empty((n_max, points), dtype=np.int64)
    tau = np.zeros((n_max, points))
    dead_rounds = int(cost // interval)
    first = interval - (cost - dead_rounds * interval)  # productive seconds of the first paid round
    nxt0 = np.empty(n_max, dtype=np.int64)
    tau0 = np.zeros(n_max)
    total_clock = rates.clock[:, -1]
    for n in range(1, n_max + 1):
        t_k = rates.time_at(n, grid[:-1])
        end = t_k + interval
        done = end >= total_clock[n] * (1 - 1e-12)
        reached = rates.reach(n, np.minimum(end, total_clock[n]))
        idx = np.searchsorted(grid, reached * (1 - 1e-12), side="left")
        idx = np.maximum(idx, np.arange(1, points + 1))  # at least one grid point on (the flow moves forward)
        nxt[n - 1] = np.where(done, -1, idx)
        tau[n - 1] = np.where(done, total_clock[n] - t_k, 0.0)
        if first >= total_clock[n] * (1 - 1e-12):
            nxt0[n - 1], tau0[n - 1] = -1, total_clock[n]
        else:
            nxt0[n - 1] = max(1, int(np.searchsorted(grid, rates.reach(n, np.array(first))[()] * (1 - 1e-12))))
    rest = fast_total - np.interp(grid[:-1], rates.x, rates.fast_clock)
    est = math.ceil((fast_total + cost) / interval) + 1
    nxtd = taud = None
    if cost < interval:
        nxtd, taud = np.empty_like(nxt), np.zeros_like(tau)
        for n in range(1, n_max + 1):
            t_k = rates.time_at(n, grid[:-1])
            end = t_k + (interval - cost)
            done = end >= total_clock[n] * (1 - 1e-12)
            reached = rates.reach(n, np.minimum(end, total_clock[n]))
            idx = np.maximum(np.searchsorted(grid, reached * (1 - 1e-12), side="left"), np.arange(1, points + 1))
            nxtd[n - 1] = np.where(done, -1, idx)
            taud[n - 1] = np.where(done, cost + total_clock[n] - t_k, 0.0)
    return _JobModel(rates, s.submit_time_s, release, cost, grid, nxt, tau, nxt0, tau0, rest,
                     horizon=max(4 * est, 8), nxtd=nxtd, taud=taud)


def _shortest(m: _JobModel, prices: np.ndarray, interval: float, limit: int,
              free: np.ndarray | None = None, held: bool = True) -> tuple[float, float, dict[int, int]]:
    """Job ``m``'s cheapest relaxed schedule at ``prices`` (per global round; rounds past ``prices`` free):
    (JCT + priced GPU-rounds, JCT, {round: GPUs}); the horizon doubles (to ``limit`` rounds after release)
    while the schedule runs into it. ``free``: GPUs it may hold per round (None: any number); ``held``: the
    GPUs held in the state where it fits (``_dp_held``), else never (``_dp``)."""
    while True:
        size = len(m.grid) * (m.nxt.shape[0] + 1) * (m.horizon + 1)
        dp = _dp_held if held and m.nxtd is not None and size <= HELD_STATES else _dp
        val, jct, use, hit = dp(m, prices, interval, free)
        if not hit or m.horizon >= limit:
            return val, jct, use
        m.horizon = min(2 * m.horizon, limit)


def _dp_held(m: _JobModel, prices: np.ndarray, interval: float, free: np.ndarray | None):
    """The dynamic programme with the GPUs held in the state, so that every change of count (first start,
    resize, resume after a pause) costs its dead time, as in the simulator: ``V(k, h, t)`` = min of pausing
    (``V(k, 0, t+1)``), changing to ``n != h`` (dead time, then ``interval - cost`` seconds of progress) and
    keeping ``h``; a paused job (``h = 0``) may wait for free."""
    H, P = m.horizon, len(m.grid) - 1
    N = m.nxt.shape[0]
    t0 = m.release
    lam = np.zeros(H + 1)
    seg = prices[t0:t0 + H + 1]
    lam[:len(seg)] = seg
    starts = interval * (t0 + np.arange(H + 1)) - m.submit
    ns = np.arange(1, N + 1)
    price = ns[:, None] * lam[None, :]
    if free is not None:
        cap = np.full(H + 1, np.inf)
        seg = free[t0:t0 + H + 1]
        cap[:len(seg)] = seg
        price[ns[:, None] > cap[None, :]] = np.inf
    price = price[:, :H]
    V = np.empty((P + 1, N + 1, H + 1))
    V[P] = starts[None, :]
    V[:P, 1:, H] = starts[H] + m.rest[:, None]
    V[:P, 0, H] = starts[H] + m.cost + m.rest  # a paused or unstarted job pays a start
    cols = np.arange(H)

    def options(k):
        """(N, H) costs of changing to n (``change``) and of keeping n (``keep``) from grid point ``k``."""
        out = []
        for nx, tau in ((m.nxtd[:, k], m.taud[:, k]), (m.nxt[:, k], m.tau[:, k])):
            c = price.copy()
            fin = nx < 0
            if fin.any():
                c[fin] += starts[None, :H] + tau[fin][:, None]
            if (~fin).any():
                c[~fin] += V[nx[~fin], ns[~fin], 1:]
            out.append(c)
        return out

    for k in range(P - 1, -1, -1):
        change, keep = options(k)
        arg = np.argmin(change, axis=0)
        first = change[arg, cols]
        change[arg, cols] = np.inf
        second = change.min(axis=0)
        V[k, 0, :H] = np.minimum.accumulate(np.append(first, V[k, 0, H])[::-1])[::-1][:H]
        other = np.where(arg[None, :] == (ns - 1)[:, None], second[None, :], first[None, :])
        V[k, 1:, :H] = np.minimum(np.minimum(other, keep), V[k, 0, 1:][None, :])
    val = float(V[0, 0, 0])
    use: dict[int, int] = {}
    k, h, i, paid = 0, 0, 0, 0.0
    while k < P:
        if i >= H:
            return val, val - paid, use, True
        change, keep = options(k)
        here = V[k, h, i]
        if V[k, 0, i + 1] == here:
            h, i = 0, i + 1  # pause (or wait)
            continue
        if h and keep[h - 1, i] == here:
            n, nx = h, int(m.nxt[h - 1, k])
        else:
            costs = change[:, i].copy()
            if h:
                costs[h - 1] = np.inf
            n = int(np.argmin(costs)) + 1
            nx = int(m.nxtd[n - 1, k])
        use[t0 + i] = n
        paid += n * lam[i]
        if nx < 0:
            break
        k, h, i = nx, n, i + 1
    return val, val - paid, use, False


def _dp(m: _JobModel, prices: np.ndarray, interval: float, free: np.ndarray | None):
    H, P = m.horizon, len(m.grid) - 1
    t0 = m.release
    lam = np.zeros(H + 1)
    seg = prices[t0:t0 + H + 1]
    lam[:len(seg)] = seg
    starts = interval * (t0 + np.arange(H + 1)) - m.submit  # round i starts this long after submission
    n_max = m.nxt.shape[0]
    ns = np.arange(1, n_max + 1, dtype=float)
    price = ns[:, None] * lam[None, :]  # (n, i)
    if free is not None:
        cap = np.full(H + 1, np.inf)
        seg = free[t0:t0 + H + 1]
        cap[:len(seg)] = seg
        price[ns[:, None] > cap[None, :]] = np.inf
    first_price = price
    price = price[:, :H]
    V = np.empty((P + 1, H + 1))
    V[P] = starts  # rounded up to the total: finished by the round's start
    V[:P, H] = starts[H] + m.rest
    best_n = np.zeros((P, H), dtype=np.int16)
    for k in range(P - 1, -1, -1):
        nx = m.nxt[:, k]
        fin = nx < 0
        cand = price.copy()
        if fin.any():
            cand[fin] += starts[None, :H] + m.tau[fin, k][:, None]
        if (~fin).any():
            cand[~fin] += V[nx[~fin], 1:]
        j = np.argmin(cand, axis=0)
        a = cand[j, np.arange(H)]
        best_n[k] = j + 1
        V[k, :H] = np.minimum.accumulate(np.append(a, V[k, H])[::-1])[::-1][:H]
    # The first start at round i: dead rounds free, then a round of ``first`` productive seconds.
    q = int(m.cost // interval)
    off = m.cost - q * interval
    i_max = H - q  # the first paid round must lie within the horizon
    cand = np.full((n_max, max(i_max, 0)), np.inf)
    if i_max > 0:
        idx = np.arange(i_max) + q
        for n in range(1, n_max + 1):
            if m.nxt0[n - 1] < 0:
                cand[n - 1] = first_price[n - 1, idx] + starts[idx] + off + m.tau0[n - 1]
            else:
                cand[n - 1] = first_price[n - 1, idx] + V[m.nxt0[n - 1], idx + 1]
    term = starts[H] + m.cost + m.rest[0] if P else starts[H] + m.cost
    a0 = cand.min(axis=0) if i_max > 0 else np.zeros(0)
    start_at = np.argmin(np.append(a0, term))
    val = float(min(a0.min() if i_max > 0 else np.inf, term))
    use: dict[int, int] = {}
    if start_at == len(a0):
        return val, val, use, True
    n0 = int(np.argmin(cand[:, start_at])) + 1
    i = int(start_at) + q
    use[t0 + i] = n0
    paid = n0 * lam[i]
    k = int(m.nxt0[n0 - 1])
    i += 1
    hit = False
    while k >= 0 and k < P:
        if i >= H:
            hit = True
            break
        if V[k, i] < V[k, i + 1]:
            n = int(best_n[k, i])
            use[t0 + i] = n
            paid += n * lam[i]
            k = int(m.nxt[n - 1, k])
            i += 1
        else:
            i += 1
    return val, val - paid, use, hit


def tight_bound(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig | None = None,
                time_budget_s: float = 90.0, cell_s: float = 4.0, max_points: int = 4000,
                max_iterations: int = 200, tol: float = 1e-4,
                progress: Callable[[int, float, float], None] | None = None) -> TightBound:
    """The Lagrangian bound of the module docstring on ``workload``; column generation stops after
    ``time_budget_s`` seconds, ``max_iterations``, or when the bound is within ``tol`` (relative) of the LP.
    ``cell_s``: the progress grid's cell, in seconds at the job's fastest rate (finer: tighter and slower;
    at most ``max_points`` per job). ``progress(iteration, best bound, LP value)`` after each iteration."""
    config = config if config is not None else SimConfig()
    if not workload:
        raise ValueError("workload has no jobs")
    t_start = time.perf_counter()
    interval = config.interval_s
    fast = lower_bound(workload, cluster, config)
    models = _models(workload, cluster, config, cell_s, max_points)
    G = cluster.num_gpus
    # A feasible start for the master, and the rounds the prices cover: jobs shortest first (at their fastest),
    # each the best schedule in the GPUs left; prices past its makespan are 0 (any prices >= 0 give a bound).
    last = max(m.release for m in models)
    span = last + sum(math.ceil((m.rates.fast_clock[-1] + m.cost) / interval) + 1 for m in models) + 1
    free = np.full(span, float(G))
    cols: list[tuple[int, float, dict[int, int]]] = []
    for j in sorted(range(len(models)), key=lambda j: (models[j].rates.fast_clock[-1], j)):
        _, jct, use = _shortest(models[j], np.zeros(span), interval, span - models[j].release, free, held=False)
        for t, n in use.items():
            free[t] -= n
        cols.append((j, jct, use))
    T = int(np.nonzero(free < G)[0].max()) + 1
    limits = [max(T - m.release + 1, 1) for m in models]
    greedy = sum(jct for _, jct, _ in cols) / len(models)
    # First prices: a GPU-round is worth about the JCT it saves, 1/G round to every job still in the system
    # (under the feasible start); scaled, the best scale kept.
    ends = np.zeros(len(models))
    for j, jct, _ in cols:
        ends[j] = models[j].submit + jct
    starts = np.array([m.submit for m in models])
    at = interval * np.arange(T)
    in_system = ((starts[None, :] <= at[:, None] + interval) & (ends[None, :] > at[:, None])).sum(axis=1)
    best, centre, upper, it = -math.inf, np.zeros(T), greedy, 0
    step = 1.0
    trials = [f * interval * in_system / G for f in (0.15, 0.3)]
    prices = np.zeros(T)
    while True:
        it += 1
        if trials:
            prices = trials.pop(0)
        total, used = 0.0, np.zeros(T)
        for j, m in enumerate(models):
            val, jct, use = _shortest(m, prices, interval, limits[j])
            total += val
            cols.append((j, jct, use))
            for t, n in use.items():
                if t < T:
                    used[t] += n
        bound = (total - G * prices.sum()) / len(models)
        if bound > best:
            best, centre, best_used = bound, prices, used
        elif not trials and (it - 1) % 3:
            step /= 2  # the subgradient step overshot: a shorter one next time
        elapsed = time.perf_counter() - t_start
        if progress is not None:
            progress(it, best, upper)
        if it >= max_iterations or elapsed > time_budget_s or (upper - best) <= tol * upper:
            break
        if trials:
            continue
        # The master LP over the columns found: its value is a target (>= the best bound), its duals a proposal.
        lp_val, duals = _master(cols, len(models), T, G, interval * len(models), 1)
        upper = min(upper, lp_val)
        if (upper - best) <= tol * upper:
            break
        if it % 3 == 0:  # the LP's prices, smoothed towards the best so far (Wentges 1997)
            prices = 0.5 * centre + 0.5 * duals
        else:  # a subgradient step from the best prices, Polyak's length towards the target
            g = best_used - G
            norm = float(g @ g)
            if norm == 0:
                break
            prices = np.maximum(centre + step * (upper - best) * len(models) / norm * g, 0.0)
    return TightBound(best, fast.mean_jct_s, upper, it, time.perf_counter() - t_start, len(models))


def _models(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig, cell_s: float,
            max_points: int) -> list[_JobModel]:
    """Each job's model; rates shared by the jobs of one truth and caps (their workload batches pooled)."""
    groups: dict[tuple, list[SimJob]] = {}
    for job in workload:
        s = job.spec
        groups.setdefault((id(job.truth), s.min_global_batch, s.per_gpu_batch, s.global_batch_cap, s.gpu_cap), []
                          ).append(job)
    rates = {}
    for key, jobs in groups.items():
        extra = {j.spec.per_gpu_batch * j.spec.requested_gpus for j in jobs}
        rates[key] = _Rates(jobs[0], cluster, extra)
    out = []
    for job in workload:
        s = job.spec
        key = (id(job.truth), s.min_global_batch, s.per_gpu_batch, s.global_batch_cap, s.gpu_cap)
        out.append(_job_model(job, rates[key], config, cell_s, max_points))
    return out


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
