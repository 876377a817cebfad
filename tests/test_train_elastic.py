"""The elastic training step end to end: real torch processes (gloo), real checkpoints, real MLflow."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mlflow = pytest.importorskip("mlflow")

from ones_pipeline.adapters.mlflow import read_progress  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 4


def train_cmd(state_dir: Path, uri: str, slots: int, batch: int, name: str = "elastic", generation: int = 0):
    return [sys.executable, "-m", "ones_pipeline.train", "--model", "cnn-digits", "--name", name,
            "--epochs", str(EPOCHS), "--per-gpu-batch", "8", "--base-lr", "0.01", "--max-lr", "0.04",
            "--slots", str(slots), "--global-batch", str(batch), "--generation", str(generation),
            "--state-dir", str(state_dir), "--tracking-uri", uri, "--grace-period", "20"]


def run_until_checkpoint_then_stop(cmd, state_dir: Path, after_epochs: float, timeout: float = 120.0):
    """Start training, wait until a checkpoint beyond ``after_epochs`` exists, SIGTERM, wait for exit 0."""
    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + timeout
    ckpt = state_dir / "checkpoint-latest.pt"
    start_mtime = ckpt.stat().st_mtime if ckpt.exists() else 0.0
    while time.monotonic() < deadline:
        if ckpt.exists() and ckpt.stat().st_mtime > start_mtime:
            state = load_checkpoint(state_dir)
            if state is not None and state["progress"]["samples_done"] / 1437 >= after_epochs:
                break
        if proc.poll() is not None:
            pytest.fail(f"training ended before it could be interrupted (exit {proc.returncode})")
        time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - t0


def metric_history(uri: str, run_id: str, key: str):
    client = mlflow.tracking.MlflowClient(uri)
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_interrupted_twice_and_resized_matches_uninterrupted(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Uninterrupted reference: 2 processes, global batch 16.
    ref_dir = tmp_path / "ref"
    assert subprocess.run(train_cmd(ref_dir, uri, 2, 16, name="reference"), cwd=ROOT, timeout=300).returncode == 0
    ref = load_checkpoint(ref_dir)["progress"]

    # Same job, stopped twice and resumed at other process counts and batch sizes.
    state = tmp_path / "elastic"
    code, took = run_until_checkpoint_then_stop(train_cmd(state, uri, 2, 16), state, after_epochs=1)
    assert code == 0 and took < 40  # within the 20 s grace period, plus the launcher's own exit on a loaded machine
    mid1 = load_checkpoint(state)["progress"]
    code, took = run_until_checkpoint_then_stop(train_cmd(state, uri, 1, 8, generation=1), state, after_epochs=2)
    assert code == 0 and took < 40  # within the 20 s grace period, plus the launcher's own exit on a loaded machine
    mid2 = load_checkpoint(state)["progress"]
    assert mid2["samples_done"] > mid1["samples_done"]
    assert subprocess.run(train_cmd(state, uri, 3, 24, generation=2), cwd=ROOT, timeout=300).returncode == 0
    final = load_checkpoint(state)["progress"]

    # Same sample count and epoch as without interruption; two restarts recorded.
    assert final["samples_done"] == ref["samples_done"] == EPOCHS * 1437
    assert final["epoch"] == ref["epoch"]
    assert final["restarts"] == 2 and final["finished"]
    # A stop lands mid-epoch: the checkpoint was written at the step boundary, not only at epoch ends.
    assert mid1["position"] % 1437 != 0 or mid2["position"] % 1437 != 0

    # One MLflow run across the three generations; its sample count only grows; the loss continues.
    progress = read_progress(uri, "ones", ["elastic"])["elastic"]
    assert progress.samples_done == EPOCHS * 1437 and progress.restarts == 2
    samples = metric_history(uri, progress.run_id, "samples")
    assert [s for s, _ in samples] == sorted(s for s, _ in samples)
    losses = metric_history(uri, progress.run_id, "loss")
    first_loss = losses[0][1]
    after_resume = [v for s, v in losses if s > mid1["samples_done"]][:1] + \
                   [v for s, v in losses if s > mid2["samples_done"]][:1]
    assert all(v < 0.6 * first_loss for v in after_resume), (first_loss, after_resume)
    accuracy = metric_history(uri, progress.run_id, "accuracy")
    assert len(accuracy) == EPOCHS and accuracy[-1][1] > 0.85


def test_bad_inputs_fail_before_anything_starts(tmp_path):
    base = [sys.executable, "-m", "ones_pipeline.train", "--name", "bad", "--epochs", "1"]
    cases = [
        (["--model", "gpt-17", "--state-dir", str(tmp_path / "a")], "unknown built-in model"),
        (["--model", "mlp-digits", "--global-batch", "100000", "--max-lr", "0.1", "--state-dir", str(tmp_path / "b")],
         "global_batch"),
        (["--model", "mlp-digits", "--state-dir", str(tmp_path / "c"), "--tracking-uri", "ftp://nowhere/x"],
         "ftp://nowhere/x"),
    ]
    for extra, needle in cases:
        out = subprocess.run(base + extra, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr
        assert not list(Path(tmp_path).glob("*/checkpoint-*"))
    if os.geteuid() != 0:  # root ignores permissions
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = subprocess.run(base + ["--state-dir", str(locked / "job")], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 2 and str(locked) in out.stderr


def test_user_script_trains_through_the_same_api(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run([sys.executable, "-m", "ones_pipeline.train", "--spec", "examples/user_job.json",
                          "--slots", "2", "--state-dir", str(tmp_path / "user"), "--tracking-uri", uri],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = (tmp_path / "user" / "result.json").read_text()
    assert '"accuracy"' in result
    progress = read_progress(uri, "ones", ["user-logreg"])["user-logreg"]
    assert progress.status == "FINISHED" and progress.samples_done > 0


def test_allocation_from_dagster_pipes_extras_and_materialization_reported(tmp_path):
    """The Pipes protocol at its boundary (what PipesSubprocessClient provides): a context file with the
    extras, a messages file the step writes to. No Dagster instance here; that is the code location's test."""
    dagster_pipes = pytest.importorskip("dagster_pipes")
    import json

    from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
    from ones_pipeline.scheduler import RunAllocation

    spec = JobSpec(name="piped", model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                   requested_gpus=2, stopping=StoppingRule(StopKind.EPOCHS, epochs=2))
    context = {"asset_keys": ["training_job"], "code_version_by_asset_key": None, "provenance_by_asset_key": None,
               "partition_key": "piped", "partition_key_range": None, "partition_time_window": None,
               "run_id": "run-1", "job_name": "train", "retry_number": 0,
               "extras": {"allocation": RunAllocation.make(spec, (0, 1), "cpu", 64, 3).to_json(),
                          "state_dir": str(tmp_path / "state"), "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"}}
    ctx_file, msg_file = tmp_path / "context.json", tmp_path / "messages.jsonl"
    ctx_file.write_text(json.dumps(context))
    env = dict(os.environ,
               DAGSTER_PIPES_CONTEXT=dagster_pipes.encode_env_var({"path": str(ctx_file)}),
               DAGSTER_PIPES_MESSAGES=dagster_pipes.encode_env_var({"path": str(msg_file)}))
    out = subprocess.run([sys.executable, "-m", "ones_pipeline.train"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    messages = [json.loads(line) for line in msg_file.read_text().splitlines() if line.strip()]
    methods = [m["method"] for m in messages]
    assert methods[0] == "opened" and methods[-1] == "closed"
    logged = [m["params"]["message"] for m in messages if m["method"] == "log"]
    epochs = [line for line in logged if ": epoch " in line]  # relayed while it trained, one per epoch
    assert len(epochs) == 2 and "epoch 2/2, 2874 samples, accuracy" in epochs[-1], logged
    assert "global batch 64 on 2 CPU slots" in epochs[-1]
    ui = "mlflow ui --app-name ones --backend-store-uri"
    assert any("MLflow run " in line and ui in line for line in logged), logged
    materialized = [m for m in messages if m["method"] == "report_asset_materialization"]
    assert len(materialized) == 1
    metadata = materialized[0]["params"]["metadata"]
    assert metadata["samples"]["raw_value"] == 2 * 1437 and metadata["generation"]["raw_value"] == 3
    progress = read_progress(f"sqlite:///{tmp_path / 'm.db'}", "ones", ["piped"])["piped"]
    assert progress.generation == 3 and progress.status == "FINISHED"
    assert metadata["mlflow_run_id"]["raw_value"] == progress.run_id  # reported through Pipes, no side file
    from mlflow import MlflowClient

    params = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}").get_run(progress.run_id).data.params
    assert params["stopping.epochs"] == "2" and "stopping.patience" not in params  # only what applies
    tags = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}").get_run(progress.run_id).data.tags
    assert tags["dagster.run_id"] == "run-1" and tags["dagster.run_id.g3"] == "run-1"  # the Pipes context's run


