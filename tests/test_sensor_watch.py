"""The scheduler sensor decides every ``tick_interval_s`` and, between those, as soon as a training run ends, a job
finishes or a job spec changes (``defs.sensor.watch_tick``): a slot a short job frees is given out seconds after
its run ends. The evaluations in between decide nothing, read nothing else, and the live replay leaves them out of
the ticks it decides at."""

from __future__ import annotations

import json

import pytest

dg = pytest.importorskip("dagster")

from dagster._core.storage.dagster_run import DagsterRunStatus  # noqa: E402
from dagster._core.test_utils import create_run_for_test  # noqa: E402

from ones_pipeline.adapters.live_as_ran import sensor_ticks  # noqa: E402
from ones_pipeline.defs.sensor import WATCHING  # noqa: E402

SPEC = "model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 10}\n"
QUEUED_COORDINATOR = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}


@pytest.fixture
def project(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nscheduler: {tick_interval_s: 60, decision_budget_s: 0.2, min_run_s: 0}\n")
    (tmp_path / "assets" / "jobs" / "a.yaml").write_text(SPEC)
    return tmp_path


def _skip(result) -> str:
    return result.skip_reason.skip_message if result.skip_reason else ""


def _decided(result) -> bool:
    return not _skip(result).startswith(WATCHING)


def test_the_sensor_decides_at_its_interval_and_when_a_run_ends_or_a_spec_changes(project, sensor_tick):
    with dg.instance_for_test(overrides=QUEUED_COORDINATOR) as instance:
        first = sensor_tick(project, instance, None)
        assert _decided(first) and [r.partition_key for r in first.run_requests if r.job_name == "train_job"] == ["a"]
        quiet = sensor_tick(project, instance, first.cursor)
        assert not _decided(quiet) and quiet.cursor == first.cursor and not quiet.run_requests
        assert "the next in" in _skip(quiet)

        (project / "assets" / "jobs" / "b.yaml").write_text(SPEC)  # a spec submitted: decided at once
        submitted = sensor_tick(project, instance, first.cursor)
        assert _decided(submitted) and "b" in json.loads(submitted.cursor)["submit"]
        assert not _decided(sensor_tick(project, instance, submitted.cursor))

        create_run_for_test(instance, job_name="train_job", tags={"ones/job": "a"},
                            status=DagsterRunStatus.SUCCESS)  # a's run ended: its slots are free
        ended = sensor_tick(project, instance, submitted.cursor)
        assert _decided(ended)
        assert not _decided(sensor_tick(project, instance, ended.cursor))

        old = json.loads(ended.cursor)
        old["last_tick"]["time_s"] -= 61  # the interval passed with nothing else
        assert _decided(sensor_tick(project, instance, json.dumps(old)))


def test_the_replay_decides_at_the_ticks_that_decided(project, sensor_tick):
    """``sensor_ticks`` (the replay's decision times) keeps the sensor's decisions and its skips that read the jobs
    ("no change: ..."), not the evaluations that only watched."""
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteInstigatorOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        TickData,
        TickStatus,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="ones_pipeline.definitions")), "__repository__"), "ones_scheduler_sensor")
    state = InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING)

    def recorded(result, at):  # the tick as the daemon stores it
        instance.create_tick(TickData(
            instigator_origin_id=state.instigator_origin_id, instigator_name=state.instigator_name,
            instigator_type=InstigatorType.SENSOR, selector_id=state.selector_id, timestamp=at, run_ids=[],
            status=TickStatus.SKIPPED if result.skip_reason else TickStatus.SUCCESS, skip_reason=_skip(result) or None))
        return result

    with dg.instance_for_test(overrides=QUEUED_COORDINATOR) as instance:
        instance.add_instigator_state(state)
        cursor, kinds = None, []
        for i in range(3):
            result = recorded(sensor_tick(project, instance, cursor), 1000.0 + i)
            cursor = result.cursor
            kinds.append(_decided(result))
        (project / "assets" / "jobs" / "a.yaml").unlink()  # removed: the next evaluation decides (no change)
        result = recorded(sensor_tick(project, instance, cursor), 1003.0)
        assert kinds == [True, False, False] and _decided(result)
        assert sensor_ticks(instance) == [1000.0, 1003.0]
