"""Elastic, resumable data order, counted in samples rather than steps.

Each epoch visits the training set in one fixed order, ``EpochOrder.permutation(epoch)``, a function
of ``(seed, epoch)`` only. Training state is the pair ``(epoch, position)``: how many samples of this
epoch's order have been consumed. A step with global batch ``B`` consumes ``perm[position:position+B]``
(truncated at the end of the epoch) and advances ``position`` by the number of samples it took; the
ranks split that global batch into contiguous shares.

Because neither the order nor the slicing depends on the number of processes or the batch size of
earlier steps, a job stopped at any position and resumed with another world size or global batch
continues the same order: over an epoch every sample index is seen exactly once, whatever sequence of
``(world_size, global_batch)`` it ran under. The global batch's content at a position is the same for
every world size; only its split between ranks differs.

Nothing here holds RNG state, so nothing needs to be checkpointed besides ``(epoch, position)``.
"""

from __future__ import annotations

import numpy as np


def _check_positive(name: str, value: int) -> int:
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def shard_bounds(batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous share of a batch of ``batch_size`` samples.

    Shares are as even as possible: the first ``batch_size % world_size`` ranks get one sample more.
    When ``batch_size < world_size``, ranks ``batch_size ..`` get an empty share (``start == stop``);
    they must still take part in the step's collective operations (e.g. contribute a zero gradient).
    """
    world_size = _check_positive("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    base, extra = divmod(int(batch_size), world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def batch_size_at(position: int, global_batch: int, dataset_size: int) -> int:
    """Samples the step at ``position`` consumes: ``global_batch``, or fewer at the end of the epoch."""
    _check_position(position, dataset_size)
    return min(_check_positive("global_batch", global_batch), int(dataset_size) - int(position))


def steps_in_epoch_from(position: int, global_batch: int, dataset_size: int) -> int:
    """Steps left in the epoch from ``position`` (the last one may be short); 0 when ``position == dataset_size``."""
    dataset_size = _check_positive("dataset_size", dataset_size)
    global_batch = _check_positive("global_batch", global_batch)
    if not 0 <= position <= dataset_size:
        raise ValueError(f"position must be in [0, {dataset_size}], got {position}")
    return -(-(dataset_size - int(position)) // global_batch)


def _check_position(position: int, dataset_size: int) -> None:
    if not 0 <= position < dataset_size:
        raise ValueError(
            f"position must be in [0, {dataset_size}) (the epoch ends at {dataset_size}: start the next "
            f"epoch at position 0), got {position}"
        )


class EpochOrder:
    """The per-epoch sample order of a dataset of ``dataset_size`` samples, seeded by ``seed``."""

    def __init__(self, dataset_size: int, seed: int = 0):
        self.dataset_size = _check_positive("dataset_size", dataset_size)
        self.seed = int(seed)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self._cached: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch`` (int64, a fresh copy): deterministic in ``(seed, epoch)``."""
        return self._perm(epoch).copy()

    def _perm(self, epoch: int) -> np.ndarray:
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self._cached is None or self._cached[0] != epoch:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            perm = rng.permutation(self.dataset_size).astype(np.int64)
            perm.flags.writeable = False
            self._cached = (epoch, perm)
        return self._cached[1]

    def global_batch_indices(self, epoch: int, position: int, global_batch: int) -> np.ndarray:
        """All sample indices of the step at ``position``: ``perm[position : position + global_batch]``."""
        _check_position(position, self.dataset_size)
        global_batch = _check_positive("global_batch", global_batch)
        return self._perm(epoch)[int(position):int(position) + global_batch].copy()

    def batch_indices(self, epoch: int, position: int, global_batch: int, rank: int, world_size: int) -> np.ndarray:
        """Rank ``rank``'s sample indices for the step at ``position`` (see ``shard_bounds`` for the split;
        may be empty when the global batch is smaller than ``world_size``). Advance ``position`` by
        ``batch_size_at(position, global_batch, dataset_size)`` after the step, the same on every rank.
        """
        batch = self.global_batch_indices(epoch, position, global_batch)
        start, stop = shard_bounds(len(batch), rank, world_size)
        return batch[start:stop].copy()

    def __repr__(self) -> str:
        return f"EpochOrder(dataset_size={self.dataset_size}, seed={self.seed})"
