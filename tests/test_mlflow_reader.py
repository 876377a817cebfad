"""The scheduler's MLflow read-back (``adapters.mlflow.reader``, ``sqlite_fast``) against a real SQLite store.

Every test that reads through the direct SQL path also reads through the MLflow client and compares.
"""

import contextlib
import logging
import math
import shutil
import sqlite3
import time

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow_helpers import (  # noqa: E402
    EXP,
    log_config,
    same,
    schema_revision,
    set_schema_revision,
)

from ones_pipeline.adapters.mlflow import (  # noqa: E402
    VERIFIED_REVISIONS,
    JobRun,
    TrackerError,
    default_tracking_uri,
    fast_path_usable,
    read_progress,
    sqlite_fast,
)
from ones_pipeline.core.types import ThroughputObs  # noqa: E402

# mlflow 3.17 + SQLAlchemy 2.1: "The noload loader strategy is deprecated", raised inside MLflow.
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")

UNKNOWN_REVISION = "0123456789ab"




def test_read_progress_histories_samples_and_throughput_medians(uri, tmp_path):
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=0)
    step = log_config(a, 0, 64, 2, 1, 32, [1.0, 0.1, 0.3, 0.2])  # first step is warm-up: median 0.2
    a.finish("KILLED")
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=1)
    step = log_config(a, step, 64, 4, 2, 16, [0.9, 0.05, 0.07, 0.06], sync=0.02)
    b = JobRun.open(uri, EXP, "job-b", tmp_path / "b", {}, generation=0)
    log_config(b, 0, 32, 1, 1, 32, [0.5])  # a single measurement is kept even though it is the first

    progress = read_progress(uri, EXP)
    assert set(progress) == {"job-a", "job-b"}
    pa = progress["job-a"]
    assert pa.run_id == a.run_id and pa.status == "RUNNING"
    assert (pa.restarts, pa.generation) == (1, 1)
    assert pa.samples_done == 512 and pa.epochs_done == pytest.approx(0.512)
    assert [s for s, _ in pa.loss_history] == [64.0 * i for i in range(1, 9)]
    assert pa.loss_history[-1] == (512.0, pytest.approx(10.0 / 512))
    assert [s for s, _ in pa.accuracy_history] == [64.0 * i for i in range(1, 9)]
    assert pa.metrics["lr"] == 0.1 and pa.grad_noise_scale == 123.0 and pa.metrics["gpus"] == 4
    assert pa.throughput_obs == (
        ThroughputObs(num_gpus=2, num_nodes=1, per_gpu_batch=32, step_time_s=pytest.approx(0.2),
                      sync_time_s=pytest.approx(0.002)),
        ThroughputObs(num_gpus=4, num_nodes=2, per_gpu_batch=16, step_time_s=pytest.approx(0.06),
                      sync_time_s=pytest.approx(0.022)),
    )
    assert progress["job-b"].throughput_obs == (ThroughputObs(1, 1, 32, pytest.approx(0.5), 0.0),)
    assert progress["job-b"].restarts == 0

    assert same(read_progress(uri, EXP, method="sql"), progress)
    assert same(read_progress(uri, EXP, method="client"), progress)
    assert set(read_progress(uri, EXP, ["job-b", "job-x"])) == {"job-b"}
    assert same(read_progress(uri, EXP, ["job-a"], method="client")["job-a"], pa)
    assert read_progress(uri, EXP, []) == {}


def test_read_progress_after_a_restart_from_an_older_checkpoint(uri, tmp_path):
    run = JobRun.open(uri, EXP, "job-r", tmp_path / "r", {}, generation=0)
    for s in (100, 200, 300, 400):
        run.log_metrics({"loss": s / 1000, "samples": s, "epoch": s / 1000}, step=s)
    run.finish("KILLED")
    time.sleep(0.01)
    run = JobRun.open(uri, EXP, "job-r", tmp_path / "r", {}, generation=1)
    for s in (200, 300):  # resumed from the checkpoint at 100 samples
        run.log_metrics({"loss": s / 2000, "samples": s, "epoch": s / 1000}, step=s)
    p = read_progress(uri, EXP)["job-r"]
    assert p.samples_done == 300 and p.epochs_done == pytest.approx(0.3)
    assert p.loss_history == ((100.0, 0.1), (200.0, 0.1), (300.0, 0.15))
    assert p.metrics["samples"] == 300  # MLflow's own latest (highest step) would say 400
    assert same(read_progress(uri, EXP, method="client")["job-r"], p)


def test_read_progress_joins_metrics_logged_one_by_one_and_derives_step_time(uri, tmp_path):
    run = JobRun.open(uri, EXP, "job-p", tmp_path / "p", {}, generation=0)
    for s in (64, 128, 192):
        for key, value in {"gpus": 2, "global_batch": 64, "samples_per_s": 640.0,
                           "loss": math.nan if s == 128 else 1.0}.items():
            run.log_metrics({key: value}, step=s)
            time.sleep(0.002)  # distinct timestamps: the SQL same-batch join does not apply
    p = read_progress(uri, EXP)["job-p"]
    assert p.throughput_obs == (ThroughputObs(2, 1, 32, pytest.approx(0.1), 0.0),)
    assert p.samples_done == 192  # no samples metric: the last step logged
    assert math.isnan(p.loss_history[1][1])
    assert same(read_progress(uri, EXP, method="client")["job-p"], p)


