"""The fast read of an SQLite store: MLflow's own tables, queried directly, read-only, in one transaction.

A fixed handful of queries whatever the number of jobs (the client path makes one round trip per run and
metric). The cost is in moving rows into Python, so the joins run in SQLite and only the loss/accuracy
histories come over point by point.

MLflow's tables are not an API: this SQL is run only on a store whose schema revision
(``alembic_version.version_num``) is in ``VERIFIED_REVISIONS``, the revisions it was checked against
(the parity tests compare it with the client path). A store at another revision raises
``UnverifiedSchema``; ``read_progress`` then reads through the MLflow client.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Collection
from pathlib import Path

from ones_pipeline.adapters.mlflow.schema import (
    FALLBACK_KEYS,
    TAG_GENERATION,
    TAG_JOB,
    TAG_RESTARTS,
    THROUGHPUT_KEYS,
    Record,
    RunRows,
    Series,
    chunks,
    logs_step_time,
    make_record,
)

# Head revision of MLflow 3.17.2's migrations (db_migrations/versions/dc11669786a5_...): what a fresh
# ensure_store creates. Add a revision only after the parity tests pass against a store at it.
VERIFIED_REVISIONS = frozenset({"dc11669786a5"})
REQUIRED_TABLES = ("experiments", "runs", "tags", "metrics", "latest_metrics")

_SQLITE_TIMEOUT_S = 5.0  # a sensor tick should not hang on a busy writer for MLflow's default 20 s
_SQL_CHUNK = 900  # under SQLite's historical 999 bound-parameter limit

_VALUE = "CASE WHEN {0}.is_nan THEN NULL ELSE {0}.value END"  # NaN is stored as 0 with is_nan set
_JOIN_DIRECT = (("b", "per_gpu_batch"), ("n", "num_nodes"), ("t", "step_time_s"), ("s", "sync_time_s"))
_JOIN_DERIVE = (("gb", "global_batch"), ("r", "samples_per_s"))


class UnverifiedSchema(Exception):
    """The store's schema revision is unknown to this SQL, or cannot be read; the message says which."""


def fast_path_usable(path: str | os.PathLike, verified: Collection[str] | None = None) -> tuple[bool, str]:
    """Whether ``read_runs`` would read the SQLite database at ``path``, and why (a sentence naming the
    schema revision). ``verified``: the revisions to accept, ``VERIFIED_REVISIONS`` by default."""
    path = Path(path)
    if not path.is_file():
        return False, f"{path} is not a file"
    try:
        con = _connect(path)
        try:
            missing = _missing_tables(con)
            if missing:
                return False, f"{path} has no MLflow tables {', '.join(missing)}"
            revision = _check_schema(con, path, verified)
        finally:
            con.close()
    except UnverifiedSchema as exc:
        return False, str(exc)
    except sqlite3.Error as exc:
        return False, f"{path} cannot be read ({exc.__class__.__name__}: {exc})"
    return True, f"{path}: schema revision {revision!r} is one this SQL was verified against"


def read_runs(path: Path, experiment: str, jobs: list[str] | None) -> dict[str, RunRows]:
    """The newest run of every job (or of ``jobs``) in ``experiment``, keyed by job name.

    ``{}`` when the file, its MLflow tables, the experiment or the runs are missing (nothing is created).
    Raises ``UnverifiedSchema`` for a schema revision outside ``VERIFIED_REVISIONS``, ``sqlite3.Error``
    when a query fails.
    """
    if not path.is_file():
        return {}
    con = _connect(path)
    try:
        if _missing_tables(con):
            return {}
        con.execute("BEGIN")  # one read transaction: every query, the revision check too, sees one snapshot
        _check_schema(con, path)
        return _query_tables(con, experiment, jobs)
    finally:
        con.close()


def _connect(path: Path) -> sqlite3.Connection:
    # Read-only: a sensor tick must never create or migrate the store.
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=_SQLITE_TIMEOUT_S)


def _missing_tables(con: sqlite3.Connection) -> list[str]:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return [t for t in REQUIRED_TABLES if t not in tables]


