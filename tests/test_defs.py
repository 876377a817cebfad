"""The Dagster code location: definitions load, and the scheduling sensor's tick on a real instance
(sqlite in a temp DAGSTER_HOME, QueuedRunCoordinator so cancellation takes the real path)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("mlflow")

from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin  # noqa: E402
from dagster._core.storage.dagster_run import DagsterRunStatus  # noqa: E402
from dagster._core.test_utils import create_run_for_test  # noqa: E402
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin  # noqa: E402

from ones_pipeline.config import load_env, load_job_spec  # noqa: E402
from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.defs.assets import training_job  # noqa: E402
from ones_pipeline.defs.launchers import InMemoryLauncher  # noqa: E402
from ones_pipeline.scheduler import Launch, RunAllocation  # noqa: E402

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


def tick(project, instance, cursor=None, commit=True):
    """One sensor evaluation; ``commit``: then run its ``ones_apply`` request in process, as the daemon
    does for a committed tick (cancellations, decision log, state files)."""
    defs = build_definitions(str(project))
    sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
    if cursor:  # every evaluation decides, as when a run has ended since the last (tests/test_sensor_watch.py)
        cursor = json.dumps({k: v for k, v in json.loads(cursor).items() if k != "watch"})
    with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=defs.resources) as ctx:
        result = sensor(ctx)
    if commit:
        for rr in result.run_requests:
            if rr.job_name == "ones_apply":
                assert defs.resolve_job_def("ones_apply").execute_in_process(
                    run_config=rr.run_config, instance=instance, tags=rr.tags).success
    return result


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


def allocation_of(rr) -> RunAllocation:
    return RunAllocation.from_json(rr.run_config["ops"]["training_job"]["config"]["allocation"])


def slots_of(rr):
    return list(allocation_of(rr).slot_ids)


def launch_run(project, job, generation, slots, batch, reason="start"):
    """The tags and run config of the sensor's run request of this allocation (``create_run_for_test`` keywords)."""
    spec = load_job_spec(project / "assets" / "jobs" / f"{job}.yaml")
    launch = Launch(RunAllocation.make(spec, slots, "cpu", batch, generation), reason)
    return {"tags": {**launch.tags(), "dagster/partition": job},
            "run_config": {"ops": {"training_job": {"config": launch.run_config()}}}}


def test_definitions_load_and_validate(project):
    defs = build_definitions(str(project))
    assert {a.key.to_user_string() for a in defs.resolve_all_asset_specs()} >= {"training_job", "cluster_report"}
    assert defs.resolve_sensor_def("ones_scheduler_sensor").minimum_interval_seconds <= 5  # it watches; decides every 5
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
        # CPU slots are named as such, each tag "held" (the run owns it; "free" once given back in place).
        assert {k: v for k, v in rr.tags.items() if k.startswith("ones/cpu-")} == {
            f"ones/cpu-{s}": "held" for s in slots}
        assert not any(k.startswith("ones/gpu") for k in rr.tags)
        # Only the job (the runs list is filtered by it) and the slot tags: the generation, slots, batch and reason
        # are in the run config (each tag is a line of the run's row in the runs list)
        assert sorted(k for k in rr.tags if not k.startswith("ones/cpu-")) == ["ones/job"]
        assert rr.run_config["ops"]["training_job"]["config"]["reason"]
        alloc = allocation_of(rr)
        assert alloc.job == rr.partition_key and alloc.global_batch >= 1 and alloc.lr > 0 and alloc.device == "cpu"
        held += slots
    assert len(held) == len(set(held)) and set(held) <= {0, 1}
    cursor = json.loads(result.cursor)
    assert set(cursor["submit"]) == {"job-a", "job-b"} and "policy" not in cursor
    # The search state rides in the apply run's config (saved for committed ticks only); the cursor names it.
    apply = next(r for r in result.run_requests if r.job_name == "ones_apply")
    saved = json.loads(apply.run_config["ops"]["apply_tick"]["config"]["plan"])["policy"]
    assert cursor["policy_ref"] == saved["ref"] and saved["state"]["name"] == "ones"
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
    assert all(r.status == DagsterRunStatus.QUEUED for r in instance.get_runs() if r.job_name == "train_job")


