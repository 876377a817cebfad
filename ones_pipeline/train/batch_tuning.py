"""The training step's own batch size: re-tuned in-process, as AdaptDL's trainer does, without a restart.

A job whose allocation says the job tunes its batch (``core.types.Allocation.batch_tuned_by_job``, set by
the ``ones``, ``pollux`` and ``sia`` policies; ``RunAllocation.tune_batch`` live) keeps, in its checkpoint,
the median time of an optimizer step for every (GPUs, nodes, micro-batch, accumulation) configuration it
has trained with. At every evaluation point (the end of an epoch), rank 0 asks ``core.goodput.job_batch``
(the function the policies' models and the simulator call for the same job, so the scheduler predicts what
the job does) for the goodput-optimal batch on the GPUs it holds, from those step times and the gradient
noise scale the step measures (``noise_probe``). The choice travels to the other ranks inside the all-reduce
the session does at every step boundary anyway (``api.TrainingSession._agree``), so no rank can be in a
collective the others skip; every rank switches at the same step boundary. The sampler counts samples, not
steps (``sampler``), so the data order and the sample count stay exact across a change; the LR follows the
core rule (``core.types.lr_for_batch``) with a linear warm-up over one epoch from the LR before the change,
as after a restart.

Bounds: the spec's (``core.goodput.batch_limits``: ``min_global_batch`` .. the cap from ``max_lr`` or
``max_global_batch``, the per-GPU range). A per-GPU batch above ``max_per_gpu_batch`` is trained by gradient
accumulation (``accumulation_for``: the fewest micro-batches that fit) when the script takes its steps in
micro-batches (``TrainingSession.steps``); a script on the older ``batches()`` loop cannot accumulate, and
for it the choice is capped at the largest per-GPU batch allowed, as before.

What the fit sees. ``core.goodput`` models an optimizer step with ``a`` accumulation micro-steps as
``a x compute(b) + optim_step(b)`` and fits ``compute`` and ``optim_step`` to ``ThroughputObs`` rows, each one
optimizer step of one micro-batch per GPU (compute = step - sync). So a configuration's record keeps the
whole optimizer step's time ``T`` and the time ``c`` of one micro-batch that did not synchronise, and
``observations`` gives the fit what its terms mean: step ``T - a x c`` (the synchronising micro-batch and
the update) with sync ``T - a x c - c``. ``ThroughputObs`` keeps its fields, so the policies, the simulator
and the MLflow reader (which reads the same numbers from the ``step_time_s``/``sync_time_s`` metrics) need
no change and checkpoints from before still load.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.goodput import GoodputModel, batch_limits, throughput
from ones_pipeline.core.types import JobSpec, ThroughputObs

MIN_STEP_TIMES = 3  # steady-state steps a configuration needs before its median is recorded
# A change must promise at least this much more goodput: below it the choice follows noise in the step
# times and the estimate (seen live: 64 -> 58 -> 44 -> 46, each "x1.00"), and every change costs an LR
# warm-up. The scheduler's prediction (``job_batch``) is then within this margin of the job's goodput.
MIN_GAIN = 0.05

Config = tuple[int, int, int, int]  # (GPUs, nodes, micro-batch per GPU, accumulation steps)


def accumulation_for(global_batch: int, world_size: int, max_micro: int | None) -> tuple[int, int]:
    """``(micro-batch per GPU, accumulation steps)`` a step of ``global_batch`` samples on ``world_size``
    processes trains with: the fewest micro-batches of at most ``max_micro`` (None: no limit) that hold a
    rank's share. A function of its arguments only, so every rank, and a resumed generation, derives the
    same split from the same global batch."""
    per_gpu = max(math.ceil(int(global_batch) / max(int(world_size), 1)), 1)
    if max_micro is None or per_gpu <= max_micro:
        return per_gpu, 0
    accum = math.ceil(per_gpu / max(int(max_micro), 1)) - 1
    return math.ceil(per_gpu / (accum + 1)), accum


def as_observation(config: Config, step_s: float, micro_s: float | None) -> ThroughputObs:
    """One recorded configuration in the terms of the fit (module docstring): an optimizer step of one
    micro-batch per GPU. The update never takes less than a micro-batch's compute (``optim_step >= compute``
    in the model), which bounds the subtraction when the timings are noisy; without the micro-batch time,
    the step's time is split evenly (compute = step, as for a step without accumulation)."""
    g, k, b, a = config
    if not a:
        return ThroughputObs(g, k, b, step_s)
    if micro_s is None or not micro_s > 0:
        return ThroughputObs(g, k, b, step_s / (a + 1))
    optim = max(step_s - a * micro_s, micro_s)
    return ThroughputObs(g, k, b, optim, optim - micro_s)


