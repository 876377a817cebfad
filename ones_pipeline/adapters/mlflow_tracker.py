"""MLflow tracking for training jobs: store setup, one resumable run per job, and the scheduler's read-back.

* ``ensure_store`` creates the database schema and the experiment once; safe from several processes.
* ``JobRun`` is the training step's side: one MLflow run per job, created on the first start and
  resumed on every restart (the run id lives in ``<state_dir>/mlflow_run_id``). Metrics are logged with
  ``step`` = samples done.
* ``read_progress`` is the scheduler's side: per job, samples and epochs done, loss/accuracy histories
  and steady-state step times per GPU configuration (``ThroughputObs``), read in one pass.

Only an explicit ``MlflowClient`` is used (never the fluent ``mlflow.*`` API), and no environment variable
is read or set: the tracking URI is always passed in. Allowed stores: ``sqlite``, ``http(s)`` servers,
``postgresql`` and ``mysql``. MLflow's file store (``file:``, plain paths) is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import os
import random
import re
import sqlite3
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy
from alembic.util import CommandError as AlembicCommandError  # mlflow's schema migrations
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from ones_pipeline.core.types import JOB_NAME_RE, ThroughputObs

log = logging.getLogger(__name__)

ALLOWED_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql")
_DB_SCHEMES = ("sqlite", "postgresql", "mysql")  # may carry a driver: ``postgresql+psycopg2://``

TAG_JOB = "ones.job"
TAG_GENERATION = "ones.generation"
TAG_RESTARTS = "ones.restarts"
TAG_CHANGED_PARAMS = "ones.changed_params"
RUN_ID_FILE = "mlflow_run_id"
END_STATUSES = ("FINISHED", "KILLED", "FAILED")

# MLflow's limits (mlflow.utils.validation, 3.17).
MAX_KEY_LENGTH = 250
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_EXPERIMENT_NAME_LENGTH = 500

# Metrics whose whole history read_progress reads; the others come from their latest value only.
PROGRESS_KEYS = ("samples", "epoch", "loss", "accuracy")
THROUGHPUT_KEYS = (
    "gpus", "num_nodes", "per_gpu_batch", "global_batch", "step_time_s", "sync_time_s", "samples_per_s",
)
HISTORY_KEYS = PROGRESS_KEYS + THROUGHPUT_KEYS

_SQLITE_TIMEOUT_S = 5.0  # a sensor tick should not hang on a busy writer for MLflow's default 20 s
_SQL_CHUNK = 900  # under SQLite's historical 999 bound-parameter limit


class TrackerError(ValueError):
    """A tracking URI or store that cannot be used; the message names the URI and the problem."""


# --------------------------------------------------------------------------- URIs and the store


def default_tracking_uri(base_dir: str | os.PathLike) -> str:
    """``sqlite:///<base_dir>/mlflow.db`` with ``base_dir`` made absolute."""
    return f"sqlite:///{(Path(base_dir).expanduser().resolve() / 'mlflow.db').as_posix()}"


def _scheme(tracking_uri: str) -> str:
    """The store kind of a URI (``sqlite``, ``http``, ``https``, ``postgresql``, ``mysql``), or TrackerError."""
    if not isinstance(tracking_uri, str) or not tracking_uri.strip():
        raise TrackerError(
            f"tracking URI {tracking_uri!r} is empty; use e.g. sqlite:///<dir>/mlflow.db or http://host:5000"
        )
    parts = urllib.parse.urlsplit(tracking_uri)
    scheme = parts.scheme.lower()
    base, _, driver = scheme.partition("+")
    if base in ("", "file") or (len(base) == 1 and os.name == "nt"):
        raise TrackerError(
            f"tracking URI {tracking_uri!r}: MLflow's file store is not allowed (it is in maintenance mode "
            f"since MLflow 3.13); use sqlite:///<dir>/mlflow.db or a tracking server URL. "
            f"Allowed schemes: {', '.join(ALLOWED_SCHEMES)}"
        )
    if base not in ALLOWED_SCHEMES or (driver and base not in _DB_SCHEMES):
        raise TrackerError(
            f"tracking URI {tracking_uri!r}: scheme {scheme!r} is not supported; allowed schemes: "
            f"{', '.join(ALLOWED_SCHEMES)} (the file store is not allowed)"
        )
    if base in ("http", "https") and not parts.hostname:
        raise TrackerError(f"tracking URI {tracking_uri!r}: no host name")
    return base