def test_launcher_kills_a_rank_that_hangs_after_rank_0_finished(tmp_path):
    """A peer stuck in teardown must not hold its slots forever once rank 0 (checkpoint, MLflow) is done."""
    from ones_pipeline.core.types import JobSpec
    from ones_pipeline.scheduler import RunAllocation
    from ones_pipeline.train.launcher import LaunchRequest, launch

    script = tmp_path / "rank.py"
    script.write_text("import os, time\nif os.environ['ONES_RANK'] != '0':\n    time.sleep(600)\n")
    spec = JobSpec(name="hang", model="custom", dataset_size=10, per_gpu_batch=1, max_lr=1.0,
                   command=(sys.executable, str(script)))
    t0 = time.monotonic()
    request = LaunchRequest(RunAllocation.make(spec, (0, 1), "cpu", 2, 0), tmp_path / "state", grace_period_s=1.0)
    assert launch(request) == 0
    assert time.monotonic() - t0 < 30


def test_launcher_stops_its_ranks_when_the_scheduler_asks_its_generation(tmp_path):
    """The apply run's ``preempt-g<N>.json`` reaches every rank as a stop request (the stop file they poll)
    and the launcher exits 0 (a clean, checkpointed stop); a request to another generation does not."""
    import threading

    from ones_pipeline.config.layout import preempt_request_file
    from ones_pipeline.core.types import JobSpec
    from ones_pipeline.scheduler import RunAllocation
    from ones_pipeline.train.launcher import LaunchRequest, launch

    script = tmp_path / "rank.py"  # a rank that trains until its stop file appears, then writes its marker
    script.write_text("import json, os, pathlib, time\nstate = pathlib.Path(os.environ['ONES_STATE_DIR'])\n"
                      "if os.environ['ONES_RANK'] == '0':  # its first training step, as TrainingSession reports it\n"
                      "    with open(state / 'progress.jsonl', 'a') as fh:\n"
                      "        fh.write(json.dumps({'event': 'training', 'generation': 7}) + '\\n')\n"
                      "stop = pathlib.Path(os.environ['ONES_STOP_FILE'])\n"
                      "while not stop.exists():\n    time.sleep(0.05)\n"
                      "(state / ('stopped-' + os.environ['ONES_RANK'])).touch()\n")
    spec = JobSpec(name="asked", model="custom", dataset_size=10, per_gpu_batch=1, max_lr=1.0,
                   command=(sys.executable, str(script)))
    state = tmp_path / "state"
    state.mkdir()
    preempt_request_file(state, 6).write_text('{"reason": "another generation"}')

    def ask() -> None:
        time.sleep(3.0)
        preempt_request_file(state, 7).write_text('{"reason": "grow 1 -> 2"}')

    asker = threading.Thread(target=ask)
    asker.start()
    t0 = time.monotonic()
    request = LaunchRequest(RunAllocation.make(spec, (0, 1), "cpu", 2, 7), state, grace_period_s=20.0)
    assert launch(request) == 0
    asker.join()
    assert 3.0 <= time.monotonic() - t0 < 20.0  # not stopped by generation 6's request; stopped by its own
    assert (state / "stopped-0").exists() and (state / "stopped-1").exists()


