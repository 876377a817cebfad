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
