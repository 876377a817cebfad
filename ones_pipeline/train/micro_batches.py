"""One optimizer step of one rank, taken as one or more micro-batches (gradient accumulation).

``TrainingSession.steps()`` hands a script one ``Step`` per optimizer step. Iterating it yields the rank's
sample indices of the step in ``len(step)`` contiguous micro-batches, as even as possible
(``sampler.shard_bounds`` again): their concatenation is the rank's share of the step, the same share a
step without accumulation takes, so the data order, the sample count and the gradient noise probe's
arithmetic do not depend on the split. Every micro-batch but the last is yielded inside the DDP wrapper's
``no_sync()``, so their backward passes only add to ``.grad``; the last one's backward all-reduces the sum,
once per optimizer step, as Pollux/AdaptDL's step model has it (``core.goodput``).

A script calls ``optimizer.zero_grad()`` before the first micro-batch and ``optimizer.step()`` after the
last, and scales every micro-batch's summed loss by the step's ``loss_scale()``, which counts the samples of
the whole step, so the accumulated gradient is that of the mean loss over the step's global batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ones_pipeline.train.sampler import shard_bounds


class Step:
    """This rank's share of one optimizer step (``indices``), in ``len(self)`` micro-batches."""

    def __init__(self, indices: np.ndarray, micro_batches: int, model: torch.nn.Module | None,
                 on_last: Callable[[], None] | None = None):
        """``model``: the session's model (the DDP wrapper with several processes); ``on_last``: called as the
        last micro-batch is handed out (the session times the micro-batches before it)."""
        self.indices = indices
        self.micro_batches = max(int(micro_batches), 1)
        self.taken = 0  # micro-batches handed out so far
        self.synced_forwards = 0  # forwards through the DDP wrapper whose backward all-reduces (session's hook)
        self._model, self._on_last = model, on_last

    def __len__(self) -> int:
        return self.micro_batches

    @property
    def complete(self) -> bool:
        """Every micro-batch has been handed out (the session counts the step's samples only then)."""
        return self.taken == self.micro_batches

    def check_taken(self, rank: int, world_size: int) -> None:
        """Fail on this rank, with the reason, where it would otherwise leave the ranks' collectives out of
        step: a step counted before all its micro-batches were taken, or one taken without a forward through
        the DDP wrapper (its backward then all-reduces nothing, and the peers' gradient all-reduce meets this
        rank's next collective: gloo's "collective mismatch")."""
        if not self.complete:
            raise RuntimeError(f"step_done after {self.taken} of the step's {len(self)} micro-batches: iterate "
                               "the whole step (for batch_idx in step: ...) before optimizer.step()")
        if world_size > 1 and self.synced_forwards == 0:
            raise RuntimeError(f"rank {rank} took a step without calling the model prepare() returned (the DDP "
                               "wrapper): its gradients were not all-reduced with the other ranks'. Call the model "
                               "also when this rank's share is empty, on zero samples (docs/live.md)")

    def _no_sync(self) -> contextlib.AbstractContextManager:
        no_sync = getattr(self._model, "no_sync", None)  # one process: nothing to hold back
        return no_sync() if no_sync is not None else contextlib.nullcontext()

    def __iter__(self) -> Iterator[np.ndarray]:
        n = self.micro_batches
        for k in range(n):
            start, stop = shard_bounds(len(self.indices), k, n)
            self.taken = k + 1
            if k < n - 1:
                with self._no_sync():  # the backward of this micro-batch adds to .grad, no all-reduce
                    yield self.indices[start:stop]
            else:
                if self._on_last is not None:
                    self._on_last()
                yield self.indices[start:stop]

    def __repr__(self) -> str:
        return f"Step({len(self.indices)} samples in {self.micro_batches} micro-batch(es))"
