"""Each job's cheapest relaxed schedule at given prices per round: the pricing problem of ``sim.tight_bound``.

What is relaxed and why each step keeps the bound valid: ``sim/tight_bound.py``'s docstring. Here: the job's
rates per GPU count along its progress (``Rates``), its progress grid and transitions (``JobModel``), and the
two dynamic programmes (with the GPUs held in the state, where it fits, or without).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.rates import Rates, rates_by_type
from ones_pipeline.sim.truth import SimJob

# Largest (grid points x GPU counts x rounds) for which a job's programme keeps the GPUs it holds in its state
# (every change costs its dead time); above it (the longest jobs) changes after the first start are free.
HELD_STATES = 20_000_000
# Fewest progress grid points per job: short jobs get cells finer than ``cell_s`` (their rounding up, at most a
# cell per round, is otherwise a large part of their run).
MIN_POINTS = 400


@dataclass
class JobModel:
    """One job's relaxed schedules, given its rates: grid, transitions, first start."""

    rates: Rates
    submit: float
    release: int  # first round it can start in
    cost: float  # dead time of its first start
    grid: np.ndarray  # progress grid points, the last = total
    nxt: np.ndarray  # (n_max, P) next grid index after a round at n = 1..n_max from grid point k; -1: finishes
    tau: np.ndarray  # (n_max, P) seconds into the round at which it finishes (where nxt == -1)
    nxt0: np.ndarray  # (n_max,) the same for the first start (after the dead time), from progress 0
    tau0: np.ndarray
    rest: np.ndarray  # (P,) seconds from grid point k to the end at the fastest rate
    horizon: int
    # After a change of GPU count (``change`` < a round): the round's ``interval - change`` productive seconds,
    # from every grid point; ``taud`` counts the dead time too. None where the change costs a round or more.
    nxtd: np.ndarray | None = None
    taud: np.ndarray | None = None
    # Dead time charged to every change of the programme with the GPUs held (the first start included): the
    # least of the start and of any change in any environment modelled (``ChangeCosts.least_change``).
    change: float = 0.0
    # The job's JCT alone (``sim.bound``'s part (a): first start at its release round after its ``cost``, then
    # the fastest rate throughout): no real schedule of the job ends sooner, so every completion the
    # programmes value is counted as at least this (the grid's rounding up can end a path sooner).
    floor: float = 0.0


def job_model(job: SimJob, rates: Rates, config: SimConfig, cell_s: float, max_points: int) -> JobModel:
    interval = config.interval_s
    s = job.spec
    own = config.restart_cost_for(s.model, job.truth.restart_cost_s)
    cost = config.change_costs.costs(own, False)["start"]
    change = min(cost, config.change_costs.least_change(own))
    release = math.ceil(s.submit_time_s / interval - 1e-9)
    fast_total = rates.fast_clock[-1]
    points = int(min(max_points, max(MIN_POINTS, math.ceil(fast_total / cell_s))))
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
    if change < interval:
        nxtd, taud = np.empty_like(nxt), np.zeros_like(tau)
        for n in range(1, n_max + 1):
            t_k = rates.time_at(n, grid[:-1])
            end = t_k + (interval - change)
            done = end >= total_clock[n] * (1 - 1e-12)
            reached = rates.reach(n, np.minimum(end, total_clock[n]))
            idx = np.maximum(np.searchsorted(grid, reached * (1 - 1e-12), side="left"), np.arange(1, points + 1))
            nxtd[n - 1] = np.where(done, -1, idx)
            taud[n - 1] = np.where(done, change + total_clock[n] - t_k, 0.0)
    floor = release * interval + cost + fast_total - s.submit_time_s
    return JobModel(rates, s.submit_time_s, release, cost, grid, nxt, tau, nxt0, tau0, rest,
                    horizon=max(4 * est, 8), nxtd=nxtd, taud=taud, change=change, floor=floor)


def job_models(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig, cell_s: float,
            max_points: int) -> list[JobModel]:
    """Each job's model; rates shared by the jobs of one truth and caps (``rates.rates_by_type``)."""
    return [job_model(job, rates, config, cell_s, max_points)
            for job, rates in zip(workload, rates_by_type(workload, cluster), strict=True)]


