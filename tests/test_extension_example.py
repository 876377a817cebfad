"""ONES as an extension of a user's Dagster project (issue 39): ``examples/dagster_project`` (a dataset asset,
two elastic training jobs declared in the ONES component's ``defs.yaml``, an evaluation asset loading each
trained model) materialized end to end: a real Dagster instance, the sensor deciding every launch, real
training on 2 CPU slots through Dagster Pipes, a real sqlite MLflow store. And the component's Python side
(``ones_job``): a job whose upstream asset is not materialized waits, then runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("mlflow")
pytest.importorskip("torch")
pytest.importorskip("sklearn")

from ones_pipeline.config import ConfigError  # noqa: E402
from ones_pipeline.defs.component import OnesComponent, ones_job  # noqa: E402
from ones_pipeline.defs.launchers import InMemoryLauncher  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dagster_project"
TRAINING = dg.AssetKey("training_job")


def tick(defs, instance, cursor):
    """One sensor evaluation as the daemon runs it: the partitions added, the observations stored, the apply
    run executed, the training runs executed (in this process, one after the other). Returns the result and
    the train runs."""
    sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
    with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs, resources=defs.resources) as ctx:
        result = sensor(ctx)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for event in result.asset_events or []:  # the decisions' and waiting jobs' observations
        instance.report_runless_asset_event(event)
    runs = []
    for rr in result.run_requests:
        if rr.job_name == "ones_apply":
            assert defs.resolve_job_def("ones_apply").execute_in_process(
                run_config=rr.run_config, instance=instance, tags=rr.tags).success
    for rr in result.run_requests:
        if rr.job_name == "train_job":
            runs.append(defs.resolve_job_def("train_job").execute_in_process(
                run_config=rr.run_config, instance=instance, tags=rr.tags, partition_key=rr.partition_key))
    return result, runs


def waiting_reasons(instance, job):
    records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=TRAINING, asset_partitions=[job]),
                                          limit=20).records
    return [r.event_log_entry.asset_observation.metadata["waiting"].value for r in records
            if "waiting" in r.event_log_entry.asset_observation.metadata]


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The example project copied (its state, data and MLflow store land in the copy), importable as a
    user's installed project is, also by the training processes."""
    project = tmp_path / "dagster_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns(".ones", "data", "__pycache__", "*.egg-info"))
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(project / "src"), os.environ.get("PYTHONPATH", "")]))
    for name in [m for m in sys.modules if m == "ones_example" or m.startswith("ones_example.")]:
        monkeypatch.delitem(sys.modules, name)
    return project


def test_the_example_project_materializes_end_to_end(example):
    defs = dg.load_from_defs_folder(path_within_project=example)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("digits_dataset") in graph.get(TRAINING).parent_keys  # the edge the graph shows
    assert TRAINING in graph.get(dg.AssetKey("model_accuracy")).parent_keys
    with dg.instance_for_test() as instance:
        # Before the dataset exists: both jobs are partitions that wait, saying for what; nothing launched.
        result, runs = tick(defs, instance, None)
        assert not runs and set(instance.get_dynamic_partitions("training_jobs")) == {"digits-linear", "digits-mlp"}
        assert waiting_reasons(instance, "digits-mlp") == [
            "waits for upstream asset(s) digits_dataset to be materialized"]
        assert dg.materialize([defs.resolve_assets_def("digits_dataset")], instance=instance).success
        cursor = result.cursor
        for _ in range(6):  # the sensor decides every launch until both jobs are done
            result, runs = tick(defs, instance, cursor)
            cursor = result.cursor
            assert all(r.success for r in runs)
            if instance.get_materialized_partitions(TRAINING) == {"digits-linear", "digits-mlp"}:
                break
        assert instance.get_materialized_partitions(TRAINING) == {"digits-linear", "digits-mlp"}
        linear = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=TRAINING, asset_partitions=["digits-linear"]), limit=1).records[0]
        meta = linear.event_log_entry.asset_materialization.metadata
        assert meta["model_uri"].value.startswith("models:/m-") and meta["registered_model"].value == "digits-linear/1"
        assert meta["mlflow_run_url"].value.startswith("http://127.0.0.1:5000/#/experiments/")
        # The project's own downstream asset loads both models from MLflow and measures them.
        evaluation = defs.resolve_assets_def("model_accuracy")
        assert dg.materialize([evaluation], instance=instance).success  # with the component's mlflow resource
        accuracy = instance.get_latest_materialization_event(dg.AssetKey("model_accuracy")).asset_materialization
        values = {k: v.value for k, v in accuracy.metadata.items() if k.startswith("accuracy/")}
        assert set(values) == {"accuracy/digits-linear", "accuracy/digits-mlp"}
        assert all(v > 0.8 for v in values.values()), values
        assert values["accuracy/digits-linear"] == pytest.approx(meta["accuracy"].value, abs=1e-4)


