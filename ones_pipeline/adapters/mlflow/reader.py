"""The scheduler's side: per job, samples and epochs done, loss/accuracy histories and steady-state step
times per GPU configuration (``ThroughputObs``), read in one pass.

Two read paths hand over the same ``RunRows``: ``sqlite_fast`` (an SQLite store whose schema revision is
verified) and the MLflow client (any store). Everything after that, the current trajectory after a
rewind, throughput records and their medians, is computed here, once, for both.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import statistics
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mlflow import MlflowClient

from ones_pipeline.adapters.mlflow.schema import (
    FALLBACK_KEYS,
    HISTORY_KEYS,
    TAG_GENERATION,
    TAG_JOB,
    TAG_RESTARTS,
    THROUGHPUT_KEYS,
    Record,
    RunRows,
    Series,
    logs_step_time,
    make_record,
)
from ones_pipeline.adapters.mlflow.sqlite_fast import UnverifiedSchema, read_runs
from ones_pipeline.adapters.mlflow.store import TrackerError, check_reachable, sqlite_path, store_scheme
from ones_pipeline.core.types import JOB_NAME_RE, ThroughputObs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobProgress:
    """A job's progress as its MLflow run records it.

    ``samples_done``/``epochs_done`` (the ``samples``/``epoch`` metrics) and the histories follow the
    job's current trajectory: they are the last values logged, and when a restart resumed from an older
    checkpoint and logged a smaller ``step`` again, the points logged earlier past that step are dropped.
    ``metrics``: the last logged value of ``samples``, ``epoch``, ``loss``, ``accuracy``, ``gpus``,
    ``per_gpu_batch``, ``num_nodes``, ``step_time_s``, ``sync_time_s``; MLflow's latest value (the one
    at the highest step) of the others.
    ``throughput_obs`` has one entry per (GPUs, nodes, per-GPU batch) configuration the job ran with,
    in that order: the median step and sync time, leaving out the first step after every change or
    restart (warm-up) when the configuration has other measurements.
    """

    job: str
    run_id: str
    status: str  # MLflow run status: RUNNING, FINISHED, KILLED, FAILED, SCHEDULED
    samples_done: float
    epochs_done: float
    metrics: dict[str, float]
    throughput_obs: tuple[ThroughputObs, ...]
    loss_history: tuple[tuple[float, float], ...]  # (samples, loss)
    accuracy_history: tuple[tuple[float, float], ...]  # (samples, accuracy)
    restarts: int
    generation: int
    start_time_s: float | None = None  # run start, Unix seconds

    @property
    def grad_noise_scale(self) -> float | None:
        return self.metrics.get("grad_noise_scale")

    @property
    def epoch_end_s(self) -> float | None:
        """Seconds one evaluation point takes outside the steps, as the job measured it; None before one."""
        return self.metrics.get("epoch_end_s")


REACH_TIMEOUT_S = 5.0  # a tracking server that does not answer /health within this is unreachable


def read_progress(tracking_uri: str, experiment: str, jobs: Iterable[str] | None = None, *,
                  method: str = "auto") -> dict[str, JobProgress]:
    """Progress of every job (or of ``jobs``) with a run in ``experiment``, keyed by job name.

    A job with several runs (e.g. its state directory was lost) is read from the newest one. Jobs without
    a run are absent. A missing store or experiment gives ``{}`` (nothing is created).

    ``method``: ``"sql"`` reads an SQLite store's tables directly, read-only, in one transaction (a fixed
    handful of queries whatever the number of jobs), and only at a schema revision that SQL was verified
    against (``sqlite_fast.VERIFIED_REVISIONS``; TrackerError otherwise); ``"client"`` uses
    ``MlflowClient.search_runs`` plus one ``get_metric_history`` per run and metric (the only way for a
    tracking server); ``"auto"`` picks ``sql`` for SQLite, falling back to ``client`` (with a warning)
    when the schema revision is not verified or the direct read fails.
    """
    kind = store_scheme(tracking_uri)
    wanted = None if jobs is None else sorted(set(jobs))
    if wanted == []:
        return {}
    if method not in ("auto", "sql", "client"):
        raise ValueError(f"method must be 'auto', 'sql' or 'client', got {method!r}")
    if method == "sql" and kind != "sqlite":
        raise TrackerError(f"tracking URI {tracking_uri!r}: method='sql' needs an sqlite store")
    if kind != "sqlite":  # a dead server: one TrackerError within REACH_TIMEOUT_S, not minutes of client retries
        check_reachable(tracking_uri, REACH_TIMEOUT_S)
    rows = None
    if kind == "sqlite" and method in ("auto", "sql"):
        rows = _read_direct(tracking_uri, experiment, wanted, strict=method == "sql")
    if rows is None:
        rows = _read_client(tracking_uri, experiment, wanted)
    return {job: _build_progress(r) for job, r in rows.items()}


# (database, reason) pairs already warned about: a sensor tick reads every few seconds.
_WARNED: set[tuple[str, str]] = set()


def _read_direct(tracking_uri: str, experiment: str, jobs: list[str] | None, strict: bool
                 ) -> dict[str, RunRows] | None:
    """``sqlite_fast.read_runs``, or None when the client must read instead. ``strict``: raise instead."""
    path = sqlite_path(tracking_uri)
    try:
        return read_runs(path, experiment, jobs)
    except UnverifiedSchema as exc:
        if strict:
            raise TrackerError(f"tracking URI {tracking_uri!r}: method='sql' refused: {exc}") from exc
        key = (str(path.resolve()), str(exc))
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("MLflow store %s: %s; reading it through the MLflow client instead", tracking_uri, exc)
    except sqlite3.Error as exc:
        if strict:
            raise
        log.warning("direct read of %s failed (%s); using the MLflow client", tracking_uri, exc)
    return None


# --------------------------------------------------------------------------- the client path


def _read_client(tracking_uri: str, experiment: str, jobs: list[str] | None) -> dict[str, RunRows]:
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        return {}
    newest = _newest_client_runs(client, exp.experiment_id, jobs)
    tasks = []
    for job, run in newest.items():
        have = run.data.metrics
        for key in HISTORY_KEYS:
            if key not in have or (key in THROUGHPUT_KEYS and "gpus" not in have):
                continue
            if key in FALLBACK_KEYS and logs_step_time(have):
                continue
            tasks.append((job, key))

    def history(task: tuple[str, str]) -> Series:
        job, key = task
        points = sorted(client.get_metric_history(newest[job].info.run_id, key),
                        key=lambda m: (m.timestamp, m.step))
        return [(m.step, m.value) for m in points]

    if store_scheme(tracking_uri) in ("http", "https") and len(tasks) > 1:
        with ThreadPoolExecutor(max_workers=8) as pool:  # N x M round trips: overlap their latency
            histories = list(pool.map(history, tasks))
    else:
        histories = [history(t) for t in tasks]
    series: dict[str, dict[str, Series]] = {job: {} for job in newest}
    for (job, key), points in zip(tasks, histories, strict=False):
        series[job][key] = points
    out = {}
    for job, run in newest.items():
        by_key = series[job]
        current = {key: by_key[key][-1] for key in ("samples", "epoch") if by_key.get(key)}
        out[job] = RunRows(job=job, run_id=run.info.run_id, status=run.info.status, start_ms=run.info.start_time,
                           tags=run.data.tags, latest=dict(run.data.metrics), current=current, series=by_key,
                           records=None)
    return out


def _newest_client_runs(client: MlflowClient, experiment_id: str, jobs: list[str] | None) -> dict[str, Any]:
    """{job: newest run} for the jobs (all when None) with a run in the experiment."""
    # MLflow's search has no IN for tags: one job is filtered by the store, several in Python.
    if jobs is not None and len(jobs) == 1 and JOB_NAME_RE.match(jobs[0]):  # no quotes to escape
        filter_string = f"tags.`{TAG_JOB}` = '{jobs[0]}'"
    else:
        filter_string = f"tags.`{TAG_JOB}` LIKE '%'"
    wanted = None if jobs is None else set(jobs)
    newest: dict[str, Any] = {}
    page_token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000,
                                  page_token=page_token)
        for run in page:
            job = run.data.tags.get(TAG_JOB)
            if job is None or (wanted is not None and job not in wanted):
                continue
            if job not in newest or (run.info.start_time or 0) > (newest[job].info.start_time or 0):
                newest[job] = run
        page_token = page.token
        if not page_token:
            return newest


# --------------------------------------------------------------------------- from rows to progress


def _build_progress(rows: RunRows) -> JobProgress:
    """The ``JobProgress`` of one run as either read path hands it over."""
    current, series = rows.current, rows.series
    records = _series_records(series) if rows.records is None else rows.records
    metrics = dict(rows.latest)
    for key, (_step, value) in current.items():
        metrics[key] = value
    for key in ("loss", "accuracy"):
        if series.get(key):
            metrics[key] = series[key][-1][1]  # last logged = current, also after a rewind
    if records:
        last = records[-1]
        for key, value in zip(("gpus", "per_gpu_batch", "num_nodes", "step_time_s", "sync_time_s"), last[1:],
                              strict=False):
            if value is not None and math.isfinite(value) and key in metrics:
                metrics[key] = value
    loss = _current_trajectory(series.get("loss", ()))
    accuracy = _current_trajectory(series.get("accuracy", ()))
    if "samples" in current:
        samples_done = float(current["samples"][1])
    else:  # no samples metric: the step (= samples by convention) of the last point logged
        lasts = [p[-1][0] for p in (loss, accuracy) if p] + ([records[-1][0]] if records else [])
        samples_done = float(max(lasts, default=0))
    return JobProgress(
        job=rows.job,
        run_id=rows.run_id,
        status=str(rows.status),
        samples_done=samples_done,
        epochs_done=float(current["epoch"][1]) if "epoch" in current else 0.0,
        metrics=metrics,
        throughput_obs=_throughput_obs(records),
        loss_history=loss,
        accuracy_history=accuracy,
        restarts=_int_tag(rows.tags, TAG_RESTARTS),
        generation=_int_tag(rows.tags, TAG_GENERATION),
        start_time_s=None if rows.start_ms is None else rows.start_ms / 1000.0,
    )


def _int_tag(tags: Mapping[str, str], key: str) -> int:
    try:
        return int(tags.get(key, 0))
    except ValueError:
        return 0


def _current_trajectory(points: Series) -> tuple[tuple[float, float], ...]:
    """(step, value) pairs with steps increasing, in logging order.

    A restart that resumes from an older checkpoint logs a step at or below earlier ones: those earlier
    points belong to lost work and are dropped (for the same step, the later value wins).
    """
    steps = [p[0] for p in points]
    if all(a < b for a, b in zip(steps, steps[1:], strict=False)):  # no rewind: the common case
        return tuple((float(s), float(v)) for s, v in points)
    out: list[tuple[float, float]] = []
    for step, value in points:
        while out and out[-1][0] >= step:
            out.pop()
        out.append((float(step), float(value)))
    return tuple(out)


def _by_occurrence(points: Series | None) -> dict[tuple[int, int], float]:
    """{(step, k): value} where k counts earlier points at the same step (0 unless a step was re-logged)."""
    out: dict[tuple[int, int], float] = {}
    for step, value in points or ():
        k = 0
        while (step, k) in out:
            k += 1
        out[(step, k)] = value
    return out


def _series_records(series: Mapping[str, Series]) -> list[Record]:
    """Throughput records joined in Python: the k-th point at a step of each metric goes with the k-th
    ``gpus`` point at that step, so a step logged again after a restart is a new measurement, also when
    metrics were logged one call each. Derives a missing step time from ``global_batch / samples_per_s``
    and a missing per-GPU batch from ``ceil(global_batch / gpus)``."""
    gpus_points = series.get("gpus")
    if not gpus_points:
        return []
    index = {key: _by_occurrence(series.get(key)) for key in THROUGHPUT_KEYS[1:] if key in series}
    empty: dict = {}
    fields = [index.get(key, empty) for key in
              ("per_gpu_batch", "num_nodes", "step_time_s", "sync_time_s", "global_batch", "samples_per_s")]
    out: list[Record] = []
    seen: dict[int, int] = {}
    for step, gpus in gpus_points:
        k = seen.get(step, 0)
        seen[step] = k + 1
        out.append(make_record(step, gpus, *(f.get((step, k)) for f in fields)))
    return out


def _throughput_obs(records: Sequence[Record]) -> tuple[ThroughputObs, ...]:
    """Steady-state median step/sync time per (GPUs, nodes, per-GPU batch) configuration.

    Without ``num_nodes`` one node is assumed, without ``sync_time_s`` zero. The first measurement after a
    configuration change or a restart (the step going backwards) is counted only when its configuration
    has nothing else, since it carries start-up costs. Records lacking a finite positive step time,
    GPU count or per-GPU batch are skipped.
    """
    steady: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    warmup: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    prev_config, prev_step = None, None
    for step, gpus, per_gpu, nodes, step_time, sync in records:
        if (step_time is None or per_gpu is None or not math.isfinite(gpus) or gpus < 1
                or not math.isfinite(step_time) or step_time <= 0 or not math.isfinite(per_gpu) or per_gpu < 1):
            continue
        nodes_i = int(round(nodes)) if nodes is not None and math.isfinite(nodes) and nodes >= 1 else 1
        config = (int(round(gpus)), nodes_i, int(round(per_gpu)))
        if sync is None or not math.isfinite(sync) or sync < 0:
            sync = 0.0
        first = config != prev_config or (prev_step is not None and step <= prev_step)
        (warmup if first else steady).setdefault(config, []).append((step_time, sync))
        prev_config, prev_step = config, step
    out = []
    for config in sorted(set(steady) | set(warmup)):
        values = steady.get(config) or warmup[config]
        out.append(ThroughputObs(
            num_gpus=config[0], num_nodes=config[1], per_gpu_batch=config[2],
            step_time_s=float(statistics.median(v[0] for v in values)),
            sync_time_s=float(statistics.median(v[1] for v in values)),
        ))
    return tuple(out)
