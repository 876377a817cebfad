"""Statistical efficiency of large batches (gradient-noise-scale model, McCandlish et al. 2018; Pollux).

With gradient noise scale ``gns`` (samples) measured at base batch ``m0``, one step at global batch
``m`` makes as much progress as ``(gns + m) / (gns + m0)`` steps at ``m0``... but costs ``m / m0``
times the samples. Efficiency per sample is therefore ``(gns + m0) / (gns + m)`` (1 at ``m0``,
falling towards ``m0 / m`` when noise is small). Goodput = throughput x efficiency.
"""

from __future__ import annotations

import numpy as np

# Prior gradient noise scale, in multiples of the base batch, for a job that has not reported one yet
# (so at the start of training). From the Pollux profiles (../shared/traces/pollux, grad_var/grad_sqr
# at the first epoch of the base-batch run, divided by M0): cifar10 0.57, ncf 72.5, deepspeech2 0.51,
# bert 35.3, yolov3 0.08, imagenet 4.64; the median is 2.6. (Noise grows during training: at 10% of
# training the same ratios are 6.5-72, so measured values replace this prior as soon as they exist.)
DEFAULT_GNS_OVER_BASE = 2.6


def efficiency(gns, base_batch, global_batch) -> np.ndarray:
    """Samples-to-progress efficiency in (0, 1] (above 1 when ``global_batch < base_batch``)."""
    gns = np.maximum(np.asarray(gns, dtype=float), 0.0)
    return (gns + np.asarray(base_batch, dtype=float)) / (gns + np.asarray(global_batch, dtype=float))


def gns_or_prior(gns: float | None, base_batch: float) -> float:
    return float(gns) if gns is not None and gns > 0 else DEFAULT_GNS_OVER_BASE * float(base_batch)
