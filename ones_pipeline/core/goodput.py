"""Pollux's goodput model (Qiao et al., OSDI'21): step time with compute/network overlap, fitted online,
times the statistical efficiency of the batch; and the job's goodput-optimal batch for an allocation.

This is an independent numpy formulation of the model the Pollux authors' simulator and AdaptDL use
(``adaptdl/goodput.py``); ``pollux``, ``sia`` and the simulator's job-side batch tuning share it.

Step time of one optimizer step on ``k`` nodes and ``n`` replicas (GPUs), micro-batch ``b`` per GPU and
``a`` extra accumulation micro-steps, with the 7 parameters ``(ac, bc, an, bn, ar, br, gamma)``::

    compute(b)  = ac + bc * b                                  # one forward + backward pass
    network     = an + bn * max(n - 2, 0)   if k > 1           # ring all-reduce across nodes
                = ar + br * max(n - 2, 0)   if k == 1, n > 1   # ... inside one node
                = 0                          if n == 1
    optim_step  = (compute^gamma + network^gamma)^(1/gamma)    # gamma in [1, 10]: 1 = no overlap,
                                                               # large = full overlap (max)
    step        = a * compute(b) + optim_step
    throughput  = n * b * (a + 1) / step                       # samples / s

The fit minimises the root-mean-square log error of the compute and the step time over what the job has
observed, plus two small penalties (towards gamma = 1, and against the "retrogression" slopes bn, br).
Parameters the data cannot inform stay at their floor: with no multi-GPU observation the network is
nearly free, with no multi-node one crossing nodes costs 1.1x the in-node network, with one micro-batch
size ``ac`` is half the compute time. The model is therefore optimistic about what a job has not tried,
which is what lets a goodput-driven scheduler scale a job out (and then correct itself).

Statistical efficiency of a total batch ``M`` with gradient noise scale ``gns`` measured at base batch
``M0``: ``(gns + M0) / (gns + M)`` (``core.efficiency``). Goodput = throughput x efficiency, in base-batch
samples per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.types import JobSpec, ThroughputObs

N_PERF = 7  # ac, bc, an, bn, ar, br, gamma
_FLOOR = 1e-8
_GAMMA_MAX = 10.0
_INIT = np.array([1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3])
BATCH_CANDIDATES = 50  # geometric grid of total batch sizes searched per allocation
_EPS = 1e-8


# ------------------------------------------------------------------------------------------ model
def _network(p: np.ndarray, nodes, replicas) -> np.ndarray:
    k = np.asarray(nodes, dtype=float)
    n = np.asarray(replicas, dtype=float)
    inter = k > 1
    intra = ~inter & (n > 1)
    alpha = np.where(inter, p[..., 2], np.where(intra, p[..., 4], _FLOOR))
    beta = np.where(inter, p[..., 3], np.where(intra, p[..., 5], _FLOOR))
    return alpha + beta * np.maximum(n - 2.0, _FLOOR)


def step_time(params: np.ndarray, nodes, replicas, micro_batch, accum_steps=0) -> np.ndarray:
    """Seconds per optimizer step (arrays broadcast; ``params`` (..., 7))."""
    p = np.asarray(params, dtype=float)
    compute = p[..., 0] + p[..., 1] * np.asarray(micro_batch, dtype=float)
    net = _network(p, nodes, replicas)
    g = p[..., 6]
    # (c^g + n^g)^(1/g) computed as max * (1 + (min/max)^g)^(1/g): no overflow for any gamma.
    hi = np.maximum(compute, net)
    lo = np.minimum(compute, net)
    optim = hi * (1.0 + (lo / hi) ** g) ** (1.0 / g)
    return np.asarray(accum_steps, dtype=float) * compute + optim


def throughput(params: np.ndarray, nodes, replicas, micro_batch, accum_steps=0) -> np.ndarray:
    """Samples per second."""
    n = np.asarray(replicas, dtype=float)
    b = np.asarray(micro_batch, dtype=float)
    a1 = np.asarray(accum_steps, dtype=float) + 1.0
    return n * b * a1 / step_time(params, nodes, replicas, micro_batch, accum_steps)


# ------------------------------------------------------------------------------------------ fitting
def _objective(p: np.ndarray, k, n, b, log_compute, log_step, free: np.ndarray) -> tuple[float, np.ndarray]:
    """Objective and its gradient with respect to ``p`` (7,), zero on fixed parameters."""
    ac, bc, an, bn, ar, br, g = p
    compute = ac + bc * b
    inter = k > 1
    intra = ~inter & (n > 1)
    r = np.maximum(n - 2.0, _FLOOR)
    alpha = np.where(inter, an, np.where(intra, ar, _FLOOR))
    beta = np.where(inter, bn, np.where(intra, br, _FLOOR))
    net = alpha + beta * r
    lc, ln = np.log(compute), np.log(net)
    m = np.maximum(g * lc, g * ln)
    wc, wn = np.exp(g * lc - m), np.exp(g * ln - m)
    s = wc + wn
    log_optim = (m + np.log(s)) / g
    e1 = lc - log_compute
    e2 = log_optim - log_step
    cnt = float(len(b))
    rm1 = np.sqrt(np.mean(e1 * e1) + 1e-16)
    rm2 = np.sqrt(np.mean(e2 * e2) + 1e-16)
    reg1 = 1e-3 * (g - 1.0) ** 2
    reg2 = 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    f = rm1 + rm2 + reg1 + reg2
    # Gradients.
    d1 = e1 / (cnt * rm1)  # d rm1 / d lc
    d2 = e2 / (cnt * rm2)  # d rm2 / d log_optim
    dlo_dc = wc / s / compute  # d log_optim / d compute
    dlo_dn = wn / s / net
    dlo_dg = (wc * lc + wn * ln) / s / g - log_optim / g
    dc = d1 / compute + d2 * dlo_dc  # d f / d compute, per observation
    dn = d2 * dlo_dn
    grad = np.array([
        dc.sum(),
        (dc * b).sum(),
        (dn * inter).sum() - 2e-2 * bn * bn / an ** 3,
        (dn * inter * r).sum() + 2e-2 * bn / an ** 2,
        (dn * intra).sum() - 2e-2 * br * br / ar ** 3,
        (dn * intra * r).sum() + 2e-2 * br / ar ** 2,
        (d2 * dlo_dg).sum() + 2e-3 * (g - 1.0),
    ])
    return float(f), np.where(free, grad, 0.0)


def _to_params(z: np.ndarray, fixed: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Unconstrained ``z`` -> parameters within their bounds (positive; gamma in [1, 10])."""
    p = fixed.copy()
    pos = free.copy()
    pos[6] = False
    p[pos] = _FLOOR + np.exp(np.clip(z[pos], -40.0, 8.0))  # up to ~3000 s: far beyond any step time
    if free[6]:
        p[6] = 1.0 + (_GAMMA_MAX - 1.0) / (1.0 + np.exp(-np.clip(z[6], -40.0, 40.0)))
    return p


