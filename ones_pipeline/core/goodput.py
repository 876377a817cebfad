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
Fits are memoised per observation tuple in a ``Fits`` its owner keeps (``fitted``); a policy fits all its
jobs' new tuples in one batched BFGS run (``fit_many``) rather than one job after the other.

Statistical efficiency of a total batch ``M`` with gradient noise scale ``gns`` measured at base batch
``M0``: ``(gns + M0) / (gns + M)`` (``core.efficiency``). Goodput = throughput x efficiency, in base-batch
samples per second.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ones_pipeline.core.types import JobSpec, ThroughputObs, obs_key

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
# Jobs are fitted B at a time, each by its own BFGS run, all runs advancing together (``_bfgs_many``).
# Observations are padded to a common count L and laid out (L, B), one column per job, so that every sum
# over a job's observations reduces an outer axis: numpy adds them one after the other and a padded zero
# changes nothing. Everything else is elementwise or row by row, so a job's fit does not depend on which
# other jobs share its batch, bit for bit (tested): a memoised fit is the same whichever decision asked
# for it first.
_EYE = np.eye(N_PERF)
_Z_HI = np.array([8.0] * 6 + [40.0])  # upper clip of each coordinate
_TRIAL_CELLS = 256  # (observations x trial points) up to which a round tries several steps of a line search


class _ObsBatch:
    """Observations of B jobs, (L, B) arrays (padding: 1 node, 1 GPU, micro-batch 1, compute = step = 1 s),
    and each job's fixed parameter values and free mask, (B, 7)."""

    def __init__(self, sets: Sequence[Sequence[ThroughputObs]]) -> None:
        lens = np.array([len(s) for s in sets], dtype=np.int64)
        vals = np.array([(o.num_nodes, o.num_gpus, o.per_gpu_batch, o.step_time_s, o.sync_time_s)
                         for s in sets for o in s], dtype=float)  # (sum of lens, 5)
        pos = np.arange(len(vals)) - np.repeat(np.cumsum(lens) - lens, lens)
        a = np.ones((5, int(lens.max()), len(sets)))
        a[4] = 0.0
        a[:, pos, np.repeat(np.arange(len(sets)), lens)] = vals.T
        k, self.n, self.b = a[0], a[1], a[2]
        self.compute = np.maximum(a[3] - a[4], 1e-9)
        self.log_compute, self.log_step = np.log(self.compute), np.log(np.maximum(a[3], self.compute))
        self.w = np.arange(a.shape[1])[:, None] < lens[None, :]  # (L, B) a real observation
        self.padded = not self.w.all()
        self.inter, self.intra = k > 1, (k <= 1) & (self.n > 1)
        self.r = np.maximum(self.n - 2.0, _FLOOR)
        self.cnt = lens.astype(float)
        self.fixed, self.free = np.zeros((len(sets), N_PERF)), np.ones((len(sets), N_PERF), dtype=bool)

    def take(self, rows: np.ndarray) -> _ObsBatch:
        out = object.__new__(_ObsBatch)
        for key, val in vars(self).items():
            if key != "padded":
                setattr(out, key, val[rows] if key in ("cnt", "fixed", "free") else val[:, rows])
        out.padded = not out.w.all()
        return out

    def mean(self, x: np.ndarray) -> np.ndarray:
        return np.where(self.w, x, 0.0).sum(axis=0) / self.cnt