def _sqlite_path(tracking_uri: str) -> Path:
    """Database file of a ``sqlite:///`` URI (relative paths are relative to the working directory)."""
    try:
        database = sqlalchemy.engine.make_url(tracking_uri).database
    except sqlalchemy.exc.ArgumentError as exc:
        raise TrackerError(f"tracking URI {tracking_uri!r}: {exc}") from exc
    if not database or database == ":memory:" or database.startswith("file:"):
        raise TrackerError(
            f"tracking URI {tracking_uri!r}: an SQLite store needs a file path "
            f"(sqlite:///relative/mlflow.db or sqlite:////absolute/mlflow.db); in-memory databases are "
            f"not shared between the scheduler and the trainers"
        )
    return Path(database)


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, with a TrackerError naming the URI and the problem, when the store cannot be used.

    sqlite: the file (or the directory it will be created in) is writable. http(s): the server answers
    ``/health`` within ``timeout_s``. postgresql/mysql: a connection opens within ``timeout_s``.
    """
    kind = _scheme(tracking_uri)
    if kind == "sqlite":
        _check_sqlite_writable(tracking_uri, _sqlite_path(tracking_uri))
    elif kind in ("http", "https"):
        _check_http(tracking_uri, timeout_s)
    else:
        _check_database(tracking_uri, timeout_s)


def _check_sqlite_writable(tracking_uri: str, path: Path) -> None:
    if path.exists():
        if not path.is_file():
            raise TrackerError(f"tracking URI {tracking_uri!r}: {path} is not a file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise TrackerError(f"tracking URI {tracking_uri!r}: {path} is not readable and writable")
        with path.open("rb") as fh:
            header = fh.read(16)
        if header and header != b"SQLite format 3\x00":
            raise TrackerError(f"tracking URI {tracking_uri!r}: {path} is not an SQLite database")
        directory = path.parent
    else:
        directory = path.parent
        while not directory.exists() and directory != directory.parent:
            directory = directory.parent
        if not directory.is_dir():
            raise TrackerError(f"tracking URI {tracking_uri!r}: {directory} is not a directory")
    # SQLite writes its journal next to the database, so the directory must be writable too.
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TrackerError(f"tracking URI {tracking_uri!r}: directory {directory} is not writable")


def _check_http(tracking_uri: str, timeout_s: float) -> None:
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked)
            resp.read(64)
    except urllib.error.HTTPError as exc:
        # Any HTTP answer below 500 (e.g. 401 without credentials, 404 behind a proxy) means a server is there.
        if exc.code >= 500:
            raise TrackerError(f"tracking URI {tracking_uri!r}: server error {exc.code} from {url}") from exc
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackerError(
            f"tracking URI {tracking_uri!r}: server not reachable within {timeout_s:g} s ({reason})"
        ) from exc
    except Exception as exc:  # http.client errors such as RemoteDisconnected on a non-HTTP port
        raise TrackerError(f"tracking URI {tracking_uri!r}: no valid HTTP answer from {url} ({exc!r})") from exc


def _check_database(tracking_uri: str, timeout_s: float) -> None:
    try:
        engine = sqlalchemy.create_engine(
            tracking_uri, connect_args={"connect_timeout": max(1, int(math.ceil(timeout_s)))}
        )
    except ImportError as exc:
        raise TrackerError(
            f"tracking URI {tracking_uri!r}: its database driver is not installed ({exc.name or exc})"
        ) from exc
    except sqlalchemy.exc.ArgumentError as exc:
        raise TrackerError(f"tracking URI {tracking_uri!r}: {exc}") from exc
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise TrackerError(f"tracking URI {tracking_uri!r}: cannot connect ({exc.__class__.__name__}: "
                           f"{str(exc).splitlines()[0]})") from exc
    finally:
        engine.dispose()


_EXPERIMENT_IDS: dict[tuple[str, str], str] = {}


def ensure_store(tracking_uri: str, experiment: str) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    Safe to call from several processes at once. For SQLite an exclusive lock on ``<db>.init-lock``
    serialises the first-time schema creation: MLflow's migrations race otherwise, and (measured with
    4 processes on a fresh file) the losers leave a half-migrated schema that no retry repairs. What can
    still race (the experiment created by another process, a busy database) is retried. Idempotent;
    the experiment id is cached per process.
    """
    if not isinstance(experiment, str) or not experiment.strip() or len(experiment) > MAX_EXPERIMENT_NAME_LENGTH:
        raise TrackerError(
            f"experiment name {experiment!r} must be a non-empty string of at most "
            f"{MAX_EXPERIMENT_NAME_LENGTH} characters"
        )
    cached = _EXPERIMENT_IDS.get((tracking_uri, experiment))
    if cached is not None:
        return cached
    kind = _scheme(tracking_uri)
    artifact_location = None
    if kind == "sqlite":
        path = _sqlite_path(tracking_uri)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerError(f"tracking URI {tracking_uri!r}: cannot create {path.parent} ({exc})") from exc
        check_reachable(tracking_uri)
        # Artifacts beside the database rather than in ./mlruns of whatever directory a process runs in.
        artifact_location = (path.parent.resolve() / "mlartifacts").as_uri()
        attempts = 6
    else:
        check_reachable(tracking_uri)  # MLflow's REST client would retry for minutes on a dead server
        attempts = 3
    with _init_lock(tracking_uri if kind == "sqlite" else None):
        for attempt in range(attempts):
            try:
                client = MlflowClient(tracking_uri=tracking_uri)
                exp_id = _get_or_create_experiment(client, experiment, artifact_location)
                break
            except (MlflowException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, AlembicCommandError) as exc:
                if attempt == attempts - 1:
                    hint = (
                        "; if a first-time schema creation was interrupted or raced (another process that "
                        "did not use ensure_store), the schema is half-built: move the file away, or run "
                        "`mlflow db upgrade` on it" if kind == "sqlite" else ""
                    )
                    first_line = str(exc).splitlines()[0] if str(exc) else ""
                    raise TrackerError(
                        f"tracking URI {tracking_uri!r}: cannot set up experiment {experiment!r} "
                        f"({exc.__class__.__name__}: {first_line}){hint}"
                    ) from exc
                log.info("MLflow store %s not ready (%s); retrying", tracking_uri, exc)
                time.sleep(0.1 * 2**attempt * (1 + random.random()))
    _EXPERIMENT_IDS[(tracking_uri, experiment)] = exp_id
    return exp_id


