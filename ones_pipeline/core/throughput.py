"""Throughput model: step time of data-parallel training, fitted online from observed steps.

Step time of one optimizer step with ``n`` GPUs on ``k`` nodes, per-GPU batch ``b`` and ``a``
gradient-accumulation micro-steps (``a = 0`` when ``b`` fits in memory)::

    compute(b) = c0 + c1 * b                                   # forward + backward of one micro-batch
    sync(n, k) = [n > 1] * (s0 + s1 * (n - 1))                 # all-reduce inside a node (ring)
               + [k > 1] * (x0 + x1 * (k - 1))                 # extra cost of crossing nodes
    step       = (a + 1) * compute(b) + sync(n, k)
    throughput = n * b * (a + 1) / step                        # samples per second

The six parameters (``ThroughputParams``: ``c0, c1, s0, s1, x0, x1``) are non-negative. They are fitted
by ridge-regularised least squares towards a prior, so one observation at 1 GPU already gives a usable
(pessimistic-for-scale-out) model and more placements sharpen it. The model never returns a non-positive
step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ones_pipeline.core.types import ThroughputObs

N_PARAMS = 6
MIN_STEP_S = 1e-6


class ThroughputParams(NamedTuple):
    """Parameters of the step-time model (seconds). Each field is a number or an array; arrays broadcast
    against the configuration arguments of ``step_time`` and ``throughput``, so one value can hold the
    parameters of many jobs (``(J,)`` fields, see ``select``)."""

    # compute(b) = c0 + c1 * b, one forward + backward pass over a micro-batch of b samples
    c0: Any  # constant term of compute time (s)
    c1: Any  # compute time per sample of the micro-batch (s)
    # sync(n, k) = [n > 1] * (s0 + s1 * (n - 1)) + [k > 1] * (x0 + x1 * (k - 1))
    s0: Any  # constant term of the all-reduce over n > 1 GPUs (s)
    s1: Any  # all-reduce time per GPU of the ring beyond the first (s)
    x0: Any  # constant extra cost of crossing nodes, k > 1 (s)
    x1: Any  # extra cost per node beyond the first (s)
    # step = (a + 1) * compute(b) + sync(n, k), with a accumulation micro-steps
    # throughput = n * b * (a + 1) / step (samples per second)

    @classmethod
    def from_array(cls, values: Any) -> ThroughputParams:
        """From a ``(..., 6)`` array, columns in field order; fields are ``(...)`` views (or scalars)."""
        a = np.asarray(values, dtype=float)
        if a.shape[-1:] != (N_PARAMS,):
            raise ValueError(f"throughput parameters need a last axis of {N_PARAMS}, got shape {a.shape}")
        return cls(*np.moveaxis(a, -1, 0))

    def as_array(self) -> np.ndarray:
        """``(..., 6)`` array of the fields broadcast against each other, columns in field order."""
        return np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in self)), axis=-1)

    def select(self, index: Any) -> ThroughputParams:
        """Every field indexed by ``index``: the parameters of some jobs (an index array), of one job (an
        int), or with axes added for broadcasting (``np.s_[:, None]``)."""
        return ThroughputParams(*(np.asarray(v, dtype=float)[index] for v in self))


# With no observation at all: a generic small-model prior (seconds).
DEFAULT_PARAMS = ThroughputParams(c0=0.01, c1=1e-3, s0=0.005, s1=0.002, x0=0.02, x1=0.01)
# Relative priors for sync terms once compute is known: fractions of one compute step.
_SYNC_PRIOR_FRACTIONS = np.array([0.05, 0.02, 0.2, 0.1])


def _factors(num_gpus, num_nodes, per_gpu_batch, accum_steps=0) -> tuple[np.ndarray, ...]:
    """``(a + 1, b, n > 1, n - 1, k > 1, k - 1)`` as float arrays, broadcast against each other."""
    n = np.asarray(num_gpus, dtype=float)
    k = np.asarray(num_nodes, dtype=float)
    b = np.asarray(per_gpu_batch, dtype=float)
    a1 = np.asarray(accum_steps, dtype=float) + 1.0
    multi = (n > 1).astype(float)
    cross = (k > 1).astype(float)
    return tuple(np.broadcast_arrays(a1, b, multi, n - 1, cross, k - 1))


def features(num_gpus, num_nodes, per_gpu_batch, accum_steps=0) -> np.ndarray:
    """(..., 6) design matrix rows for the step-time equation: the factor of each parameter, in field
    order, so that ``step = features @ params``."""
    a1, b, multi, n1, cross, k1 = _factors(num_gpus, num_nodes, per_gpu_batch, accum_steps)
    return np.stack([a1, a1 * b, multi, multi * n1, cross, cross * k1], axis=-1)


def step_time(params: ThroughputParams, num_gpus, num_nodes, per_gpu_batch, accum_steps=0) -> np.ndarray:
    """Seconds per optimizer step (> 0); ``params``' fields broadcast against the other arguments."""
    if not isinstance(params, ThroughputParams):
        raise TypeError(f"params must be ThroughputParams, got {type(params).__name__}")
    c0, c1, s0, s1, x0, x1 = (np.asarray(v, dtype=float) for v in params)
    a1, b, multi, n1, cross, k1 = _factors(num_gpus, num_nodes, per_gpu_batch, accum_steps)
    # The factors of ``features`` times the parameters, summed left to right in field order: the same
    # floating-point result as ``features @ params``, without building the (..., 6) array.
    step = a1 * c0 + a1 * b * c1 + multi * s0 + multi * n1 * s1 + cross * x0 + cross * k1 * x1
    return np.maximum(step, MIN_STEP_S)


