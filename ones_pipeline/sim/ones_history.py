"""The ONES (SC'21) artifact's measurements: ``job_history.csv`` and the published ``*_profile.csv`` runs.

:func:`read_job_history` is the one reader of ``job_history.csv`` (per-epoch logs of 20 completed jobs;
columns in ``shared/traces/ones_sc21/README.md``): the catalogue of the ONES trace
(:mod:`ones_pipeline.sim.ones_catalogue`), the remaining-work fit (:mod:`ones_pipeline.calibration.progress_fit`)
and the artifact checks (:mod:`ones_pipeline.calibration.ones_artifact`) all read it through this function.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ones_pipeline.core.limits import MAX_BATCH, MAX_EPOCH_SIZE, shown
from ones_pipeline.sim.csv_fields import Row, integer, number, read_rows
from ones_pipeline.sim.ones_trace_reader import TraceRow, read_ones_trace
from ones_pipeline.sim.truth import TraceError

HISTORY_FIELDS = (
    integer("id", minimum=0),
    integer("epoch", minimum=0),
    integer("epoch_size", minimum=1, maximum=MAX_EPOCH_SIZE),
    number("num_samples", low=0),
    number("total_workload", low=0, low_open=True),
    integer("batch_size", minimum=1, maximum=MAX_BATCH),
    number("lr", low=0, low_open=True),
    number("initial_loss"),
    number("loss"),
    number("acc", low=0, high=1),
    number("throughput", low=0, low_open=True),
)
HISTORY_COLUMNS = tuple(f.name for f in HISTORY_FIELDS)
# The ONES artifact's published Tiresias run (kurisusnowdeng/ones_sc21 ``out/TIRESIAS_profile.csv``: per job of
# the first 50 rows of trace_1.csv, completion/execution/waiting seconds), relative to the history's folder.
ARTIFACT_PROFILE = Path("results-published") / "TIRESIAS_profile.csv"
ARTIFACT_TRACE = "trace_1.csv"
ARTIFACT_FIELDS = (
    integer("id", minimum=0),
    number("completion_time"),
    number("execution_time", low=0, low_open=True),
    number("waiting_time"),
)
ARTIFACT_COLUMNS = tuple(f.name for f in ARTIFACT_FIELDS)


@dataclass(frozen=True)
class HistoryBlock:
    """One run of ``job_history.csv``: a contiguous block of rows of one id with rising epochs.

    Arrays have one entry per logged epoch (E,); ``epoch_size``, ``total_workload`` and ``initial_loss``
    are those of the block's first row.
    """

    job_id: int
    first_row: int  # 1-based data row of its first line
    epoch_size: int
    total_workload: float  # raw samples processed when the job finished
    initial_loss: float  # test loss before training
    epochs: np.ndarray  # (E,) int
    samples: np.ndarray  # (E,) raw samples processed so far (num_samples)
    batch_sizes: np.ndarray  # (E,) int, global batch
    lrs: np.ndarray  # (E,)
    losses: np.ndarray  # (E,)
    accs: np.ndarray  # (E,)
    throughputs: np.ndarray  # (E,) samples/s over the epoch


def _block(rows: list[Row]) -> HistoryBlock:
    first = rows[0]
    col = {c: np.array([r[c] for r in rows]) for c in HISTORY_COLUMNS}
    return HistoryBlock(first["id"], first.number, first["epoch_size"], first["total_workload"],
                        first["initial_loss"], col["epoch"], col["num_samples"], col["batch_size"], col["lr"],
                        col["loss"], col["acc"], col["throughput"])


def read_job_history(path: str | Path) -> list[HistoryBlock]:
    """The runs of ``job_history.csv``, in file order (validated; raises TraceError on the first problem).

    A new run starts whenever the id changes or the epoch does not increase (the published file reuses id 0
    for two jobs).
    """
    rows = read_rows(path, HISTORY_FIELDS, what="history file", extra_columns=True)
    blocks: list[list[Row]] = []
    for r in rows:
        if blocks and blocks[-1][-1]["id"] == r["id"] and r["epoch"] > blocks[-1][-1]["epoch"]:
            blocks[-1].append(r)
        else:
            blocks.append([r])
    return [_block(b) for b in blocks]


@dataclass(frozen=True)
class HistoryRun:
    """One ``job_history.csv`` run matched to a ``trace_dev.csv`` row (history id = dev row index)."""

    dev_row: TraceRow
    epochs: np.ndarray  # epochs done at each evaluation (num_samples / epoch_size)
    accs: np.ndarray
    losses: np.ndarray
    initial_loss: float
    batch_sizes: np.ndarray
    throughputs: np.ndarray
    total_epochs: float  # total_workload / epoch_size

    @property
    def reference_batch(self) -> int:
        return int(self.batch_sizes[0])


def _matches(block: HistoryBlock, row: TraceRow) -> bool:
    ratio = block.lrs / block.batch_sizes
    return bool(block.epoch_size == row.epoch_size
                and not np.any(np.abs(ratio - row.lr / row.batch_size) > 0.01 * row.lr / row.batch_size)
                and not np.any(block.batch_sizes % row.batch_size != 0))


def read_history_runs(history_csv: str | Path, dev_trace: str | Path) -> list[HistoryRun]:
    """Match ``job_history.csv`` runs to ``trace_dev.csv`` rows.

    The history ids are the dev trace's row indices: a run (contiguous rows of one id with rising
    epochs) belongs to dev row ``id`` when its signature agrees with the row (same epoch size, LR per
    sample of batch equal within 1 %, batch a multiple of the row's per-GPU batch). Exactly one run per
    dev row must agree; runs that agree with no row (the file reuses id 0 for an extra CIFAR run) are
    not used here.
    """
    history_csv, dev_trace = Path(history_csv), Path(dev_trace)
    dev = read_ones_trace(dev_trace)
    by_row: dict[int, list[HistoryRun]] = {}
    for block in read_job_history(history_csv):
        jid = block.job_id
        if not 0 <= jid < len(dev) or not _matches(block, dev[jid]):
            continue
        es = block.epoch_size
        by_row.setdefault(jid, []).append(HistoryRun(
            dev[jid], block.samples / es, block.accs, block.losses, float(block.initial_loss),
            block.batch_sizes.astype(int), block.throughputs, float(block.total_workload) / es))
    runs = []
    for jid, row in enumerate(dev):
        found = by_row.get(jid, [])
        if len(found) != 1:
            raise TraceError(history_csv, f"{len(found)} runs match {dev_trace.name} row {jid + 1} "
                             f"({row.model}/{row.task}, epoch_size {row.epoch_size}); expected exactly 1",
                             field="id")
        runs.append(found[0])
    return runs


def read_artifact_rows(path: str | Path) -> list[Row]:
    """The rows of an ONES artifact ``*_profile.csv`` (``id,completion_time,execution_time,waiting_time``)."""
    return read_rows(path, ARTIFACT_FIELDS, what="artifact profile", extra_columns=True)


def read_artifact_profile(path: str | Path) -> dict[int, float]:
    """``{trace row id: execution_time s}`` from an ONES artifact ``*_profile.csv`` (validated)."""
    out: dict[int, float] = {}
    first: dict[int, int] = {}
    for row in read_artifact_rows(path):
        jid = row["id"]
        if jid in out:
            raise row.error("id", f"repeated job id {shown(row.raw['id'])} (first at row {first[jid]}); "
                                  "allowed: each trace row once")
        first[jid] = row.number
        out[jid] = row["execution_time"]
    return out
