"""Reading and validating an ONES (SC'21) trace CSV: one :class:`TraceRow` per job submission.

Columns ``time,model,task,epoch_size,patience,batch_size,lr,max_lr,target_acc,num_gpus`` (exactly these;
``shared/traces/ones_sc21/README.md`` says what each means). Validation is strict: any bad row or column
raises :class:`~ones_pipeline.sim.truth.TraceError` naming the file, the 1-based data row, the field, the
value and what is allowed; nothing is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.core.limits import MAX_BATCH, MAX_EPOCH_SIZE, MAX_GPUS, MAX_LR, MAX_PATIENCE, MIN_LR, shown
from ones_pipeline.sim.csv_fields import integer, number, read_rows, text
from ones_pipeline.sim.ones_job_types import JOB_TYPES, JobType, allowed_pairs
from ones_pipeline.sim.truth import MAX_ARRIVAL_S

TRACE_FIELDS = (
    number("time", low=0, high=MAX_ARRIVAL_S),
    text("model"),
    text("task"),
    integer("epoch_size", minimum=1, maximum=MAX_EPOCH_SIZE),
    integer("patience", minimum=1, maximum=MAX_PATIENCE),
    integer("batch_size", minimum=1, maximum=MAX_BATCH),
    number("lr", low=MIN_LR, high=MAX_LR),
    number("max_lr", low=MIN_LR, high=MAX_LR),  # >= lr, checked per row
    number("target_acc", low=0, low_open=True, high=1),
    integer("num_gpus", minimum=1, maximum=MAX_GPUS),
)
TRACE_COLUMNS = tuple(f.name for f in TRACE_FIELDS)


@dataclass(frozen=True)
class TraceRow:
    index: int  # 0-based data row
    time: float
    model: str
    task: str
    epoch_size: int
    patience: int
    batch_size: int
    lr: float
    max_lr: float
    target_acc: float
    num_gpus: int

    @property
    def job_type(self) -> JobType:
        return JOB_TYPES[(self.model, self.task)]


def read_ones_trace(path: str | Path) -> list[TraceRow]:
    """Parse and validate an ONES trace CSV (every row; raises TraceError on the first problem)."""
    models = {m for m, _ in JOB_TYPES}
    out = []
    for row in read_rows(path, TRACE_FIELDS, what="trace file"):
        v = row.values
        if (v["model"], v["task"]) not in JOB_TYPES:
            pair = shown(f"{v['model']}/{v['task']}")
            raise row.error("model" if v["model"] not in models else "task",
                            f"unknown model/task {pair}; allowed: {', '.join(allowed_pairs())}")
        if not v["max_lr"] >= v["lr"]:
            raise row.out_of_range("max_lr", f"a number >= lr ({v['lr']:g})")
        out.append(TraceRow(row.number - 1, **v))
    return out
