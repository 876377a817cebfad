"""What the training step's writer and the scheduler's readers agree on: a job's run, as MLflow holds it.

A job's run carries the tags ``TAG_*`` and logs metrics with ``step`` = samples done. ``read_progress``
reads the whole history of ``HISTORY_KEYS`` and only the latest value of any other metric. ``RunRows`` is
one run as a read path (``sqlite_fast`` or the MLflow client in ``reader``) hands it over, before
``reader`` turns it into a ``JobProgress``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

TAG_JOB = "ones.job"
TAG_GENERATION = "ones.generation"
TAG_RESTARTS = "ones.restarts"
TAG_CHANGED_PARAMS = "ones.changed_params"
TAG_CURRENT_PREFIX = "current."  # ``current.<param>``: a param's value now, where the spec changed it since

# Metrics whose whole history read_progress reads; the others come from their latest value only.
PROGRESS_KEYS = ("samples", "epoch", "loss", "accuracy")
THROUGHPUT_KEYS = (
    "gpus", "num_nodes", "per_gpu_batch", "global_batch", "step_time_s", "sync_time_s", "samples_per_s",
)
HISTORY_KEYS = PROGRESS_KEYS + THROUGHPUT_KEYS
# A run that logs both DIRECT_KEYS never derives them, so its histories of FALLBACK_KEYS are not read.
DIRECT_KEYS = frozenset({"step_time_s", "per_gpu_batch"})
FALLBACK_KEYS = ("global_batch", "samples_per_s")

# A metric's points as (step, value), in logging order (timestamp, then step). NaN is float("nan").
Series = list[tuple[int, float]]
# One throughput measurement: (step, gpus, per_gpu_batch, num_nodes, step_time_s, sync_time_s), None where
# not logged.
Record = tuple[int, float, "float | None", "float | None", "float | None", "float | None"]


@dataclass(frozen=True)
class RunRows:
    """The newest run of one job, as read from the store.

    ``latest``: MLflow's latest value per metric (the one at the highest step); ``current``: (step, value)
    of the last logged ``samples``/``epoch``; ``series``: the histories read, in logging order;
    ``records``: throughput measurements in logging order, or None when they are to be joined from
    ``series`` in Python.
    """

    job: str
    run_id: str
    status: str
    start_ms: int | None
    tags: Mapping[str, str]
    latest: Mapping[str, float]
    current: Mapping[str, tuple[int, float]]
    series: Mapping[str, Series]
    records: list[Record] | None


def make_record(step: int, gpus: float, per_gpu: float | None, nodes: float | None, step_time: float | None,
                sync: float | None, global_batch: float | None = None, rate: float | None = None) -> Record:
    """A throughput record; a missing step time is ``global_batch / samples_per_s``, a missing per-GPU
    batch ``ceil(global_batch / gpus)``."""
    if step_time is None and global_batch and rate:
        step_time = global_batch / rate
    if per_gpu is None and global_batch and math.isfinite(gpus) and gpus >= 1:
        per_gpu = float(math.ceil(global_batch / round(gpus)))
    return step, gpus, per_gpu, nodes, step_time, sync


def logs_step_time(metric_keys: Iterable[str]) -> bool:
    """Whether a run logs ``step_time_s`` and ``per_gpu_batch`` itself rather than deriving them."""
    return DIRECT_KEYS.issubset(metric_keys)


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    """Consecutive slices of at most ``size`` items (MLflow's batch limits, SQLite's parameter limit)."""
    for i in range(0, len(items), size):
        yield items[i: i + size]
