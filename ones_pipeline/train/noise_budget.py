"""The noise-scale probe's time budget (``noise_probe``) and how it travels from a launcher to its ranks:
without torch, so that the launcher does not import it."""

from __future__ import annotations

import math
from collections.abc import Mapping

# The share of the step time the probe allows its own work, as it times it (math.inf: every step). The true
# cost is 2-3x that: the steps just after a measurement find their caches flushed by its passes over the
# gradient (benchmarks/train_throughput.py --gns-overhead: 1 % as timed cost cnn-digits 2-4 % of its steps).
DEFAULT_BUDGET = 0.005
BUDGET_ENV = "ONES_GNS_BUDGET"


def budget_from_env(env: Mapping[str, str]) -> float:
    """The probe's budget from a training process's environment (``api.Placement.from_env``): a share of
    the step time, ``inf`` to measure every step, ``0`` to switch the estimate off; unset: the default."""
    text = env.get(BUDGET_ENV, "").strip()
    if not text:
        return DEFAULT_BUDGET
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ValueError(f"{BUDGET_ENV}={text!r}: must be a number >= 0 (a share of the step time, e.g. 0.01; "
                         "inf: every step; 0: off)")
    return value


def budget_to_env(budget: float) -> dict[str, str]:
    """``{BUDGET_ENV: ...}`` unless ``budget`` is the default, so that a launcher's own setting reaches its
    ranks (it starts them with its environment, then the placement's variables)."""
    return {} if budget == DEFAULT_BUDGET else {BUDGET_ENV: repr(float(budget))}
