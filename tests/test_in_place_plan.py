"""The tick prefers in-place changes where the launcher can make them (``scheduler.in_place``): a running
generation's slots change through a ``Resize`` the apply run carries out (same run, same generation), the
decision record says which path each change took, and later ticks neither repeat nor undo a change asked for."""

import pytest

from ones_pipeline.core.types import Cluster, JobSpec, StopKind, StoppingRule
from ones_pipeline.scheduler import Launch, RunAllocation, RunInfo, SchedulerSettings, TickInputs, plan_tick
from ones_pipeline.scheduler.in_place import not_in_place, rank_order
from ones_pipeline.scheduler.runs import SLOT_FREE


def spec(name, epochs=50.0):
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=2, stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))


def run_of(run_id, status, job, gen, slots, batch=64, change=None, tags=None, **times):
    """What ``defs.instance.run_info`` reads of a sensor-made run: its tags, its run config and its generation's
    in-place change request (``change``), if any; ``tags``: the slot tags as changed since."""
    launch = Launch(RunAllocation.make(spec(job), slots, "cpu", batch, gen), "test")
    return RunInfo.from_run(run_id, status, {**launch.tags(), **(tags or {})}, launch.run_config(), change, **times)


def plan(runs, now=1000.0, cursor=None, launcher="subprocess", min_hold_s=0.0, finished=frozenset()):
    specs = [spec("long", 2000), spec("short", 2)]
    inputs = TickInputs(now=now, specs={s.name: s for s in specs}, finished=finished, runs=runs, progress={},
                        slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor or {})
    return plan_tick(inputs, SchedulerSettings(params={"generations": 5}, min_hold_s=min_hold_s, launcher=launcher))


def test_a_shrink_for_a_new_job_is_made_in_place_and_not_decided_again():
    """'long' holds both slots, 'short' arrives: the subprocess launcher shrinks 'long' in place (no cancel, no
    new generation of it), 'short' is launched on the slot it gives up (Dagster's queue holds it until the slot's
    tag is freed), and the decision says "in place". The next tick, before the apply run has set the tags, sees
    the change as made; once the tags show it, the run's change time holds it as a young run would be held."""
    long0 = run_of("long-0", "STARTED", "long", 0, [0, 1], created_s=900.0, start_s=901.0)
    p = plan([long0])
    (resize,) = p.resizes
    assert (resize.job, resize.run_id, resize.generation, resize.before) == ("long", "long-0", 0, (0, 1))
    assert len(resize.after) == 1 and resize.kind == "shrink" and resize.global_batch >= 1
    assert not p.cancels and [x.job for x in p.launches] == ["short"]
    assert set(p.launches[0].slot_ids).isdisjoint(resize.after)
    (d,) = [d for d in p.decisions if d.job == "long"]
    assert d.path == "in place" and "shrink 2 -> 1 in place" in d.reason and d.to_dict()["path"] == "in place"
    assert "in place" in d.line()
    again = plan([long0], now=1005.0, cursor=p.cursor)
    assert not again.resizes and not [x for x in again.decisions if x.job == "long"]
    # The apply run wrote the run's change request, the step freed the slot it gave up: the run is the truth again.
    request = {"slots": list(resize.after), "global_batch": resize.global_batch, "time_s": 1004.0, "run_id": "long-0"}
    freed = {f"ones/cpu-{s}": SLOT_FREE for s in resize.before if s not in resize.after}
    long0b = run_of("long-0", "STARTED", "long", 0, [0, 1], change=request, tags=freed, created_s=900.0, start_s=901.0)
    assert long0b.held_ids == resize.after and long0b.changed_s == 1004.0
    held = plan([long0b], now=1010.0, cursor=again.cursor, min_hold_s=30.0)
    assert not held.resizes and not held.cancels and not [x for x in held.decisions if x.job == "long"]