def cheapest(m: JobModel, prices: np.ndarray, interval: float, limit: int,
             free: np.ndarray | None = None, held: bool = True) -> tuple[float, float, dict[int, int]]:
    """Job ``m``'s cheapest relaxed schedule at ``prices`` (per global round; rounds past ``prices`` free):
    (JCT + priced GPU-rounds, JCT, {round: GPUs}); the horizon doubles (to ``limit`` rounds after release)
    while the schedule runs into it. ``free``: GPUs it may hold per round (None: any number); ``held``: the
    GPUs held in the state where it fits (``HELD_STATES``), else never."""
    while True:
        size = len(m.grid) * (m.nxt.shape[0] + 1) * (m.horizon + 1)
        dp = _dp_held if held and m.nxtd is not None and size <= HELD_STATES else _dp_free
        val, jct, use, hit = dp(m, *_priced(m, prices, interval, free))
        if not hit or m.horizon >= limit:
            return val, jct, use
        m.horizon = min(2 * m.horizon, limit)


def _priced(m: JobModel, prices: np.ndarray, interval: float, free: np.ndarray | None):
    """(price per round ``lam`` (H+1,), seconds from submission to each round's start (H+1,), price of n GPUs
    per round (N, H+1), infinite above ``free``) over the job's horizon, from its release round."""
    H, t0 = m.horizon, m.release
    lam = np.zeros(H + 1)
    seg = prices[t0:t0 + H + 1]
    lam[:len(seg)] = seg
    starts = interval * (t0 + np.arange(H + 1)) - m.submit
    ns = np.arange(1, m.nxt.shape[0] + 1)
    price = ns[:, None] * lam[None, :]
    if free is not None:
        cap = np.full(H + 1, np.inf)
        seg = free[t0:t0 + H + 1]
        cap[:len(seg)] = seg
        price[ns[:, None] > cap[None, :]] = np.inf
    return lam, starts, price


def _moves(nx: np.ndarray, tau: np.ndarray, price: np.ndarray, starts: np.ndarray, after,
           floor: float) -> np.ndarray:
    """(N, H) cost of each GPU count in each round: its price plus, where it finishes (``nx < 0``), the JCT
    at ``tau`` into the round (at least ``floor``), else the value ``after(rows, counts)`` of where it lands
    the next round."""
    H = price.shape[1] - 1
    c = price[:, :H].copy()
    fin = nx < 0
    if fin.any():
        c[fin] += np.maximum(starts[None, :H] + tau[fin][:, None], floor)
    if (~fin).any():
        c[~fin] += after(nx[~fin], np.nonzero(~fin)[0] + 1)
    return c


def _dp_held(m: JobModel, lam: np.ndarray, starts: np.ndarray, price: np.ndarray):
    """The programme with the GPUs held in the state: ``V(k, h, t)`` = the least of pausing
    (``V(k, 0, t+1)``), changing to ``n != h`` (its dead time, then ``interval - cost`` seconds of progress)
    and keeping ``h``; a paused or unstarted job (``h = 0``) waits for free. (value, JCT, use, horizon hit)."""
    H, P, N = m.horizon, len(m.grid) - 1, m.nxt.shape[0]
    V = np.empty((P + 1, N + 1, H + 1))
    V[P] = np.maximum(starts, m.floor)[None, :]  # rounded up to the total: finished by the round's start
    V[:P, 1:, H] = np.maximum(starts[H] + m.rest[:, None], m.floor)
    # A paused or unstarted job pays a start (at least ``change``).
    V[:P, 0, H] = np.maximum(starts[H] + m.change + m.rest, m.floor)
    cols, ns = np.arange(H), np.arange(1, N + 1)

    def options(k):
        after = lambda rows, n: V[rows, n, 1:]  # noqa: E731
        return (_moves(m.nxtd[:, k], m.taud[:, k], price, starts, after, m.floor),
                _moves(m.nxt[:, k], m.tau[:, k], price, starts, after, m.floor))

    for k in range(P - 1, -1, -1):
        change, keep = options(k)
        arg = np.argmin(change, axis=0)
        first = change[arg, cols]
        change[arg, cols] = np.inf
        second = change.min(axis=0)  # the best change to another count than the best one
        V[k, 0, :H] = np.minimum.accumulate(np.append(first, V[k, 0, H])[::-1])[::-1][:H]
        other = np.where(arg[None, :] == (ns - 1)[:, None], second[None, :], first[None, :])
        V[k, 1:, :H] = np.minimum(np.minimum(other, keep), V[k, 0, 1:][None, :])
    val, use = float(V[0, 0, 0]), {}
    k, h, i, paid = 0, 0, 0, 0.0
    while k < P:  # follow the optimum: the first option whose value is the state's
        if i >= H:
            return val, val - paid, use, True
        if V[k, 0, i + 1] == V[k, h, i]:
            h, i = 0, i + 1  # pause, or wait
            continue
        change, keep = options(k)
        if h and keep[h - 1, i] == V[k, h, i]:
            n, nx = h, int(m.nxt[h - 1, k])
        else:
            costs = change[:, i]
            if h:
                costs[h - 1] = np.inf
            n = int(np.argmin(costs)) + 1
            nx = int(m.nxtd[n - 1, k])
        use[m.release + i] = n
        paid += n * lam[i]
        if nx < 0:
            break
        k, h, i = nx, n, i + 1
    return val, val - paid, use, False


