"""Ground truth of a simulated job: what really happens when it runs (policies never see this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ones_pipeline.core.types import JobSpec

# Latest arrival a trace may have (30 days): the simulation runs at most twice that (sim.engine), and a
# larger value (1e99) is a broken file, not a workload.
MAX_ARRIVAL_S = 30 * 24 * 3600.0


class TraceError(ValueError):
    """A bad trace or profile input; the message names the file, row and field."""

    def __init__(self, path, message: str, row: int | None = None, field: str | None = None):
        where = str(path)
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.field = str(path), row, field
        self._message = message

    def __reduce__(self):  # raised in a worker process (policy_quality.py --processes): rebuilt with its message
        return type(self), (self.path, self._message, self.row, self.field)


class JobTruth(Protocol):
    """Measured behaviour of one job type.

    Progress is counted in base-equivalent samples (samples at the base batch ``base_batch``); the
    job finishes when it reaches ``total_progress``. With global batch M, it advances at
    ``throughput(M) * efficiency(progress, M)`` base-equivalent samples per second.
    """

    model: str
    base_batch: int  # M0: the batch at which efficiency is 1
    max_local_batch: int  # largest per-GPU micro-batch that fits in memory
    total_progress: float  # base-equivalent samples to finish
    restart_cost_s: float  # seconds without progress after each start, restart or resize

    def step_time(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        """(step_time_s, sync_time_s) of one optimizer step; ``placement`` = GPUs per node, largest first;
        ``local_batch`` <= ``max_local_batch`` (the simulator adds accumulation micro-steps itself)."""

    def efficiency(self, progress: float, global_batch: float) -> float:
        """Base-equivalent samples per sample processed at ``global_batch`` (<= 1 above the base batch)."""

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
        """Gradient noise scale in samples at this progress and (when given) total batch: what the job's
        own gradient-statistics monitor reports while it trains at that batch."""

    def metrics(self, progress: float) -> tuple[float, float]:
        """(loss, accuracy in [0, 1]) after training to ``progress``."""


@dataclass(frozen=True)
class SimJob:
    """One job of a workload: what the user submitted and how it really behaves."""

    spec: JobSpec  # spec.submit_time_s is the arrival time
    truth: JobTruth
