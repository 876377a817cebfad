"""Slot ownership across in-place changes on a real Dagster instance: the run's slot tags (``held``/``free``)
read by Dagster's own tag-limit counter, as the queued-run coordinator reads them on every pass."""

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import create_run_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._utils.tags import TagConcurrencyLimitsCounter

from ones_pipeline.cli.status import slots_text
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
from ones_pipeline.defs.instance import instance_yaml
from ones_pipeline.defs.slot_owner import allocation_now, claim, free_given_back, read_ledger
from ones_pipeline.scheduler import Launch, RunAllocation
from ones_pipeline.scheduler.runs import RunInfo
from ones_pipeline.train.resize_control import read_resize_request

DagsterRunStatus = dg.DagsterRunStatus
ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
    LoadableTargetOrigin(module_name="ones_pipeline.definitions")), "__repository__"), "train_job")


def spec(name):
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=2, stopping=StoppingRule(StopKind.EPOCHS, epochs=5.0))


def sensor_run(instance, job, slots, status, **kw):
    """A run as the sensor requests it: its tags (the job, one per slot) and its allocation in its run config."""
    launch = Launch(RunAllocation.make(spec(job), slots, "cpu", 32 * len(slots), 0), "test")
    return create_run_for_test(instance, job_name="train_job", status=status, tags=launch.tags(),
                               run_config={"ops": {"training_job": {"config": launch.run_config()}}}, **kw)


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_a_shrink_frees_its_slot_for_a_queued_run_and_a_grow_claims_only_a_free_slot(instance, tmp_path):
    limits = yaml.safe_load(instance_yaml([0, 1, 2], 4, "cpu"))["concurrency"]["runs"]["tag_concurrency_limits"]
    a = sensor_run(instance, "a", [0, 1], DagsterRunStatus.STARTED)
    b = sensor_run(instance, "b", [2], DagsterRunStatus.STARTED)
    queued = sensor_run(instance, "c", [1], DagsterRunStatus.QUEUED, remote_job_origin=ORIGIN)

    def blocked(run) -> bool:  # what the queued-run coordinator decides on its next pass
        in_progress = [instance.get_run_by_id(r.run_id) for r in (a, b)]
        return TagConcurrencyLimitsCounter(limits, in_progress).is_blocked(instance.get_run_by_id(run.run_id))

    def info(run) -> RunInfo:
        return allocation_now(instance, run.run_id, tmp_path / instance.get_run_by_id(run.run_id).tags["ones/job"])

    assert blocked(queued)
    grow_b = {"run_id": b.run_id, "job": "b", "generation": 0, "before": [2], "after": [2, 1], "global_batch": 64,
              "lr": 0.1, "device": "cpu", "reason": "grow 1 -> 2 in place"}
    assert not claim(instance, grow_b, tmp_path / "b", wait_s=0.3, log=lambda msg: None)  # a holds slot 1
    assert info(b).slot_ids == (2,) and info(b).held_ids == (2,)
    # a shrinks in place: the apply run sets its allocation; slot 1 stays held until its change is done
    shrink_a = {**grow_b, "run_id": a.run_id, "job": "a", "before": [0, 1], "after": [0], "global_batch": 32,
                "reason": "shrink 2 -> 1 in place"}
    assert claim(instance, shrink_a, tmp_path / "a", wait_s=0.0, log=pytest.fail)
    assert info(a).slot_ids == (0,) and info(a).held_ids == (0, 1) and blocked(queued)
    assert slots_text("cpu", info(a)) == "cpu 0 (freeing 1)"  # what `ones status` shows meanwhile
    assert free_given_back(instance, a.run_id, "cpu", tmp_path / "a", 0) == [1]  # the step: change done
    assert info(a).held_ids == (0,) and slots_text("cpu", info(a)) == "cpu 0" and not blocked(queued)
    assert free_given_back(instance, a.run_id, "cpu", tmp_path / "a", 0) == []  # once
    # the grow now finds slot 1 free of in-flight holders only once the queued run is gone or ends
    assert not claim(instance, grow_b, tmp_path / "b", wait_s=0.3, log=lambda msg: None)
    instance.report_run_canceled(instance.get_run_by_id(queued.run_id))
    assert claim(instance, grow_b, tmp_path / "b", wait_s=0.3, log=pytest.fail)
    assert info(b).slot_ids == (2, 1) and info(b).held_ids == (1, 2)
    assert [(r["claimed"], r["freed"]) for r in read_ledger(tmp_path / "a")] == [([], [1])]
    assert [(r["claimed"], r["freed"]) for r in read_ledger(tmp_path / "b")] == [([1], [])]


def test_a_grow_never_shares_a_slot_with_a_run_the_coordinator_starts_while_it_claims(instance, tmp_path, monkeypatch):
    """The grow's claim against Dagster's queued-run coordinator, at the worst moment: a run for slot 1 is queued
    (a later tick planned it) and the coordinator's pass starts it (no in-progress run holds slot 1 yet) just
    before the grow writes its tags. The claim holds first and looks after, so it sees that run, gives the slot
    back and is not made: never two in-progress runs holding slot 1, and no claim in the ledger."""
    limits = yaml.safe_load(instance_yaml([0, 1, 2], 4, "cpu"))["concurrency"]["runs"]["tag_concurrency_limits"]
    b = sensor_run(instance, "b", [2], DagsterRunStatus.STARTED)
    write_tags = instance.add_run_tags
    raced = []

    def coordinator_pass_then_write(run_id, tags):
        if not raced:  # once: queue the later tick's run, and start it if the coordinator would
            queued = sensor_run(instance, "c", [1], DagsterRunStatus.QUEUED, remote_job_origin=ORIGIN)
            in_progress = [r for r in instance.get_runs() if r.status == DagsterRunStatus.STARTED]
            if not TagConcurrencyLimitsCounter(limits, in_progress).is_blocked(queued):
                instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_START.value, "train_job"),
                                              queued.run_id)
            raced.append(queued)
        write_tags(run_id, tags)

    monkeypatch.setattr(instance, "add_run_tags", coordinator_pass_then_write)
    grow_b = {"run_id": b.run_id, "job": "b", "generation": 0, "before": [2], "after": [2, 1], "global_batch": 64,
              "lr": 0.1, "device": "cpu", "reason": "grow 1 -> 2 in place"}
    made = claim(instance, grow_b, tmp_path / "b", wait_s=0.3, log=lambda msg: None)
    (c,) = raced
    assert instance.get_run_by_id(c.run_id).status == DagsterRunStatus.STARTED  # the coordinator started it
    holding = [r.run_id for r in instance.get_runs() if r.status == DagsterRunStatus.STARTED
               and r.tags.get("ones/cpu-1") == "held"]
    assert holding == [c.run_id] and not made
    assert allocation_now(instance, b.run_id, tmp_path / "b").slot_ids == (2,) and read_ledger(tmp_path / "b") == []
    assert read_resize_request(tmp_path / "b", 0) is None  # its launcher was not asked
