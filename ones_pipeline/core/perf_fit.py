"""The fit of Pollux's step-time model (``core.goodput``) to a job's observed steps: each job's 7 parameters by
BFGS in unconstrained coordinates with the analytic gradient, many jobs at once.

The objective is the root-mean-square log error of the compute and the step time over what the job has
observed, plus two small penalties (towards gamma = 1, and against the "retrogression" slopes bn, br).
Parameters the data cannot inform stay at their floor: with no multi-GPU observation the network is
nearly free, with no multi-node one crossing nodes costs 1.1x the in-node network, with one micro-batch
size ``ac`` is half the compute time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ones_pipeline.core.types import ThroughputObs

N_PERF = 7  # ac, bc, an, bn, ar, br, gamma
_FLOOR = 1e-8
_GAMMA_MAX = 10.0
_INIT = np.array([1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3])


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