def test_changed_allocation_cancels_the_run_and_requests_the_next_generation(project, instance):
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    # job-a runs on both slots (generation 0).
    run = queued_run(instance, **launch_run(project, "job-a", 0, (0, 1), 64))
    first = tick(project, instance)
    # Its spec changes (a longer budget): the run is cancelled and generation 1 requested.
    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A.replace("epochs: 10", "epochs: 12"))
    second = tick(project, instance, first.cursor)
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    (rr,) = [rr for rr in second.run_requests if rr.job_name == "train_job"]
    config = rr.run_config["ops"]["training_job"]["config"]
    assert rr.run_key == "job-a-g1" and config["previous_slots"] == "0,1" and "spec changed" in config["reason"]
    assert allocation_of(rr).spec.stopping.epochs == 12
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
    run = queued_run(instance, **launch_run(project, "job-a", 0, (0, 1), 64))
    result = tick(project, instance)
    started = {rr.partition_key: slots_of(rr) for rr in result.run_requests if rr.job_name == "train_job"}
    assert "job-b" in started
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    assert len(started.get("job-a", [])) <= 1


def ones_tags(run) -> dict:
    """A run's tags but Dagster's own (``dagster/...``, ``.dagster/...``): what ones put on its row."""
    return {k: v for k, v in run.tags.items() if not k.startswith(("dagster/", ".dagster/"))}


def test_a_training_run_is_tagged_only_with_its_job_and_slots_also_after_an_in_place_change(project, instance):
    """Each tag is a line of the run's row in Dagster's runs list (ten ``ones/*`` tags made each row 200 px tall):
    a training run carries ``ones/job`` (what a user filters by) and one tag per slot (what Dagster's tag
    concurrency limits count), nothing else, from its creation through an in-place shrink the apply run makes
    and the step's freeing of the slot. The scheduler reads its generation, slots and batch back all the same
    (from its run config and the change request), as ``ones status`` does."""
    from ones_pipeline.cli.status import slots_text
    from ones_pipeline.defs.instance import job_run_infos
    from ones_pipeline.defs.slot_owner import free_given_back

    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A.replace("epochs: 10", "epochs: 2000"))
    job_b = (project / "assets" / "jobs" / "job-b.yaml").read_text()
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    first = tick(project, instance)
    for req in first.dynamic_partitions_requests:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    (rr,) = [rr for rr in first.run_requests if rr.job_name == "train_job"]
    assert slots_of(rr) == [0, 1]
    # the run as the daemon creates it from the request, started
    run = create_run_for_test(instance, job_name="train_job", run_config=rr.run_config, status=DagsterRunStatus.STARTED,
                              tags={**rr.tags, "dagster/partition": rr.partition_key, "dagster/run_key": rr.run_key},
                              remote_job_origin=ORIGIN)
    only = {"ones/job": "job-a", "ones/cpu-0": "held", "ones/cpu-1": "held"}
    (record,) = instance.get_run_records(dg.RunsFilter(job_name="train_job"))
    assert ones_tags(record.dagster_run) == only
    # job-b arrives: job-a shrinks in place (the apply run writes its change request), job-b waits for slot 1
    (project / "assets" / "jobs" / "job-b.yaml").write_text(job_b)
    second = tick(project, instance, first.cursor)
    d = [d for d in (json.loads(line) for line in (project / ".ones/state/decisions.jsonl").read_text()
                     .splitlines()) if d["job"] == "job-a"][-1]
    assert d["path"] == "in place" and d["before"] == [0, 1] and len(d["after"]) == 1, d
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED  # same run
    (record,) = instance.get_run_records(dg.RunsFilter(job_name="train_job"))
    assert ones_tags(record.dagster_run) == only  # the slot it gives up stays held until the change is done
    env = load_env(project)
    (info,) = job_run_infos(instance, env.job_state_dir, "job-a")
    assert (info.generation, info.slot_ids, info.held_ids) == (0, tuple(d["after"]), (0, 1))
    assert info.global_batch == d["global_batch"] and info.resized_s is not None
    (gone,) = {0, 1} - set(d["after"])
    assert slots_text("cpu", info) == f"cpu {d['after'][0]} (freeing {gone})"
    # the step sees the change done and frees the slot: its tag's value changes, no tag is added
    assert free_given_back(instance, run.run_id, "cpu", env.job_state_dir("job-a"), 0) == [gone]
    (record,) = instance.get_run_records(dg.RunsFilter(job_name="train_job"))
    assert ones_tags(record.dagster_run) == {**only, f"ones/cpu-{gone}": "free"}
    (info,) = job_run_infos(instance, env.job_state_dir, "job-a")
    assert info.held_ids == info.slot_ids == tuple(d["after"])
    # the next tick sees job-a on its one slot: it neither shrinks it again nor undoes the change
    third = tick(project, instance, second.cursor)
    assert not [x for x in third.run_requests if x.job_name == "train_job" and x.partition_key == "job-a"]


