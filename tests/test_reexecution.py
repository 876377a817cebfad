"""A re-execution never trains a finished job nor touches its materialization (issue 39): Dagster copies a
run's config and tags into its re-execution, so "Re-execute all" on a preempted run of a job that has since
finished carried the sensor's allocation and trained again, writing a second materialization. Through
Dagster's own API (``execute_job`` with ``ReexecutionOptions``) on a real instance."""

import json
import os

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("mlflow")

from ones_pipeline.config import load_env, load_job_spec  # noqa: E402
from ones_pipeline.config.layout import PROGRESS_FILE  # noqa: E402
from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.defs.instance import job_run_infos  # noqa: E402
from ones_pipeline.defs.launchers import InMemoryLauncher  # noqa: E402
from ones_pipeline.scheduler import Launch, RunAllocation  # noqa: E402

SPEC = "model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 10}\n"
KEY = dg.AssetKey("training_job")


class OutcomeLauncher(InMemoryLauncher):
    """The in-memory step with the outcome the test sets when the step starts (``ONES_TEST_OUTCOME``):
    Dagster loads a reconstructable job once per process."""

    def run(self, context, allocation):
        step = InMemoryLauncher(ones_env=self.ones_env, mlflow=self.mlflow, outcome=os.environ["ONES_TEST_OUTCOME"])
        return step.run(context, allocation)


def train_job_of_the_test_project():
    """The code location's ``train_job`` (reconstructable: Dagster's re-execution loads it again)."""
    return build_definitions(os.environ["ONES_TEST_PROJECT"], launcher=OutcomeLauncher).resolve_job_def("train_job")


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 2}\n")
    (tmp_path / "assets" / "jobs" / "job-a.yaml").write_text(SPEC)
    monkeypatch.setenv("ONES_TEST_PROJECT", str(tmp_path))
    monkeypatch.setenv("ONES_TEST_OUTCOME", "finish")
    return tmp_path


def generation_run(instance, project, generation: int, outcome: str, slots=(0,)):
    """What the daemon runs for the sensor's run request of ``generation``: its tags, its allocation."""
    spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
    launch = Launch(RunAllocation.make(spec, slots, "cpu", 32, generation, submit_time_s=1.0), "start")
    os.environ["ONES_TEST_OUTCOME"] = outcome  # the fixture's monkeypatch restores it
    return dg.execute_job(dg.reconstructable(train_job_of_the_test_project), instance,
                          run_config={"ops": {"training_job": {"config": {"allocation": launch.allocation.to_json()}}}},
                          tags={**launch.tags(), "dagster/partition": "job-a", "dagster/sensor_name":
                                "ones_scheduler_sensor", "dagster/run_key": launch.run_key})


def reexecute(instance, parent_run_id: str):
    """"Re-execute all" as the UI does it: the parent's run config and tags (the sensor's, its allocation)."""
    parent = instance.get_run_by_id(parent_run_id)
    return dg.execute_job(dg.reconstructable(train_job_of_the_test_project), instance, run_config=parent.run_config,
                          tags=dict(parent.tags),
                          reexecution_options=dg.ReexecutionOptions(parent_run_id=parent_run_id))


def steps_started(project) -> list[dict]:
    path = load_env(project).job_state_dir("job-a") / PROGRESS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_reexecuting_a_preempted_run_of_a_finished_job_trains_nothing(project, monkeypatch):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("training_jobs", ["job-a"])
        preempted = generation_run(instance, project, 0, "preempt")
        assert preempted.success and "job-a" not in instance.get_materialized_partitions(KEY)
        finished = generation_run(instance, project, 1, "finish", slots=(0, 1))
        assert finished.success
        before = instance.get_latest_materialization_event(KEY)
        rows = len(steps_started(project))
        monkeypatch.setenv("ONES_TEST_OUTCOME", "finish")  # a step launched now would train and materialize
        again = reexecute(instance, preempted.run_id)
        run = instance.get_run_by_id(again.run_id)
        assert again.success and run.parent_run_id == preempted.run_id
        assert run.tags["ones/job"] == "job-a"  # Dagster copied the sensor's tags ...
        messages = [e.message for e in instance.all_logs(again.run_id)]
        assert not any(m.startswith("in-memory launcher") for m in messages), messages  # ... but no step ran
        assert len(steps_started(project)) == rows
        assert any("job-a has finished: its materialization stands" in m for m in messages), "\n".join(messages)
        assert len(instance.fetch_materializations(KEY, limit=10).records) == 1
        after = instance.get_latest_materialization_event(KEY)
        assert after.run_id == before.run_id == finished.run_id
        assert after.asset_materialization.metadata == before.asset_materialization.metadata
        # ones no longer counts it as a run of the job (the scheduler's view, the next materialization's
        # restarts and slot-hours)
        assert run.tags["ones/outcome"].startswith("not trained")
        counted = {r.run_id for r in job_run_infos(instance, load_env(project).job_state_dir, "job-a")}
        assert again.run_id not in counted and counted == {preempted.run_id, finished.run_id}


def test_reexecuting_a_preempted_run_of_an_unfinished_job_trains_nothing(project, monkeypatch):
    """Not finished yet: the re-execution's allocation (old slots, old generation) is not the scheduler's;
    the sensor starts the job's next generation itself. A stale generation started late does not train
    either."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("training_jobs", ["job-a"])
        preempted = generation_run(instance, project, 0, "preempt")
        monkeypatch.setenv("ONES_TEST_OUTCOME", "finish")
        again = reexecute(instance, preempted.run_id)
        messages = [e.message for e in instance.all_logs(again.run_id)]
        assert again.success and any(f"re-executes run {preempted.run_id}" in m for m in messages), messages
        assert not instance.get_materialized_partitions(KEY)
        generation_run(instance, project, 2, "preempt")
        stale = generation_run(instance, project, 1, "finish")
        messages = [e.message for e in instance.all_logs(stale.run_id)]
        assert any("generation 1 is stale: the scheduler has since started generation 2" in m for m in messages)
        assert not instance.get_materialized_partitions(KEY)