def _check_schema(con: sqlite3.Connection, path: Path, verified: Collection[str] | None = None) -> str:
    """The store's schema revision when it is in ``verified`` (``VERIFIED_REVISIONS`` when None, looked up
    at each call), else UnverifiedSchema."""
    verified = VERIFIED_REVISIONS if verified is None else verified
    if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'").fetchone():
        raise UnverifiedSchema(f"{path}: no alembic_version table, so its schema revision is unknown")
    # Other errors (a busy database) are sqlite3.Error, as for any query here.
    revisions = sorted({str(r[0]) for r in con.execute("SELECT version_num FROM alembic_version")})
    if len(revisions) != 1:
        raise UnverifiedSchema(
            f"{path}: alembic_version holds {len(revisions)} revisions ({', '.join(revisions) or 'none'}), "
            f"not one"
        )
    if revisions[0] not in verified:
        raise UnverifiedSchema(
            f"{path}: schema revision {revisions[0]!r} is not one this SQL was verified against "
            f"({', '.join(sorted(verified)) or 'none'})"
        )
    return revisions[0]


def _marks(items: Collection) -> str:
    return ", ".join("?" * len(items))


def _query_tables(con: sqlite3.Connection, experiment: str, jobs: list[str] | None) -> dict[str, RunRows]:
    newest = _newest_runs(con, experiment, jobs)
    if not newest:
        return {}
    run_ids = [v[0] for v in newest.values()]
    tags, latest, current = _tags_and_latest(con, run_ids)
    series: dict[str, dict[str, Series]] = {r: {} for r in run_ids}
    for key in ("loss", "accuracy"):
        _read_series(con, series, key, [r for r in run_ids if key in latest[r]])
    records, unjoined = _joined_records(con, run_ids, latest)
    for key in THROUGHPUT_KEYS:
        # As in the client path: runs that log step_time_s and per_gpu_batch never derive them.
        _read_series(con, series, key, [r for r in unjoined if key in latest[r] and not (
            key in FALLBACK_KEYS and logs_step_time(latest[r]))])
    con.rollback()
    return {
        job: RunRows(job=job, run_id=run_uuid, status=status, start_ms=start_ms, tags=tags[run_uuid],
                     latest=latest[run_uuid], current=current[run_uuid], series=series[run_uuid],
                     records=None if run_uuid in unjoined else records[run_uuid])
        for job, (run_uuid, status, start_ms) in newest.items()
    }


def _newest_runs(con: sqlite3.Connection, experiment: str, jobs: list[str] | None) -> dict[str, tuple]:
    """{job: (run_uuid, status, start_ms)} of each job's newest active run in the active experiment."""
    row = con.execute(
        "SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = 'active'", (experiment,)
    ).fetchone()
    if row is None:
        return {}
    query = (
        "SELECT r.run_uuid, r.status, r.start_time, t.value FROM runs r "
        "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = ? "
        "WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'"
    )
    runs: list[tuple] = []
    if jobs is None:
        runs = con.execute(query, (TAG_JOB, row[0])).fetchall()
    else:
        for chunk in chunks(jobs, _SQL_CHUNK):
            runs += con.execute(f"{query} AND t.value IN ({_marks(chunk)})", (TAG_JOB, row[0], *chunk)).fetchall()
    newest: dict[str, tuple] = {}
    for run_uuid, status, start_ms, job in runs:
        if job not in newest or (start_ms or 0) > (newest[job][2] or 0):
            newest[job] = (run_uuid, status, start_ms)
    return newest