def _dp_free(m: JobModel, lam: np.ndarray, starts: np.ndarray, price: np.ndarray):
    """The programme without the GPUs held: only the first start pays its dead time (its rounds wholly
    inside it free of price), ``V(k, t) = min(V(k, t+1), min_n [price + V(next(k, n), t+1)])``."""
    H, P, N = m.horizon, len(m.grid) - 1, m.nxt.shape[0]
    V = np.empty((P + 1, H + 1))
    V[P] = np.maximum(starts, m.floor)  # rounded up to the total: finished by the round's start
    V[:P, H] = np.maximum(starts[H] + m.rest, m.floor)
    after = lambda rows, n: V[rows, 1:]  # noqa: E731
    # V is non-increasing in progress (the next grid point is non-decreasing in k and in n), so of the counts
    # that land on the same grid point only the fewest GPUs can be best; those that finish all stay.
    lead = m.nxt < 0
    lead[0] = True
    lead[1:] |= m.nxt[1:] != m.nxt[:-1]
    for k in range(P - 1, -1, -1):
        sel = lead[:, k]
        a = _moves(m.nxt[sel, k], m.tau[sel, k], price[sel], starts, after, m.floor).min(axis=0)
        V[k, :H] = np.minimum.accumulate(np.append(a, V[k, H])[::-1])[::-1][:H]
    # The first start at round i: dead rounds free, then a round of ``interval - cost`` productive seconds.
    q = int(m.cost // (starts[1] - starts[0])) if H else 0
    off = m.cost - q * (starts[1] - starts[0]) if H else 0.0
    first = np.full((N, max(H - q, 0)), np.inf)
    if H - q > 0:
        idx = np.arange(H - q) + q
        for n in range(1, N + 1):
            nx = m.nxt0[n - 1]
            rest = np.maximum(starts[idx] + off + m.tau0[n - 1], m.floor) if nx < 0 else V[nx, idx + 1]
            first[n - 1] = price[n - 1, idx] + rest
    term = max(starts[H] + m.cost + (m.rest[0] if P else 0.0), m.floor)
    a0 = first.min(axis=0)
    if not len(a0) or a0.min() >= term:
        return float(term), float(term), {}, True
    i = int(np.argmin(a0))
    val = float(a0[i])
    return (val, *_follow_free(m, V, lam, price, starts, first, i, q, val))


def _follow_free(m: JobModel, V, lam, price, starts, first, i: int, q: int, val: float):
    """(JCT, use, horizon hit) of the optimum of ``_dp_free`` that starts at round ``i`` (first paid ``i + q``)."""
    H, P = m.horizon, len(m.grid) - 1
    n = int(np.argmin(first[:, i])) + 1
    i += q
    use = {m.release + i: n}
    paid = n * lam[i]
    k, i = int(m.nxt0[n - 1]), i + 1
    after = lambda rows, n: V[rows, 1:]  # noqa: E731
    while 0 <= k < P:
        if i >= H:
            return val - paid, use, True
        if V[k, i] < V[k, i + 1]:
            costs = _moves(m.nxt[:, k], m.tau[:, k], price, starts, after, m.floor)[:, i]
            n = int(np.argmin(costs)) + 1
            use[m.release + i] = n
            paid += n * lam[i]
            k = int(m.nxt[n - 1, k])
        i += 1
    return val - paid, use, False
