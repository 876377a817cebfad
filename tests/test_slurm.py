"""The Slurm launcher and inventory against a real Slurm cluster (``scripts/slurm.sh start``: slurmctld and
two slurmd, n1 and n2, 4 fake GPUs each; training runs on CPU with gloo, one process per "GPU").

Skipped, with the reason, when ``SLURM_CONF`` names no cluster that answers. The Dagster run's
cancellation is injected where Dagster injects it (``DagsterExecutionInterruptedError`` raised inside the
step's wait loop); everything Slurm does is real."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("torch")
pytest.importorskip("mlflow")

from dagster._core.errors import DagsterExecutionInterruptedError  # noqa: E402

from ones_pipeline.adapters import slurm as sl  # noqa: E402
from ones_pipeline.config import load_job_spec  # noqa: E402
from ones_pipeline.scheduler import RunAllocation  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]  # one cluster: one worker at a time
ROOT = Path(__file__).resolve().parents[1]


def _cluster_conf() -> str | None:
    conf = os.environ.get("SLURM_CONF")
    if not conf or not Path(conf).exists():
        return None
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "SLURM_CONF": conf})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return conf if "UP" in out.stdout else None


CONF = _cluster_conf()
if CONF is None:
    pytest.skip("no Slurm cluster answers (start one: eval \"$(scripts/slurm.sh start)\" as root; .ci/run does)",
                allow_module_level=True)


def write_project(root: Path, jobs: dict[str, str], grace: float = 15, pending_timeout: float = 60) -> Path:
    """A project on the private cluster. The decision budget (5 s) lets the search run all its 30 generations
    however loaded the CPU (0.5 s on a loaded machine may cut the search short)."""
    (root / "resources").mkdir(parents=True, exist_ok=True)
    (root / "assets" / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "resources" / "slurm.yaml").write_text(
        f"cluster:\n  slurm: {{partition: gpu, slurm_conf: {CONF}}}\n"
        f"launcher:\n  kind: slurm\n  grace_period_s: {grace}\n"
        f"  slurm: {{rank_device: cpu, pending_timeout_s: {pending_timeout}}}\n"
        "scheduler: {tick_interval_s: 3, decision_budget_s: 5, min_run_s: 10, retry_backoff_s: 2}\n"
        "policy: {name: ones}\n")
    for name, text in jobs.items():
        (root / "assets" / "jobs" / f"{name}.yaml").write_text(text)
    return root


CNN = "model: cnn-digits\nper_gpu_batch: 16\nbase_lr: 0.02\nmax_lr: 0.16\nmax_gpus: 8\nstopping: {epochs: %s}\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("ONES_ENV", "slurm")
    monkeypatch.setenv("ONES_PROJECT_DIR", str(tmp_path))
    return write_project(tmp_path, {"wide": CNN % 4})


@pytest.fixture
def long_project(tmp_path, monkeypatch):
    monkeypatch.setenv("ONES_ENV", "slurm")
    monkeypatch.setenv("ONES_PROJECT_DIR", str(tmp_path))
    return write_project(tmp_path, {"wide": CNN % 6})


def progress_rows(state_dir: Path) -> list[dict]:
    path = state_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_generation(project: Path, job: str, slots, generation: int, monkeypatch, stop_at_samples: int | None = None):
    """``dg.materialize`` of one partition on the Slurm launcher; with ``stop_at_samples``, the run is
    cancelled (Dagster's interrupt) once the job has trained that many samples in this generation."""
    from ones_pipeline.definitions import build_definitions
    from ones_pipeline.defs import slurm_step
    from ones_pipeline.defs.assets import training_job

    defs = build_definitions(str(project), "slurm")
    spec = load_job_spec(project / "assets" / "jobs" / f"{job}.yaml")
    alloc = RunAllocation.make(spec, tuple(slots), "gpu", spec.per_gpu_batch * len(slots), generation)
    state_dir = project / ".ones/state/jobs" / job
    real_state, fired = sl.job_state, []

    def job_state(job_id, conf=None):
        state = real_state(job_id, conf)
        if stop_at_samples is not None and not fired:
            rows = [r for r in progress_rows(state_dir) if r.get("event") == "epoch"
                    and r.get("generation") == generation]
            if rows and rows[-1]["samples"] >= stop_at_samples:
                fired.append(time.monotonic())
                raise DagsterExecutionInterruptedError("run terminated (test: preempted)")
        return state

    monkeypatch.setattr(slurm_step, "job_state", job_state)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("training_jobs", [job])
        result = dg.materialize([training_job], partition_key=job, instance=instance, raise_on_error=False,
                                run_config={"ops": {"training_job": {"config": {"allocation": alloc.to_json()}}}},
                                resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
        tags = instance.get_run_by_id(result.run_id).tags
        logs = [r.user_message for r in instance.all_logs(result.run_id) if r.user_message]
    return result, tags, logs, state_dir


def launched(rr) -> RunAllocation:
    """The allocation of a run request of ``train_job`` (its run config: not tags)."""
    return RunAllocation.from_json(rr.run_config["ops"]["training_job"]["config"]["allocation"])


def no_jobs_left() -> list[dict]:
    return sl.jobs_named("ones-", CONF)


# -- inventory ----------------------------------------------------------------------------------------
def test_inventory_reads_nodes_and_gres_and_leaves_out_a_drained_node():
    inv = sl.SlurmInventory("gpu", slurm_conf=CONF)
    found = inv.discover()
    assert [n.name for n in found.nodes] == ["n1", "n2"]
    assert found.slot_ids == tuple(range(8)) and found.cluster().gpus_per_node == (4, 4)
    sl.run_cli(["scontrol", "update", "nodename=n2", "state=drain", "reason=test-maintenance"], CONF)
    try:
        drained = inv.discover()
        assert [n.name for n in drained.nodes] == ["n1"] and drained.slot_ids == (0, 1, 2, 3)
        assert any("n2" in u and "drain" in u and "test-maintenance" in u for u in drained.unavailable)
        assert "left out" in drained.reason
    finally:
        sl.run_cli(["scontrol", "update", "nodename=n2", "state=resume"], CONF)
    assert [(n.name, c) for n, c in inv.place([1, 4, 5, 6])] == [("n1", 1), ("n2", 3)]


def test_an_unreachable_controller_is_inventory_unavailable(tmp_path):
    from ones_pipeline.adapters.inventory import InventoryUnavailable

    conf = tmp_path / "slurm.conf"  # the same cluster on a port nobody listens on
    text = Path(CONF).read_text()
    conf.write_text("\n".join("SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
                              for line in text.splitlines()) + "\nMessageTimeout=2\n")
    started = time.monotonic()
    with pytest.raises(InventoryUnavailable, match="slurmctld|controller"):
        sl.SlurmInventory("gpu", slurm_conf=str(conf)).discover()
    assert time.monotonic() - started < sl.CLI_TIMEOUT_S + 5


# -- one job across both nodes ------------------------------------------------------------------------------
def test_a_job_spanning_both_nodes_trains_to_completion(project, monkeypatch):
    result, tags, logs, state_dir = run_generation(project, "wide", [0, 1, 4, 5], 0, monkeypatch)
    assert result.success, "\n".join(logs[-30:])
    step_dirs = list((state_dir / "slurm").glob("g0-*"))
    assert len(step_dirs) == 1
    ranks = json.loads("[" + ",".join(p.read_text() for p in sorted(step_dirs[0].glob("rank-*.json"))) + "]")
    # The ranks' own records and Slurm's: ranks 0-1 on n1, 2-3 on n2, each with its own GPU.
    assert [(r["rank"], r["node"]) for r in sorted(ranks, key=lambda r: r["rank"])] == [
        (0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")]
    assert {(r["node"], tuple(r["gpus"])) for r in ranks} == {("n1", ("0",)), ("n1", ("1",)), ("n2", ("0",)),
                                                               ("n2", ("1",))}
    state = sl.job_state(tags["ones/slurm-job"], CONF)
    assert state is not None and state.state == "COMPLETED" and state.nodes == "n[1-2]"
    assert tags["ones/slurm-devices"] == "0:n1/gpu0 1:n1/gpu1 2:n2/gpu0 3:n2/gpu1"
    epochs = [r for r in progress_rows(state_dir) if r.get("event") == "epoch"]
    assert epochs[-1]["processes"] == 4 and epochs[-1]["samples"] == 4 * 1437
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    import mlflow

    mlflow_run = next(r for r in progress_rows(state_dir) if r.get("event") == "mlflow_run")
    run = mlflow.MlflowClient(f"sqlite:///{project}/.ones/state/mlflow.db").get_run(mlflow_run["run_id"])
    assert run.data.tags["slurm.devices.g0"] == tags["ones/slurm-devices"]
    assert run.data.tags["slurm.job_id.g0"] == tags["ones/slurm-job"]
    assert not no_jobs_left()


def test_resize_across_nodes_continues_the_sample_count_exactly(long_project, monkeypatch):
    """1 node x 2 GPUs -> 2 nodes x 2 GPUs -> 1 node x 1 GPU: each generation is cancelled (TERM, checkpoint)
    and the next resumes from the checkpoint's sample count; one MLflow run throughout."""
    total = 6 * 1437  # stops well before the end: a stop that lands after the last epoch finds nothing to stop
    plan = [([0, 1], 1200), ([0, 1, 4, 5], 3000), ([2], None)]
    stopped_at = []
    for generation, (slots, stop) in enumerate(plan):
        started = time.monotonic()
        result, tags, logs, state_dir = run_generation(long_project, "wide", slots, generation, monkeypatch, stop)
        rows = progress_rows(state_dir)
        gen_rows = [r for r in rows if r.get("generation") == generation]
        if stop is None:
            assert result.success, "\n".join(logs[-30:])
            assert [r for r in gen_rows if r.get("event") == "epoch"][-1]["samples"] == total
        else:
            assert not result.success  # the interrupted run
            stop_row = next(r for r in gen_rows if r.get("event") == "stopped")
            stopped_at.append(stop_row["samples"])
            assert stop_row["samples"] >= stop
            assert any("scancel --signal=TERM" in m for m in logs)
            assert time.monotonic() - started < 120
        assert not no_jobs_left(), "a Slurm job outlived its run"
        ckpt = load_checkpoint(state_dir)
        assert ckpt is not None
        if stop is not None:  # what the next generation resumes from: exactly where this one stopped
            assert ckpt["progress"]["samples_done"] == stopped_at[-1]
        if generation > 0:
            first = next(r for r in gen_rows if r.get("event") == "epoch")
            assert stopped_at[generation - 1] < first["samples"] <= stopped_at[generation - 1] + 1437
    runs = {r["run_id"] for r in progress_rows(state_dir) if r.get("event") == "mlflow_run"}
    assert len(runs) == 1
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{long_project}/.ones/state/mlflow.db")
    samples = [m.value for m in client.get_metric_history(runs.pop(), "samples")]
    assert samples == sorted(samples) and samples[-1] == total  # never back beyond a checkpoint here


# -- faults -------------------------------------------------------------------------------------------------
def test_a_job_pending_forever_on_a_drained_node_fails_with_the_reason_and_is_planned_elsewhere(tmp_path,
                                                                                              monkeypatch):
    """The sensor plans the job; the test drains the node it was planned on (resources taken outside
    ones); the run's Slurm job stays pending, is cancelled after ``pending_timeout_s`` and fails the run
    with Slurm's reason; the next tick plans a new generation on the other node."""
    from ones_pipeline.definitions import build_definitions
    from ones_pipeline.defs.assets import training_job

    monkeypatch.setenv("ONES_ENV", "slurm")
    monkeypatch.setenv("ONES_PROJECT_DIR", str(tmp_path))
    project = write_project(tmp_path, {"stuck": CNN.replace("max_gpus: 8", "max_gpus: 2") % 2}, pending_timeout=6)
    defs = build_definitions(str(project), "slurm")
    sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance, definitions=defs, resources=defs.resources) as ctx:
            first = sensor(ctx)
        for req in first.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        rr = next(r for r in first.run_requests if r.job_name == "train_job")
        slots = list(launched(rr).slot_ids)
        node = "n1" if slots[0] < 4 else "n2"
        sl.run_cli(["scontrol", "update", f"nodename={node}", "state=drain", "reason=taken-outside-ones"], CONF)
        try:
            started = time.monotonic()
            done = dg.materialize([training_job], partition_key="stuck", instance=instance, raise_on_error=False,
                                  run_config=rr.run_config, tags=rr.tags,
                                  resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
            assert not done.success and time.monotonic() - started < 60
            failure = next(e for e in done.all_events if e.event_type_value == "STEP_FAILURE")
            message = failure.step_failure_data.error.message
            assert "still pending after 6 s" in message and "planned again" in message, message
            assert "ReqNodeNotAvail" in message or "Resources" in message or "drain" in message.lower(), message
            assert not no_jobs_left()
            time.sleep(2.5)  # the retry backoff (retry_backoff_s: 2)
            with dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs,
                                         resources=defs.resources) as ctx:
                again = sensor(ctx)
            retry = next(r for r in again.run_requests if r.job_name == "train_job")
            new_slots = list(launched(retry).slot_ids)
            other = range(4, 8) if node == "n1" else range(0, 4)
            assert launched(retry).generation > launched(rr).generation
            assert all(s in other for s in new_slots), (node, new_slots)
        finally:
            sl.run_cli(["scontrol", "update", f"nodename={node}", "state=resume"], CONF)


def test_a_slurm_job_left_by_a_killed_run_is_stopped_before_the_next_generation(tmp_path, monkeypatch):
    """A run worker killed with -9 never runs its ``finally``: its Slurm job keeps the GPUs. The next
    generation of the job stops it first (TERM, then cancel) instead of waiting behind it."""
    monkeypatch.setenv("ONES_ENV", "slurm")
    monkeypatch.setenv("ONES_PROJECT_DIR", str(tmp_path))
    project = write_project(tmp_path, {"wide": CNN % 1}, grace=3)
    left = subprocess.run(["sbatch", "--parsable", "--job-name=ones-wide-g0", "--nodelist=n1", "--ntasks=4",
                           "--gpus-per-task=1", "--output=/dev/null", "--wrap=srun sleep 600"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "SLURM_CONF": CONF}).stdout.strip()
    deadline = time.monotonic() + 30
    while (st := sl.job_state(left, CONF)) is not None and st.state != "RUNNING":
        assert time.monotonic() < deadline, st
        time.sleep(0.5)
    result, tags, logs, _ = run_generation(project, "wide", [0, 1], 1, monkeypatch)
    assert result.success, "\n".join(logs[-30:])
    assert any(f"Slurm job {left} (ones-wide-g0) of an earlier generation" in m for m in logs), logs[:20]
    assert not (st := sl.job_state(left, CONF)) or not st.active
    assert not no_jobs_left()