@contextlib.contextmanager
def _init_lock(tracking_uri: str | None) -> Iterator[None]:
    """An exclusive lock on ``<db>.init-lock`` for SQLite stores; no-op for servers."""
    if tracking_uri is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: rely on the retries alone
        yield
        return
    lock_path = _sqlite_path(tracking_uri)
    lock_path = lock_path.with_name(lock_path.name + ".init-lock")
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _get_or_create_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = client.get_experiment_by_name(name)  # another process won the race
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        log.warning("MLflow experiment %r (id %s) was deleted; restoring it", name, exp.experiment_id)
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


# --------------------------------------------------------------------------- the training step's run


class JobRun:
    """One MLflow run per job, resumed across restarts. Build it with ``JobRun.open``."""

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, job: str, generation: int,
                 restarts: int, resumed: bool) -> None:
        self.client = client
        self._run_id = run_id
        self.experiment_id = experiment_id
        self.job = job
        self.generation = generation
        self.restarts = restarts
        self.resumed = resumed

    @property
    def run_id(self) -> str:
        return self._run_id

    def __repr__(self) -> str:
        return (f"JobRun(job={self.job!r}, run_id={self._run_id!r}, generation={self.generation}, "
                f"restarts={self.restarts})")

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, job_name: str, state_dir: str | os.PathLike,
             params: Mapping[str, Any] | Any, generation: int) -> JobRun:
        """Resume the job's run (id in ``<state_dir>/mlflow_run_id``) or create it.

        A new run gets ``params`` (a mapping or a dataclass such as a ``JobSpec``; nested values are
        flattened to dotted keys, values stringified and truncated to MLflow's limits) and the tag
        ``ones.job``. A resumed run is set back to RUNNING; params it lacks are added, and keys whose
        value changed are listed in the tag ``ones.changed_params`` (MLflow params are immutable).
        Every open sets ``ones.generation`` and ``ones.restarts`` (opens - 1).
        """
        if not isinstance(job_name, str) or not JOB_NAME_RE.match(job_name):
            raise ValueError(f"job name {job_name!r} must match {JOB_NAME_RE.pattern}")
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"job {job_name}: generation must be an integer >= 0, got {generation!r}")
        exp_id = ensure_store(tracking_uri, experiment)
        client = MlflowClient(tracking_uri=tracking_uri)
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        id_file = state / RUN_ID_FILE
        wanted = _flatten_params(params)

        run = _resumable_run(client, id_file, exp_id, job_name)
        if run is None:
            run = client.create_run(exp_id, tags={TAG_JOB: job_name}, run_name=job_name)
            run_id = run.info.run_id
            _log_params(client, run_id, wanted)
            _write_atomic(id_file, run_id + "\n")
            restarts, resumed, extra_tags = 0, False, {}
        else:
            run_id = run.info.run_id
            client.update_run(run_id, status="RUNNING")
            try:
                restarts = int(run.data.tags.get(TAG_RESTARTS, "-1")) + 1
            except ValueError:
                restarts = 0
            have = run.data.params
            _log_params(client, run_id, {k: v for k, v in wanted.items() if k not in have})
            changed = sorted(k for k, v in wanted.items() if k in have and have[k] != v)
            extra_tags = {TAG_CHANGED_PARAMS: json.dumps(changed)} if changed else {}
            if changed:
                log.warning("job %s: params %s changed since run %s started; kept the first values, "
                            "listed in tag %s", job_name, changed, run_id, TAG_CHANGED_PARAMS)
            resumed = True
        job_run = cls(client, run_id, exp_id, job_name, generation, restarts, resumed)
        job_run.set_tags({TAG_JOB: job_name, TAG_GENERATION: generation, TAG_RESTARTS: restarts, **extra_tags})
        return job_run

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` (= samples done) in one ``log_batch``; None values are skipped."""
        if isinstance(step, bool) or int(step) != step or step < 0:
            raise ValueError(f"job {self.job}: step must be an integer >= 0 (samples done), got {step!r}")
        ts = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), ts, int(step)) for k, v in metrics.items() if v is not None]
        for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._run_id, metrics=chunk, synchronous=True)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(_key(k), _truncate(_stringify(v), MAX_TAG_VAL_LENGTH)) for k, v in tags.items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self._run_id, tags=chunk, synchronous=True)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED (job done), KILLED (preempted; it will be resumed) or FAILED."""
        if status not in END_STATUSES:
            raise ValueError(f"job {self.job}: finish status must be one of {END_STATUSES}, got {status!r}")
        self.client.set_terminated(self._run_id, status=status)


def _resumable_run(client: MlflowClient, id_file: Path, exp_id: str, job_name: str):
    """The run recorded in ``id_file`` when it still exists in this experiment, else None."""
    try:
        run_id = id_file.read_text().strip()
    except FileNotFoundError:
        return None
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        log.warning("%s names MLflow run %s, which no longer exists; starting a new run", id_file, run_id)
        return None
    owner = run.data.tags.get(TAG_JOB)
    if owner not in (None, job_name):
        raise TrackerError(
            f"{id_file} names MLflow run {run_id} of job {owner!r}, not {job_name!r}; give each job its "
            f"own state directory"
        )
    if run.info.lifecycle_stage != "active" or run.info.experiment_id != exp_id:
        log.warning("%s names MLflow run %s, which is deleted or in another experiment (%s); starting a "
                    "new run", id_file, run_id, run.info.experiment_id)
        return None
    return run


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename durable where directories can be fsynced
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


_BAD_KEY_CHARS = re.compile(r"[^\w\-. /]")


def _key(key: str) -> str:
    """An MLflow-valid key: letters, digits, ``_ - . / space``, at most 250 characters."""
    return _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY_LENGTH]


def _stringify(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return json.dumps(list(value) if isinstance(value, (set, frozenset)) else value, default=str)
    return str(value)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten_params(params: Mapping[str, Any] | Any, prefix: str = "") -> dict[str, str]:
    """``{"stopping": {"kind": "epochs"}}`` -> ``{"stopping.kind": "epochs"}``, values stringified."""
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        params = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping or a dataclass, got {type(params).__name__}")
    out: dict[str, str] = {}
    for name, value in params.items():
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping) and value:
            out.update(_flatten_params(value, key + "."))
        else:
            out[_key(key)] = _truncate(_stringify(value), MAX_PARAM_VAL_LENGTH)
    return out


def _log_params(client: MlflowClient, run_id: str, params: Mapping[str, str]) -> None:
    items = [Param(k, v) for k, v in params.items()]
    for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=chunk, synchronous=True)


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i: i + size]


# --------------------------------------------------------------------------- the scheduler's read-back


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


# A metric's points as (step, value), in logging order (timestamp, then step). NaN is float("nan").
_Series = list[tuple[int, float]]


def read_progress(tracking_uri: str, experiment: str, jobs: Iterable[str] | None = None, *,
                  method: str = "auto") -> dict[str, JobProgress]:
    """Progress of every job (or of ``jobs``) with a run in ``experiment``, keyed by job name.

    A job with several runs (e.g. its state directory was lost) is read from the newest one. Jobs without
    a run are absent. A missing store or experiment gives ``{}`` (nothing is created).

    ``method``: ``"sql"`` reads an SQLite store's tables directly, read-only, in one transaction (a fixed
    handful of queries whatever the number of jobs); ``"client"`` uses ``MlflowClient.search_runs`` plus
    one ``get_metric_history`` per run and metric (the only way for a tracking server); ``"auto"`` picks
    ``sql`` for SQLite, falling back to ``client`` if the direct read fails (e.g. a schema change).
    """
    kind = _scheme(tracking_uri)
    wanted = None if jobs is None else sorted(set(jobs))
    if wanted == []:
        return {}
    if method not in ("auto", "sql", "client"):
        raise ValueError(f"method must be 'auto', 'sql' or 'client', got {method!r}")
    if method == "sql" and kind != "sqlite":
        raise TrackerError(f"tracking URI {tracking_uri!r}: method='sql' needs an sqlite store")
    if kind == "sqlite" and method in ("auto", "sql"):
        try:
            return _read_sqlite(_sqlite_path(tracking_uri), experiment, wanted)
        except sqlite3.Error as exc:
            if method == "sql":
                raise
            log.warning("direct read of %s failed (%s); using the MLflow client", tracking_uri, exc)
    return _read_client(tracking_uri, experiment, wanted)


def _read_sqlite(path: Path, experiment: str, jobs: list[str] | None) -> dict[str, JobProgress]:
    """``read_progress`` straight from MLflow's tables (runs, tags, metrics, latest_metrics; unchanged
    from MLflow 2.x to 3.17). The cost is in moving rows into Python, so the joins run in SQLite and
    only the loss/accuracy histories come over point by point."""
    if not path.is_file():
        return {}
    # Read-only: a sensor tick must never create or migrate the store.
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=_SQLITE_TIMEOUT_S)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"experiments", "runs", "tags", "metrics", "latest_metrics"} <= tables:
            return {}
        con.execute("BEGIN")  # one read transaction: every query sees the same snapshot
        return _query_sqlite(con, experiment, jobs)
    finally:
        con.close()


def _query_sqlite(con: sqlite3.Connection, experiment: str, jobs: list[str] | None) -> dict[str, JobProgress]:
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
        for chunk in _chunks(jobs, _SQL_CHUNK):
            runs += con.execute(f"{query} AND t.value IN ({_marks(chunk)})", (TAG_JOB, row[0], *chunk)).fetchall()
    newest: dict[str, tuple] = {}
    for run_uuid, status, start_ms, job in runs:
        if job not in newest or (start_ms or 0) > (newest[job][2] or 0):
            newest[job] = (run_uuid, status, start_ms)
    if not newest:
        return {}
    run_ids = [v[0] for v in newest.values()]
    tags: dict[str, dict[str, str]] = {r: {} for r in run_ids}
    latest: dict[str, dict[str, float]] = {r: {} for r in run_ids}
    current: dict[str, dict[str, tuple[int, float]]] = {r: {} for r in run_ids}
    for chunk in _chunks(run_ids, _SQL_CHUNK):
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

    series: dict[str, dict[str, _Series]] = {r: {} for r in run_ids}

    def read_series(key: str, ids: list[str]) -> None:
        for chunk in _chunks(ids, _SQL_CHUNK):
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

    for key in ("loss", "accuracy"):
        read_series(key, [r for r in run_ids if key in latest[r]])

    # Throughput: each `gpus` point joined, in SQLite, with the metrics logged in the same batch (same
    # timestamp and step; the primary-key index makes each join a seek). Runs whose points do not join
    # (metrics logged one call each) are joined in Python from their series instead.
    records: dict[str, list[_Record]] = {r: [] for r in run_ids}
    with_gpus = [r for r in run_ids if "gpus" in latest[r]]
    direct = [r for r in with_gpus if {"step_time_s", "per_gpu_batch"} <= latest[r].keys()]
    derived = [r for r in with_gpus if not {"step_time_s", "per_gpu_batch"} <= latest[r].keys()]
    unjoined: set[str] = set()
    for ids, aliases in ((direct, _JOIN_DIRECT), (derived, _JOIN_DIRECT + _JOIN_DERIVE)):
        joins = " ".join(
            f"LEFT JOIN metrics {a} ON {a}.key = '{key}' AND {a}.timestamp = g.timestamp AND {a}.step = g.step "
            f"AND {a}.run_uuid = g.run_uuid" for a, key in aliases
        )
        values = ", ".join(_VALUE.format(a) for a, _ in (("g", "gpus"), *aliases))
        for chunk in _chunks(ids, _SQL_CHUNK):
            for run_uuid, step, gpus, *rest in con.execute(
                f"SELECT g.run_uuid, g.step, {values} FROM metrics g {joins} "
                f"WHERE g.key = 'gpus' AND g.run_uuid IN ({_marks(chunk)}) ORDER BY g.timestamp, g.step",
                chunk,
            ):
                rec = _make_record(step, math.nan if gpus is None else gpus, *rest)
                if rec[2] is None or rec[4] is None:
                    unjoined.add(run_uuid)
                records[run_uuid].append(rec)
    for key in THROUGHPUT_KEYS:
        # As in the client path: runs that log step_time_s and per_gpu_batch never derive them.
        read_series(key, [r for r in unjoined if key in latest[r] and not (
            key in _FALLBACK_KEYS and {"step_time_s", "per_gpu_batch"} <= latest[r].keys())])
    for run_uuid in unjoined:
        records[run_uuid] = _series_records(series[run_uuid])
    con.rollback()
    return {
        job: _build_progress(job, run_uuid, status, start_ms, tags[run_uuid], latest[run_uuid],
                             current[run_uuid], series[run_uuid], records[run_uuid])
        for job, (run_uuid, status, start_ms) in newest.items()
    }


_VALUE = "CASE WHEN {0}.is_nan THEN NULL ELSE {0}.value END"  # NaN is stored as 0 with is_nan set
_JOIN_DIRECT = (("b", "per_gpu_batch"), ("n", "num_nodes"), ("t", "step_time_s"), ("s", "sync_time_s"))
_JOIN_DERIVE = (("gb", "global_batch"), ("r", "samples_per_s"))
_FALLBACK_KEYS = ("global_batch", "samples_per_s")

# One throughput measurement: (step, gpus, per_gpu_batch, num_nodes, step_time_s, sync_time_s), None where
# not logged.
_Record = tuple[int, float, "float | None", "float | None", "float | None", "float | None"]


def _marks(items: Sequence) -> str:
    return ", ".join("?" * len(items))


def _read_client(tracking_uri: str, experiment: str, jobs: list[str] | None) -> dict[str, JobProgress]:
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        return {}
    # MLflow's search has no IN for tags: one job is filtered by the store, several in Python.
    if jobs is not None and len(jobs) == 1 and JOB_NAME_RE.match(jobs[0]):  # no quotes to escape
        filter_string = f"tags.`{TAG_JOB}` = '{jobs[0]}'"
    else:
        filter_string = f"tags.`{TAG_JOB}` LIKE '%'"
    wanted = None if jobs is None else set(jobs)
    newest: dict[str, Any] = {}
    page_token = None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000,
                                  page_token=page_token)
        for run in page:
            job = run.data.tags.get(TAG_JOB)
            if job is None or (wanted is not None and job not in wanted):
                continue
            if job not in newest or (run.info.start_time or 0) > (newest[job].info.start_time or 0):
                newest[job] = run
        page_token = page.token
        if not page_token:
            break
    tasks = []
    for job, run in newest.items():
        have = run.data.metrics
        for key in HISTORY_KEYS:
            if key not in have or (key in THROUGHPUT_KEYS and "gpus" not in have):
                continue
            if key in _FALLBACK_KEYS and {"step_time_s", "per_gpu_batch"} <= have.keys():
                continue
            tasks.append((job, key))

    def history(task: tuple[str, str]) -> _Series:
        job, key = task
        points = sorted(client.get_metric_history(newest[job].info.run_id, key),
                        key=lambda m: (m.timestamp, m.step))
        return [(m.step, m.value) for m in points]

    if _scheme(tracking_uri) in ("http", "https") and len(tasks) > 1:
        with ThreadPoolExecutor(max_workers=8) as pool:  # N x M round trips: overlap their latency
            histories = list(pool.map(history, tasks))
    else:
        histories = [history(t) for t in tasks]
    series: dict[str, dict[str, _Series]] = {job: {} for job in newest}
    for (job, key), points in zip(tasks, histories, strict=False):
        series[job][key] = points
    out = {}
    for job, run in newest.items():
        by_key = series[job]
        current = {key: by_key[key][-1] for key in ("samples", "epoch") if by_key.get(key)}
        out[job] = _build_progress(job, run.info.run_id, run.info.status, run.info.start_time, run.data.tags,
                                   dict(run.data.metrics), current, by_key, _series_records(by_key))
    return out


def _build_progress(job: str, run_id: str, status: str, start_ms: int | None, tags: Mapping[str, str],
                    latest: Mapping[str, float], current: Mapping[str, tuple[int, float]],
                    series: Mapping[str, _Series], records: list[_Record]) -> JobProgress:
    """``latest``: MLflow's latest value per key (at the highest step); ``current``: (step, value) of the
    last logged samples/epoch; ``series``: loss/accuracy points in logging order; ``records``: throughput
    measurements in logging order."""
    metrics = dict(latest)
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
        job=job,
        run_id=run_id,
        status=str(status),
        samples_done=samples_done,
        epochs_done=float(current["epoch"][1]) if "epoch" in current else 0.0,
        metrics=metrics,
        throughput_obs=_throughput_obs(records),
        loss_history=loss,
        accuracy_history=accuracy,
        restarts=_int_tag(tags, TAG_RESTARTS),
        generation=_int_tag(tags, TAG_GENERATION),
        start_time_s=None if start_ms is None else start_ms / 1000.0,
    )


def _int_tag(tags: Mapping[str, str], key: str) -> int:
    try:
        return int(tags.get(key, 0))
    except ValueError:
        return 0


def _current_trajectory(points: _Series) -> tuple[tuple[float, float], ...]:
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


def _by_occurrence(points: _Series | None) -> dict[tuple[int, int], float]:
    """{(step, k): value} where k counts earlier points at the same step (0 unless a step was re-logged)."""
    out: dict[tuple[int, int], float] = {}
    for step, value in points or ():
        k = 0
        while (step, k) in out:
            k += 1
        out[(step, k)] = value
    return out


def _series_records(series: Mapping[str, _Series]) -> list[_Record]:
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
    out: list[_Record] = []
    seen: dict[int, int] = {}
    for step, gpus in gpus_points:
        k = seen.get(step, 0)
        seen[step] = k + 1
        out.append(_make_record(step, gpus, *(f.get((step, k)) for f in fields)))
    return out


def _make_record(step: int, gpus: float, per_gpu: float | None, nodes: float | None, step_time: float | None,
                 sync: float | None, global_batch: float | None = None, rate: float | None = None) -> _Record:
    """A throughput record; a missing step time is ``global_batch / samples_per_s``, a missing per-GPU
    batch ``ceil(global_batch / gpus)``."""
    if step_time is None and global_batch and rate:
        step_time = global_batch / rate
    if per_gpu is None and global_batch and math.isfinite(gpus) and gpus >= 1:
        per_gpu = float(math.ceil(global_batch / round(gpus)))
    return step, gpus, per_gpu, nodes, step_time, sync


def _throughput_obs(records: Sequence[_Record]) -> tuple[ThroughputObs, ...]:
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