def test_a_run_changed_in_place_moments_ago_grows_back_once_the_slot_it_gave_up_is_free():
    """The tick holds a run for ``min_run_s`` from its start, not from an in-place change: 'long' (started at
    900 s) shrank at 1004 s for 'short', 'short' finished at once, and the next tick grows 'long' back in place
    although its change is 6 s old (the demo left the slot idle 30 s there: the hold counted from the shrink).
    While the change is still being made, it is held."""
    long0 = run_of("long-0", "STARTED", "long", 0, [0, 1], created_s=900.0, start_s=901.0)
    p = plan([long0])
    (resize,) = p.resizes
    pending = plan([long0], now=1003.0, cursor=p.cursor, min_hold_s=30.0, finished=frozenset({"short"}))
    assert not pending.resizes and not pending.cancels
    request = {"slots": list(resize.after), "global_batch": resize.global_batch, "time_s": 1004.0, "run_id": "long-0"}
    freed = {f"ones/cpu-{s}": SLOT_FREE for s in resize.before if s not in resize.after}
    long0b = run_of("long-0", "STARTED", "long", 0, [0, 1], change=request, tags=freed, created_s=900.0, start_s=901.0)
    grown = plan([long0b], now=1010.0, cursor=pending.cursor, min_hold_s=30.0, finished=frozenset({"short"}))
    (back,) = grown.resizes
    assert back.job == "long" and back.kind == "grow" and set(back.after) == {0, 1} and not grown.cancels



def test_a_run_that_started_moments_ago_is_changed_in_place_but_not_stopped():
    """``min_run_s`` keeps a young run from being stopped (its start-up would be lost), not from a change in
    place, which loses none of it: 'long', started 15 s ago on 1 of 2 idle slots, grows at once (the live A/B
    left the slot beside a resumed job idle 35 s); through a checkpoint (Slurm) the same grow waits."""
    young = run_of("long-0", "STARTED", "long", 0, [0], created_s=995.0, start_s=996.0)
    (grow,) = plan([young], now=1010.0, min_hold_s=30.0, finished=frozenset({"short"})).resizes
    assert grow.kind == "grow" and set(grow.after) == {0, 1}
    slurm = plan([young], now=1010.0, min_hold_s=30.0, finished=frozenset({"short"}), launcher="slurm")
    assert not slurm.cancels and not slurm.launches and slurm.idle["long"].endswith("ago (min_run_s)")


@pytest.mark.parametrize(("launcher", "status", "why"), [
    ("slurm", "STARTED", "a Slurm job's nodes and tasks are fixed"),
    ("subprocess", "STARTING", "its run is starting, not started"),
])
def test_a_change_the_launcher_cannot_make_in_place_takes_the_checkpoint_path_and_says_why(launcher, status, why):
    long0 = run_of("long-0", status, "long", 0, [0, 1], created_s=900.0, start_s=901.0)
    p = plan([long0], launcher=launcher)
    assert not p.resizes and [c.job for c in p.cancels] == ["long"]
    (d,) = [d for d in p.decisions if d.job == "long"]
    assert d.path == "checkpoint" and f"through a checkpoint ({why}" in d.reason
    assert {x.job: x.generation for x in p.launches}.get("long", 1) == 1


def test_which_changes_each_launcher_makes_in_place():
    assert not_in_place("subprocess", "cpu", [0], [0, 1], "STARTED") is None
    assert not_in_place("subprocess", "cpu", [0, 1], [1], "STARTED") is None  # CPU ranks are relabelled
    assert not_in_place("docker", "cpu", [0, 1], [0], "STARTED") is None
    assert "exactly the GPUs" in not_in_place("docker", "gpu", [0, 1], [0], "STARTED")
    assert "rank 0's GPU 0" in not_in_place("subprocess", "gpu", [0, 1], [1], "STARTED")
    assert not_in_place("subprocess", "gpu", [1], [0, 1], "STARTED") is None
    assert "same slots" in not_in_place("subprocess", "cpu", [0], [0], "STARTED")
    assert rank_order("gpu", [1], [0, 1]) == (1, 0) and rank_order("cpu", [1], [0, 1]) == (0, 1)
    with pytest.raises(ValueError, match="launcher kind 'k8s'; allowed: subprocess, docker, slurm"):
        not_in_place("k8s", "cpu", [0], [1], "STARTED")


