"""The torch side of the gradient-noise-scale estimate (``noise_scale``): gradient norms of a training step.

Several processes (DDP): on a measured step, a hook on every parameter's gradient sees this replica's
local gradient before it is accumulated into ``.grad``, and so before DDP (whose own hooks run after that
accumulation) all-reduces it; it adds the squared norm to a list. At ``step_done``, ``.grad`` holds the
all-reduced average, whose squared norm is the big-batch one. The ranks' local norms are summed in the
all-reduce the session does at every step boundary anyway: no collective is added, DDP's bucketed
all-reduce stays as it is (a Python communication hook would put Python on its critical path every step).

One process: the gradient in ``.grad`` is flattened at ``step_done`` and paired with the next step's (their
squared norms and dot product, one 2 x n matrix-vector product): two steps stand in for two replicas.

Both read ``.grad`` at ``step_done``, after ``optimizer.step()``: a script must clear gradients before
a step's first ``backward`` (as the built-in workloads do), not between ``step()`` and ``step_done``.

Gradient accumulation (``micro_batches``): the statistic is that of the step's whole local gradient, the sum
over its micro-batches, at the step's sample count (a rank's share of the step is the same with or without
accumulation). The micro-batches before the last run under DDP's ``no_sync()``: the hooks skip their
backward (the wrapper's ``require_backward_grad_sync`` is off), which leaves their sum in ``.grad``, still
this rank's own; in the last one, which all-reduces, a hook sees the new gradient before it is added to
``.grad`` and squares the sum of the two. One process reads the accumulated ``.grad`` at ``step_done``
anyway. Assumed, not checked: dense gradients, no clipping and no loss scaling of the gradients (the hooks
would see them before, ``.grad`` after).

Cost: measuring is a few passes over the gradient plus Python per parameter, which is a visible share of
the step of a tiny model. The probe therefore times itself (CPU time) and measures one step (one pair of
steps) in ``interval``, the smallest interval that keeps its share of the step time under ``budget``
(``api.Placement.noise_scale_budget``, ``ONES_GNS_BUDGET``; 0 switches it off); the ranks agree on the
interval through the same all-reduce. Skipped steps cost two attribute reads.

Plain SGD (with or without momentum) preconditions nothing, so the gradient is used as it is. (AdaptDL
divides an Adam gradient by Adam's running ``sqrt(v) + eps`` first; that is not done here.)
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ones_pipeline.train.noise_budget import DEFAULT_BUDGET
from ones_pipeline.train.noise_scale import (
    NoiseScaleSmoother,
    default_memory_samples,
    estimate_gradient_stats,
    pair_of_steps,
    replica_harmonic_batch,
)
from ones_pipeline.train.sampler import shard_bounds

MAX_INTERVAL = 128  # measure at least one step in this many
TIMING_WINDOW = 5  # the probe's cost and the step time: medians of the last this many measurements


@functools.lru_cache(maxsize=64)
def _shares(batch: int, world_size: int) -> tuple[int, ...]:
    """Every rank's share of a step of ``batch`` samples (``sampler.shard_bounds``)."""
    return tuple(stop - start for start, stop in (shard_bounds(batch, r, world_size) for r in range(world_size)))


# The probe's clock: CPU time of the calling thread. Wall clock would count the preemptions of a loaded
# machine, which fall on the long step far more often than on the short measurement and would make the
# probe's share look smaller than it is. (A hook runs in the thread that runs backward: still one thread
# per interval measured.)
_clock = time.thread_time


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


