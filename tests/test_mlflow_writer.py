"""The training step's MLflow run (``adapters.mlflow.writer.JobRun``) against a real SQLite store in tmp_path."""


import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402
from mlflow_helpers import EXP, job_spec  # noqa: E402

from ones_pipeline.adapters.mlflow import MAX_PARAM_VAL_LENGTH, JobRun, TrackerError  # noqa: E402

# mlflow 3.17 + SQLAlchemy 2.1: "The noload loader strategy is deprecated", raised inside MLflow.
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")




def test_jobrun_resumes_the_same_run_across_restarts(uri, tmp_path):
    state = tmp_path / "state" / "job-a"
    run = JobRun.open(uri, EXP, "job-a", state, job_spec(), generation=0)
    assert (run.restarts, run.generation, run.resumed) == (0, 0, False)
    assert (state / "mlflow_run_id").read_text().strip() == run.run_id
    for i in range(1, 4):
        run.log_metrics({"loss": 1.0 / i, "samples": 64 * i, "gpus": 2}, step=64 * i)
    run.finish("KILLED")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run.run_id).info.status == "KILLED"

    again = JobRun.open(uri, EXP, "job-a", state, job_spec(), generation=3)
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

    third = JobRun.open(uri, EXP, "job-a", state, job_spec(), generation=4)
    assert third.restarts == 2 and third.run_id == run.run_id


def test_jobrun_params_are_flattened_stringified_and_truncated(uri, tmp_path):
    params = {"spec": job_spec(), "note": "x" * 10_000, "tags": ["a", "b"], "bad key!": None}
    run = JobRun.open(uri, EXP, "job-b", tmp_path / "s", params, generation=0)
    got = MlflowClient(tracking_uri=uri).get_run(run.run_id).data.params
    assert got["spec.name"] == "job-a"
    assert got["spec.stopping.kind"] == "accuracy"
    assert got["spec.stopping.target_accuracy"] == "0.9"
    assert got["spec.command"] == '["python", "t.py"]'
    assert got["tags"] == '["a", "b"]'
    assert got["bad key_"] == "None"
    assert len(got["note"]) == MAX_PARAM_VAL_LENGTH and got["note"].endswith("...")


def test_jobrun_reopen_with_changed_params_keeps_first_values_and_tags_the_change(uri, tmp_path):
    JobRun.open(uri, EXP, "job-c", tmp_path / "s", {"lr": 0.1}, generation=0).finish("KILLED")
    run = JobRun.open(uri, EXP, "job-c", tmp_path / "s", {"lr": 0.2, "new": 1}, generation=1)
    data = MlflowClient(tracking_uri=uri).get_run(run.run_id).data
    assert data.params == {"lr": "0.1", "new": "1"}
    assert data.tags["ones.changed_params"] == '["lr"]'
    # The value now is shown (a tag, updated at each generation), also when the spec goes back to the first one.
    assert data.tags["current.lr"] == "0.2"
    run.finish("KILLED")
    for generation, lr in ((2, 0.3), (3, 0.1)):
        run = JobRun.open(uri, EXP, "job-c", tmp_path / "s", {"lr": lr, "new": 1}, generation=generation)
        assert MlflowClient(tracking_uri=uri).get_run(run.run_id).data.tags["current.lr"] == str(lr)
        run.finish("KILLED")


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
