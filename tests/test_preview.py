"""The UI's "Preview tick result" (the GraphQL ``sensorDryRun`` mutation the sensor page calls) evaluates
the scheduling sensor for real, on the real instance. It must change nothing: no run changes state, no
state file changes; what the tick would do is only in the returned requests."""

import json
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("dagster_graphql")

from dagster._core.test_utils import create_run_for_test  # noqa: E402
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql  # noqa: E402

from ones_pipeline.config import load_job_spec  # noqa: E402
from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.scheduler import Launch, RunAllocation  # noqa: E402

SPEC = "model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 10}\n"
DRY_RUN = """
mutation($selector: SensorSelector!, $cursor: String) {
  sensorDryRun(selectorData: $selector, cursor: $cursor) {
    __typename
    ... on DryRunInstigationTick { evaluationResult { runRequests { runKey jobName } skipReason
                                                      error { message } } }
    ... on PythonError { message stack }
  }
}"""


def _snapshot(state: Path) -> dict:
    return {str(p.relative_to(state)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in state.rglob("*") if p.is_file()} if state.exists() else {}


def test_preview_tick_changes_no_run_and_no_file(tmp_path):
    project = tmp_path / "project"
    (project / "resources").mkdir(parents=True)
    (project / "assets" / "jobs").mkdir(parents=True)
    (project / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 5, decision_budget_s: 0.3, min_run_s: 0}\n")
    (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC)
    code = tmp_path / "location.py"
    code.write_text(f"from ones_pipeline.definitions import build_definitions\n\n"
                    f"defs = build_definitions({str(project)!r})\n")
    overrides = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}
    with dg.instance_for_test(overrides=overrides) as instance:
        instance.add_dynamic_partitions("training_jobs", ["job-a"])
        spec = load_job_spec(project / "assets" / "jobs" / "job-a.yaml")
        tags = {**Launch(RunAllocation.make(spec, (0, 1), "cpu", 64, 0), "start").tags(), "dagster/partition": "job-a"}
        run = create_run_for_test(instance, job_name="train_job", tags=tags, status=dg.DagsterRunStatus.STARTED)
        # A committed tick first (it records the spec's hash in the cursor), then the spec changes: the next
        # tick wants to cancel the run and start generation 1.
        defs = build_definitions(str(project))
        sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
        with dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources) as ctx:
            cursor = sensor(ctx).cursor
        (project / "assets" / "jobs" / "job-a.yaml").write_text(SPEC.replace("epochs: 10", "epochs: 12"))
        state = project / ".ones" / "state"
        before = _snapshot(state)
        with define_out_of_process_context(str(code), "defs", instance) as context:
            location = next(iter(context.code_location_names))
            selector = {"repositoryLocationName": location, "repositoryName": "__repository__",
                        "sensorName": "ones_scheduler_sensor"}
            result = execute_dagster_graphql(context, DRY_RUN, {"selector": selector, "cursor": cursor})
        tick = result.data["sensorDryRun"]
        assert tick["__typename"] == "DryRunInstigationTick", json.dumps(tick)[:2000]
        evaluation = tick["evaluationResult"]
        assert evaluation["error"] is None, evaluation["error"]
        jobs = {r["jobName"] for r in evaluation["runRequests"]}
        assert {"ones_apply", "train_job"} <= jobs  # the preview shows what the tick would do ...
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED  # ... and did none of it
        assert _snapshot(state) == before
        assert len(instance.get_runs()) == 1
