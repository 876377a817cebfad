"""Workload (job-submission trace) loaders for the simulator."""

from __future__ import annotations

import math
import re
from pathlib import Path

from ones_pipeline.core.limits import MAX_BATCH, MAX_GPUS, shown
from ones_pipeline.core.types import JOB_NAME_RE, JobSpec, StopKind, StoppingRule
from ones_pipeline.sim.csv_fields import Row, integer, number, read_rows, text
from ones_pipeline.sim.pollux_profiles import POLLUX_MODELS, PolluxModelProfile, load_pollux_profile
from ones_pipeline.sim.truth import MAX_ARRIVAL_S, SimJob, TraceError

POLLUX_WORKLOAD_FIELDS = (
    text("name"),
    number("time", low=0, high=MAX_ARRIVAL_S),
    text("application", choices=POLLUX_MODELS, lower=True),
    integer("num_replicas", minimum=1, maximum=MAX_GPUS),
    integer("batch_size", minimum=1, maximum=MAX_BATCH),
)
POLLUX_WORKLOAD_COLUMNS = tuple(f.name for f in POLLUX_WORKLOAD_FIELDS)


def _slug(name: str) -> str:
    """Lower-case job name with runs of characters outside ``[a-z0-9-]`` turned into ``-``."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.strip().lower())
    return s.strip("-")[:63].rstrip("-")


def _job_names(rows: list[Row]) -> list[str]:
    """Each row's job id (the slug of its name); a name that gives no valid id or repeats one is an error."""
    seen: dict[str, int] = {}
    for row in rows:
        name = _slug(row["name"])
        if not name or not JOB_NAME_RE.match(name):
            raise row.error("name", f"job name {shown(row['name'])} gives no valid job id; allowed: a name with a "
                                    "letter or digit (lower-cased; other characters become '-')")
        if name in seen:
            raise row.error("name", f"duplicate job name {name!r} (first at row {seen[name]})")
        seen[name] = row.number
    return list(seen)


def _profiles(rows: list[Row], traces: Path, restart_cost_s: float) -> dict[str, PolluxModelProfile]:
    """The profile of every application in ``rows``; a missing or bad one is reported at its first row."""
    profiles = {}
    for row in rows:
        app = row["application"]
        if app not in profiles:
            try:
                profiles[app] = load_pollux_profile(traces, app, restart_cost_s)
            except TraceError as exc:
                raise row.error("application", f"no usable profile for application {app!r}: {exc}") from exc
    return profiles


def load_pollux_workload(path: str | Path, traces_dir: str | Path | None = None, restart_cost_s: float = 30.0,
                         max_jobs: int | None = None) -> list[SimJob]:
    """Jobs of a Pollux workload CSV (``name,time,application,num_replicas,batch_size``), in file order.

    ``traces_dir`` (default ``<folder of the file>/../traces``, or the packaged profiles when that folder
    does not exist) holds the per-model profiles. Every row is validated (a bad row raises
    :class:`TraceError` naming the file, the 1-based data row, the field, the value and what is allowed;
    nothing is skipped; :mod:`ones_pipeline.sim.csv_fields`); ``max_jobs`` then keeps the first N rows.

    Each job's ``JobSpec``: ``name`` = the lower-cased slug of the trace name, ``model`` = application,
    ``dataset_size`` = the profile's samples per epoch, ``per_gpu_batch`` = ceil(batch_size /
    num_replicas), ``requested_gpus`` = num_replicas (the rigid baselines' GPU count),
    ``max_global_batch`` = the largest profiled batch (raised to ``per_gpu_batch * num_replicas`` if that
    is larger, so a rigid baseline always gets its trace batch), ``min_global_batch`` = M0 (the smallest
    validated batch: gradient statistics and efficiency are
    relative to it, and no job trains below it), ``min_per_gpu_batch`` = the smallest profiled local
    batch, ``max_per_gpu_batch`` = the largest per-GPU micro-batch
    the ground truth runs without accumulation (``accum_local_batch``: the largest profiled local batch,
    8 for yolov3 as in the Pollux simulator; bigger per-GPU batches need gradient accumulation: every
    bert row, 24..64 per GPU vs 12),
    ``stopping`` = EPOCHS with ``total_progress / dataset_size`` epochs (so the samples to finish equal
    the profile's ``total_progress`` up to rounding), ``submit_time_s`` = time.

    Non-divisible batches: in the 8 main workloads cifar10 2048/6 and 4096/12, deepspeech2 320/6 and
    640/12, imagenet 3200/24 and 6400/48 do not divide; ceil makes ``per_gpu_batch * num_replicas``
    up to 0.8 % larger than the trace's batch_size (e.g. 342 x 6 = 2052 instead of 2048).
    """
    path = Path(path)
    if max_jobs is not None and (not isinstance(max_jobs, int) or max_jobs < 1):
        raise ValueError(f"max_jobs must be an integer >= 1 or None, got {max_jobs!r}")
    if not path.is_file():
        raise TraceError(path, "workload file not found")
    from ones_pipeline.sim.packaged import default_profiles_for

    traces = Path(traces_dir) if traces_dir is not None else default_profiles_for(path)
    rows = read_rows(path, POLLUX_WORKLOAD_FIELDS, what="workload file")
    names = _job_names(rows)
    profiles = _profiles(rows, traces, restart_cost_s)
    return [SimJob(spec=_job_spec(row, name, profiles[row["application"]]), truth=profiles[row["application"]])
            for row, name in list(zip(rows, names, strict=True))[:max_jobs]]


def _job_spec(row: Row, name: str, prof: PolluxModelProfile) -> JobSpec:
    """The JobSpec of one workload row (see :func:`load_pollux_workload`)."""
    replicas, batch = row["num_replicas"], row["batch_size"]
    per_gpu = math.ceil(batch / replicas)
    try:
        return JobSpec(
            name=name,
            model=row["application"],
            dataset_size=int(prof.dataset_size),
            per_gpu_batch=per_gpu,
            base_lr=0.1,
            max_global_batch=max(int(prof.max_batch), per_gpu * replicas),
            max_per_gpu_batch=int(prof.accum_local_batch),
            min_global_batch=int(prof.base_batch),
            min_per_gpu_batch=min(int(prof.min_local_batch), int(prof.accum_local_batch)),
            requested_gpus=replicas,
            stopping=StoppingRule(StopKind.EPOCHS, epochs=prof.total_progress / prof.dataset_size),
            submit_time_s=row["time"],
        )
    except ValueError as exc:
        raise TraceError(row.path, str(exc), row=row.number) from exc
