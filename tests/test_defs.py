"""The Dagster code location: definitions load, and the scheduling sensor's tick on a real instance
(sqlite in a temp DAGSTER_HOME, QueuedRunCoordinator so cancellation takes the real path)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("mlflow")

from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin  # noqa: E402
from dagster._core.storage.dagster_run import DagsterRunStatus  # noqa: E402
from dagster._core.test_utils import create_run_for_test  # noqa: E402
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin  # noqa: E402

from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.live import Launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUEUED_COORDINATOR = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}

SPEC_A = "model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 10}\n"
SPEC_B = "model: cnn-digits\nper_gpu_batch: 16\nbase_lr: 0.02\nmax_lr: 0.08\nmax_gpus: 2\nstopping: {epochs: 5}\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 5, decision_budget_s: 0.3, min_run_s: 0}\n")
    (tmp_path / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A)
    (tmp_path / "assets" / "jobs" / "job-b.yaml").write_text(SPEC_B)
    return tmp_path


@pytest.fixture
def instance():
    with dg.instance_for_test(overrides=QUEUED_COORDINATOR) as inst:
        yield inst


def tick(project, instance, cursor=None):
    defs = build_definitions(str(project))
    sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=defs.resources)
    return sensor(ctx)


ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
    LoadableTargetOrigin(module_name="ones_pipeline.definitions")), "__repository__"), "train_job")


def queued_run(instance, tags, run_config=None):
    """A run as the daemon creates it from a run request: QUEUED, waiting for the coordinator."""
    return create_run_for_test(instance, job_name="train_job", run_config=run_config, tags=tags,
                               status=DagsterRunStatus.QUEUED, remote_job_origin=ORIGIN)


def apply(instance, result):
    """What the daemon does with a tick's result: add the partitions, create the runs (queued)."""
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    runs = []
    for rr in result.run_requests:
        if rr.job_name != "train_job":
            continue
        tags = {**rr.tags, "dagster/partition": rr.partition_key, "dagster/run_key": rr.run_key}
        runs.append(queued_run(instance, tags, rr.run_config))
    return runs


def slots_of(rr):
    return rr.run_config["ops"]["training_job"]["config"]["slot_ids"]


def test_definitions_load_and_validate(project):
    defs = build_definitions(str(project))
    assert {a.key.to_user_string() for a in defs.resolve_all_asset_specs()} >= {"training_job", "cluster_report"}
    assert defs.resolve_sensor_def("ones_scheduler_sensor").minimum_interval_seconds == 5
    assert defs.resolve_job_def("train_job") is not None
    out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate",
                          "-w", "workspace.yaml"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Validation successful" in out.stderr + out.stdout


def test_new_specs_become_partitions_and_runs_with_one_tag_per_slot(project, instance):
    result = tick(project, instance)
    (req,) = result.dynamic_partitions_requests
    assert sorted(req.partition_keys) == ["job-a", "job-b"]
    train = [rr for rr in result.run_requests if rr.job_name == "train_job"]
    assert train, "two jobs on two idle slots: something must start"
    held = []
    for rr in train:
        assert rr.run_key == f"{rr.partition_key}-g0"
        slots = slots_of(rr)
        assert rr.tags["ones/gpus"] == ",".join(map(str, slots))
        assert {k for k in rr.tags if k.startswith("ones/gpu-")} == {f"ones/gpu-{s}" for s in slots}
        cfg = rr.run_config["ops"]["training_job"]["config"]
        assert json.loads(cfg["spec_json"])["name"] == rr.partition_key and cfg["global_batch"] >= 1
        held += slots
    assert len(held) == len(set(held)) and set(held) <= {0, 1}
    cursor = json.loads(result.cursor)
    assert cursor["policy"]["name"] == "ones" and set(cursor["submit"]) == {"job-a", "job-b"}
    # Even a job's first decision is recorded as an observation of its (new) partition.
    assert {e.partition for e in result.asset_events} == {rr.partition_key for rr in train}


def test_same_tick_twice_launches_nothing_twice(project, instance):
    first = tick(project, instance)
    keys = {rr.run_key for rr in first.run_requests}
    # Re-evaluated before the daemon applied anything (or with the cursor lost): the same run keys,
    # which Dagster deduplicates per sensor.
    again = tick(project, instance)
    assert {rr.run_key for rr in again.run_requests} == keys
    apply(instance, first)
    # Once the runs exist they are the schedule: no new run, whatever the cursor says.
    for cursor in (first.cursor, None):
        later = tick(project, instance, cursor)
        assert [rr.run_key for rr in later.run_requests if rr.job_name == "train_job"
                and rr.run_key not in keys] == []
    assert all(r.status == DagsterRunStatus.QUEUED for r in instance.get_runs())