def _to_z(p: np.ndarray) -> np.ndarray:
    z = np.log(np.maximum(p - _FLOOR, 1e-300))
    frac = np.clip((p[6] - 1.0) / (_GAMMA_MAX - 1.0), 1e-9, 1 - 1e-9)
    z[6] = np.log(frac / (1 - frac))
    return z


def fit_perf_params(observations: Sequence[ThroughputObs], max_iter: int = 60) -> np.ndarray:
    """(7,) parameters fitted to a job's observed steps (compute = step - sync, and step).

    BFGS in unconstrained coordinates (log for the positive parameters, logistic for gamma) with the
    analytic gradient. Parameters the observations cannot inform are fixed (see the module docstring).
    """
    if not observations:
        raise ValueError("fit_perf_params needs at least one observation")
    k = np.array([o.num_nodes for o in observations], dtype=float)
    n = np.array([o.num_gpus for o in observations], dtype=float)
    b = np.array([o.per_gpu_batch for o in observations], dtype=float)
    step = np.array([o.step_time_s for o in observations], dtype=float)
    compute = np.maximum(step - np.array([o.sync_time_s for o in observations], dtype=float), 1e-9)
    step = np.maximum(step, compute)
    p0 = _INIT.copy()
    free = np.ones(N_PERF, dtype=bool)
    if len(np.unique(b)) == 1:  # one micro-batch size: split compute evenly into constant and slope
        p0[0] = float(np.mean(compute)) / 2.0
        free[0] = False
        p0[1] = max(float(np.mean(compute - p0[0]) / np.mean(b)), 1e-7)
    else:  # start the compute line from least squares (a start close to the optimum, not a prior)
        slope, icpt = np.polyfit(b, compute, 1)
        p0[0], p0[1] = max(float(icpt), 1e-4 * float(np.mean(compute))), max(float(slope), 1e-7)
    if not (k > 1).any():
        p0[2:4] = _FLOOR
        free[2:4] = False
    if not ((k == 1) & (n > 1)).any():
        p0[4:6] = _FLOOR
        free[4:6] = False
    if not (n > 2).any():
        p0[[3, 5]] = _FLOOR
        free[[3, 5]] = False
    args = (k, n, b, np.log(compute), np.log(step), free)
    fixed = p0.copy()
    z = _to_z(p0)
    idx = np.flatnonzero(free)

    def fg(zz: np.ndarray) -> tuple[float, np.ndarray]:
        p = _to_params(zz, fixed, free)
        f, gp = _objective(p, *args)
        # Chain rule through the coordinate maps.
        dp = p - _FLOOR
        dp[6] = (p[6] - 1.0) * (_GAMMA_MAX - p[6]) / (_GAMMA_MAX - 1.0)
        return f, gp * dp

    with np.errstate(all="ignore"):
        p = _bfgs(fg, z, idx, max_iter)
    p = _to_params(p, fixed, free)
    if not (k > 1).any():  # prior: crossing nodes costs at least 1.1x the in-node network
        p[2] = max(p[2], 1.1 * p[4])
        p[3] = max(p[3], 1.1 * p[5])
    return p