def test_bad_spec_is_reported_once_and_skipped(project, instance, capfd):
    (project / "assets" / "jobs" / "broken.yaml").write_text("model: gpt-17\nper_gpu_batch: 8\nstopping: {epochs: 1}\n")
    first = tick(project, instance)
    assert sorted(first.dynamic_partitions_requests[0].partition_keys) == ["job-a", "job-b"]
    train = [rr for rr in first.run_requests if rr.job_name == "train_job"]
    assert {rr.partition_key for rr in train} <= {"job-a", "job-b"} and train
    errors = json.loads((project / ".ones/state/spec_errors.json").read_text())
    assert len(errors) == 1 and errors[0]["field"] == "model" and "broken.yaml" in errors[0]["file"]
    assert "mlp-digits" in errors[0]["message"]  # the allowed values
    logged = [line for line in capfd.readouterr().err.splitlines() if "skipped job spec" in line]
    assert len(logged) == 1 and "broken.yaml" in logged[0] and "field 'model'" in logged[0]
    second = tick(project, instance, first.cursor)
    err = capfd.readouterr().err
    assert "skipped job spec:" not in err  # the full error once per content ...
    assert "1 job spec file(s) skipped until fixed: broken.yaml" in err  # ... and a line every tick while bad
    if second.skip_reason:
        assert "broken.yaml" in second.skip_reason


def test_a_spec_the_tick_cannot_use_is_quarantined_and_reported(project, instance, monkeypatch, capfd):
    """Issue 40, finding 1: a spec with NaN in it (one no loader lets through, handed to the sensor here as
    from any other source) fails its own job: failed_jobs.json, spec_errors.json and the tick's log say why,
    and the other jobs are scheduled."""
    import dataclasses

    import ones_pipeline.defs.sensor as sensor_module

    real = sensor_module.load_job_specs

    def with_a_broken_one(jobs_dir):
        specs, errors = real(jobs_dir)
        return {**specs, "job-c": dataclasses.replace(specs["job-a"], name="job-c", max_lr=float("nan"))}, errors

    monkeypatch.setattr(sensor_module, "load_job_specs", with_a_broken_one)
    first = tick(project, instance)
    train = {rr.partition_key for rr in first.run_requests if rr.job_name == "train_job"}
    assert train and train <= {"job-a", "job-b"}
    state = project / ".ones" / "state"
    failed = json.loads((state / "failed_jobs.json").read_text())
    assert failed["job-c"].startswith("spec quarantined") and "field 'max_lr'" in failed["job-c"]
    errors = json.loads((state / "spec_errors.json").read_text())
    assert [e["file"] for e in errors] == [str(project / "assets" / "jobs" / "job-c.yaml")]
    assert "non-finite value nan" in errors[0]["message"]
    assert "job job-c marked failed: spec quarantined" in capfd.readouterr().err