def test_a_rank_with_an_empty_share_still_joins_the_gradient_all_reduce(tmp_path):
    """The CI crash (gloo "collective mismatch", 151308 vs 8 bytes): 1437 = 359 x 4 + 1, so with global batch 4
    on 2 processes every epoch ends on a step of 1 sample, which leaves rank 1 nothing. A rank that skips the
    forward there skips DDP's gradient all-reduce too (DDP joins it only after a forward through its wrapper),
    and meets its peer's all-reduce with the epoch end's next collective instead."""
    cmd = [sys.executable, "-m", "ones_pipeline.train", "--model", "mlp-digits", "--name", "empty", "--epochs", "1",
           "--per-gpu-batch", "2", "--slots", "2", "--global-batch", "4", "--state-dir", str(tmp_path / "s")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert load_checkpoint(tmp_path / "s")["progress"]["samples_done"] == 1437


ACCUM_DRIVER = """
import json, os, sys
os.environ["ONES_TUNE_BATCH"] = "1"  # the command line's allocation does not tune; this job does
from ones_pipeline.train import batch_tuning, builtin, micro_batches

def choose(self, current, grad_noise_scale):  # rank 0 at every epoch end: a batch that must accumulate
    return None if current == {batch} else batch_tuning.BatchChange(current, {batch}, grad_noise_scale, None,
                                                                    *self.split({batch}))

batch_tuning.BatchTuner.choose = choose
log = open(os.path.join(os.environ["ONES_STATE_DIR"], "seen-" + os.environ["ONES_RANK"] + ".jsonl"), "a")
taken = micro_batches.Step.__iter__

def logged(self):  # every micro-batch the built-in loop trains on, one line per optimizer step
    parts = []
    for idx in taken(self):
        parts.append(idx.tolist())
        yield idx
    log.write(json.dumps(parts) + "\\n")
    log.flush()

micro_batches.Step.__iter__ = logged
sys.exit(builtin.main())
"""


def test_builtin_job_switches_to_accumulation_mid_run_and_resumes_with_exact_samples(tmp_path):
    """mlp-digits on 2 processes with max_per_gpu_batch 8: at an epoch end the job moves from 16 to 48 (24 per
    process: 3 micro-batches of 8); stopped mid-epoch while accumulating, resumed at the allocation's batch
    (every rank from the same source), it switches again at its first epoch end. Every sample once per
    epoch, in the epochs' order, each micro-batch within the cap."""
    import json

    from ones_pipeline.train.sampler import EpochOrder

    driver = tmp_path / "driver.py"
    driver.write_text(ACCUM_DRIVER.format(batch=48))
    spec = {"name": "accum", "model": "mlp-digits", "dataset_size": 1437, "per_gpu_batch": 8, "base_lr": 0.05,
            "max_lr": 0.4, "max_per_gpu_batch": 8, "requested_gpus": 2, "stopping": {"kind": "epochs", "epochs": 4},
            "command": ["python", str(driver)]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    state, uri = tmp_path / "state", f"sqlite:///{tmp_path / 'mlflow.db'}"

    def cmd(generation):
        return [sys.executable, "-m", "ones_pipeline.train", "--spec", str(tmp_path / "spec.json"), "--slots", "2",
                "--global-batch", "16", "--generation", str(generation), "--state-dir", str(state),
                "--tracking-uri", uri, "--grace-period", "20"]

    code, _ = run_until_checkpoint_then_stop(cmd(0), state, after_epochs=1.5)  # the second epoch's end
    assert code == 0
    mid = load_checkpoint(state)["progress"]
    assert mid["samples_done"] % 1437 and mid["global_batch"] == 48  # stopped mid-epoch, accumulating
    assert subprocess.run(cmd(1), cwd=ROOT, timeout=300).returncode == 0
    final = load_checkpoint(state)["progress"]
    assert final["samples_done"] == 4 * 1437 and final["finished"] and final["restarts"] == 1

    ranks = [[json.loads(line) for line in (state / f"seen-{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])  # the same optimizer steps on both ranks
    assert {len(step) for step in ranks[0]} == {1, 3}  # without and with accumulation
    assert max(len(part) for rank in ranks for step in rank for part in step) <= 8
    order = EpochOrder(1437, seed=0)
    trained = [i for s0, s1 in zip(*ranks, strict=True) for part in s0 + s1 for i in part]
    assert trained == np.concatenate([order.permutation(e) for e in range(4)]).tolist()
    rows = [json.loads(line) for line in (state / "progress.jsonl").read_text().splitlines()]
    switches = [r for r in rows if r["event"] == "batch"]
    assert [(r["from"], r["to"], r["micro_batch"], r["accum_steps"], r["generation"]) for r in switches] == \
        [(16, 48, 8, 2, 0), (16, 48, 8, 2, 1)]
    progress = read_progress(uri, "ones", ["accum"])["accum"]
    assert [(o.num_gpus, o.per_gpu_batch) for o in progress.throughput_obs] == [(2, 8)]  # the micro-batch
    assert 2.0 in {v for _, v in metric_history(uri, progress.run_id, "accum_steps")}
    tag = mlflow.tracking.MlflowClient(uri).get_run(progress.run_id).data.tags["ones.batch"]
    assert tag.startswith("global batch 16 -> 48 (3 x 8 per slot, accumulated over 3 micro-batches) on 2 CPU slots")


def test_a_planned_stop_before_any_training_step_kills_the_ranks_at_once_and_is_clean(tmp_path):
    """Ranks still starting up (importing torch, loading the checkpoint: slower than the grace period on a
    loaded machine) when the scheduler's request comes have changed nothing since the checkpoint: the
    launcher kills them at once, records the stop for the orchestrator, and exits 0."""
    import json
    import threading

    from ones_pipeline.config.layout import preempt_request_file
    from ones_pipeline.core.types import JobSpec
    from ones_pipeline.scheduler import RunAllocation
    from ones_pipeline.train.launcher import LaunchRequest, launch

    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")  # never reaches a training step
    spec = JobSpec(name="slow", model="custom", dataset_size=10, per_gpu_batch=1, max_lr=1.0,
                   command=(sys.executable, str(script)))
    state = tmp_path / "state"
    state.mkdir()
    asker = threading.Timer(2.0, lambda: preempt_request_file(state, 3).write_text('{"reason": "shrink 2 -> 1"}'))
    asker.start()
    t0 = time.monotonic()
    assert launch(LaunchRequest(RunAllocation.make(spec, (0, 1), "cpu", 2, 3), state, grace_period_s=60.0)) == 0
    assert time.monotonic() - t0 < 20.0  # not the 60 s grace period
    rows = [json.loads(line) for line in (state / "progress.jsonl").read_text().splitlines()]
    assert rows[-1]["event"] == "stopped" and rows[-1]["before_training"] and rows[-1]["generation"] == 3
