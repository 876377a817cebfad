"""Gradient noise scale from gradient norms at two batch sizes (McCandlish et al. 2018; Pollux/AdaptDL).

Per-sample gradients have mean ``G`` and covariance ``Sigma``. The mean gradient ``g_b`` of ``b``
independent samples satisfies ``E|g_b|^2 = |G|^2 + tr(Sigma) / b``. Measured at two batch sizes, a small
one ``b`` (one replica's share of a step) and a big one ``B`` (the step's global batch, the replicas'
average), the two equations give unbiased estimates of both unknowns::

    |G|^2     = (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(Sigma) = (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

``|g_b|^2`` is the mean of the replicas' squared norms; when their shares differ, ``b`` is the harmonic
mean of the shares (what makes ``E mean_r |g_r|^2 = |G|^2 + tr(Sigma) / b`` hold exactly). One process has
no replicas: two consecutive steps play their part (``b``: a step's batch, ``B``: the two together).

The simple noise scale ``B_simple = tr(Sigma) / |G|^2`` (samples) is the ``gns`` of ``core.efficiency``:
the Pollux profiles' ``grad_var / grad_sqr x M0``, whose ``grad_var`` is the noise of a gradient at the
base batch ``M0``, ``tr(Sigma) / M0``. Single estimates are noisy (``|G|^2`` can come out negative), so
the two components are smoothed separately by an exponential moving average with AdaptDL's bias
correction, and the scale is the ratio of the averages. Ignored, as in AdaptDL: the finite-population
correction of sampling without replacement (``(N - b) / (N - 1)``, small when the dataset is much larger
than the batch) and, with one process, the parameter change between the two steps of a pair.

Pure Python, no torch: the torch side (``noise_probe``) measures the norms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# AdaptDL's smoothing: the moving average decays by this factor per base batch of samples.
ADAPTDL_DECAY_PER_BASE_BATCH = 0.999


@dataclass(frozen=True)
class GradientStats:
    """One step's unbiased estimates: ``sqr`` = |G|^2, ``var`` = tr(Sigma) of one sample's gradient."""

    sqr: float
    var: float


def estimate_gradient_stats(local_sqr: float, global_sqr: float, local_batch: float,
                            global_batch: float) -> GradientStats:
    """Estimates from ``local_sqr`` (mean over replicas of their gradient's squared norm, each replica
    averaging ``local_batch`` samples, the harmonic mean when shares differ) and ``global_sqr`` (squared
    norm of the gradient averaged over all ``global_batch`` samples). Needs ``0 < local_batch < global_batch``.
    """
    b, big = float(local_batch), float(global_batch)
    if not 0 < b < big:
        raise ValueError(f"need 0 < local_batch < global_batch, got local_batch={local_batch!r}, "
                         f"global_batch={global_batch!r}")
    return GradientStats(sqr=(big * global_sqr - b * local_sqr) / (big - b),
                         var=(local_sqr - global_sqr) / (1.0 / b - 1.0 / big))


def replica_harmonic_batch(shares: Sequence[int]) -> tuple[int, float]:
    """(replicas with samples, harmonic mean of their shares); (0, 0.0) when none has a sample."""
    nonempty = [n for n in shares if n > 0]
    if not nonempty:
        return 0, 0.0
    return len(nonempty), len(nonempty) / sum(1.0 / n for n in nonempty)


def pair_of_steps(sqr_1: float, sqr_2: float, dot_12: float, n_1: int, n_2: int) -> GradientStats:
    """The single-process estimate from two consecutive steps' gradients ``g_1``, ``g_2`` (means of
    ``n_1``, ``n_2`` samples): their squared norms, their dot product. The big batch is both steps
    together, whose mean gradient is ``(n_1 g_1 + n_2 g_2) / (n_1 + n_2)``."""
    total = float(n_1 + n_2)
    union_sqr = (n_1 * n_1 * sqr_1 + 2.0 * n_1 * n_2 * dot_12 + n_2 * n_2 * sqr_2) / (total * total)
    _, harmonic = replica_harmonic_batch([n_1, n_2])
    return estimate_gradient_stats((sqr_1 + sqr_2) / 2.0, union_sqr, harmonic, total)


def default_memory_samples(base_batch: float, dataset_size: float) -> float:
    """Samples over which the moving average forgets by ``1/e``: AdaptDL's (``0.999`` per base batch, about
    1000 base batches), but at most one epoch, so that the estimate follows training on small datasets."""
    adaptdl = float(base_batch) / -math.log(ADAPTDL_DECAY_PER_BASE_BATCH)
    return max(min(adaptdl, float(dataset_size)), 1.0)


class NoiseScaleSmoother:
    """Bias-corrected exponential moving averages of ``|G|^2`` and ``tr(Sigma)``, weighted by samples.

    After observations ``x_1..x_k`` covering ``s_1..s_k`` samples each, with ``d_i = exp(-s_i / m_i)``, the
    average is ``sum_i w_i x_i / sum_i w_i`` with ``w_i = (1 - d_i) * prod_{j > i} d_j`` (AdaptDL's "unbias"
    correction: no pull towards the zero it starts from). ``m_i`` is ``memory_samples``, or
    ``min_observations * s_i`` when that is longer: observations far apart (a probe that measures one step
    in many) are still averaged over about ``min_observations`` of them.
    """

    def __init__(self, memory_samples: float, min_observations: float = 10.0):
        if not memory_samples > 0:
            raise ValueError(f"memory_samples must be > 0, got {memory_samples!r}")
        if not min_observations >= 1:
            raise ValueError(f"min_observations must be >= 1, got {min_observations!r}")
        self.memory_samples, self.min_observations = float(memory_samples), float(min_observations)
        self._sqr = 0.0  # biased (zero-started) averages, and the weight they carry
        self._var = 0.0
        self._weight = 0.0
        self.observations = 0

    def update(self, stats: GradientStats, samples: float) -> None:
        """Add one measurement's estimates, standing for ``samples`` samples of training (those since the
        previous one); non-finite estimates are skipped."""
        if not (math.isfinite(stats.sqr) and math.isfinite(stats.var)) or not samples > 0:
            return
        decay = math.exp(-float(samples) / max(self.memory_samples, self.min_observations * float(samples)))
        self._sqr = decay * self._sqr + (1.0 - decay) * stats.sqr
        self._var = decay * self._var + (1.0 - decay) * stats.var
        self._weight = decay * self._weight + (1.0 - decay)
        self.observations += 1

    @property
    def grad_sqr(self) -> float | None:
        """Smoothed ``|G|^2``; None before the first observation."""
        return self._sqr / self._weight if self._weight > 0 else None

    @property
    def grad_var(self) -> float | None:
        """Smoothed ``tr(Sigma)`` of one sample's gradient; None before the first observation."""
        return self._var / self._weight if self._weight > 0 else None

    def noise_scale(self) -> float | None:
        """``tr(Sigma) / |G|^2`` in samples; None until both averages are positive (a noise-dominated
        gradient can give ``|G|^2 <= 0``, whose ratio means nothing)."""
        sqr, var = self.grad_sqr, self.grad_var
        if sqr is None or var is None or not (sqr > 0 and var > 0):
            return None
        return var / sqr

    def metrics(self, base_batch: float) -> dict[str, float]:
        """``grad_noise_scale`` (samples), ``gns_grad_sqr`` (|G|^2) and ``gns_grad_var`` (tr(Sigma) /
        ``base_batch``, the Pollux profiles' ``grad_var``); what is not defined yet is left out."""
        out: dict[str, float] = {}
        if self.grad_sqr is not None:
            out["gns_grad_sqr"] = self.grad_sqr
            out["gns_grad_var"] = self.grad_var / float(base_batch)
        gns = self.noise_scale()
        if gns is not None:
            out["grad_noise_scale"] = gns
        return out

    def state_dict(self) -> dict[str, float | int]:
        return {"sqr_biased": self._sqr, "var_biased": self._var, "weight": self._weight,
                "observations": self.observations}

    def load_state_dict(self, state: Mapping[str, float | int] | None) -> None:
        """Continue from ``state_dict()``'s output; None (a checkpoint from before GNS) starts afresh."""
        if not state:
            return
        self._sqr, self._var = float(state["sqr_biased"]), float(state["var_biased"])
        self._weight, self.observations = float(state["weight"]), int(state.get("observations", 0))