def _bfgs(fg, z: np.ndarray, idx: np.ndarray, max_iter: int) -> np.ndarray:
    """Minimise ``fg`` (value, gradient) over the coordinates ``idx`` of ``z`` (BFGS, Armijo backtracking)."""
    f, g = fg(z)
    h = np.eye(len(idx))
    for _ in range(max_iter):
        gi = g[idx]
        if np.max(np.abs(gi)) < 1e-5:
            break
        d = -h @ gi
        if d @ gi >= 0:  # not a descent direction: restart from steepest descent
            h = np.eye(len(idx))
            d = -gi
        t = 1.0
        while True:
            zn = z.copy()
            zn[idx] += t * d
            fn, gn = fg(zn)
            if (np.isfinite(fn) and fn <= f + 1e-4 * t * (d @ gi)) or t < 1e-10:
                break
            t *= 0.5
        if t < 1e-10:
            break
        s_vec = zn[idx] - z[idx]
        y_vec = gn[idx] - gi
        sy = float(s_vec @ y_vec)
        z, f_old, f, g = zn, f, fn, gn
        if sy > 1e-12:
            rho = 1.0 / sy
            eye = np.eye(len(idx))
            h = ((eye - rho * np.outer(s_vec, y_vec)) @ h @ (eye - rho * np.outer(y_vec, s_vec))
                 + rho * np.outer(s_vec, s_vec))
        if abs(f_old - f) < 1e-9 * max(1.0, abs(f)):
            break
    return z


# ------------------------------------------------------------------------------------------ batch choice
def split_for(batch, replicas, max_micro, base_batch):
    """(micro-batch, accumulation steps) for total batches ``batch`` on ``replicas`` GPUs.

    Accumulate when the per-GPU batch exceeds ``max_micro``; on a single GPU above the base batch always
    at least two micro-steps (AdaptDL: the gradient statistics need two micro-batches to be estimated).
    """
    local = np.asarray(batch, dtype=float) / np.asarray(replicas, dtype=float)
    accum = np.ceil(local / np.asarray(max_micro, dtype=float) - _EPS) - 1.0
    single = (np.asarray(replicas) == 1) & (local > np.asarray(base_batch, dtype=float) + _EPS)
    accum = np.where(single, np.maximum(accum, 1.0), accum)
    accum = np.maximum(accum, 0.0)
    micro = np.ceil(local / (accum + 1.0) - _EPS)
    return micro, accum


