"""The scheduling sensor's cursor stays small whatever the number of finished jobs (the sensor's page shows it raw)."""

from __future__ import annotations

import json

import pytest

dg = pytest.importorskip("dagster")


SPEC = "model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 10}\n"
QUEUED_COORDINATOR = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}


def _finish(instance, jobs):
    """Materialize the jobs' partitions of ``training_job`` (one run that records them all)."""
    @dg.op
    def finish_all(context):
        for job in jobs:
            context.log_event(dg.AssetMaterialization(asset_key="training_job", partition=job))

    @dg.job
    def mark_finished():
        finish_all()

    assert mark_finished.execute_in_process(instance=instance).success


def test_the_cursor_does_not_grow_with_finished_jobs(tmp_path, sensor_tick):
    """60 jobs submitted, all but two finished: the cursor is as long as with the two alone (it grew by about
    100 bytes per finished job, forever); the two active jobs keep their submit times from tick to tick."""
    (tmp_path / "resources").mkdir()
    jobs_dir = tmp_path / "assets" / "jobs"
    jobs_dir.mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 5, decision_budget_s: 0.2, min_run_s: 0}\n")
    names = [f"job-{i:02d}" for i in range(60)]
    for name in names:
        (jobs_dir / f"{name}.yaml").write_text(SPEC)
    with dg.instance_for_test(overrides=QUEUED_COORDINATOR) as instance:
        first = sensor_tick(tmp_path, instance, None)
        submitted = json.loads(first.cursor)["submit"]
        assert set(submitted) == set(names)
        _finish(instance, names[2:])
        later = sensor_tick(tmp_path, instance, first.cursor)
        again = sensor_tick(tmp_path, instance, later.cursor)
    cursor = json.loads(again.cursor)
    assert cursor["submit"] == {n: submitted[n] for n in names[:2]}  # nothing of the active jobs lost
    assert not set(cursor["spec_hash"]) - set(names[:2])
    assert len(again.cursor) < 1000, again.cursor


def test_step_times_in_the_cursor_are_rounded():
    """The step times kept per model (``model_obs``) keep 4 significant digits (17 before: half the cursor)."""
    from ones_pipeline.defs.sensor import forget_finished

    cursor = {"submit": {"a": 1.0, "b": 2.0}, "model_obs": {"mlp": [[1, 1, 32, 0.00040617925060359994, 0.0]]}}
    forget_finished(cursor, {"b"})
    assert cursor["submit"] == {"a": 1.0} and cursor["model_obs"] == {"mlp": [[1, 1, 32, 0.0004062, 0.0]]}