def throughput(params: ThroughputParams, num_gpus, num_nodes, per_gpu_batch, accum_steps=0) -> np.ndarray:
    """Samples per second (> 0)."""
    n = np.asarray(num_gpus, dtype=float)
    b = np.asarray(per_gpu_batch, dtype=float)
    a1 = np.asarray(accum_steps, dtype=float) + 1.0
    return n * b * a1 / step_time(params, num_gpus, num_nodes, per_gpu_batch, accum_steps)


def prior_params(observations: Sequence[ThroughputObs] = ()) -> ThroughputParams:
    """Prior parameters: generic, or scaled from the observed compute time when there is one."""
    if not observations:
        return DEFAULT_PARAMS
    compute = np.array([o.step_time_s - o.sync_time_s for o in observations], dtype=float)
    batch = np.array([o.per_gpu_batch for o in observations], dtype=float)
    per_sample = max(float(np.median(np.maximum(compute, MIN_STEP_S) / batch)), 1e-9)
    c0 = 0.1 * per_sample * float(np.median(batch))
    c1 = 0.9 * per_sample
    step = c0 + c1 * float(np.median(batch))
    return ThroughputParams.from_array(np.concatenate([[c0, c1], _SYNC_PRIOR_FRACTIONS * step]))


def fit_params(observations: Sequence[ThroughputObs], prior: ThroughputParams | None = None,
               ridge: float = 0.05) -> ThroughputParams:
    """Fit one job's parameters to observed step times; ridge-regularised towards ``prior``.

    The sync terms are fitted from observed sync times when reported (``sync_time_s > 0``), the
    compute terms from ``step_time - sync_time``; both are least squares in relative error, so a
    fast small job and a slow large one weigh alike.
    """
    if prior is None:
        prior = prior_params(observations)
    if not observations:
        return prior
    n = np.array([o.num_gpus for o in observations], dtype=float)
    k = np.array([o.num_nodes for o in observations], dtype=float)
    b = np.array([o.per_gpu_batch for o in observations], dtype=float)
    step = np.array([o.step_time_s for o in observations], dtype=float)
    sync = np.array([o.sync_time_s for o in observations], dtype=float)
    f = features(n, k, b)
    has_sync = sync > 0
    params = prior.as_array().copy()  # (6,)
    # Compute part (cols 0-1): target is compute time when sync is known, else the whole step.
    target_c = np.where(has_sync, step - sync, step - f[:, 2:] @ params[2:])
    params[:2] = _ridge_nonneg(f[:, :2], target_c, params[:2], ridge)
    # Sync part (cols 2-5): fitted only where a sync time or multi-GPU step was seen.
    target_s = np.where(has_sync, sync, step - f[:, :2] @ params[:2])
    informative = (n > 1)
    if informative.any():
        params[2:] = _ridge_nonneg(f[informative, 2:], target_s[informative], params[2:], ridge)
    return ThroughputParams.from_array(params)