def test_slot_time_of_a_run_changed_in_place_follows_its_ledger():
    """A run held slots 0,1, gave 1 back in place at 150 s and took it again at 180 s: its slot-time (the
    partition's slot_hours, the cluster report) is 2 x 50 + 1 x 30 + 2 x 20 slot-seconds, not 2 x 100, and
    its stretches are the same whether or not its step recorded its first slots."""
    from ones_pipeline.adapters.live_report import FinishedJob, RunSpan, job_metrics
    from ones_pipeline.scheduler.runs import held_periods

    run = run_of("r", "SUCCESS", "long", 0, [0, 1], created_s=99.0, start_s=100.0, end_s=200.0)
    changes = [{"time_s": 150.0, "run_id": "r", "claimed": [], "freed": [1]},
               {"time_s": 180.0, "run_id": "r", "claimed": [1], "freed": []},
               {"time_s": 120.0, "run_id": "other", "claimed": [1], "freed": []}]
    expected = [(100.0, 150.0, (0, 1)), (150.0, 180.0, (0,)), (180.0, 200.0, (0, 1))]
    first = {"time_s": 101.0, "run_id": "r", "claimed": [0, 1], "freed": [], "first": True}
    assert held_periods(run, [first, *changes], now=500.0) == expected
    assert held_periods(run, changes, now=500.0) == expected
    spans = [RunSpan("long", 0, slots, s, e, "SUCCESS") for s, e, slots in expected]
    m = job_metrics(FinishedJob("long", 90.0, 200.0, 0.9, 1.0, 0), spans)
    assert m["gpu_s"] == 2 * 50 + 30 + 2 * 20 and m["run_s"] == 100.0 and m["generations"] == 1


def test_the_ticks_attained_service_follows_the_slot_ledger():
    """Tiresias's attained service (``JobView.attained_gpu_s``) of a run that shrank 2 -> 1 in place at 150 s,
    seen at 200 s: 2 x 50 + 1 x 50 slot-seconds from its ledger, not its final slot count x its whole life
    (1 x 100); without a ledger, the run alone (1 x 100)."""
    from ones_pipeline.core import policies
    from ones_pipeline.core.types import Schedule

    seen = {}

    class Recorder:
        name = "recorder"

        def decide(self, now, cluster, jobs, current):
            seen.update({v.name: v.attained_gpu_s for v in jobs})
            return Schedule(dict(current.allocations))

        def to_dict(self):
            return {"name": "recorder", "seed": 0, "params": {}, "state": {}}

    shrink = {"slots": [0], "global_batch": 32, "time_s": 150.0, "run_id": "r"}
    run = run_of("r", "STARTED", "long", 0, [0, 1], change=shrink, tags={"ones/cpu-1": SLOT_FREE}, created_s=99.0,
                 start_s=100.0)
    ledger = [{"time_s": 100.5, "run_id": "r", "generation": 0, "claimed": [0, 1], "freed": [], "first": True},
              {"time_s": 150.0, "run_id": "r", "generation": 0, "claimed": [], "freed": [1]}]
    policies.register("recorder-test")(lambda seed=0, **kw: Recorder())
    try:
        for ledgers, expected in (({"long": ledger}, 150.0), ({}, 100.0)):
            inputs = TickInputs(now=200.0, specs={"long": spec("long", 2000)}, finished=frozenset(), runs=[run],
                                progress={}, slot_ids=(0, 1), cluster=Cluster((2,)), ledgers=ledgers)
            plan_tick(inputs, SchedulerSettings(policy="recorder-test"))
            assert seen["long"] == pytest.approx(expected)
    finally:
        policies.POLICIES.pop("recorder-test")
