"""What the UI shows in words: the run-log lines the step relays, the cancel line, the report's Dagster table."""

from pathlib import Path

import pandas as pd

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
from ones_pipeline.defs.apply import cancel_message
from ones_pipeline.defs.assets import _job_table
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.train.__main__ import progress_line
from ones_pipeline.train.launcher import LaunchRequest


def _request(stopping: StoppingRule, device: str = "cpu", slots=(0, 1)) -> LaunchRequest:
    spec = JobSpec(name="j", model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                   requested_gpus=1, max_gpus=2, stopping=stopping)
    return LaunchRequest(allocation=RunAllocation.make(spec, slots, device, 64, 0), state_dir=Path("/tmp/x"),
                         tracking_uri="sqlite:////tmp/x/mlflow.db")


EPOCH = {"event": "epoch", "epoch": 3.0, "samples": 4311, "accuracy": 0.96944, "loss": 0.1028, "samples_per_s": 2861.0,
         "global_batch": 64, "processes": 2, "generation": 1}


def test_epoch_line_counts_epochs_of_the_total_and_names_cpu_slots():
    line = progress_line(_request(StoppingRule(StopKind.EPOCHS, epochs=12)), EPOCH)
    assert line == ("j generation 1: epoch 3/12, 4311 samples, accuracy 0.9694, loss 0.1028, 2861.0 samples/s, "
                    "global batch 64 on 2 CPU slots")
    accuracy_rule = StoppingRule(StopKind.ACCURACY, target_accuracy=0.95, patience=3)
    one_gpu = progress_line(_request(accuracy_rule, "gpu", (3,)), {**EPOCH, "epoch": 2.5, "processes": 1})
    assert "epoch 2.50, " in one_gpu and one_gpu.endswith("on 1 GPU")


def test_start_and_stop_lines_of_a_generation_read_as_words():
    req = _request(StoppingRule(StopKind.EPOCHS, epochs=12))
    started = progress_line(req, {"event": "training", "samples": 2874, "generation": 1})
    assert started == "j generation 1: training on 2 CPU slots from 2874 samples (epoch 2/12)"
    stopped = progress_line(req, {"event": "stopped", "samples": 4311, "epoch": 3.0, "generation": 1})
    assert stopped == "j generation 1: stopped with a checkpoint at 4311 samples (epoch 3/12)"
    before = progress_line(req, {"event": "stopped", "before_training": True, "samples": None, "generation": 1})
    assert before == "j generation 1: stopped while starting up, before it trained (its last checkpoint stands)"


def test_batch_line_names_the_slots_and_the_mlflow_line_names_the_run_once():
    req = _request(StoppingRule(StopKind.EPOCHS, epochs=12))
    batch = progress_line(req, {"event": "batch", "from": 64, "to": 96, "grad_noise_scale": 105.0,
                                "predicted_gain": 1.07, "processes": 2, "generation": 1})
    assert "global batch 64 -> 96 on 2 CPU slots without a restart" in batch
    accumulated = progress_line(req, {"event": "batch", "from": 64, "to": 256, "grad_noise_scale": 900.0,
                                      "micro_batch": 64, "accum_steps": 1, "processes": 2, "generation": 1})
    assert ("global batch 64 -> 256 (2 x 64 per process, accumulated over 2 micro-batches) on 2 CPU slots "
            "without a restart") in accumulated
    mlflow = progress_line(req, {"event": "mlflow_run", "run_id": "abc123", "experiment_id": "1"})
    assert mlflow.startswith("j: MLflow run abc123 in sqlite:////tmp/x/mlflow.db "
                             "(mlflow ui --app-name ones --backend-store-uri")
    assert mlflow.endswith("/#/experiments/1/runs/abc123?workflowType=machine_learning)")  # the training view


def test_cancel_line_says_resume_only_when_the_job_goes_on():
    resize = cancel_message({"job": "a", "generation": 2, "reason": "grow 1 -> 2: predicted to finish in 5 min"})
    assert resize.startswith("preempted by ones: grow 1 -> 2") and "resumes in a new generation" in resize
    done = cancel_message({"job": "a", "generation": 3, "reason": "finished"})
    assert done.startswith("cancelled by ones: finished") and "resumes" not in done


def test_report_table_rounds_accuracy_and_stays_narrow():
    table = pd.DataFrame([{"job": "a", "model": "cnn-digits", "jct_s": 338.94, "wait_s": 20.51, "run_s": 321.33,
                           "restarts": 1, "generations": 2, "gpu_s": 643.0, "accuracy": 0.9833333492279053,
                           "samples": 1.0}])
    records, schema = _job_table(table)
    assert [c.name for c in schema.columns] == ["job", "model", "jct_s", "wait_s", "run_s", "restarts", "slot_hours",
                                                "accuracy"]
    assert records[0].data["accuracy"] == 0.9833 and records[0].data["slot_hours"] == 0.179