def test_dagster_loads_the_example_from_its_yaml(example):
    """What `dg dev` / the webserver do first: load the code location; `dagster definitions validate`
    exits 0 and names it."""
    out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-m",
                          "ones_example.definitions"], cwd=example, capture_output=True, text=True, timeout=180,
                         env={**os.environ})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Validation successful" in out.stdout + out.stderr


def test_dg_checks_the_example_and_lists_the_component(example):
    """`dg check defs` validates the component's YAML against its schema and loads every definition; `dg list
    components` lists OnesComponent (the package's registry entry point)."""
    dg_bin = str(Path(sys.executable).parent / "dg")
    out = subprocess.run([dg_bin, "check", "defs"], cwd=example, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "All component YAML validated successfully" in out.stdout + out.stderr
    listed = subprocess.run([dg_bin, "list", "components", "--json"], cwd=example, capture_output=True, text=True,
                            timeout=240)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "ones_pipeline.defs.component.OnesComponent" in listed.stdout


def test_a_job_declared_in_python_waits_for_its_upstream_then_runs(tmp_path):
    @dg.asset
    def raw_data() -> None:
        return None

    component = OnesComponent(cluster={"gpus": "none", "cpu_slots": 2},
                              scheduler={"tick_interval_s": 5, "decision_budget_s": 0.3, "min_run_s": 0},
                              jobs=[ones_job("py-job", model="mlp-digits", per_gpu_batch=32, stopping={"epochs": 1},
                                             deps=["raw_data"])])
    ones = component.definitions(tmp_path, launcher=InMemoryLauncher)
    defs = dg.Definitions.merge(ones, dg.Definitions(assets=[raw_data]))
    assert dg.AssetKey("raw_data") in defs.resolve_asset_graph().get(TRAINING).parent_keys
    with dg.instance_for_test() as instance:
        first, runs = tick(defs, instance, None)
        assert not runs and waiting_reasons(instance, "py-job") == [
            "waits for upstream asset(s) raw_data to be materialized"]
        again, runs = tick(defs, instance, first.cursor)
        assert not runs and again.skip_reason.skip_message.endswith("; 1 waiting for upstream assets")
        assert dg.materialize([raw_data], instance=instance).success
        _, runs = tick(defs, instance, again.cursor)
        assert [r.success for r in runs] == [True]
        assert instance.get_materialized_partitions(TRAINING) == {"py-job"}


@pytest.mark.parametrize("job,field", [
    ({"model": "mlp-digits", "per_gpu_batch": 32, "stopping": {"epochs": 1}}, "jobs[0].name"),
    ({"name": "a", "model": "mlp-digits", "per_gpu_batch": 32, "stopping": {"epochs": 1}, "deps": "x"},
     "jobs[0].deps"),
    ({"name": "a", "model": "mlp-digits", "per_gpu_batch": 0, "stopping": {"epochs": 1}}, "per_gpu_batch"),
])
def test_a_bad_declared_job_is_one_line_naming_the_file_and_field(tmp_path, job, field):
    with pytest.raises(ConfigError) as err:
        OnesComponent(jobs=[job]).definitions(tmp_path, tmp_path / "defs.yaml")
    assert field in str(err.value) and "defs.yaml" in str(err.value) and "\n" not in str(err.value)


def test_ones_up_serves_the_same_component(tmp_path):
    """The standalone code location is the component built from resources/<env>.yaml."""
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 2}\n")
    out = subprocess.run([sys.executable, "-c", "import json, ones_pipeline.definitions as d; "
                          "meta = d.defs.resolve_job_def('train_job').metadata; print(json.dumps(sorted("
                          "k.to_user_string() for k in d.defs.resolve_asset_graph().get_all_asset_keys())))"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ONES_PROJECT_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["cluster_report", "training_job"]
