"""``scheduler.holds``: which changes stop a run, which runs the tick keeps as they are (young ones, ending ones),
and no run stopped to leave its slots idle."""

from __future__ import annotations

from ones_pipeline.core.types import Allocation, Cluster, JobSpec, Schedule, StopKind, StoppingRule, ThroughputObs
from ones_pipeline.scheduler import Launch, RunAllocation, RunInfo, SchedulerSettings, TickInputs, plan_tick
from ones_pipeline.scheduler.holds import Slots, hold_young_runs, keep_stopped_for_nothing, stopped, young_runs
from ones_pipeline.scheduler.runs import ProgressInfo


def _alloc(job: str, gpus: tuple[int, ...], batch: int = 64, tuned: bool = True) -> Allocation:
    return Allocation(job, gpus, batch, 0.1, batch_tuned_by_job=tuned)


CURRENT = Schedule({"grow": _alloc("grow", (0,)), "gone": _alloc("gone", (1,)),
                    "batch": _alloc("batch", (2,), tuned=False), "same": _alloc("same", (3,))})
NEW = Schedule({"grow": _alloc("grow", (0, 4)), "batch": _alloc("batch", (2,), 128, tuned=False),
                "same": _alloc("same", (3,), 128), "queued": _alloc("queued", (1,))})


def test_on_cpu_slots_only_a_preemption_and_an_untuned_batch_change_stop_a_run():
    cpu = Slots("subprocess", "cpu", tuple(range(8)))
    assert stopped(CURRENT, NEW, cpu) == {"gone", "batch"}  # "same" re-tunes its batch itself
    assert stopped(CURRENT, NEW, cpu, spec_changed={"same"}) == {"gone", "batch", "same"}
    assert stopped(CURRENT, NEW, cpu, {"grow": "STARTING"}) == {"gone", "batch", "grow"}  # not started: no resize


def test_where_the_launcher_cannot_resize_in_place_a_slot_change_stops_the_run():
    assert "grow" in stopped(CURRENT, NEW, Slots("slurm", "cpu", tuple(range(8))))
    assert "grow" in stopped(CURRENT, NEW, Slots("docker", "gpu", tuple(range(8))))
    assert "grow" not in stopped(CURRENT, NEW, Slots("docker", "cpu", tuple(range(8))))
    # on GPUs a change in place keeps rank 0's GPU: slot ids 10.. here, rank 0 on id 10 dropped
    moved = Schedule({**NEW.allocations, "grow": _alloc("grow", (4,))})
    assert "grow" in stopped(CURRENT, moved, Slots("subprocess", "gpu", tuple(range(10, 18))))


def test_young_runs_are_held_only_against_what_stops_them_and_the_hold_keeps_their_slots():
    started = {"grow": 95.0, "gone": 95.0, "batch": 50.0, "same": 99.0}
    young = young_runs(100.0, 30.0, started, {"gone", "batch"}, changing={"same"})
    assert young == {"gone": "its run started less than 30 s ago (min_run_s)",
                     "same": "its in-place change is being made"}
    held = hold_young_runs(NEW, CURRENT, young)
    assert held.gpus_of("gone") == (1,) and held.gpus_of("same") == (3,)
    assert held.allocations["same"].global_batch == 128  # its own tuning moves its batch; nothing to hold
    assert "queued" not in held.allocations  # it needed the slot of the run kept
    assert held.gpus_of("grow") == (0, 4)  # not young against an in-place grow


def test_a_job_is_not_stopped_to_leave_its_slots_idle():
    current = Schedule({"long": _alloc("long", (0,)), "ending": _alloc("ending", (1,)), "gone": _alloc("gone", (2,))})
    # the policy stopped 'long' to grow 'ending', a run that has trained its budget (the tick drops its change);
    # 'gone' (no longer a job the policy sees: its spec was removed) stays stopped
    grown = Schedule({"ending": _alloc("ending", (0, 1))})
    kept = keep_stopped_for_nothing(grown, current, {"long", "ending"}, ending={"ending"})
    assert kept.gpus_of("long") == (0,) and "gone" not in kept.allocations
    assert keep_stopped_for_nothing(grown, current, {"long", "ending"}) == grown  # a grow that is made: not idle
    held = Schedule({"ending": _alloc("ending", (1,))})  # ... or one a hold kept as it is
    assert keep_stopped_for_nothing(held, current, {"long", "ending"}).gpus_of("long") == (0,)
    taken = Schedule({"ending": _alloc("ending", (1,)), "queued": _alloc("queued", (0,))})
    assert keep_stopped_for_nothing(taken, current, {"long", "ending"}, ending={"ending"}) == taken


def _spec(name: str, epochs: float) -> JobSpec:
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=2, stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))


def test_a_run_that_has_trained_its_whole_budget_is_left_to_end_and_its_slots_wait_for_the_next():
    """tiresias shrinks 'done' (on both slots) for 'queued'. While 'done' trains, in place; once it has trained its
    5 epochs its run is ending: the tick leaves it as it is and launches 'queued' onto the slot it still holds
    (Dagster's queue starts the run once the slot is free), so the start-up overlaps the end."""
    launch = Launch(RunAllocation.make(_spec("done", 5), [0, 1], "cpu", 64, 0), "test")
    runs = [RunInfo.from_run("done-0", "STARTED", launch.tags(), launch.run_config(), created_s=900.0, start_s=901.0)]
    obs = (ThroughputObs(1, 1, 32, 0.02, 0.0), ThroughputObs(2, 1, 64, 0.02, 0.0))

    def tick(epochs_done: float):
        inputs = TickInputs(now=1000.0, specs={"done": _spec("done", 5), "queued": _spec("queued", 3)},
                            finished=frozenset(), runs=runs, slot_ids=(0, 1), cluster=Cluster((2,)), cursor={},
                            progress={"done": ProgressInfo(samples_done=1437 * epochs_done, throughput_obs=obs)})
        return plan_tick(inputs, SchedulerSettings(policy="tiresias"))

    training = tick(4.0)
    assert [(d.job, d.after) for d in training.decisions] == [("done", (0,)), ("queued", (1,))]
    assert [r.job for r in training.resizes] == ["done"]
    ending = tick(5.0)
    assert [(d.job, d.after) for d in ending.decisions] == [("queued", (1,))] and ending.resizes == []
    assert [la.allocation.slot_ids for la in ending.launches] == [(1,)] and ending.cancels == []