def _initial_many(obs: _ObsBatch) -> np.ndarray:
    """(B, 7) start of each job's fit; sets ``obs.fixed`` and ``obs.free`` as ``fit_perf_params`` does."""
    w, b, c = obs.w, obs.b, obs.compute
    p0 = np.tile(_INIT, (len(obs.cnt), 1))
    one_b = np.where(w, b, np.inf).min(axis=0) == np.where(w, b, -np.inf).max(axis=0)
    mc, mb = obs.mean(c), obs.mean(b)
    # One micro-batch size: split the compute evenly into constant and slope (``ac`` stays fixed). Else
    # start the compute line from least squares (a start close to the optimum, not a prior).
    slope = obs.mean((b - mb) * (c - mc)) / np.where(one_b, 1.0, obs.mean((b - mb) ** 2))
    p0[:, 0] = np.where(one_b, mc / 2.0, np.maximum(mc - slope * mb, 1e-4 * mc))
    p0[:, 1] = np.maximum(np.where(one_b, (mc - mc / 2.0) / mb, slope), 1e-7)
    obs.free[one_b, 0] = False
    for cols, seen in (([2, 3], obs.inter), ([4, 5], obs.intra), ([3, 5], obs.n > 2)):  # never observed
        unseen = np.ix_(~(w & seen).any(axis=0), cols)
        p0[unseen], obs.free[unseen] = _FLOOR, False
    obs.fixed = p0.copy()
    return p0


def _to_z(p: np.ndarray) -> np.ndarray:
    z = np.log(np.maximum(p - _FLOOR, 1e-300))
    frac = np.clip((p[..., 6] - 1.0) / (_GAMMA_MAX - 1.0), 1e-9, 1 - 1e-9)
    z[..., 6] = np.log(frac / (1 - frac))
    return z


def _params_many(z: np.ndarray, obs: _ObsBatch) -> np.ndarray:
    """Unconstrained ``z`` (B, 7) -> parameters within their bounds (positive, up to ~3000 s: far beyond
    any step time; gamma in [1, 10], logistic); the fixed ones from ``obs``."""
    e = np.exp(np.clip(z, -40.0, _Z_HI))
    p = np.where(obs.free, _FLOOR + e, obs.fixed)
    p[:, 6] = 1.0 + (_GAMMA_MAX - 1.0) * e[:, 6] / (1.0 + e[:, 6])  # gamma is always free
    return p


def _fg_many(z: np.ndarray, obs: _ObsBatch) -> tuple[np.ndarray, np.ndarray]:
    """(B,) objective of each job at ``z`` (B, 7) (unconstrained coordinates) and (B, 7) its gradient."""
    p = _params_many(z, obs)
    ac, bc, an, bn, ar, br, g = p.T
    compute = ac + bc * obs.b  # (L, B)
    net = (np.where(obs.inter, an, np.where(obs.intra, ar, _FLOOR))
           + np.where(obs.inter, bn, np.where(obs.intra, br, _FLOOR)) * obs.r)
    lc, ln = np.log(compute), np.log(net)
    glc, gln = g * lc, g * ln
    m = np.maximum(glc, gln)
    wc, wn = np.exp(glc - m), np.exp(gln - m)
    s = wc + wn
    log_optim = (m + np.log(s)) / g
    e1, e2 = lc - obs.log_compute, log_optim - obs.log_step
    if obs.padded:
        e1, e2 = np.where(obs.w, e1, 0.0), np.where(obs.w, e2, 0.0)
    # The gradient of each RMS term is (its sum over observations) / (count x RMS): one reduction for all.
    t = np.empty(compute.shape + (11,))  # (L, B, 11) the summands
    np.multiply(e1, e1, out=t[..., 0])
    np.multiply(e2, e2, out=t[..., 1])
    ec = np.divide(e1, compute, out=t[..., 2])
    np.multiply(ec, obs.b, out=t[..., 3])
    es = e2 / s
    c2 = np.divide(es * wc, compute, out=t[..., 4])
    np.multiply(c2, obs.b, out=t[..., 5])
    n2 = es * wn / net
    n2i, n2a = np.multiply(n2, obs.inter, out=t[..., 6]), np.multiply(n2, obs.intra, out=t[..., 8])
    np.multiply(n2i, obs.r, out=t[..., 7])
    np.multiply(n2a, obs.r, out=t[..., 9])
    np.divide(es * (wc * lc + wn * ln) - e2 * log_optim, g, out=t[..., 10])
    sums = t.sum(axis=0)  # (B, 11)
    rms = np.sqrt(sums[:, :2] / obs.cnt[:, None] + 1e-16)  # (B, 2)
    q = p[:, 3:6:2] / p[:, 2:6:2]  # (B, 2) bn / an, br / ar: the retrogression penalty
    f = rms[:, 0] + rms[:, 1] + 1e-3 * (g - 1.0) ** 2 + 1e-2 * (q[:, 0] ** 2 + q[:, 1] ** 2)
    inv = 1.0 / (obs.cnt[:, None] * rms)
    grad = np.empty_like(p)
    grad[:, :2] = sums[:, 2:4] * inv[:, :1] + sums[:, 4:6] * inv[:, 1:]
    grad[:, 2:6] = sums[:, 6:10] * inv[:, 1:]
    qa = 2e-2 * q / p[:, 2:6:2]
    grad[:, 2:6:2] -= q * qa
    grad[:, 3:6:2] += qa
    grad[:, 6] = sums[:, 10] * inv[:, 1] + 2e-3 * (g - 1.0)
    dp = p - _FLOOR
    dp[:, 6] = (g - 1.0) * (_GAMMA_MAX - g) / (_GAMMA_MAX - 1.0)
    return f, np.where(obs.free, grad, 0.0) * dp


