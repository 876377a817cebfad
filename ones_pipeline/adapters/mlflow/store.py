"""The MLflow store: which tracking URIs are allowed, whether one can be used, and its one-time set-up.

Allowed stores: ``sqlite``, ``http(s)`` servers, ``postgresql`` and ``mysql``. MLflow's file store
(``file:``, plain paths) is refused. No environment variable is read or set: the tracking URI is always
passed in.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy
from alembic.util import CommandError as AlembicCommandError  # mlflow's schema migrations
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

ALLOWED_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql")
_DB_SCHEMES = ("sqlite", "postgresql", "mysql")  # may carry a driver: ``postgresql+psycopg2://``
MAX_EXPERIMENT_NAME_LENGTH = 500  # MLflow's limit (mlflow.utils.validation, 3.17)


class TrackerError(ValueError):
    """A tracking URI or store that cannot be used; the message names the URI and the problem."""


# --------------------------------------------------------------------------- URIs


def default_tracking_uri(base_dir: str | os.PathLike) -> str:
    """``sqlite:///<base_dir>/mlflow.db`` with ``base_dir`` made absolute."""
    return f"sqlite:///{(Path(base_dir).expanduser().resolve() / 'mlflow.db').as_posix()}"


# The UI's route to a run. MLflow 3.17's UI opens in its GenAI view in a browser that never chose otherwise
# (a ``mlflow.workflowType`` browser setting that overrides the experiment's ``mlflow.experimentKind`` tag);
# the query parameter opens the run in the model-training view.
_RUN_ROUTE = "#/experiments/{experiment}/runs/{run}?workflowType=machine_learning"


DEFAULT_UI_URL = "http://127.0.0.1:5000"  # `mlflow ui`'s own default address
# How to open a UI on a database store: MLflow's app with its mappers configured first (``ui_app``: `mlflow ui` alone
# broke every model-registry request once a run page had been opened).
UI_COMMAND = "mlflow ui --app-name ones --backend-store-uri"
UI_URL_ENV = "ONES_MLFLOW_UI_URL"  # the environment's ``mlflow.ui_url``, passed to training steps


def ui_base(tracking_uri: str, ui_url: str | None = None) -> str:
    """The MLflow UI's address: ``ui_url`` when set, the tracking server itself for an http(s) store, else
    `mlflow ui`'s default address."""
    if ui_url:
        return ui_url.rstrip("/")
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return DEFAULT_UI_URL


def run_link(tracking_uri: str, run_id: str, experiment_id: str | None = None, address: bool = True,
             ui_url: str | None = None) -> str:
    """Where to look at a run: for an http(s) store, a URL into its MLflow UI (experiment ``0``, MLflow's
    default, when ``experiment_id`` is not given: the UI shows the run all the same); for any other store,
    how to open a UI on it: ``run <id> in <uri> (mlflow ui --app-name ones --backend-store-uri <uri>, then
    <ui>/#/...)``, without the address when ``address`` is false (a narrow table cell). The UI's address:
    ``ui_url``, else ``$ONES_MLFLOW_UI_URL``, else the http(s) store itself or `mlflow ui`'s
    http://127.0.0.1:5000 (``ui_base``)."""
    route = _RUN_ROUTE.format(experiment=experiment_id or "0", run=run_id)
    base = ui_base(tracking_uri, ui_url or os.environ.get(UI_URL_ENV))
    if tracking_uri.startswith(("http://", "https://")):
        return f"{base}/{route}"
    then = f", then {base}/{route}" if address else ""
    return f"run {run_id} in {tracking_uri} ({UI_COMMAND} {tracking_uri}{then})"


def store_scheme(tracking_uri: str) -> str:
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


def sqlite_path(tracking_uri: str) -> Path:
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


# --------------------------------------------------------------------------- reachability


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, with a TrackerError naming the URI and the problem, when the store cannot be used.

    sqlite: the file (or the directory it will be created in) is writable. http(s): the server answers
    ``/health`` within ``timeout_s``. postgresql/mysql: a connection opens within ``timeout_s``.
    """
    kind = store_scheme(tracking_uri)
    if kind == "sqlite":
        _check_sqlite_writable(tracking_uri, sqlite_path(tracking_uri))
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
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # scheme checked by store_scheme
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


# --------------------------------------------------------------------------- schema and experiment


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
    kind = store_scheme(tracking_uri)
    artifact_location = None
    if kind == "sqlite":
        path = sqlite_path(tracking_uri)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackerError(f"tracking URI {tracking_uri!r}: cannot create {path.parent} ({exc})") from exc
        check_reachable(tracking_uri)
        # Artifacts beside the database rather than in ./mlruns of whatever directory a process runs in.
        artifact_location = (path.parent.resolve() / "mlartifacts").as_uri()
    else:
        check_reachable(tracking_uri)  # MLflow's REST client would retry for minutes on a dead server
    with _init_lock(tracking_uri if kind == "sqlite" else None):
        exp_id = _set_up_with_retries(tracking_uri, experiment, artifact_location, sqlite=kind == "sqlite")
    _EXPERIMENT_IDS[(tracking_uri, experiment)] = exp_id
    return exp_id


def _set_up_with_retries(tracking_uri: str, experiment: str, artifact_location: str | None, sqlite: bool) -> str:
    """The experiment's id, created if missing; a busy or racing store is retried (6 times for SQLite,
    3 for servers) with jittered exponential back-off, then reported as a TrackerError."""
    attempts = 6 if sqlite else 3
    for attempt in range(attempts):
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            return _get_or_create_experiment(client, experiment, artifact_location)
        except (MlflowException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, AlembicCommandError) as exc:
            if attempt == attempts - 1:
                hint = (
                    "; if a first-time schema creation was interrupted or raced (another process that "
                    "did not use ensure_store), the schema is half-built: move the file away, or run "
                    "`mlflow db upgrade` on it" if sqlite else ""
                )
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                raise TrackerError(
                    f"tracking URI {tracking_uri!r}: cannot set up experiment {experiment!r} "
                    f"({exc.__class__.__name__}: {first_line}){hint}"
                ) from exc
            log.info("MLflow store %s not ready (%s); retrying", tracking_uri, exc)
            time.sleep(0.1 * 2**attempt * (1 + random.random()))
    raise AssertionError("unreachable: the last attempt returns or raises")


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
    lock_path = sqlite_path(tracking_uri)
    lock_path = lock_path.with_name(lock_path.name + ".init-lock")
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# Without this experiment tag MLflow 3's UI opens an experiment in its GenAI view; these are model trainings.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _get_or_create_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = client.get_experiment_by_name(name)  # another process won the race
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        log.warning("MLflow experiment %r (id %s) was deleted; restoring it", name, exp.experiment_id)
        client.restore_experiment(exp.experiment_id)
    if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # an experiment made before, or by someone else
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id
