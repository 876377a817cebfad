"""Per-job estimates every policy needs: remaining work, noise scales, goodput under ``core.throughput``'s
equation (its fitted parameters: ``core.goodput.GoodputModel.prior``).

Conversions from ``JobView`` objects to arrays happen here, once per decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ones_pipeline.core import throughput as tp
from ones_pipeline.core.efficiency import efficiency, gns_or_prior
from ones_pipeline.core.progress import remaining_samples
from ones_pipeline.core.types import JobView


def remaining_work(jobs: Sequence[JobView]) -> np.ndarray:
    """(J,) base-equivalent samples each job still needs (> 0)."""
    return np.array([max(remaining_samples(j), 1.0) for j in jobs], dtype=float)


def evaluation_time(jobs: Sequence[JobView], remaining: np.ndarray) -> np.ndarray:
    """(J,) s each job still spends at its evaluation points, which no count of GPUs shortens: the time one
    takes (``JobView.epoch_end_s``, 0 before the job has measured one) times the points within its
    ``remaining`` samples: each epoch's end it passes and its last step (at least one: the budget's end)."""
    out = np.zeros(len(jobs))
    for i, j in enumerate(jobs):
        if j.epoch_end_s > 0:
            size = max(j.spec.dataset_size, 1)
            points = np.ceil((j.samples_done + remaining[i]) / size) - np.floor(j.samples_done / size)
            out[i] = j.epoch_end_s * max(points, 1.0)
    return out


def with_fixed_time(rate: np.ndarray, remaining: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """``rate`` (base-equivalent samples/s, (J,) or (J, N + 1)) averaged over a job's whole ``remaining`` work
    with its ``fixed`` seconds added (``evaluation_time``): ``remaining / (remaining / rate + fixed)``, so
    that ``remaining / rate`` is the job's time left on that many GPUs. Jobs without fixed time, and rates of
    0, are kept as they are (bit for bit)."""
    out = np.array(rate, dtype=float)
    rows = fixed > 0
    if not rows.any():
        return out
    r, work, extra = out[rows], remaining[rows], fixed[rows]
    if r.ndim == 2:
        work, extra = work[:, None], extra[:, None]
    with np.errstate(divide="ignore"):
        out[rows] = np.where(r > 0, work / (work / np.where(r > 0, r, 1.0) + extra), r)
    return out


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