def test_failed_runs_are_retried_with_backoff_then_the_job_is_marked_failed(project, instance):
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    (project / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 5, decision_budget_s: 0.3, "
        "max_retries: 1, retry_backoff_s: 3600}\n")
    create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.FAILURE,
                        **launch_run(project, "job-a", 0, (0,), 32))
    backing_off = tick(project, instance)
    assert not backing_off.run_requests  # within the backoff window
    create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.FAILURE,
                        **launch_run(project, "job-a", 1, (0,), 32, "retry"))
    failed = tick(project, instance, backing_off.cursor)
    assert "job-a" in json.loads(failed.cursor)["failed"]
    assert "job-a" in json.loads((project / ".ones/state/failed_jobs.json").read_text())


def test_tick_then_materialize_a_partition_in_process_with_the_in_memory_launcher(project, instance):
    """Dagster's cheap end-to-end path: the sensor's tick (build_sensor_context) plans a run, and
    ``dg.materialize`` runs ``training_job`` for that partition with its run config and the in-memory
    launcher (no daemon, no webserver, no training process); the materialization carries the allocation."""
    defs = build_definitions(str(project), launcher=InMemoryLauncher)
    sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
    with dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources) as ctx:
        result = sensor(ctx)
    for req in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    rr = next(rr for rr in result.run_requests if rr.job_name == "train_job")
    alloc = allocation_of(rr)
    done = dg.materialize([training_job], partition_key=rr.partition_key, instance=instance, run_config=rr.run_config,
                          resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
    assert done.success
    meta = instance.get_latest_materialization_event(dg.AssetKey("training_job")).asset_materialization.metadata
    assert meta["global_batch"].value == alloc.global_batch
    assert meta["slots"].value == "cpu " + ",".join(map(str, alloc.slot_ids))
    assert meta["accuracy"].value == 0.9 and meta["model"].value == alloc.spec.model
    assert (project / ".ones/state/jobs" / rr.partition_key).is_dir()  # the launcher's state directory
    assert rr.partition_key in instance.get_materialized_partitions(dg.AssetKey("training_job"))
    # While it trained, each epoch of the generation became an observation of its partition.
    records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("training_job"),
                                                                asset_partitions=[rr.partition_key]), limit=20).records
    progress = [r.event_log_entry.asset_observation.metadata for r in records
                if "progress" in r.event_log_entry.asset_observation.metadata]
    epochs = alloc.spec.stopping.epochs
    assert len(progress) == 1 and progress[0]["epoch"].value == f"{epochs:.2f}/{epochs:g}", progress
    assert progress[0]["global_batch"].value == alloc.global_batch and progress[0]["progress_percent"].value == 100.0
    assert progress[0]["slots"].value == f"{alloc.world_size} CPU slot" + ("s" if alloc.world_size > 1 else "")
    # The cluster report's table gives the JCT the partition gives.
    from ones_pipeline.defs.assets import cluster_report

    report_resources = {k: v for k, v in defs.resources.items() if k in ("ones_env", "inventory")}
    assert dg.materialize([cluster_report], instance=instance, resources=report_resources).success
    report = instance.get_latest_materialization_event(dg.AssetKey("cluster_report")).asset_materialization.metadata
    (row,) = [r for r in report["job_table"].value.records if r.data["job"] == rr.partition_key]
    assert row.data["jct_s"] == meta["jct_s"].value
    # The next tick sees the job finished and does not start it again.
    with dg.build_sensor_context(instance=instance, cursor=result.cursor, definitions=defs,
                                 resources=defs.resources) as ctx:
        later = sensor(ctx)
    assert rr.partition_key not in {r.partition_key for r in later.run_requests}


