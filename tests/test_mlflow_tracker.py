"""MLflow tracker adapter against a real SQLite store in tmp_path (nothing mocked, no env vars set)."""

import math
import multiprocessing
import shutil
import socket
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from ones_pipeline.adapters import mlflow_tracker as mt  # noqa: E402
from ones_pipeline.adapters.mlflow_tracker import (  # noqa: E402
    JobRun,
    TrackerError,
    check_reachable,
    default_tracking_uri,
    ensure_store,
    read_progress,
)
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule, ThroughputObs  # noqa: E402

# mlflow 3.17 + SQLAlchemy 2.1: "The noload loader strategy is deprecated", raised inside MLflow.
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")

EXP = "ones"


@pytest.fixture(scope="session")
def template_db(tmp_path_factory) -> Path:
    """A store with the schema and experiment created once; tests copy it (schema creation takes seconds)."""
    base = tmp_path_factory.mktemp("mlflow-template")
    ensure_store(default_tracking_uri(base), EXP)
    return base / "mlflow.db"


@pytest.fixture
def uri(template_db, tmp_path) -> str:
    shutil.copy(template_db, tmp_path / "mlflow.db")
    return default_tracking_uri(tmp_path)


def _same(a, b) -> bool:
    """Equality of JobProgress values (or dicts of them) treating NaN == NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return repr(a) == repr(b)


# --------------------------------------------------------------------------- store set-up


def test_default_uri_is_absolute_sqlite(tmp_path):
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_ensure_store_is_idempotent(uri):
    first = ensure_store(uri, EXP)
    mt._EXPERIMENT_IDS.clear()  # go to the store again, not the per-process cache
    assert ensure_store(uri, EXP) == first
    other = ensure_store(uri, "other")
    assert other != first
    names = [e.name for e in MlflowClient(tracking_uri=uri).search_experiments()]
    assert names.count(EXP) == 1 and names.count("other") == 1


def test_ensure_store_makes_parent_dirs_and_puts_artifacts_beside_db(tmp_path, template_db):
    target = tmp_path / "a" / "b"
    uri = default_tracking_uri(target)
    target.mkdir(parents=True)
    shutil.copy(template_db, target / "mlflow.db")
    exp_id = ensure_store(uri, "artifacts-here")
    location = MlflowClient(tracking_uri=uri).get_experiment(exp_id).artifact_location
    assert location == (target / "mlartifacts").resolve().as_uri()


def _ensure_worker(uri, experiment, barrier, results):
    barrier.wait()
    try:
        results.put(("ok", ensure_store(uri, experiment)))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put(("error", repr(exc)))


def test_ensure_store_from_four_concurrent_processes_on_a_fresh_db(tmp_path):
    uri = default_tracking_uri(tmp_path / "fresh")  # parent dir does not exist yet: ensure_store makes it
    # fork when available: the children skip re-importing mlflow (~1 s each) but still open their own
    # connections and locks, which is what the race is about.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_ensure_worker, args=(uri, EXP, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    assert len({exp_id for _, exp_id in outcomes}) == 1
    names = [e.name for e in MlflowClient(tracking_uri=uri).search_experiments()]
    assert names.count(EXP) == 1


# --------------------------------------------------------------------------- JobRun


def _spec(name="job-a") -> JobSpec:
    return JobSpec(name=name, model="resnet18", dataset_size=1000, per_gpu_batch=32, requested_gpus=2,
                   stopping=StoppingRule(StopKind.ACCURACY, target_accuracy=0.9), command=("python", "t.py"))


def test_jobrun_resumes_the_same_run_across_restarts(uri, tmp_path):
    state = tmp_path / "state" / "job-a"
    run = JobRun.open(uri, EXP, "job-a", state, _spec(), generation=0)
    assert (run.restarts, run.generation, run.resumed) == (0, 0, False)
    assert (state / "mlflow_run_id").read_text().strip() == run.run_id
    for i in range(1, 4):
        run.log_metrics({"loss": 1.0 / i, "samples": 64 * i, "gpus": 2}, step=64 * i)
    run.finish("KILLED")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run.run_id).info.status == "KILLED"

    again = JobRun.open(uri, EXP, "job-a", state, _spec(), generation=3)
    assert again.run_id == run.run_id
    assert (again.restarts, again.generation, again.resumed) == (1, 3, True)
    stored = client.get_run(run.run_id)
    assert stored.info.status == "RUNNING"
    assert stored.data.tags["ones.job"] == "job-a"
    assert stored.data.tags["ones.generation"] == "3"
    assert stored.data.tags["ones.restarts"] == "1"
    for i in range(4, 6):
        again.log_metrics({"loss": 1.0 / i, "samples": 64 * i, "gpus": 4}, step=64 * i)
    again.finish("FINISHED")
    history = client.get_metric_history(run.run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [64, 128, 192, 256, 320]
    assert client.get_run(run.run_id).info.status == "FINISHED"

    third = JobRun.open(uri, EXP, "job-a", state, _spec(), generation=4)
    assert third.restarts == 2 and third.run_id == run.run_id


def test_jobrun_params_are_flattened_stringified_and_truncated(uri, tmp_path):
    params = {"spec": _spec(), "note": "x" * 10_000, "tags": ["a", "b"], "bad key!": None}
    run = JobRun.open(uri, EXP, "job-b", tmp_path / "s", params, generation=0)
    got = MlflowClient(tracking_uri=uri).get_run(run.run_id).data.params
    assert got["spec.name"] == "job-a"
    assert got["spec.stopping.kind"] == "accuracy"
    assert got["spec.stopping.target_accuracy"] == "0.9"
    assert got["spec.command"] == '["python", "t.py"]'
    assert got["tags"] == '["a", "b"]'
    assert got["bad key_"] == "None"
    assert len(got["note"]) == mt.MAX_PARAM_VAL_LENGTH and got["note"].endswith("...")


def test_jobrun_reopen_with_changed_params_keeps_first_values_and_tags_the_change(uri, tmp_path):
    JobRun.open(uri, EXP, "job-c", tmp_path / "s", {"lr": 0.1}, generation=0).finish("KILLED")
    run = JobRun.open(uri, EXP, "job-c", tmp_path / "s", {"lr": 0.2, "new": 1}, generation=1)
    data = MlflowClient(tracking_uri=uri).get_run(run.run_id).data
    assert data.params == {"lr": "0.1", "new": "1"}
    assert data.tags["ones.changed_params"] == '["lr"]'


def test_jobrun_state_dir_of_another_job_is_refused(uri, tmp_path):
    JobRun.open(uri, EXP, "job-d", tmp_path / "s", {}, generation=0)
    with pytest.raises(TrackerError, match=r"mlflow_run_id.*job-d.*job-e"):
        JobRun.open(uri, EXP, "job-e", tmp_path / "s", {}, generation=0)


def test_jobrun_with_a_stale_run_id_starts_a_new_run(uri, tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "mlflow_run_id").write_text("0" * 32 + "\n")
    run = JobRun.open(uri, EXP, "job-f", tmp_path / "s", {}, generation=0)
    assert run.run_id != "0" * 32 and run.restarts == 0
    assert (tmp_path / "s" / "mlflow_run_id").read_text().strip() == run.run_id


def test_jobrun_rejects_bad_arguments(uri, tmp_path):
    with pytest.raises(ValueError, match="job name"):
        JobRun.open(uri, EXP, "Bad_Name", tmp_path / "s", {}, generation=0)
    with pytest.raises(ValueError, match="generation"):
        JobRun.open(uri, EXP, "job-g", tmp_path / "s", {}, generation=-1)
    run = JobRun.open(uri, EXP, "job-g", tmp_path / "s", {}, generation=0)
    with pytest.raises(ValueError, match="step"):
        run.log_metrics({"loss": 1.0}, step=-1)
    with pytest.raises(ValueError, match="FINISHED"):
        run.finish("DONE")


# --------------------------------------------------------------------------- read_progress


def _log_config(run, start_step, per_step, gpus, nodes, per_gpu_batch, step_times, sync=0.0):
    """One log_metrics per step, as the training step does; returns the next step."""
    step = start_step
    for k, st in enumerate(step_times):
        step += per_step
        run.log_metrics({
            "loss": 10.0 / step, "accuracy": step / 10_000, "samples": step, "epoch": step / 1000,
            "gpus": gpus, "num_nodes": nodes, "per_gpu_batch": per_gpu_batch,
            "global_batch": gpus * per_gpu_batch, "step_time_s": st, "sync_time_s": sync + k * 0.001,
            "samples_per_s": gpus * per_gpu_batch / st, "lr": 0.1, "grad_noise_scale": 123.0,
        }, step=step)
    return step


def test_read_progress_histories_samples_and_throughput_medians(uri, tmp_path):
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=0)
    step = _log_config(a, 0, 64, 2, 1, 32, [1.0, 0.1, 0.3, 0.2])  # first step is warm-up: median 0.2
    a.finish("KILLED")
    a = JobRun.open(uri, EXP, "job-a", tmp_path / "a", {}, generation=1)
    step = _log_config(a, step, 64, 4, 2, 16, [0.9, 0.05, 0.07, 0.06], sync=0.02)
    b = JobRun.open(uri, EXP, "job-b", tmp_path / "b", {}, generation=0)
    _log_config(b, 0, 32, 1, 1, 32, [0.5])  # a single measurement is kept even though it is the first

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

    assert _same(read_progress(uri, EXP, method="client"), progress)
    assert set(read_progress(uri, EXP, ["job-b", "job-x"])) == {"job-b"}
    assert _same(read_progress(uri, EXP, ["job-a"], method="client")["job-a"], pa)
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
    assert _same(read_progress(uri, EXP, method="client")["job-r"], p)


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
    assert _same(read_progress(uri, EXP, method="client")["job-p"], p)


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

    monkeypatch.setattr(mt, "_query_sqlite", broken)
    assert read_progress(uri, EXP)["job-a"].samples_done == 5
    with pytest.raises(sqlite3.OperationalError):
        read_progress(uri, EXP, method="sql")


# --------------------------------------------------------------------------- bad and unreachable URIs


@pytest.mark.parametrize("bad, why", [
    ("ftp://host/db", "not supported; allowed schemes: sqlite, http, https, postgresql, mysql"),
    ("file:///tmp/mlruns", "file store is not allowed"),
    ("/tmp/mlruns", "file store is not allowed"),
    ("sqlite://", "needs a file path"),
    ("sqlite:///:memory:", "needs a file path"),
    ("http://", "no host name"),
    ("", "empty"),
])
def test_bad_uris_raise_tracker_error_naming_the_uri(bad, why, tmp_path):
    for call in (lambda: check_reachable(bad), lambda: ensure_store(bad, EXP),
                 lambda: read_progress(bad, EXP),
                 lambda: JobRun.open(bad, EXP, "job-a", tmp_path / "s", {}, generation=0)):
        with pytest.raises(TrackerError, match=why) as info:
            call()
        assert repr(bad) in str(info.value)
        assert isinstance(info.value, ValueError)


def test_sqlite_path_that_cannot_be_used(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    blocked = f"sqlite:///{tmp_path}/file/mlflow.db"
    with pytest.raises(TrackerError, match="file"):
        ensure_store(blocked, EXP)
    (tmp_path / "junk.db").write_text("hello, not sqlite")
    junk = f"sqlite:///{tmp_path}/junk.db"
    with pytest.raises(TrackerError, match="not an SQLite database"):
        check_reachable(junk)
    check_reachable(default_tracking_uri(tmp_path / "new" / "dir"))  # creatable: fine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_http_server_fails_fast():
    uri = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TrackerError, match="not reachable") as info:
        ensure_store(uri, EXP)
    assert time.monotonic() - t0 < 10
    assert uri in str(info.value)


def test_silent_http_server_times_out():
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(TrackerError, match="not reachable within 1 s"):
            check_reachable(uri, timeout_s=1)
        assert time.monotonic() - t0 < 10


def test_answering_http_server_is_reachable():
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server API)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_reachable(f"http://127.0.0.1:{server.server_port}", timeout_s=2)
    finally:
        server.shutdown()
        server.server_close()


def test_unreachable_database_server_names_the_uri():
    uri = f"postgresql://ones@127.0.0.1:{_free_port()}/mlflow"
    t0 = time.monotonic()
    with pytest.raises(TrackerError, match="driver is not installed|cannot connect") as info:
        check_reachable(uri, timeout_s=2)  # no driver here, or connection refused where there is one
    assert uri in str(info.value) and time.monotonic() - t0 < 10