def _direction(h: np.ndarray, g: np.ndarray, it: np.ndarray, max_iter: int):
    """``(h, d, d . g, live)`` of rows starting an iteration: quasi-Newton direction, or steepest descent
    (and ``h`` reset) where that is not a descent direction; ``live`` False where the fit has stopped."""
    live = (it < max_iter) & ~(np.abs(g).max(axis=1) < 1e-5)
    d = -(h * g[:, None, :]).sum(axis=2)
    dg = (d * g).sum(axis=1)
    bad = dg >= 0
    if bad.any():
        h = np.where(bad[:, None, None], _EYE, h)
        d = np.where(bad[:, None], -g, d)
        dg = np.where(bad, (-g * g).sum(axis=1), dg)
    return h, d, dg, live


def _bfgs_update(h: np.ndarray, s: np.ndarray, y: np.ndarray) -> np.ndarray:
    """BFGS inverse-Hessian update of each row of ``h`` (A, 7, 7), skipped where s . y <= 1e-12:
    (I - rho s y') h (I - rho y s') + rho s s', expanded. ``h`` stays exactly symmetric (from I), so
    y' h = (h y)'."""
    sy = (s * y).sum(axis=1)
    ok = sy > 1e-12
    rho = np.where(ok, 1.0 / np.where(ok, sy, 1.0), 0.0)[:, None, None]
    hy = (h * y[:, None, :]).sum(axis=2)  # (A, 7)
    yhy = (hy * y).sum(axis=1)[:, None, None]
    hys = hy[:, :, None] * s[:, None, :]
    new = h - rho * (hys + hys.transpose(0, 2, 1)) + (rho * rho * yhy + rho) * (s[:, :, None] * s[:, None, :])
    return np.where(ok[:, None, None], new, h)