@dataclass(frozen=True)
class BatchChange:
    """One re-tune that changed the batch: from, to, how the new one is split, and the numbers behind it."""

    old: int
    new: int
    grad_noise_scale: float | None
    gain: float | None  # predicted goodput at ``new`` over that at ``old`` (None: no model yet)
    micro: int | None = None  # the new batch's micro-batch per GPU
    accum: int = 0  # ... and its accumulation steps (micro-batches per optimizer step - 1)

    def text(self, slots: str, per: str = "slot") -> str:
        """In words; ``slots``: what the job holds, e.g. ``2 CPU slots``; ``per``: one of them (``GPU``)."""
        noise = f"noise scale {self.grad_noise_scale:.0f} samples" if self.grad_noise_scale else "no noise scale yet"
        gain = f", predicted goodput x{self.gain:.2f}" if self.gain is not None else ""
        split = ""
        if self.accum and self.micro:
            n = self.accum + 1
            split = f" ({n} x {self.micro} per {per}, accumulated over {n} micro-batches)"
        return (f"global batch {self.old} -> {self.new}{split} on {slots}: goodput-optimal at the measured "
                f"{noise}{gain}")

    def to_dict(self) -> dict[str, Any]:
        return {"event": "batch", "from": self.old, "to": self.new, "grad_noise_scale": self.grad_noise_scale,
                "predicted_gain": self.gain, "micro_batch": self.micro, "accum_steps": self.accum}


