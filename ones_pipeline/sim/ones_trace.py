"""The ONES (SC'21) artifact trace as simulator jobs, with a documented ground truth for its job types.

``trace_1.csv`` (``shared/traces/ones_sc21``) lists 400 submissions of ten (model, task) job types; the
artifact replays the first 50 on 64 GPUs. The published data carry no per-GPU-count throughput and no
learning curves beyond ``job_history.csv`` (one run of each ``trace_dev.csv`` job), so each job type is
*derived* from a measured Pollux (OSDI'21) profile (``shared/traces/pollux``) and calibrated on that
history. ``docs/ones_catalogue.md`` states every assumption and tabulates the result
(``python -m ones_pipeline.calibration.ones_catalogue_table --catalogue`` prints the table, ``--sanity`` the
standalone durations of the first 50 jobs).

The pieces, one module per role:

* :mod:`~ones_pipeline.sim.ones_trace_reader`: reading and validating a trace CSV (one ``TraceRow`` per line);
* :mod:`~ones_pipeline.sim.ones_job_types`: the ten job types and the Pollux profile each derives from;
* :mod:`~ones_pipeline.sim.ones_history`: the artifact's measurements (``job_history.csv``, its one reader,
  and the published Tiresias run);
* :mod:`~ones_pipeline.sim.ones_catalogue`: each type's parameters fitted on those measurements;
* :mod:`~ones_pipeline.sim.ones_truth`: the ground truth of one job (the model, stated in its docstring);
* this module: :func:`load_ones_trace`, what the simulator calls.

Validation is strict: any bad row or column raises :class:`~ones_pipeline.sim.truth.TraceError` naming
the file, the 1-based data row, the field, the value and what is allowed; nothing is skipped.
"""

from __future__ import annotations

from pathlib import Path

from ones_pipeline.sim.ones_catalogue import catalogue
from ones_pipeline.sim.ones_trace_reader import read_ones_trace
from ones_pipeline.sim.ones_truth import OnesJobTruth, make_spec
from ones_pipeline.sim.truth import SimJob, TraceError

CALIBRATION_FILES = ("job_history.csv", "trace_dev.csv")


def load_ones_trace(path: str | Path, max_jobs: int | None = None, pollux_traces_dir: str | Path | None = None,
                    restart_cost_s: float = 30.0, history_dir: str | Path | None = None) -> list[SimJob]:
    """Jobs of an ONES trace (``time,model,task,epoch_size,patience,batch_size,lr,max_lr,target_acc,
    num_gpus``) with their derived ground truth.

    Every row is validated (also those past ``max_jobs``); the first ``max_jobs`` rows are returned.
    The calibration data (``job_history.csv``, ``trace_dev.csv``) are read from ``history_dir``
    (default: the trace's folder; ``ones simulate --history DIR``), the Pollux profiles from
    ``pollux_traces_dir`` (default: the packaged profiles; ``ones simulate --profiles DIR``).
    """
    path = Path(path)
    if max_jobs is not None and max_jobs < 1:
        raise ValueError(f"max_jobs must be >= 1, got {max_jobs!r}")
    if not restart_cost_s >= 0:
        raise ValueError(f"restart_cost_s must be >= 0, got {restart_cost_s!r}")
    rows = read_ones_trace(path)
    if max_jobs is not None:
        rows = rows[:max_jobs]
    history = Path(history_dir) if history_dir is not None else path.resolve().parent
    missing = [name for name in CALIBRATION_FILES if not (history / name).is_file()]
    if missing:
        raise TraceError(history / missing[0], "not found: an ONES trace is simulated with the ONES artifact's "
                         f"calibration data ({', '.join(CALIBRATION_FILES)}), read from the trace's folder; "
                         "give their folder with `ones simulate --history DIR` (e.g. ../shared/traces/ones_sc21)")
    cat = catalogue(history, pollux_traces_dir, restart_cost_s)
    jobs = []
    for row in rows:
        truth = OnesJobTruth(row, cat[(row.model, row.task)], restart_cost_s)
        jobs.append(SimJob(make_spec(row, truth), truth))
    return jobs
