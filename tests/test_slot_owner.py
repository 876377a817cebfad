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
from ones_pipeline.defs.instance import instance_yaml
from ones_pipeline.defs.slot_owner import claim, free_given_back, read_ledger
from ones_pipeline.scheduler.runs import TAG_JOB, TAG_MANAGED, TAG_SLOTS, RunInfo

DagsterRunStatus = dg.DagsterRunStatus
ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
    LoadableTargetOrigin(module_name="ones_pipeline.definitions")), "__repository__"), "train_job")


def slot_tags(job, slots, gen=0):
    return {TAG_MANAGED: "true", TAG_JOB: job, "ones/generation": str(gen), TAG_SLOTS: ",".join(map(str, slots)),
            **{f"ones/cpu-{s}": "held" for s in slots}}


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_a_shrink_frees_its_slot_for_a_queued_run_and_a_grow_claims_only_a_free_slot(instance, tmp_path):
    limits = yaml.safe_load(instance_yaml([0, 1, 2], 4, "cpu"))["concurrency"]["runs"]["tag_concurrency_limits"]
    a = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED,
                            tags=slot_tags("a", [0, 1]))
    b = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED, tags=slot_tags("b", [2]))
    queued = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.QUEUED,
                                 tags=slot_tags("c", [1]), remote_job_origin=ORIGIN)

    def blocked(run) -> bool:  # what the queued-run coordinator decides on its next pass
        in_progress = [instance.get_run_by_id(r.run_id) for r in (a, b)]
        return TagConcurrencyLimitsCounter(limits, in_progress).is_blocked(instance.get_run_by_id(run.run_id))

    def info(run) -> RunInfo:
        r = instance.get_run_by_id(run.run_id)
        return RunInfo.from_tags(r.run_id, r.status.value, r.tags)

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
    b = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED, tags=slot_tags("b", [2]))
    write_tags = instance.add_run_tags
    raced = []

    def coordinator_pass_then_write(run_id, tags):
        if not raced:  # once: queue the later tick's run, and start it if the coordinator would
            queued = create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.QUEUED,
                                         tags=slot_tags("c", [1]), remote_job_origin=ORIGIN)
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
    b_now = instance.get_run_by_id(b.run_id)
    assert RunInfo.from_tags(b.run_id, "STARTED", b_now.tags).slot_ids == (2,) and read_ledger(tmp_path / "b") == []
