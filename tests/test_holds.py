"""``scheduler.holds``: which changes stop a run, and which young runs the tick keeps as they are."""

from __future__ import annotations

from ones_pipeline.core.types import Allocation, Schedule
from ones_pipeline.scheduler.holds import Slots, hold_young_runs, stopped, young_runs


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
