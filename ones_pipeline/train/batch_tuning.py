"""The training step's own batch size: re-tuned in-process, as AdaptDL's trainer does, without a restart.

A job whose allocation says the job tunes its batch (``core.types.Allocation.batch_tuned_by_job``, set by
the ``ones``, ``pollux`` and ``sia`` policies; ``RunAllocation.tune_batch`` live) keeps, in its checkpoint,
the median step time of every (GPUs, nodes, per-GPU batch) configuration it has trained with. At every
evaluation point (the end of an epoch), rank 0 asks ``core.goodput.job_batch`` (the function the policies'
models and the simulator call for the same job, so the scheduler predicts what the job does) for the
goodput-optimal batch on the GPUs it holds, from those step times and the gradient noise scale the step
measures (``noise_probe``), and broadcasts it; every rank switches at the same step boundary. The sampler
counts samples, not steps (``sampler``), so the data order and the sample count stay exact across a
change; the LR follows the core rule (``core.types.lr_for_batch``) with a linear warm-up over one epoch
from the LR before the change, as after a restart.

Bounds: the spec's (``core.goodput.batch_limits``: ``min_global_batch`` .. the cap from ``max_lr`` or
``max_global_batch``, the per-GPU range). The live step has no gradient accumulation: where the core
choice would accumulate (``max_per_gpu_batch`` exceeded), it trains with the largest per-GPU batch allowed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.goodput import batch_limits, fitted, job_batch, split_for, throughput
from ones_pipeline.core.types import JobSpec, ThroughputObs

MIN_STEP_TIMES = 3  # steady-state steps a configuration needs before its median is recorded
# A change must promise at least this much more goodput: below it the choice follows noise in the step
# times and the estimate (seen live: 64 -> 58 -> 44 -> 46, each "x1.00"), and every change costs an LR
# warm-up. The scheduler's prediction (``job_batch``) is then within this margin of the job's goodput.
MIN_GAIN = 0.05


@dataclass(frozen=True)
class BatchChange:
    """One re-tune that changed the batch: from, to, and the numbers behind it."""

    old: int
    new: int
    grad_noise_scale: float | None
    gain: float | None  # predicted goodput at ``new`` over that at ``old`` (None: no model yet)

    def text(self, slots: str) -> str:
        """In words; ``slots``: what the job holds, e.g. ``2 CPU slots``."""
        noise = f"noise scale {self.grad_noise_scale:.0f} samples" if self.grad_noise_scale else "no noise scale yet"
        gain = f", predicted goodput x{self.gain:.2f}" if self.gain is not None else ""
        return f"global batch {self.old} -> {self.new} on {slots}: goodput-optimal at the measured {noise}{gain}"

    def to_dict(self) -> dict[str, Any]:
        return {"event": "batch", "from": self.old, "to": self.new, "grad_noise_scale": self.grad_noise_scale,
                "predicted_gain": self.gain}


class BatchTuner:
    """The step-time record and the batch choice of one job; ``enabled`` False: the batch never changes."""

    def __init__(self, spec: JobSpec, world_size: int, num_nodes: int, enabled: bool):
        self.spec, self.world_size, self.num_nodes = spec, int(world_size), max(int(num_nodes), 1)
        self.enabled = bool(enabled)
        self.step_times: dict[tuple[int, int, int], float] = {}  # (GPUs, nodes, per-GPU batch) -> median s

    def per_gpu(self, global_batch: int) -> int:
        return math.ceil(global_batch / self.world_size)

    def record(self, global_batch: int, step_times: Sequence[float]) -> None:
        """The median of ``step_times`` (steady-state steps at ``global_batch`` on this allocation)."""
        if len(step_times) >= MIN_STEP_TIMES:
            key = (self.world_size, self.num_nodes, self.per_gpu(global_batch))
            self.step_times[key] = float(statistics.median(step_times))

    def observations(self) -> tuple[ThroughputObs, ...]:
        return tuple(ThroughputObs(g, k, b, t) for (g, k, b), t in sorted(self.step_times.items()))

    def choose(self, current: int, grad_noise_scale: float | None) -> BatchChange | None:
        """The change to make now, None to keep ``current``: off; already optimal or less than ``MIN_GAIN``
        better; or no noise scale (undefined while the averaged |G|^2 is not positive: mostly noise)."""
        if not self.enabled or grad_noise_scale is None:
            return None
        obs = self.observations()
        micro, accum = job_batch(self.spec, obs, grad_noise_scale, self.num_nodes, self.world_size)
        per_gpu = micro * (accum + 1)
        if self.spec.max_per_gpu_batch is not None:  # no accumulation in the live step
            per_gpu = min(per_gpu, self.spec.max_per_gpu_batch)
        new = max(min(self.world_size * per_gpu, self.spec.global_batch_cap), 1)
        if new == current:
            return None
        gain = self._gain(obs, grad_noise_scale, current, new)
        if gain is not None and gain < 1.0 + MIN_GAIN:
            return None
        return BatchChange(current, new, grad_noise_scale, gain)

    def _gain(self, obs, gns, old: int, new: int) -> float | None:
        if not obs or gns is None:
            return None
        m0, _, _, hi = batch_limits(self.spec)
        params = fitted(obs)
        goods = []
        for batch in (old, new):
            micro, accum = split_for(batch, self.world_size, hi, m0)
            goods.append(float(throughput(params, self.num_nodes, self.world_size, micro, accum)
                               * efficiency(gns, m0, max(batch, m0))))
        return goods[1] / goods[0] if goods[0] > 0 else None

    def state_dict(self) -> list[list[float]]:
        return [[g, k, b, t] for (g, k, b), t in sorted(self.step_times.items())]

    def load_state_dict(self, state: Sequence[Sequence[float]] | Mapping | None) -> None:
        """Continue from ``state_dict()``'s output (None: a checkpoint from before batch tuning)."""
        for g, k, b, t in state or ():
            self.step_times[(int(g), int(k), int(b))] = float(t)