def _tags_and_latest(con: sqlite3.Connection, run_ids: list[str]) -> tuple[dict, dict, dict]:
    """Per run: the generation/restarts tags, MLflow's latest value of every metric, and (step, value) of
    the last logged samples/epoch."""
    tags: dict[str, dict[str, str]] = {r: {} for r in run_ids}
    latest: dict[str, dict[str, float]] = {r: {} for r in run_ids}
    current: dict[str, dict[str, tuple[int, float]]] = {r: {} for r in run_ids}
    for chunk in chunks(run_ids, _SQL_CHUNK):
        marks = _marks(chunk)
        for run_uuid, key, value in con.execute(
            f"SELECT run_uuid, key, value FROM tags WHERE key IN (?, ?) AND run_uuid IN ({marks})",
            (TAG_GENERATION, TAG_RESTARTS, *chunk),
        ):
            tags[run_uuid][key] = value
        for run_uuid, key, value, is_nan in con.execute(
            f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({marks})", chunk
        ):
            latest[run_uuid][key] = math.nan if is_nan else value
        # Current samples/epoch: the last point logged (latest_metrics keeps the highest step, which is stale
        # after a restart rewound to an older checkpoint). Several points in the same millisecond: the
        # highest step wins.
        for run_uuid, key, step, value in con.execute(
            f"SELECT m.run_uuid, m.key, m.step, {_VALUE.format('m')} FROM metrics m JOIN ("
            f"  SELECT run_uuid, key, MAX(timestamp) AS ts FROM metrics"
            f"  WHERE key IN ('samples', 'epoch') AND run_uuid IN ({marks}) GROUP BY run_uuid, key"
            f") last ON m.key = last.key AND m.timestamp = last.ts AND m.run_uuid = last.run_uuid",
            chunk,
        ):
            have = current[run_uuid].get(key)
            if have is None or step > have[0]:
                current[run_uuid][key] = (step, math.nan if value is None else value)
    return tags, latest, current


def _read_series(con: sqlite3.Connection, series: dict[str, dict[str, Series]], key: str, ids: list[str]) -> None:
    """Append the history of metric ``key`` of runs ``ids`` to ``series[run][key]``, in logging order."""
    for chunk in chunks(ids, _SQL_CHUNK):
        # The primary-key index (key, timestamp, step, run_uuid, value, is_nan) gives the rows in
        # logging order with no sort and no table lookups.
        for run_uuid, step, value in con.execute(
            f"SELECT run_uuid, step, {_VALUE.format('metrics')} FROM metrics "
            f"WHERE key = ? AND run_uuid IN ({_marks(chunk)}) ORDER BY timestamp, step",
            (key, *chunk),
        ):
            by_key = series[run_uuid]
            points = by_key.get(key)
            if points is None:
                points = by_key[key] = []
            points.append((step, math.nan if value is None else value))


def _joined_records(con: sqlite3.Connection, run_ids: list[str], latest: dict[str, dict[str, float]]
                    ) -> tuple[dict[str, list[Record]], set[str]]:
    """Throughput records per run, and the runs whose records did not join.

    Each ``gpus`` point is joined, in SQLite, with the metrics logged in the same batch (same timestamp
    and step; the primary-key index makes each join a seek). Runs whose points do not join (metrics logged
    one call each) are returned as unjoined: the reader joins them from their series instead.
    """
    records: dict[str, list[Record]] = {r: [] for r in run_ids}
    with_gpus = [r for r in run_ids if "gpus" in latest[r]]
    direct = [r for r in with_gpus if logs_step_time(latest[r])]
    derived = [r for r in with_gpus if not logs_step_time(latest[r])]
    unjoined: set[str] = set()
    for ids, aliases in ((direct, _JOIN_DIRECT), (derived, _JOIN_DIRECT + _JOIN_DERIVE)):
        joins = " ".join(
            f"LEFT JOIN metrics {a} ON {a}.key = '{key}' AND {a}.timestamp = g.timestamp AND {a}.step = g.step "
            f"AND {a}.run_uuid = g.run_uuid" for a, key in aliases
        )
        values = ", ".join(_VALUE.format(a) for a, _ in (("g", "gpus"), *aliases))
        for chunk in chunks(ids, _SQL_CHUNK):
            for run_uuid, step, gpus, *rest in con.execute(
                f"SELECT g.run_uuid, g.step, {values} FROM metrics g {joins} "
                f"WHERE g.key = 'gpus' AND g.run_uuid IN ({_marks(chunk)}) ORDER BY g.timestamp, g.step",
                chunk,
            ):
                rec = make_record(step, math.nan if gpus is None else gpus, *rest)
                if rec[2] is None or rec[4] is None:
                    unjoined.add(run_uuid)
                records[run_uuid].append(rec)
    return records, unjoined