def test_read_progress_creates_nothing_and_tolerates_missing_parts(tmp_path, uri):
    missing = default_tracking_uri(tmp_path / "nowhere")
    assert read_progress(missing, EXP) == {}
    assert not (tmp_path / "nowhere").exists()
    assert read_progress(uri, "no-such-experiment") == {}
    assert read_progress(uri, EXP) == {}  # experiment without runs


def test_read_progress_falls_back_to_the_client_when_the_direct_read_fails(uri, tmp_path, monkeypatch):
    JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=0).log_metrics({"samples": 5}, step=5)

    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("no such column: is_nan")

    monkeypatch.setattr(sqlite_fast, "_query_tables", broken)
    assert read_progress(uri, EXP)["job-a"].samples_done == 5
    with pytest.raises(sqlite3.OperationalError):
        read_progress(uri, EXP, method="sql")


# --------------------------------------------------------------------------- the schema revision gate


def test_the_schema_a_fresh_store_gets_is_verified(template_db):
    revision = schema_revision(template_db)
    assert revision in VERIFIED_REVISIONS, (
        f"MLflow now creates schema revision {revision!r}: check the direct SQL against it (the parity tests "
        f"here) and add it to sqlite_fast.VERIFIED_REVISIONS")
    usable, why = fast_path_usable(template_db)
    assert usable, why
    assert repr(revision) in why


def test_fast_path_usable_explains_what_it_cannot_read(tmp_path, template_db):
    assert fast_path_usable(tmp_path / "missing.db") == (False, f"{tmp_path / 'missing.db'} is not a file")
    (tmp_path / "junk.db").write_text("hello, not sqlite")
    usable, why = fast_path_usable(tmp_path / "junk.db")
    assert not usable and "cannot be read" in why
    sqlite3.connect(tmp_path / "empty.db").close()
    usable, why = fast_path_usable(tmp_path / "empty.db")
    assert not usable and "no MLflow tables" in why
    shutil.copy(template_db, tmp_path / "unversioned.db")
    with contextlib.closing(sqlite3.connect(tmp_path / "unversioned.db")) as con:
        con.execute("DROP TABLE alembic_version")
    usable, why = fast_path_usable(tmp_path / "unversioned.db")
    assert not usable and "no alembic_version table" in why


def test_an_unknown_schema_revision_keeps_the_direct_sql_off(uri, tmp_path, caplog):
    """A copy of a real store at a revision the SQL was not verified against: the direct read is refused,
    ``auto`` goes to the MLflow client (which, for a revision other than its own head, refuses the store
    itself and says so), and the reason is logged once."""
    run = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=0)
    log_config(run, 0, 64, 2, 1, 32, [1.0, 0.1, 0.3])
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    copy = copy_dir / "mlflow.db"
    shutil.copy(tmp_path / "mlflow.db", copy)
    set_schema_revision(copy, UNKNOWN_REVISION)
    copy_uri = default_tracking_uri(copy_dir)

    usable, why = fast_path_usable(copy)
    assert not usable
    assert repr(UNKNOWN_REVISION) in why and "not one this SQL was verified against" in why
    assert fast_path_usable(copy, verified={UNKNOWN_REVISION})[0]  # only the revision stands in the way
    with pytest.raises(TrackerError, match=f"method='sql' refused.*{UNKNOWN_REVISION}"):
        read_progress(copy_uri, EXP, method="sql")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            # The direct SQL would have read this file; the error comes from the client path instead.
            with pytest.raises(MlflowException, match=f"found version {UNKNOWN_REVISION}"):
                read_progress(copy_uri, EXP)
    gate_warnings = [r for r in caplog.records if "not one this SQL was verified" in r.getMessage()]
    assert len(gate_warnings) == 1 and copy_uri in gate_warnings[0].getMessage()


def test_an_unverified_schema_is_read_through_the_client_with_the_same_progress(uri, tmp_path, monkeypatch,
                                                                                caplog):
    """What an MLflow upgrade looks like: the store is at MLflow's own head revision (the client reads it),
    but the direct SQL was verified against other revisions only."""
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=0)
    step = log_config(a, 0, 64, 2, 1, 32, [1.0, 0.1, 0.3, 0.2])
    a.finish("KILLED")
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=1)
    log_config(a, step, 64, 4, 2, 16, [0.9, 0.05, 0.07])
    log_config(JobRun.open(uri, EXP, "job-b", tmp_path / "b", {}, generation=0), 0, 32, 1, 1, 32, [0.5])
    db = tmp_path / "mlflow.db"
    by_sql = read_progress(uri, EXP, method="sql")
    by_client = read_progress(uri, EXP, method="client")
    assert same(by_sql, by_client)

    monkeypatch.setattr(sqlite_fast, "VERIFIED_REVISIONS", frozenset({UNKNOWN_REVISION}))
    usable, why = fast_path_usable(db)
    assert not usable and repr(schema_revision(db)) in why
    with caplog.at_level(logging.WARNING):
        first = read_progress(uri, EXP)
        second = read_progress(uri, EXP, ["job-b"])
    assert same(first, by_client) and same(second, {"job-b": by_client["job-b"]})
    gate_warnings = [r for r in caplog.records if "not one this SQL was verified" in r.getMessage()]
    assert len(gate_warnings) == 1
    assert "reading it through the MLflow client" in gate_warnings[0].getMessage()