def fit_params_many(observation_sets: Sequence[Sequence[ThroughputObs]], ridge: float = 0.05) -> np.ndarray:
    """(B, 6) ``fit_params`` (with its default prior) of each of B observation sets, the same values: jobs
    with the same number of observations are fitted together, their least-squares systems stacked (a first
    decision fits thousands of jobs; one at a time, numpy's per-call cost dominates)."""
    out = np.empty((len(observation_sets), N_PARAMS))
    by_len: dict[int, list[int]] = {}
    for i, obs in enumerate(observation_sets):
        by_len.setdefault(len(obs), []).append(i)
    for length, members in by_len.items():
        idx = np.array(members)
        if length == 0:
            out[idx] = DEFAULT_PARAMS
            continue
        a = np.array([[(o.num_gpus, o.num_nodes, o.per_gpu_batch, o.step_time_s, o.sync_time_s)
                       for o in observation_sets[i]] for i in members], dtype=float)  # (B, L, 5)
        n, k, b, step, sync = np.moveaxis(a, -1, 0)  # (B, L) each
        # ``prior_params``, row by row.
        per_sample = np.maximum(np.median(np.maximum(step - sync, MIN_STEP_S) / b, axis=1), 1e-9)
        mid = np.median(b, axis=1)
        c0, c1 = 0.1 * per_sample * mid, 0.9 * per_sample
        params = np.concatenate([c0[:, None], c1[:, None], _SYNC_PRIOR_FRACTIONS[None, :] * (c0 + c1 * mid)[:, None]],
                                axis=1)  # (B, 6)
        f = features(n, k, b)  # (B, L, 6)
        has_sync = sync > 0
        target_c = np.where(has_sync, step - sync, step - (f[:, :, 2:] @ params[:, 2:, None])[:, :, 0])
        params[:, :2] = _ridge_nonneg_many(f[:, :, :2], target_c, params[:, :2], ridge)
        target_s = np.where(has_sync, sync, step - (f[:, :, :2] @ params[:, :2, None])[:, :, 0])
        informative = n > 1
        patterns, which = np.unique(informative, axis=0, return_inverse=True)
        for g, pattern in enumerate(patterns):  # jobs whose multi-GPU observations sit at the same places
            if pattern.any():
                rows = np.flatnonzero(which.ravel() == g)
                params[rows, 2:] = _ridge_nonneg_many(f[rows][:, pattern, 2:], target_s[rows][:, pattern],
                                                      params[rows, 2:], ridge)
        out[idx] = params
    return out


def _ridge_nonneg_many(x: np.ndarray, y: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """``_ridge_nonneg`` of each row: ``x`` (B, L, K), ``y`` (B, L), ``prior`` (B, K) -> (B, K). The rows
    that share an active set are solved together, round after round."""
    B, _, K = x.shape
    scale = np.maximum(np.abs(y), MIN_STEP_S)
    xw = x / scale[:, :, None]
    yw = y / scale
    data_scale = np.median(scale, axis=1)[:, None] / np.maximum(np.mean(np.abs(x), axis=1), 1e-12)
    p_scale = np.maximum(np.maximum(np.abs(prior), data_scale), 1e-9)
    out = np.zeros((B, K))
    active = np.ones((B, K), dtype=bool)
    todo = np.arange(B)
    for _ in range(K):
        if not todo.size:
            break
        again = []
        masks, which = np.unique(active[todo], axis=0, return_inverse=True)
        for g, mask in enumerate(masks):
            rows = todo[which.ravel() == g]
            cols = np.flatnonzero(mask)
            ps = p_scale[rows][:, cols]  # (R, A)
            xa = xw[rows][:, :, cols] * ps[:, None, :]  # (R, L, A)
            xt = xa.transpose(0, 2, 1)
            lhs = xt @ xa + ridge * np.eye(cols.size)
            rhs = (xt @ yw[rows][:, :, None])[:, :, 0] + ridge * (prior[rows][:, cols] / ps)
            p = np.zeros((rows.size, K))
            p[:, cols] = np.linalg.solve(lhs, rhs[:, :, None])[:, :, 0] * ps
            out[rows] = p
            negative = ~(p >= 0).all(axis=1)
            active[rows] &= np.where(negative[:, None], p > 0, True)
            again.append(rows[negative & active[rows].any(axis=1)])
        todo = np.concatenate(again)
    return np.maximum(out, 0.0)


def _ridge_nonneg(x: np.ndarray, y: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """argmin sum(((x@p - y)/y)^2) + ridge * sum(((p - prior)/p_scale)^2), p >= 0 (active set)."""
    scale = np.maximum(np.abs(y), MIN_STEP_S)
    xw = x / scale[:, None]
    yw = y / scale
    # Each parameter is penalised in units of the size the data would give it alone, so a prior that
    # is far off (e.g. sync 10x the default guess) yields to a few observations.
    data_scale = float(np.median(scale)) / np.maximum(np.mean(np.abs(x), axis=0), 1e-12)
    p_scale = np.maximum(np.maximum(np.abs(prior), data_scale), 1e-9)
    active = np.ones(x.shape[1], dtype=bool)
    p = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        xa = xw[:, active] * p_scale[active]
        lhs = xa.T @ xa + ridge * np.eye(int(active.sum()))
        rhs = xa.T @ yw + ridge * (prior[active] / p_scale[active])
        z = np.linalg.solve(lhs, rhs)
        p = np.zeros(x.shape[1])
        p[active] = z * p_scale[active]
        if (p >= 0).all():
            return p
        active &= p > 0
        if not active.any():
            break
    return np.maximum(p, 0.0)