def test_changed_allocation_cancels_the_run_and_requests_the_next_generation(project, instance):
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    # job-a runs on both slots (generation 0).
    launch = Launch("job-a", 0, (0, 1), 64, 0.1, "start")
    run = queued_run(instance, {**launch.tags(), "dagster/partition": "job-a"})
    first = tick(project, instance)
    # Its spec changes (a longer budget): the run is cancelled and generation 1 requested.
    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A.replace("epochs: 10", "epochs: 12"))
    second = tick(project, instance, first.cursor)
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    (rr,) = [rr for rr in second.run_requests if rr.job_name == "train_job"]
    assert rr.run_key == "job-a-g1" and rr.tags["ones/previous-gpus"] == "0,1"
    assert json.loads(rr.run_config["ops"]["training_job"]["config"]["spec_json"])["stopping"]["epochs"] == 12
    decisions = [json.loads(line) for line in (project / ".ones/state/decisions.jsonl").read_text().splitlines()]
    assert (decisions[-1]["job"] == "job-a" and decisions[-1]["before"] == [0, 1]
            and "spec changed" in decisions[-1]["reason"])
    # The decision is visible in the UI as an observation of the job's partition.
    assert any(e.partition == "job-a" and "spec changed" in str(e.metadata["reason"].value)
               for e in second.asset_events)


def test_a_new_job_on_a_full_cluster_makes_room_by_preemption_or_shrink(project, instance):
    """job-a (long) holds both slots; job-b (short) arrives. ONES predicts a lower mean JCT with job-b
    running, so it takes a slot from job-a (cancel + a smaller generation 1) rather than queue job-b."""
    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A.replace("epochs: 10", "epochs: 2000"))
    instance.add_dynamic_partitions("training_jobs", ["job-a", "job-b"])
    launch = Launch("job-a", 0, (0, 1), 64, 0.1, "start")
    run = queued_run(instance, {**launch.tags(), "dagster/partition": "job-a"})
    result = tick(project, instance)
    started = {rr.partition_key: slots_of(rr) for rr in result.run_requests if rr.job_name == "train_job"}
    assert "job-b" in started
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    assert len(started.get("job-a", [])) <= 1


def test_bad_spec_is_reported_once_and_skipped(project, instance, capfd):
    (project / "assets" / "jobs" / "broken.yaml").write_text("model: gpt-17\nper_gpu_batch: 8\nstopping: {epochs: 1}\n")
    first = tick(project, instance)
    assert sorted(first.dynamic_partitions_requests[0].partition_keys) == ["job-a", "job-b"]
    assert {rr.partition_key for rr in first.run_requests} <= {"job-a", "job-b"} and first.run_requests
    errors = json.loads((project / ".ones/state/spec_errors.json").read_text())
    assert len(errors) == 1 and errors[0]["field"] == "model" and "broken.yaml" in errors[0]["file"]
    assert "mlp-digits" in errors[0]["message"]  # the allowed values
    logged = [line for line in capfd.readouterr().err.splitlines() if "skipped job spec" in line]
    assert len(logged) == 1 and "broken.yaml" in logged[0] and "field 'model'" in logged[0]
    tick(project, instance, first.cursor)
    assert "skipped job spec" not in capfd.readouterr().err  # reported once per content


def test_failed_runs_are_retried_with_backoff_then_the_job_is_marked_failed(project, instance):
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    (project / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 5, decision_budget_s: 0.3, "
        "max_retries: 1, retry_backoff_s: 3600}\n")
    create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.FAILURE,
                        tags={**Launch("job-a", 0, (0,), 32, 0.05, "start").tags(), "dagster/partition": "job-a"})
    backing_off = tick(project, instance)
    assert not backing_off.run_requests  # within the backoff window
    create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.FAILURE,
                        tags={**Launch("job-a", 1, (0,), 32, 0.05, "retry").tags(), "dagster/partition": "job-a"})
    failed = tick(project, instance, backing_off.cursor)
    assert "job-a" in json.loads(failed.cursor)["failed"]
    assert "job-a" in json.loads((project / ".ones/state/failed_jobs.json").read_text())