def best_batch(params: np.ndarray, gns, base_batch, max_batch, min_micro, max_micro, nodes, replicas,
               candidates: int = BATCH_CANDIDATES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Goodput-optimal batch of each allocation: ``(goodput, micro_batch, accum_steps)``, each of the
    broadcast shape of ``nodes``/``replicas`` (per-job arguments broadcast against them; ``params``
    (..., 7)).

    Candidates: ``candidates`` total batches geometrically spaced from max(base batch, min micro-batch x
    GPUs) to ``max_batch``, each split by :func:`split_for`; a candidate whose micro-batch falls outside
    [min_micro, max_micro] has goodput 0. Goodput in base-batch samples per second.
    """
    k, n = np.broadcast_arrays(np.asarray(nodes, dtype=float), np.asarray(replicas, dtype=float))
    p = np.asarray(params, dtype=float)
    m0 = np.asarray(base_batch, dtype=float)
    lo = np.maximum(m0, np.asarray(min_micro, dtype=float) * n)
    hi = np.broadcast_to(np.asarray(max_batch, dtype=float), lo.shape)
    frac = np.linspace(0.0, 1.0, candidates) if candidates > 1 else np.zeros(1)
    frac = frac.reshape((candidates,) + (1,) * lo.ndim)
    batch = lo * (hi / lo) ** frac  # (C, ...) geometric from lo to hi
    micro, accum = split_for(batch, n, max_micro, m0)
    total = n * micro * (accum + 1.0)
    good = throughput(p, k, n, micro, accum) * efficiency(gns, m0, np.maximum(total, m0))
    ok = (micro >= np.asarray(min_micro, dtype=float)) & (micro <= np.asarray(max_micro, dtype=float)) & (n > 0)
    good = np.where(ok, good, 0.0)
    i = np.argmax(good, axis=0)[None]
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, good.shape), i, axis=0)[0]  # noqa: E731
    return pick(good), pick(micro).astype(np.int64), pick(accum).astype(np.int64)


# ------------------------------------------------------------------------------------------ per job
def batch_limits(spec: JobSpec) -> tuple[float, float, float, float]:
    """``(base batch M0, largest total batch, smallest micro-batch, largest micro-batch)`` of a job.

    M0 is ``min_global_batch`` when the spec gives it (the Pollux profiles' smallest validated batch),
    else the 1-GPU recipe ``per_gpu_batch``. Without a cap on the total batch: 64 x M0.
    """
    m0 = float(spec.min_global_batch or spec.per_gpu_batch)
    cap = spec.global_batch_cap
    has_cap = spec.max_lr is not None or spec.max_global_batch is not None
    top = float(cap) if has_cap else 64.0 * m0
    top = max(top, m0)
    lo_micro = float(spec.min_per_gpu_batch or 1)
    hi_micro = float(spec.max_per_gpu_batch or top)
    return m0, top, lo_micro, max(hi_micro, lo_micro)


@lru_cache(maxsize=65536)
def fitted(observations: tuple[ThroughputObs, ...]) -> np.ndarray:
    """``fit_perf_params`` memoised on the observation tuple (a job refits only when it has run on a
    configuration it had not seen)."""
    p = fit_perf_params(observations)
    p.setflags(write=False)
    return p


def job_batch(spec: JobSpec, observations: Sequence[ThroughputObs], gns: float | None, nodes: int,
              replicas: int) -> tuple[int, int]:
    """``(micro-batch, accumulation steps)`` a job picks for itself on ``nodes`` nodes x ``replicas``
    GPUs, as AdaptDL's trainer does: the goodput-optimal batch under its own fitted model and measured
    noise scale; before it has measured anything, max(M0, smallest micro-batch x GPUs). The micro-batch is
    then capped so the total stays within the largest batch."""
    m0, top, lo_micro, hi_micro = batch_limits(spec)
    if observations and gns is not None:
        _, micro, accum = best_batch(fitted(tuple(observations)), gns, m0, top, lo_micro, hi_micro, nodes, replicas)
        micro, accum = int(micro), int(accum)
    else:
        micro, accum = (int(v) for v in split_for(max(m0, lo_micro * replicas), replicas, hi_micro, m0))
    if micro < 1:  # no valid candidate (the largest batch is below one micro-batch per GPU)
        micro, accum = (int(v) for v in split_for(max(m0, lo_micro * replicas), replicas, hi_micro, m0))
    micro = min(micro, int(top // (replicas * (accum + 1))))
    return max(micro, 1), accum