def _bfgs_many(obs: _ObsBatch, z: np.ndarray, max_iter: int) -> np.ndarray:
    """Minimise each job's objective from its row of ``z`` (B, 7) by BFGS with Armijo backtracking over its
    free coordinates; a job stops when its gradient is below 1e-5, its line search fails (step < 1e-10),
    its objective changes by less than 1e-9 (relative) or after ``max_iter`` iterations. Every job runs its
    own iterations. A round tries W steps t, t/2, ... of each running job at once and takes the first the
    backtracking would accept (while the arrays are small, W > 1 costs about as much as W = 1): the same
    trial points, so the same result, in fewer rounds."""
    out = z.copy()
    rows = np.arange(len(z))  # row of ``out`` of each running row
    f, g = _fg_many(z, obs)
    it = np.zeros(len(z), dtype=np.int64)
    h, d, dg, live = _direction(np.broadcast_to(_EYE, (len(z), N_PERF, N_PERF)).copy(), g, it, max_iter)
    t = np.ones(len(z))
    wide = None
    while True:
        if not live.all():
            out[rows[~live]] = z[~live]
            keep = np.flatnonzero(live)
            if keep.size == 0:
                return out
            rows, z, f, g, h, d, dg, t, it = (a[keep] for a in (rows, z, f, g, h, d, dg, t, it))
            obs, wide = obs.take(keep), None
        if wide is None:  # the observations of each trial point
            W = int(np.clip(_TRIAL_CELLS // obs.w.size, 1, 8))
            wide, halves, r = obs.take(np.repeat(np.arange(len(z)), W)), 0.5 ** np.arange(W), np.arange(len(z))
        steps = t[:, None] * halves  # (B, W)
        zw = z[:, None, :] + steps[:, :, None] * d[:, None, :]  # (B, W, 7)
        fw, gw = _fg_many(zw.reshape(-1, N_PERF), wide)
        small = steps < 1e-10  # the line search gave up: stop where the row is
        ends = (np.isfinite(fw).reshape(-1, W) & (fw.reshape(-1, W) <= f[:, None] + 1e-4 * steps * dg[:, None])) | small
        k = ends.argmax(axis=1)  # the first trial that ends the line search, if any
        hit, small = ends[r, k], small[r, k]
        acc = hit & ~small
        t = np.where(hit, 1.0, t * 0.5 ** W)
        if not acc.any():
            live = ~(hit & small)
            continue
        zn, fn, gn = zw[r, k], fw.reshape(-1, W)[r, k], gw.reshape(-1, W, N_PERF)[r, k]
        flat = np.abs(f - fn) < 1e-9 * np.maximum(1.0, np.abs(fn))
        it = it + acc
        h_new, d_new, dg_new, live_new = _direction(_bfgs_update(h, zn - z, gn - g), gn, it, max_iter)
        live = np.where(acc, live_new & ~flat, ~(hit & small))
        if acc.all():
            z, f, g, h, d, dg = zn, fn, gn, h_new, d_new, dg_new
        else:
            a1, a2 = acc[:, None], acc[:, None, None]
            z, f, g = np.where(a1, zn, z), np.where(acc, fn, f), np.where(a1, gn, g)
            h, d, dg = np.where(a2, h_new, h), np.where(a1, d_new, d), np.where(acc, dg_new, dg)


def fit_perf_params(observations: Sequence[ThroughputObs], max_iter: int = 60) -> np.ndarray:
    """(7,) parameters fitted to a job's observed steps (compute = step - sync, and step).

    BFGS in unconstrained coordinates (log for the positive parameters, logistic for gamma) with the
    analytic gradient. Parameters the observations cannot inform are fixed (see the module docstring).
    """
    return fit_perf_params_many([observations], max_iter)[0]


def fit_perf_params_many(observation_sets: Sequence[Sequence[ThroughputObs]], max_iter: int = 60) -> np.ndarray:
    """(B, 7) ``fit_perf_params`` of each of B jobs, fitted together: one numpy evaluation of all the
    objectives per line-search round rather than one per job (the first decision of a policy fits every
    job). A job's result does not depend on the other jobs in the batch."""
    if any(not s for s in observation_sets):
        raise ValueError("fit_perf_params needs at least one observation per job")
    B = len(observation_sets)
    if B == 0:
        return np.zeros((0, N_PERF))
    sets = list(observation_sets) + list(observation_sets[:1]) * (B == 1)  # >= 2 columns (see above)
    obs = _ObsBatch(sets)
    with np.errstate(all="ignore"):
        z = _bfgs_many(obs, _to_z(_initial_many(obs)), max_iter)
        p = _params_many(z, obs)[:B]
    lone = ~(obs.w & obs.inter).any(axis=0)[:B]  # prior: crossing nodes costs >= 1.1x the in-node network
    p[lone, 2:4] = np.maximum(p[lone, 2:4], 1.1 * p[lone, 4:6])
    return p


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


def _goodput_in_place(p, k, n, micro, accum, total, gns, m0) -> np.ndarray:
    """``best_batch``'s goodput of each candidate: ``throughput x efficiency`` as ``step_time``,
    ``throughput`` and ``efficiency`` compute it, operation for operation, in ``total``'s memory."""
    # step time (step_time): compute, then the optimiser step against the network
    compute = np.multiply(p[..., 1], micro)
    np.add(compute, p[..., 0], out=compute)
    net = _network(p, k, n)
    g = p[..., 6]
    top = np.maximum(compute, net)
    r = np.minimum(compute, net)
    np.divide(r, top, out=r)
    np.power(r, g, out=r)
    np.add(r, 1.0, out=r)
    np.power(r, 1.0 / g, out=r)
    np.multiply(top, r, out=r)  # optim
    np.multiply(accum, compute, out=compute)
    np.add(compute, r, out=compute)  # step time
    eff = np.maximum(total, m0)  # efficiency at the total batch
    gn = np.maximum(np.asarray(gns, dtype=float), 0.0)
    np.add(eff, gn, out=eff)
    np.divide(gn + m0, eff, out=eff)
    good = np.divide(total, compute, out=total)  # throughput
    return np.multiply(good, eff, out=good)


def best_batch(params: np.ndarray, gns, base_batch, max_batch, min_micro, max_micro, nodes, replicas,
               candidates: int = BATCH_CANDIDATES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Goodput-optimal batch of each allocation: ``(goodput, micro_batch, accum_steps)``, each of the
    broadcast shape of ``nodes``/``replicas`` (per-job arguments broadcast against them; ``params``
    (..., 7)).

    Candidates: ``candidates`` total batches geometrically spaced from max(base batch, min micro-batch x
    GPUs) to ``max_batch``, each split by :func:`split_for`; a candidate whose micro-batch falls outside
    [min_micro, max_micro] has goodput 0. Goodput in base-batch samples per second. In place (the (C, ...)
    arrays reach tens of MB), operation for operation as ``split_for`` and the model functions (tested).
    """
    k, n = np.broadcast_arrays(np.asarray(nodes, dtype=float), np.asarray(replicas, dtype=float))
    p = np.asarray(params, dtype=float)
    m0 = np.asarray(base_batch, dtype=float)
    lo_micro, hi_micro = np.asarray(min_micro, dtype=float), np.asarray(max_micro, dtype=float)
    lo = np.maximum(m0, lo_micro * n)
    hi = np.broadcast_to(np.asarray(max_batch, dtype=float), lo.shape)
    frac = np.linspace(0.0, 1.0, candidates) if candidates > 1 else np.zeros(1)
    frac = frac.reshape((candidates,) + (1,) * lo.ndim)
    local = np.power(hi / lo, frac)
    np.multiply(lo, local, out=local)  # the candidate total batches, geometric from lo to hi
    np.divide(local, n, out=local)  # split_for: per-GPU batch
    accum = np.divide(local, hi_micro)
    np.subtract(accum, _EPS, out=accum)
    np.ceil(accum, out=accum)
    np.subtract(accum, 1.0, out=accum)
    single = np.greater(local, m0 + _EPS)
    np.logical_and(single, n == 1, out=single)
    np.maximum(accum, single, out=accum)  # at least 1 where single, at least 0 everywhere
    a1 = accum + 1.0
    micro = np.divide(local, a1, out=local)
    np.subtract(micro, _EPS, out=micro)
    np.ceil(micro, out=micro)
    total = np.multiply(n, micro)
    np.multiply(total, a1, out=total)  # samples per step
    good = _goodput_in_place(p, k, n, micro, accum, total, gns, m0)
    bad = np.less(micro, lo_micro)
    np.logical_or(bad, micro > hi_micro, out=bad)
    np.logical_or(bad, ~(n > 0), out=bad)
    np.copyto(good, 0.0, where=bad)
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


class Fits:
    """Fitted step-time parameters memoised on the observation tuple, owned by whoever fits (a policy, the
    simulator's job side, a job's batch tuner; nothing is shared through module state): ``perf`` this
    module's model (``fit_many``, ``fitted``), ``linear`` ``core.estimates``' model; each at most ``limit``
    tuples, the oldest half forgotten past it. A job refits only when it has run somewhere new."""

    def __init__(self, limit: int = 65536) -> None:
        self.limit = limit
        self.perf: dict[tuple[ThroughputObs, ...], np.ndarray] = {}
        self.linear: dict[tuple[ThroughputObs, ...], object] = {}

    def make_room(self, memo: dict, adding: int) -> None:
        for key in list(memo)[: len(memo) // 2 + adding] if len(memo) + adding > self.limit else ():
            del memo[key]


def fit_many(observation_sets: Iterable[Sequence[ThroughputObs]], fits: Fits) -> None:
    """Fit in one batch (``fit_perf_params_many``) every non-empty observation tuple not in ``fits`` yet: a
    policy calls it once per decision, before it asks ``fitted`` job by job."""
    todo = list(dict.fromkeys(t for s in observation_sets if (t := obs_key(s)) and t not in fits.perf))
    fits.make_room(fits.perf, len(todo))
    for key, p in zip(todo, fit_perf_params_many(todo), strict=True):
        p.setflags(write=False)
        fits.perf[key] = p


def fitted(observations: tuple[ThroughputObs, ...], fits: Fits | None = None) -> np.ndarray:
    """(7,) read-only ``fit_perf_params`` of one job, memoised in ``fits`` (fitted afresh without)."""
    if not observations:
        raise ValueError("fitted needs at least one observation")
    fits = fits if fits is not None else Fits()
    if observations not in fits.perf:
        fit_many([observations], fits)
    return fits.perf[observations]


def job_batch(spec: JobSpec, observations: Sequence[ThroughputObs], gns: float | None, nodes: int,
              replicas: int, fits: Fits | None = None) -> tuple[int, int]:
    """``(micro-batch, accumulation steps)`` a job picks for itself on ``nodes`` nodes x ``replicas``
    GPUs, as AdaptDL's trainer does: the goodput-optimal batch under its own fitted model and measured
    noise scale; before it has measured anything, max(M0, smallest micro-batch x GPUs). The micro-batch is
    then capped so the total stays within the largest batch."""
    return job_batches([spec], [observations], [gns], [nodes], [replicas], fits)[0]


def _settled(limits: tuple[float, float, float, float], picked: tuple[int, int] | None,
             replicas: int) -> tuple[int, int]:
    """``job_batch``'s last step: the searched ``picked`` (micro-batch, accumulation steps), or, unmeasured
    (None) or with no valid candidate, the smallest batch; the micro-batch capped so the total stays
    within the largest batch."""
    m0, top, lo_micro, hi_micro = limits
    n = int(replicas)
    if picked is None or picked[0] < 1:
        picked = tuple(int(v) for v in split_for(max(m0, lo_micro * n), n, hi_micro, m0))
    micro, accum = picked
    micro = min(micro, int(top // (n * (accum + 1))))
    return max(micro, 1), accum


def job_batches(specs: Sequence[JobSpec], observations: Sequence[Sequence[ThroughputObs]],
                gns: Sequence[float | None], nodes: Sequence[int], replicas: Sequence[int],
                fits: Fits | None = None) -> list[tuple[int, int]]:
    """``job_batch`` of many allocations at once (the i-th job on ``nodes[i]`` x ``replicas[i]``), the same
    values: the measured jobs' batch searches run as one ``best_batch`` call (a decision that starts or resizes
    thousands of jobs would otherwise search them one after the other)."""
    out: list[tuple[int, int] | None] = [None] * len(specs)
    measured = [i for i in range(len(specs)) if observations[i] and gns[i] is not None]
    if measured:
        obs = [tuple(observations[i]) for i in measured]
        fits = fits if fits is not None else Fits()
        fit_many(obs, fits)
        lim = np.array([batch_limits(specs[i]) for i in measured])  # (M, 4)
        _, micro, accum = best_batch(np.stack([fitted(t, fits) for t in obs]),
                                     np.array([gns[i] for i in measured], dtype=float), *lim.T,
                                     np.array([nodes[i] for i in measured], dtype=float),
                                     np.array([replicas[i] for i in measured], dtype=float))
        for r, i in enumerate(measured):
            out[i] = (int(micro[r]), int(accum[r]))
    return [_settled(batch_limits(spec), out[i], replicas[i]) for i, spec in enumerate(specs)]
