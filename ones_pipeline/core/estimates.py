"""Per-job estimates every policy needs: fitted throughput parameters and remaining work.

Conversions from ``JobView`` objects to arrays happen here, once per decision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ones_pipeline.core import goodput
from ones_pipeline.core import throughput as tp
from ones_pipeline.core.efficiency import efficiency, gns_or_prior
from ones_pipeline.core.progress import remaining_samples
from ones_pipeline.core.types import JobView, obs_key


def fitted_params(jobs: Sequence[JobView], rows: np.ndarray | None = None,
                  fits: goodput.Fits | None = None) -> tp.ThroughputParams:
    """Throughput parameters of every job, ``(J,)`` fields: each job's own fit, else the mean fit of jobs
    of the same model, else the fit of the step times earlier jobs of its model measured
    (``JobView.model_obs``), else the generic prior. With ``rows`` (indices into ``jobs``): only those
    jobs', ``(R,)`` fields, the same values, and only the fits they need are made (a job's own, and its
    model's other jobs' when it has none). Fits are memoised in ``fits`` (``linear``) when given."""
    fits = fits if fits is not None else goodput.Fits()
    idx = np.arange(len(jobs)) if rows is None else np.asarray(rows, dtype=np.int64)
    wanted = {int(i) for i in idx}
    need_models = {jobs[i].spec.model for i in wanted if not jobs[i].throughput_obs}
    _fit_all(fits, [obs_key(j.throughput_obs) for i, j in enumerate(jobs)
              if j.throughput_obs and (i in wanted or j.spec.model in need_models)]
             + [tuple(jobs[i].model_obs) for i in wanted if not jobs[i].throughput_obs and jobs[i].model_obs])
    own: dict[int, np.ndarray] = {}
    by_model: dict[str, list[np.ndarray]] = defaultdict(list)
    for i, j in enumerate(jobs):  # in job order: the model means sum their fits in the same order
        if j.throughput_obs and (i in wanted or j.spec.model in need_models):
            own[i] = p = _linear(fits, obs_key(j.throughput_obs))
            by_model[j.spec.model].append(p)
    model_mean = {model: np.mean(ps, axis=0) for model, ps in by_model.items()
                  if model in need_models}  # once per model
    default = np.asarray(tp.DEFAULT_PARAMS, dtype=float)
    out = np.empty((len(idx), tp.N_PARAMS))
    for r, i in enumerate(idx):
        j = jobs[i]
        p = own.get(int(i))
        if p is None:
            p = model_mean.get(j.spec.model)
        if p is None and j.model_obs:
            p = _linear(fits, tuple(j.model_obs))
        out[r] = default if p is None else p
    return tp.ThroughputParams.from_array(out)


def _linear(fits: goodput.Fits, observations: tuple) -> np.ndarray:
    """The linear fit of ``observations`` as an array, from ``fits`` (fitted now if it was forgotten)."""
    if observations not in fits.linear:
        _fit_all(fits, [observations])
    return np.asarray(fits.linear[observations], dtype=float)


def _fit_all(fits: goodput.Fits, observation_sets) -> None:
    """Fit, in one batch (``tp.fit_params_many``: the same values), every observation tuple not in
    ``fits.linear`` yet (the result of a fit is an immutable tuple of numbers, safe to share)."""
    todo = list(dict.fromkeys(t for t in observation_sets if t not in fits.linear))
    if not todo:
        return
    fits.make_room(fits.linear, len(todo))
    for key, row in zip(todo, tp.fit_params_many(todo), strict=True):
        fits.linear[key] = tp.ThroughputParams(*(float(v) for v in row))


def remaining_work(jobs: Sequence[JobView]) -> np.ndarray:
    """(J,) base-equivalent samples each job still needs (> 0)."""
    return np.array([max(remaining_samples(j), 1.0) for j in jobs], dtype=float)


def noise_scales(jobs: Sequence[JobView]) -> np.ndarray:
    """(J,) gradient noise scale in samples (measured, else the prior)."""
    return np.array([gns_or_prior(j.grad_noise_scale, j.spec.per_gpu_batch) for j in jobs], dtype=float)


def split_batch(global_batch, num_gpus, max_per_gpu) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU micro-batch and accumulation steps for a global batch over ``num_gpus`` GPUs."""
    g = np.asarray(global_batch, dtype=float)
    n = np.maximum(np.asarray(num_gpus, dtype=float), 1.0)
    local = np.ceil(g / n)
    cap = np.asarray(max_per_gpu, dtype=float)
    accum = np.maximum(np.ceil(local / cap) - 1.0, 0.0)
    micro = np.ceil(local / (accum + 1.0))
    return micro, accum


def goodput_of(params: tp.ThroughputParams, gns, base_batch, max_per_gpu, num_gpus, num_nodes, global_batch,
               use_efficiency: bool = True) -> np.ndarray:
    """Base-equivalent samples/s of jobs at the given sizes (all arguments and ``params``' fields broadcast)."""
    micro, accum = split_batch(global_batch, num_gpus, max_per_gpu)
    thr = tp.throughput(params, num_gpus, num_nodes, micro, accum)
    if not use_efficiency:
        return thr
    return thr * efficiency(gns, base_batch, np.asarray(num_gpus) * micro * (accum + 1.0))