class BatchTuner:
    """The step-time record and the batch choice of one job; ``enabled`` False: the batch never changes.

    ``accumulates``: the script takes its steps in micro-batches (``TrainingSession.steps``), so a batch
    above ``max_per_gpu_batch`` per GPU can be trained; the session sets it."""

    def __init__(self, spec: JobSpec, world_size: int, num_nodes: int, enabled: bool):
        self.spec, self.world_size, self.num_nodes = spec, int(world_size), max(int(num_nodes), 1)
        self.enabled = bool(enabled)
        self.accumulates = False
        self.step_times: dict[Config, float] = {}  # median s of an optimizer step
        self.micro_times: dict[Config, float] = {}  # accumulating: median s of a micro-batch that did not sync
        self.model = GoodputModel()  # the goodput model of this job's measurements, and its fits

    def split(self, global_batch: int) -> tuple[int, int]:
        """``(micro-batch per GPU, accumulation steps)`` of ``global_batch`` in this job's step."""
        return accumulation_for(global_batch, self.world_size, self.spec.max_per_gpu_batch if self.accumulates
                                else None)

    def record(self, global_batch: int, step_times: Sequence[float], micro_times: Sequence[float] = ()) -> None:
        """The medians of ``step_times`` (steady-state optimizer steps at ``global_batch`` on this allocation)
        and, when they accumulate, of ``micro_times`` (their micro-batches before the synchronising one)."""
        if len(step_times) < MIN_STEP_TIMES:
            return
        micro, accum = self.split(global_batch)
        key = (self.world_size, self.num_nodes, micro, accum)
        self.step_times[key] = float(statistics.median(step_times))
        if accum and micro_times:
            self.micro_times[key] = float(statistics.median(micro_times))

    def observations(self) -> tuple[ThroughputObs, ...]:
        """One ``ThroughputObs`` per (GPUs, nodes, micro-batch), in that order. Where a micro-batch was trained
        with several accumulation counts, the record with the most micro-steps stands for it: the others
        measured the same optimizer step, less precisely apart from the compute."""
        best: dict[tuple[int, int, int], Config] = {}
        for key in sorted(self.step_times):
            best[key[:3]] = key  # sorted: the largest accumulation count comes last
        return tuple(as_observation(key, self.step_times[key], self.micro_times.get(key))
                     for _, key in sorted(best.items()))

    def choose(self, current: int, grad_noise_scale: float | None) -> BatchChange | None:
        """The change to make now, None to keep ``current``: off; already optimal or less than ``MIN_GAIN``
        better; or no noise scale (undefined while the averaged |G|^2 is not positive: mostly noise)."""
        if not self.enabled or grad_noise_scale is None:
            return None
        obs = self.observations()
        micro, accum = self.model.batch(self.spec, obs, grad_noise_scale, self.num_nodes, self.world_size)
        per_gpu = micro * (accum + 1)
        if self.spec.max_per_gpu_batch is not None and not self.accumulates:  # the script cannot accumulate
            per_gpu = min(per_gpu, self.spec.max_per_gpu_batch)
        new = max(min(self.world_size * per_gpu, self.spec.global_batch_cap), 1)
        if new == current:
            return None
        gain = self._gain(obs, grad_noise_scale, current, new)
        if gain is not None and gain < 1.0 + MIN_GAIN:
            return None
        return BatchChange(current, new, grad_noise_scale, gain, *self.split(new))

    def _gain(self, obs, gns, old: int, new: int) -> float | None:
        """Predicted goodput at ``new`` over ``old``, each as this step would train it (its own split). A
        batch this allocation has trained at counts at its measured step time, not the fit's: the fit of a
        few noisy points can rank two batches one way at one and the other way at the other, and a job then
        flipped between them at every epoch (seen live: 32 -> 128 -> 32 -> 128 -> 32 -> 128, each "x1.07"
        or better)."""
        if not obs or gns is None:
            return None
        m0 = batch_limits(self.spec)[0]
        params = self.model.params(obs)
        goods = []
        for batch in (old, new):
            micro, accum = self.split(batch)
            measured = self.step_times.get((self.world_size, self.num_nodes, micro, accum))
            rate = (self.world_size * micro * (accum + 1) / measured if measured else
                    float(throughput(params, self.num_nodes, self.world_size, micro, accum)))
            goods.append(rate * float(efficiency(gns, m0, max(batch, m0))))
        return goods[1] / goods[0] if goods[0] > 0 else None

    def state_dict(self) -> list[list[float]]:
        """Rows ``[GPUs, nodes, micro-batch, step s]``, and ``accumulation steps, micro-batch s`` after them
        where the step accumulated (0 s: not measured); the rows of checkpoints from before accumulation."""
        rows = []
        for (g, k, b, a), t in sorted(self.step_times.items()):
            rows.append([g, k, b, t] if not a else [g, k, b, t, a, self.micro_times.get((g, k, b, a), 0.0)])
        return rows

    def load_state_dict(self, state: Sequence[Sequence[float]] | Mapping | None) -> None:
        """Continue from ``state_dict()``'s output (None: a checkpoint from before batch tuning)."""
        for row in state or ():
            g, k, b, t = row[:4]
            a = int(row[4]) if len(row) > 4 else 0
            key = (int(g), int(k), int(b), a)
            self.step_times[key] = float(t)
            if a and len(row) > 5 and float(row[5]) > 0:
                self.micro_times[key] = float(row[5])