def test_a_step_that_stops_without_finishing_fails_the_run_with_the_reason(project, instance):
    from functools import partial

    defs = build_definitions(str(project), launcher=partial(InMemoryLauncher, outcome="stop"))
    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    config = {"ops": {"training_job": {"config": {
        "allocation": RunAllocation.make(spec, (0,), "cpu", 32, 0).to_json()}}}}
    done = dg.materialize([training_job], partition_key="job-a", instance=instance,
                          run_config=config, raise_on_error=False,
                          resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
    assert not done.success
    failure = next(e for e in done.all_events if e.event_type_value == "STEP_FAILURE")
    assert "ended without finishing the job" in failure.step_failure_data.error.message
    bad = {"ops": {"training_job": {"config": {"allocation": config["ops"]["training_job"]["config"]["allocation"]
                                               .replace('"lr": 0.05', '"lr": 0.0')}}}}
    done = dg.materialize([training_job], partition_key="job-a", instance=instance,
                          run_config=bad, raise_on_error=False,
                          resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
    failure = next(e for e in done.all_events if e.event_type_value == "STEP_FAILURE")
    assert "bad allocation in the run config" in failure.step_failure_data.error.message


def test_the_tick_acts_only_through_its_apply_run(project, instance):
    """The evaluation itself cancels nothing and writes nothing; the returned ``ones_apply`` run does,
    and logs why on the cancelled run."""
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    (project / "assets" / "jobs" / "job-b.yaml").unlink()
    run = queued_run(instance, **launch_run(project, "job-a", 0, (0, 1), 64))
    first = tick(project, instance)
    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC_A.replace("epochs: 10", "epochs: 12"))
    state = project / ".ones" / "state"
    before = sorted(p.name for p in state.rglob("*")) if state.exists() else []
    decisions_before = (state / "decisions.jsonl").read_text() if (state / "decisions.jsonl").exists() else ""
    planned = tick(project, instance, first.cursor, commit=False)
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.QUEUED  # nothing cancelled yet
    assert (sorted(p.name for p in state.rglob("*")) if state.exists() else []) == before
    assert ((state / "decisions.jsonl").read_text() if (state / "decisions.jsonl").exists() else "") == \
        decisions_before
    (apply,) = [rr for rr in planned.run_requests if rr.job_name == "ones_apply"]
    # The same plan evaluated again (a crash before the cursor was committed) has the same run key: the
    # daemon would not apply it twice.
    again = tick(project, instance, first.cursor, commit=False)
    assert [rr.run_key for rr in again.run_requests if rr.job_name == "ones_apply"] == [apply.run_key]
    defs = build_definitions(str(project))
    assert defs.resolve_job_def("ones_apply").execute_in_process(run_config=apply.run_config,
                                                                 instance=instance).success
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    events = [e.message for e in instance.all_logs(run.run_id)]
    assert any(m.startswith("preempted by ones: spec changed") for m in events), events
    assert "spec changed" in (state / "decisions.jsonl").read_text().splitlines()[-1]


def test_a_run_launched_by_hand_leaves_a_trained_partition_green(project, instance):
    """The UI's "Materialize..." starts training_job without the sensor's allocation: it must not fail
    the partition (red) nor overwrite its materialization; it says why it does nothing."""
    defs = build_definitions(str(project), launcher=InMemoryLauncher)
    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    resources = {k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")}
    config = {"ops": {"training_job": {"config": {
        "allocation": RunAllocation.make(spec, (0,), "cpu", 32, 0).to_json()}}}}
    assert dg.materialize([training_job], partition_key="job-a", instance=instance, run_config=config,
                          resources=resources).success
    key = dg.AssetKey("training_job")
    first = instance.get_latest_materialization_event(key)
    count = len(instance.fetch_materializations(key, limit=100).records)
    by_hand = dg.materialize([training_job], partition_key="job-a", instance=instance, resources=resources)
    assert by_hand.success  # no red run, no failed partition
    assert len(instance.fetch_materializations(key, limit=100).records) == count  # nothing overwritten
    assert instance.get_latest_materialization_event(key).run_id == first.run_id
    logs = [e.message for e in instance.all_logs(by_hand.run_id)]
    assert any("already trained" in m and "ones submit" in m for m in logs), logs


def test_a_planned_preemption_says_so_on_the_run(project, instance):
    """A run the scheduler asked to stop, whose step checkpointed: no materialization, a log line and a tag
    saying it was preempted and resumes, and the run succeeds with no step failure (no red run, no stack
    trace). Cancelled through Dagster instead (the fallback) after a checkpoint: the same line and tag, the
    run ends by Dagster's interrupt. Without a checkpoint of this generation, neither."""
    from functools import partial

    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    outcomes = {}
    for generation, outcome in enumerate(("interrupt", "preempt", "cancel"), start=4):
        config = {"ops": {"training_job": {"config": {
            "allocation": RunAllocation.make(spec, (0,), "cpu", 32, generation).to_json()}}}}
        defs = build_definitions(str(project), launcher=partial(InMemoryLauncher, outcome=outcome))
        resources = {k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")}
        outcomes[outcome] = dg.materialize([training_job], partition_key="job-a", instance=instance,
                                           run_config=config, resources=resources, raise_on_error=False)
    assert "job-a" not in instance.get_materialized_partitions(dg.AssetKey("training_job"))
    assert outcomes["preempt"].success and not outcomes["cancel"].success
    planned = instance.get_run_by_id(outcomes["preempt"].run_id)
    assert planned.status == DagsterRunStatus.SUCCESS and planned.tags["ones/outcome"] == "preempted, checkpointed"
    events = instance.all_logs(planned.run_id)
    assert not [e for e in events if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE"]
    assert any(e.message.startswith("preempted by ones: job-a generation 5 checkpointed at 100 samples")
               for e in events)
    cancelled = instance.get_run_by_id(outcomes["cancel"].run_id)
    assert cancelled.tags["ones/outcome"] == "preempted, checkpointed"
    crashed = instance.get_run_by_id(outcomes["interrupt"].run_id)
    assert "ones/outcome" not in crashed.tags


def test_a_step_stopped_with_a_checkpoint_but_not_by_the_scheduler_fails(project, instance):
    """A checkpointed stop nobody asked for (a SIGTERM from elsewhere): not a planned preemption; the run
    fails (the sensor relaunches the job from its checkpoint) and says why."""
    from functools import partial

    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    config = {"ops": {"training_job": {"config": {
        "allocation": RunAllocation.make(spec, (0,), "cpu", 32, 2).to_json()}}}}
    defs = build_definitions(str(project), launcher=partial(InMemoryLauncher, outcome="stop"))
    resources = {k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")}
    job_dir = load_env(project).job_state_dir("job-a")
    job_dir.mkdir(parents=True, exist_ok=True)
    with open(job_dir / "progress.jsonl", "a") as fh:  # rank 0 checkpointed on a stop (no request file)
        fh.write(json.dumps({"event": "stopped", "samples": 50, "epoch": 0.05, "generation": 2,
                             "time_s": time.time() + 1.0}) + "\n")
    result = dg.materialize([training_job], partition_key="job-a", instance=instance, run_config=config,
                            resources=resources, raise_on_error=False)
    assert not result.success
    assert "ones/outcome" not in instance.get_run_by_id(result.run_id).tags
    assert any("ended without finishing the job" in (e.message or "") or
               (e.dagster_event and "ended without finishing" in str(e.dagster_event.event_specific_data))
               for e in instance.all_logs(result.run_id))


def test_the_policy_search_state_is_saved_by_the_apply_run_and_restored_from_the_cursor_ref(project, instance):
    """The cursor holds a reference, not the population: the committed tick's apply run writes the state
    to policy/<ref>.json, and the next tick restores the search from that file. A tick that is not
    committed (a preview) writes nothing."""
    from ones_pipeline.defs.sensor import _saved_policy_state

    layout = load_env(project).layout
    preview = tick(project, instance, commit=False)
    assert not layout.policy_dir.exists()
    first = tick(project, instance)
    cursor = json.loads(first.cursor)
    saved = layout.read_json(layout.policy_state(cursor["policy_ref"]), None)
    assert saved is not None and saved["name"] == "ones" and saved["state"]
    assert json.loads(preview.cursor).keys() == cursor.keys() and len(first.cursor) < 1000

    class Ctx:  # only the logger is used
        log = type("L", (), {"info": staticmethod(lambda m: None)})

    assert _saved_policy_state(Ctx, load_env(project), cursor) == saved
    assert _saved_policy_state(Ctx, load_env(project), {"policy_ref": "0" * 16}) is None


def test_apply_asks_a_running_run_to_stop_and_cancels_it_only_when_it_does_not(project, instance, monkeypatch):
    """A running run is asked to stop (``preempt-g<N>.json`` with the reason, in its job's directory) and
    not cancelled when it ends in time; one that does not end is cancelled through Dagster after the grace
    period and the margin."""
    import threading

    from ones_pipeline.config.layout import preempt_request_file
    from ones_pipeline.defs import apply as apply_mod

    (project / "resources" / "local.yaml").write_text(
        (project / "resources" / "local.yaml").read_text() + "launcher: {grace_period_s: 1}\n")
    monkeypatch.setattr(apply_mod, "STOP_MARGIN_S", 1.0)
    env = load_env(project)
    defs = build_definitions(str(project))
    runs = {}
    for job in ("job-a", "job-b"):
        runs[job] = create_run_for_test(instance, job_name="train_job", **launch_run(project, job, 3, (0,), 32),
                                        status=DagsterRunStatus.STARTED, remote_job_origin=ORIGIN)
    request_a = preempt_request_file(env.job_state_dir("job-a"), 3)

    def step_of_a():  # job-a's step: it sees the request, checkpoints and its run ends
        for _ in range(200):
            if request_a.exists():
                instance.report_run_failed(runs["job-a"])  # any end will do: the apply run must not cancel it
                return
            threading.Event().wait(0.05)

    watcher = threading.Thread(target=step_of_a)
    watcher.start()
    plan = {"cancels": [{"run_id": r.run_id, "job": job, "generation": 3, "reason": "grow 1 -> 2"}
                        for job, r in runs.items()]}
    assert defs.resolve_job_def("ones_apply").execute_in_process(
        run_config={"ops": {"apply_tick": {"config": {"plan": json.dumps(plan)}}}}, instance=instance).success
    watcher.join()
    assert json.loads(request_a.read_text())["reason"] == "grow 1 -> 2"
    assert preempt_request_file(env.job_state_dir("job-b"), 3).exists()
    assert instance.get_run_by_id(runs["job-a"].run_id).status == DagsterRunStatus.FAILURE  # ended by itself
    assert instance.get_run_by_id(runs["job-b"].run_id).status in (DagsterRunStatus.CANCELED,
                                                                    DagsterRunStatus.CANCELING)


class _PipesPreemptedLauncher:
    """A step that ran a real Pipes session and stopped with a checkpoint because the scheduler asked (what
    the subprocess launcher's step does on ``preempt-g<N>.json``): Dagster's typed-event-stream rule
    applies to it, unlike the in-memory launcher's."""

    @staticmethod
    def make():
        from ones_pipeline.config.layout import preempt_request_file
        from ones_pipeline.defs.launchers import StepLauncher

        class PipesPreempted(StepLauncher):
            def run(self, context, allocation):
                state = Path(self.step_extras(allocation)["state_dir"])
                preempt_request_file(state, allocation.generation).write_text('{"reason": "test"}')
                with open(state / "progress.jsonl", "a") as fh:
                    fh.write(json.dumps({"event": "stopped", "samples": 64, "epoch": 0.04, "time_s": time.time(),
                                         "generation": allocation.generation}) + "\n")
                script = ("from dagster_pipes import open_dagster_pipes\n"
                          "with open_dagster_pipes() as p:\n    p.log.info('stopped with a checkpoint')")
                done = dg.PipesSubprocessClient().run(context=context, command=[sys.executable, "-c", script])
                return list(done.get_results(implicit_materializations=False))

        return PipesPreempted


def test_a_planned_preemption_after_a_real_pipes_session_ends_green(project, instance):
    """Dagster demands an asset's output once a Pipes session ran in it (dagster-io/dagster#28491); the
    planned preemption lifts that for its step (``assets._no_output_allowed``), so the run succeeds with no
    materialization. Fails if a Dagster upgrade moves the flag it resets."""
    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    instance.add_dynamic_partitions("training_jobs", ["job-a"])
    config = {"ops": {"training_job": {"config": {
        "allocation": RunAllocation.make(spec, (0,), "cpu", 32, 9).to_json()}}}}
    defs = build_definitions(str(project), launcher=_PipesPreemptedLauncher.make())
    resources = {k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")}
    result = dg.materialize([training_job], partition_key="job-a", instance=instance, run_config=config,
                            resources=resources, raise_on_error=False)
    events = instance.all_logs(result.run_id)
    failures = [e.dagster_event.event_specific_data for e in events
                if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE"]
    assert result.success and not failures, failures
    assert instance.get_run_by_id(result.run_id).tags["ones/outcome"] == "preempted, checkpointed"
    assert "job-a" not in instance.get_materialized_partitions(dg.AssetKey("training_job"))


def test_progress_observations_are_spaced_and_only_of_this_generation(tmp_path):
    """One observation for the first epoch of the generation, then at most one per ``OBSERVE_EVERY_S``;
    rows of other generations and half-written lines are skipped; the MLflow run is linked once known."""
    from observer_helpers import Recorder

    from ones_pipeline.defs.progress_events import OBSERVE_EVERY_S, ProgressObserver

    spec = load_job_spec(ROOT / "assets" / "jobs" / "mlp-small.yaml")
    alloc = RunAllocation.make(spec, (0, 1), "cpu", 64, 3)
    path = tmp_path / "progress.jsonl"
    path.write_text(json.dumps({"event": "epoch", "epoch": 1, "generation": 2, "time_s": 0.0}) + "\n")  # before
    context = Recorder()
    observer = ProgressObserver(context, path, alloc, run_link=lambda run_id, _=None: f"link:{run_id}", poll_s=3600)
    rows = [{"event": "mlflow_run", "run_id": "abc", "generation": 3, "time_s": 1.0},
            {"event": "epoch", "epoch": 2, "generation": 2, "time_s": 2.0}]  # another generation
    rows += [{"event": "epoch", "epoch": e, "samples": 1437 * e, "accuracy": 0.9, "global_batch": 64, "processes": 2,
              "generation": 3, "time_s": 10.0 + (e - 3) * OBSERVE_EVERY_S / 4} for e in range(3, 12)]
    with observer:
        path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in rows) + '{"event": "ep')
    shown = [e.metadata for e in context.events]
    assert [m["epoch"].value for m in shown] == ["3.00/40", "7.00/40", "11.00/40"]
    assert shown[0]["progress"].value == "4,311/57,480 samples (7.5 %)"
    assert shown[0]["slots"].value == "2 CPU slots" and shown[0]["mlflow_run"].value == "link:abc"
    assert all(e.partition == spec.name for e in context.events)
