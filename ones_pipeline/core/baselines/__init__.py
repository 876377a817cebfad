"""Baseline policies: ``fifo``, ``tiresias``, ``optimus``, ``pollux`` and ``sia`` (named in
``core.policy.POLICIES``).

Written from the papers' descriptions (and, for ``pollux`` and ``sia``, from reading their authors'
simulators), configured as the Pollux authors' simulator configures them (see
``shared/traces/pollux/README.md``). Shared helpers live in ``common.py``.
"""

from ones_pipeline.core.baselines.fifo import FifoPolicy
from ones_pipeline.core.baselines.optimus import OptimusPolicy
from ones_pipeline.core.baselines.pollux import PolluxPolicy
from ones_pipeline.core.baselines.sia import SiaPolicy
from ones_pipeline.core.baselines.tiresias import TiresiasPolicy

__all__ = ["FifoPolicy", "OptimusPolicy", "PolluxPolicy", "SiaPolicy", "TiresiasPolicy"]