class NoiseScaleProbe:
    """One rank's measurement of the gradient noise scale; every rank ends a step with the same estimate.

    Per step: ``local_statistic(batch)`` before the session's all-reduce, ``observe(sums, batch)`` with its
    elementwise sum over ranks after it (``batch``: the samples the step took across all ranks).
    """

    def __init__(self, world_size: int, rank: int, base_batch: float, dataset_size: int,
                 budget: float = DEFAULT_BUDGET):
        """``budget``: the share of the step time the probe may take (``math.inf``: every step; 0: off)."""
        if not budget >= 0:
            raise ValueError(f"noise-scale budget must be >= 0 (0: off), got {budget!r}")
        self.world_size, self.rank, self.base_batch = int(world_size), int(rank), float(base_batch)
        self.budget = float(budget)
        self.enabled = self.budget > 0
        self.smoother = NoiseScaleSmoother(default_memory_samples(base_batch, dataset_size))
        self.interval = 1  # measure one step (one pair) in this many
        self._countdown = 0  # steps before the next measured one; 0: this step is measured
        self._params: list[torch.nn.Parameter] = []
        self._model: torch.nn.Module | None = None  # the DDP wrapper: its flag says whether a backward syncs
        self._handles: list[Any] = []  # this step's gradient hooks (several processes, measured steps only)
        self._local: list[torch.Tensor] = []  # squared norms of this step's local gradients, per parameter
        self._prev: tuple[int, torch.Tensor] | None = None  # one process: the stored step's samples, |g_1|^2
        self._samples = 0  # since the last update of the smoother
        self._cost_s = 0.0  # this measurement's time so far
        # CPU seconds per measurement and per step; medians of the last few, robust to the odd outlier.
        self._costs: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._cycles: deque[float] = deque(maxlen=TIMING_WINDOW)
        self._start: float | None = None  # clock when the measured steps began (the previous step ended)
        self._measured_steps = 0
        self._measurements = 0
        self._idle = [0.0, 1.0]  # local_statistic of an unmeasured step: nothing, and the interval wanted
        self._pair_buffer: torch.Tensor | None = None  # one process: the two steps' flat gradients, (2, n)

    @classmethod
    def for_placement(cls, placement: Any, dataset_size: int) -> NoiseScaleProbe:
        """The probe of one rank of ``placement`` (``api.Placement``), relative to the job's base batch
        (``min_global_batch``, else ``per_gpu_batch``: the ``M0`` of ``core.goodput``)."""
        spec = placement.spec
        return cls(placement.world_size, placement.rank, spec.min_global_batch or spec.per_gpu_batch, dataset_size,
                   budget=placement.noise_scale_budget)

    def attach(self, model: torch.nn.Module) -> None:
        """Measure the gradients of ``model`` (the DDP wrapper or the bare module)."""
        if self.enabled:
            self._model = model
            self._params = [p for p in model.parameters() if p.requires_grad]
            self._arm()

    def detach(self) -> None:
        """Remove this probe's gradient hooks (its model moves to another probe: an in-place resize)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _arm(self) -> None:
        """Hook the parameters for the coming step when it is measured (several processes)."""
        if self.world_size > 1 and self._countdown == 0 and not self._handles:
            self._handles = [p.register_hook(functools.partial(self._on_local_grad, p)) for p in self._params]

    def _on_local_grad(self, param: torch.nn.Parameter, grad: torch.Tensor) -> None:
        if not getattr(self._model, "require_backward_grad_sync", True):
            return  # a micro-batch under no_sync: its gradient waits in .grad for the synchronising one
        t0 = _clock()
        flat = grad.detach().reshape(-1)
        if param.grad is not None:  # the step's earlier micro-batches (this rank's, not all-reduced)
            flat = flat + param.grad.detach().reshape(-1)
        self._local.append(torch.dot(flat, flat))
        self._cost_s += _clock() - t0

    @property
    def cost_s(self) -> float | None:
        """The probe's seconds per measurement (a step, or a pair of steps), None before it knows."""
        return _median(self._costs)

    @property
    def step_s(self) -> float | None:
        """Seconds per training step without the probe's work, None before it knows."""
        return _median(self._cycles)

    def _wanted_interval(self) -> int:
        """Steps from one measurement's start to the next's that keep the probe's share under the budget."""
        cost, step = self.cost_s, self.step_s
        if cost is None or not step:
            return 1
        return min(max(math.ceil(cost / (self.budget * step)), 1), MAX_INTERVAL)

    def local_statistic(self, batch: int) -> list[float]:
        """What the session sums over ranks: this rank's squared local-gradient norm, as that of the mean over
        its share (the session's loss scale makes the local gradient ``world_size x share / batch`` times that
        mean; 0 for an empty share or an unmeasured step), and the measuring interval it wants."""
        if not self.enabled or self._countdown:
            return self._idle  # an unmeasured step costs two attribute reads
        t0 = _clock()
        sqr, share = 0.0, _shares(batch, self.world_size)[self.rank]
        if self.world_size > 1 and self._local and share:
            factor = self.world_size * share / batch
            sqr = float(torch.stack(self._local).sum()) / (factor * factor)
        self._cost_s += _clock() - t0
        return [sqr, self._idle[1]]

    def observe(self, sums: Sequence[float], batch: int) -> None:
        """Finish the step: turn a measurement into estimates and smooth them, and choose the next measured
        step. ``sums``: the elementwise sum over ranks of ``local_statistic``."""
        if not self.enabled or batch <= 0:
            return
        self._samples += batch
        if self._countdown:
            self._countdown -= 1
            if not self._countdown:  # the next step is measured: hook it, and time it whole
                self._arm()
                self._start = _clock()
            return
        t0 = _clock()
        self._measured_steps += 1
        if self.world_size > 1:
            self._observe_replicas(sums[0], batch)
            done, interval = True, math.ceil(sums[1] / self.world_size - 1e-9)  # the same on every rank
        else:
            done, interval = self._observe_pair(batch), self._idle[1]
        if done:  # a pair has taken two of its interval's steps already
            self.interval = max(int(interval), 1)
            self._countdown = max(self.interval - (1 if self.world_size > 1 else 2), 0)
        self._arm()
        t1 = _clock()
        self._cost_s += t1 - t0
        if done:
            self._timed(t1)

    def _timed(self, now: float) -> None:
        """A measurement is complete: update the probe's cost and the step time (from the measured steps'
        whole time less the probe's, so that only this job's own steps count), and the interval it wants.
        The first measurement is warm-up."""
        if self._start is not None and self._measurements:
            self._costs.append(self._cost_s)
            self._cycles.append(max(now - self._start - self._cost_s, 0.0) / self._measured_steps)
        self._measurements += 1
        self._cost_s, self._measured_steps = 0.0, 0
        self._start = now if not self._countdown else None  # the next step is measured too
        self._idle = [0.0, float(self._wanted_interval())]

    def _observe_replicas(self, summed_local: float, batch: int) -> None:
        for handle in self._handles:
            handle.remove()
        for p in self._params:
            # Removing a handle leaves torch's per-tensor hook in place, which enters Python at every backward
            # to find an empty dict; clearing the dict (when nobody else's hook is in it) removes it.
            if not p._backward_hooks:
                p._backward_hooks = None
        measured, self._handles, self._local = bool(self._local), [], []
        grads = [p.grad.detach() for p in self._params if p.grad is not None]
        replicas, harmonic = replica_harmonic_batch(_shares(batch, self.world_size))
        if not (measured and grads) or replicas < 2:  # no backward, or one replica had all the samples
            return
        global_sqr = float(torch.stack(torch._foreach_norm(grads)).double().square().sum())
        stats = estimate_gradient_stats(summed_local / replicas, global_sqr, harmonic, batch)
        self.smoother.update(stats, self._samples)
        self._samples = 0

    def _observe_pair(self, batch: int) -> bool:
        """One process: the first step of a pair stores its gradient, the second completes the estimate.
        True when the pair is complete (or cannot be: no gradient)."""
        grads = [p.grad.reshape(-1) for p in self._params if p.grad is not None]
        if not grads:
            self._prev = None
            return True
        numel, both = sum(g.numel() for g in grads), self._pair_buffer
        if both is None or both.shape[1] != numel or both.dtype != grads[0].dtype or both.device != grads[0].device:
            both = self._pair_buffer = torch.empty(2, numel, dtype=grads[0].dtype, device=grads[0].device)
            self._prev = None
        if self._prev is None:
            torch.cat(grads, out=both[0])
            self._prev = (batch, torch.dot(both[0], both[0]))  # left on the device: no synchronisation yet
            return False
        torch.cat(grads, out=both[1])
        n_1, sqr_1 = self._prev
        sqr_1, dot, sqr_2 = torch.cat([sqr_1.view(1), torch.mv(both, both[1])]).tolist()
        self.smoother.update(pair_of_steps(sqr_1, sqr_2, dot, n_1, batch), self._samples)
        self._samples, self._prev = 0, None
        return True

    def metrics(self) -> dict[str, float]:
        return self.smoother.metrics(self.base_batch)

    def state_dict(self) -> dict[str, Any]:
        return self.smoother.state_dict()

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        self.smoother.load_state_dict(state)
