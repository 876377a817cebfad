"""A finished job leaves its model in MLflow: a logged model of the job's run (MLflow 3), its final metrics
linked to it, and with the spec's ``register_as`` a registry version. Real training (a user's script on the
session API, 2 CPU processes), a real sqlite store; the test loads the model back and predicts with it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from ones_pipeline.adapters.mlflow.models import TAG_MODEL_ID, TAG_MODEL_VERSION, model_url, run_url  # noqa: E402
from ones_pipeline.config import ConfigError, parse_job_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_a_finished_user_script_job_has_a_logged_model_that_loads_and_predicts(tmp_path):
    spec = json.loads((ROOT / "examples" / "user_job.json").read_text())
    spec.update(name="logreg-model", stopping={"kind": "epochs", "epochs": 3}, register_as="digits-logreg")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run([sys.executable, "-m", "ones_pipeline.train", "--spec", str(tmp_path / "spec.json"),
                          "--slots", "2", "--state-dir", str(tmp_path / "job"), "--tracking-uri", uri],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    model_id = run.data.tags[TAG_MODEL_ID]
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == run.info.run_id and logged.name == "model"
    # The final evaluation's metrics are the model's metrics too, at the job's last step (samples done).
    accuracy = {m.key: m for m in logged.metrics}["accuracy"]
    assert accuracy.value == pytest.approx(result["accuracy"]) and accuracy.step == result["samples"]
    # Loaded back in this process, it predicts the digits as well as the job's last evaluation said.
    from sklearn.datasets import load_digits

    mlflow.set_tracking_uri(uri)
    model = mlflow.pytorch.load_model(f"models:/{model_id}")
    digits = load_digits()
    x = torch.tensor(digits.data[1500:], dtype=torch.float32) / 16.0
    with torch.no_grad():
        predicted = model(x).argmax(1).numpy()
    assert float((predicted == digits.target[1500:]).mean()) == pytest.approx(result["accuracy"], abs=1e-6)
    # register_as: version 1 of the registered model, made from this run's logged model.
    version = client.get_model_version("digits-logreg", "1")
    assert version.run_id == run.info.run_id and version.source == f"models:/{model_id}"
    assert run.data.tags[TAG_MODEL_VERSION] == "digits-logreg/1"
    # CPU and memory are system metrics where MLflow expects them (its System metrics tab), not model charts.
    assert {"system/cpu_utilization_percentage", "system/process_rss_megabytes"} <= set(run.data.metrics)
    assert not [k for k in run.data.metrics if k.startswith("system_")]


def test_ui_links_open_the_model_training_view():
    base = "http://mlflow.example:5000"
    assert run_url(base, "3", "abc") == "http://mlflow.example:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert model_url(base, "3", "m-1").endswith("/#/experiments/3/models/m-1?workflowType=machine_learning")


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 129, "naïve", 3])
def test_register_as_must_be_a_model_name(tmp_path, bad):
    data = {"model": "mlp-digits", "per_gpu_batch": 32, "stopping": {"epochs": 1}, "register_as": bad}
    with pytest.raises(ConfigError) as err:
        parse_job_spec(data, tmp_path / "job-x.yaml", default_name="job-x")
    assert "register_as" in str(err.value) and "job-x.yaml" in str(err.value)


def test_register_as_round_trips_and_leaves_other_spec_hashes_unchanged(tmp_path):
    from ones_pipeline.config import job_spec_to_yaml_dict
    from ones_pipeline.core.types import spec_to_dict

    data = {"model": "mlp-digits", "per_gpu_batch": 32, "stopping": {"epochs": 1}}
    plain = parse_job_spec(data, tmp_path / "a.yaml", default_name="a")
    assert "register_as" not in spec_to_dict(plain)  # the hash of every spec without it stays as it was
    named = parse_job_spec({**data, "register_as": "digits.mlp_v2"}, tmp_path / "a.yaml", default_name="a")
    assert parse_job_spec(job_spec_to_yaml_dict(named), tmp_path / "a.yaml").register_as == "digits.mlp_v2"


@pytest.mark.parametrize("field,bad", [("ui_url", "localhost:5000"), ("dagster_ui_url", "http://a b"),
                                       ("ui_url", "ftp://x")])
def test_ui_addresses_are_checked_with_the_file_and_field(tmp_path, field, bad):
    from ones_pipeline.config import load_env

    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text(f"mlflow: {{{field}: '{bad}'}}\n")
    with pytest.raises(ConfigError) as err:
        load_env(tmp_path)
    assert f"mlflow.{field}" in str(err.value) and "local.yaml" in str(err.value) and "http://HOST" in str(err.value)
