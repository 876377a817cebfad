"""MLflow store set-up and URI checks (``adapters.mlflow.store``) against a real SQLite store in tmp_path."""

import multiprocessing
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402
from mlflow_helpers import EXP, copy_store  # noqa: E402

from ones_pipeline.adapters.mlflow import (  # noqa: E402
    JobRun,
    TrackerError,
    check_reachable,
    default_tracking_uri,
    ensure_store,
    read_progress,
    run_link,
    store,
)

# mlflow 3.17 + SQLAlchemy 2.1: "The noload loader strategy is deprecated", raised inside MLflow.
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")




# --------------------------------------------------------------------------- store set-up


def test_default_uri_is_absolute_sqlite(tmp_path):
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_run_link_is_a_ui_url_for_servers_and_a_hint_for_other_stores():
    ml = "?workflowType=machine_learning"  # the model-training view, not the GenAI one
    assert run_link("http://mlflow:5000/", "abc", "7") == f"http://mlflow:5000/#/experiments/7/runs/abc{ml}"
    assert run_link("https://mlflow.example", "abc") == f"https://mlflow.example/#/experiments/0/runs/abc{ml}"
    uri = "sqlite:////data/mlflow.db"
    assert run_link(uri, "abc", "7") == (f"run abc in {uri} (mlflow ui --app-name ones --backend-store-uri {uri}, then "
                                         f"http://127.0.0.1:5000/#/experiments/7/runs/abc{ml})")
    assert run_link(uri, "abc", "7", address=False) == (
        f"run abc in {uri} (mlflow ui --app-name ones --backend-store-uri {uri})")


def test_ensure_store_is_idempotent(uri):
    first = ensure_store(uri, EXP)
    store._EXPERIMENT_IDS.clear()  # go to the store again, not the per-process cache
    assert ensure_store(uri, EXP) == first
    other = ensure_store(uri, "other")
    assert other != first
    names = [e.name for e in MlflowClient(tracking_uri=uri).search_experiments()]
    assert names.count(EXP) == 1 and names.count("other") == 1


def test_experiments_open_as_model_training_in_the_mlflow_ui(uri):
    """MLflow 3's UI shows an experiment without this tag in its GenAI view."""
    client = MlflowClient(tracking_uri=uri)
    new = ensure_store(uri, "fresh-experiment")
    assert client.get_experiment(new).tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment("made-elsewhere")  # e.g. by an older version of this product
    store._EXPERIMENT_IDS.clear()
    assert ensure_store(uri, "made-elsewhere") == old
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def test_ensure_store_makes_parent_dirs_and_puts_artifacts_beside_db(tmp_path, template_db):
    target = tmp_path / "a" / "b"
    uri = copy_store(template_db, target)
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
        def do_GET(self):  # the name http.server calls
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
