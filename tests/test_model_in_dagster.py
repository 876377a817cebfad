"""A finished job's materialization carries its trained model: the model URI a downstream asset loads and
links (``MetadataValue.url``) to the MLflow run, logged model and registry version, in MLflow's
model-training view; the MLflow run links back to the Dagster run. Real Dagster instance, real training
step through Dagster Pipes (the subprocess launcher), real sqlite MLflow store."""

import pytest

dg = pytest.importorskip("dagster")
mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from ones_pipeline.config import load_env, load_job_spec  # noqa: E402
from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.defs.assets import training_job  # noqa: E402
from ones_pipeline.scheduler import RunAllocation  # noqa: E402

SPEC = ("model: mlp-digits\nper_gpu_batch: 64\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 2}\n"
        "register_as: digits-mlp\n")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nmlflow: {ui_url: 'http://mlflow.example:5001/'}\n")
    (tmp_path / "assets" / "jobs" / "tiny.yaml").write_text(SPEC)
    return tmp_path


def test_the_materialization_carries_the_model_and_links_both_ways(project):
    defs = build_definitions(str(project))
    spec = load_job_spec(project / "assets" / "jobs" / "tiny.yaml")
    config = {"ops": {"training_job": {"config": {
        "allocation": RunAllocation.make(spec, (0,), "cpu", 64, 0, submit_time_s=0.0).to_json()}}}}
    resources = {k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("training_jobs", ["tiny"])
        done = dg.materialize([training_job], partition_key="tiny", instance=instance, run_config=config,
                              resources=resources)
        assert done.success
        meta = instance.get_latest_materialization_event(dg.AssetKey("training_job")).asset_materialization.metadata
    run_id = meta["mlflow_run_id"].value
    client = mlflow.MlflowClient(tracking_uri=load_env(project).tracking_uri())
    run = client.get_run(run_id)
    exp = run.info.experiment_id
    model_id = meta["model_uri"].value.removeprefix("models:/")
    assert isinstance(meta["mlflow_run_url"], dg.UrlMetadataValue)
    assert meta["mlflow_run_url"].value == (f"http://mlflow.example:5001/#/experiments/{exp}/runs/{run_id}"
                                            "?workflowType=machine_learning")
    assert meta["mlflow_model_url"].value == (f"http://mlflow.example:5001/#/experiments/{exp}/models/{model_id}"
                                              "?workflowType=machine_learning")
    assert meta["registered_model"].value == "digits-mlp/1"
    assert meta["registered_model_url"].value.startswith("http://mlflow.example:5001/#/models/digits-mlp/versions/1?")
    assert run.data.tags["dagster.run_url"] == f"http://127.0.0.1:3000/runs/{done.run_id}"
    # What a downstream asset does with it: load the model and predict.
    mlflow.set_tracking_uri(load_env(project).tracking_uri())
    model = mlflow.pytorch.load_model(meta["model_uri"].value)
    from sklearn.datasets import load_digits

    digits = load_digits()
    with torch.no_grad():
        predicted = model(torch.tensor(digits.data, dtype=torch.float32) / 16.0).argmax(1).numpy()
    assert float((predicted == digits.target).mean()) > 0.5
