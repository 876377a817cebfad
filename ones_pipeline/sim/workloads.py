"""Workload (job-submission trace) loaders for the simulator."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from ones_pipeline.core.types import JOB_NAME_RE, JobSpec, StopKind, StoppingRule
from ones_pipeline.sim.pollux_profiles import POLLUX_MODELS, load_pollux_profile
from ones_pipeline.sim.truth import SimJob, TraceError

POLLUX_WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def _slug(name: str) -> str:
    """Lower-case job name with runs of characters outside ``[a-z0-9-]`` turned into ``-``."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.strip().lower())
    return s.strip("-")[:63].rstrip("-")


def _parse_number(path: Path, row: int, field: str, text: str, *, integer: bool, minimum: float) -> float | int:
    text = (text or "").strip()
    if not text:
        raise TraceError(path, "empty value", row=row, field=field)
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, f"not a number: {text!r}", row=row, field=field) from None
    if not math.isfinite(value):
        raise TraceError(path, f"not a finite number: {text!r}", row=row, field=field)
    if integer:
        if value != int(value):
            raise TraceError(path, f"not an integer: {text!r}", row=row, field=field)
        value = int(value)
    if value < minimum:
        raise TraceError(path, f"must be >= {minimum:g}, got {text!r}", row=row, field=field)
    return value


def load_pollux_workload(path: str | Path, traces_dir: str | Path | None = None, restart_cost_s: float = 30.0,
                         max_jobs: int | None = None) -> list[SimJob]:
    """Jobs of a Pollux workload CSV (``name,time,application,num_replicas,batch_size``), in file order.

    ``traces_dir`` (default ``<folder of the file>/../traces``, or the packaged profiles when that folder
    does not exist) holds the per-model profiles. Every row is
    validated (a bad row raises :class:`TraceError` naming the file, the 1-based data row and the field;
    nothing is skipped); ``max_jobs`` then keeps the first N rows.

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
    allowed = ", ".join(POLLUX_WORKLOAD_COLUMNS)
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        while header is not None and not any(c.strip() for c in header):  # leading blank lines
            header = next(reader, None)
        if header is None:
            raise TraceError(path, f"empty file; expected a header with columns {allowed}")
        header = [c.strip() for c in header]
        for col in header:
            if col not in POLLUX_WORKLOAD_COLUMNS:
                raise TraceError(path, f"unknown column {col!r} in the header; allowed columns: {allowed}", field=col)
        for col in POLLUX_WORKLOAD_COLUMNS:
            if col not in header:
                raise TraceError(path, f"missing column {col!r} in the header; required columns: {allowed}", field=col)
        if len(set(header)) != len(header):
            dup = next(c for c in header if header.count(c) > 1)
            raise TraceError(path, f"duplicate column {dup!r} in the header", field=dup)
        rows = [r for r in reader]

    parsed = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(rows, start=1):
        if not any(c.strip() for c in raw):
            raise TraceError(path, "blank row", row=i)
        if len(raw) != len(header):
            raise TraceError(path, f"{len(raw)} fields, expected {len(header)} ({allowed})", row=i)
        rec = dict(zip(header, raw, strict=False))
        raw_name = rec["name"].strip()
        name = _slug(raw_name)
        if not name or not JOB_NAME_RE.match(name):
            raise TraceError(path, f"job name {raw_name!r} gives no valid job id", row=i, field="name")
        if name in seen:
            raise TraceError(path, f"duplicate job name {name!r} (first at row {seen[name]})", row=i, field="name")
        seen[name] = i
        time_s = _parse_number(path, i, "time", rec["time"], integer=False, minimum=0.0)
        app = rec["application"].strip().lower()
        if app not in POLLUX_MODELS:
            raise TraceError(path, f"unknown application {rec['application']!r}; allowed: {', '.join(POLLUX_MODELS)}",
                             row=i, field="application")
        replicas = _parse_number(path, i, "num_replicas", rec["num_replicas"], integer=True, minimum=1)
        batch = _parse_number(path, i, "batch_size", rec["batch_size"], integer=True, minimum=1)
        parsed.append((i, name, float(time_s), app, int(replicas), int(batch)))
    if not parsed:
        raise TraceError(path, "no job rows (empty workload)")

    profiles = {}
    for i, _, _, app, _, _ in parsed:
        if app not in profiles:
            try:
                profiles[app] = load_pollux_profile(traces, app, restart_cost_s)
            except TraceError as exc:
                raise TraceError(path, f"no usable profile for application {app!r}: {exc}",
                                 row=i, field="application") from exc

    jobs = []
    for i, name, time_s, app, replicas, batch in parsed[:max_jobs]:
        prof = profiles[app]
        per_gpu = math.ceil(batch / replicas)
        try:
            spec = JobSpec(
                name=name,
                model=app,
                dataset_size=int(prof.dataset_size),
                per_gpu_batch=per_gpu,
                base_lr=0.1,
                max_global_batch=max(int(prof.max_batch), per_gpu * replicas),
                max_per_gpu_batch=int(prof.accum_local_batch),
                min_global_batch=int(prof.base_batch),
                min_per_gpu_batch=min(int(prof.min_local_batch), int(prof.accum_local_batch)),
                requested_gpus=replicas,
                stopping=StoppingRule(StopKind.EPOCHS, epochs=prof.total_progress / prof.dataset_size),
                submit_time_s=time_s,
            )
        except ValueError as exc:
            raise TraceError(path, str(exc), row=i) from exc
        jobs.append(SimJob(spec=spec, truth=prof))
    return jobs
