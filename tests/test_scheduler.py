"""plan_tick without Dagster: the schedule comes from the runs, generations and run keys, young runs held;
the allocation record is validated where it is made and round-trips through JSON."""

import dataclasses
import json

import pytest

from ones_pipeline.core.types import Cluster, JobSpec, StopKind, StoppingRule, ThroughputObs, lr_for_batch
from ones_pipeline.scheduler import Launch, RunAllocation, RunInfo, SchedulerSettings, TickInputs, plan_tick
from ones_pipeline.scheduler.runs import ProgressInfo


def spec(name, epochs=50.0, max_gpus=2):
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=max_gpus, stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))


def run(job, gen, slots, status="STARTED", created=0.0, batch=32):
    launch = Launch(RunAllocation.make(spec(job), slots, "cpu", batch, gen), "test")
    return RunInfo.from_run(f"{job}-{gen}", status, launch.tags(), launch.run_config(), created_s=created,
                            start_s=created + 1)


def plan(specs, runs, now=1000.0, cursor=None, finished=(), progress=None, **settings):
    inputs = TickInputs(now=now, specs={s.name: s for s in specs}, finished=frozenset(finished), runs=runs,
                        progress=progress or {}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor or {})
    return plan_tick(inputs, SchedulerSettings(params={"generations": 5}, **settings))


def test_generation_follows_every_run_ever_and_stale_runs_are_cancelled():
    runs = [run("a", 0, [0], "CANCELED"), run("a", 3, [0], "FAILURE", created=10.0),
            run("b", 0, [1], "QUEUED"), run("b", 1, [1], "STARTED")]
    p = plan([spec("a"), spec("b")], runs, now=10_000.0, retry_backoff_s=0.0)
    assert [c.run_id for c in p.cancels if c.reason.startswith("superseded")] == ["b-0"]
    (launch,) = [item for item in p.launches if item.job == "a"]  # slot 0 is free and the backoff is over
    assert launch.generation == 4 and launch.run_key == "a-g4"


def test_a_young_run_keeps_its_slots_and_blocks_what_would_need_them():
    """'long' (2000 epochs) holds both slots; 'short' arrives. Where a change stops the run (Slurm: through a
    checkpoint) the long job's run, created 5 s ago, is left alone with min_hold; once it is older, the policy may
    take a slot for 'short'. Where it shrinks in place, it loses none of its start-up, and does so at once."""
    long_run = run("long", 0, [0, 1], created=995.0, batch=64)
    held = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=30.0, launcher="slurm")
    assert not held.cancels and not held.launches
    in_place = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=30.0)
    assert [r.job for r in in_place.resizes] == ["long"] and [x.job for x in in_place.launches] == ["short"]
    free = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=0.0, launcher="slurm")
    assert [c.job for c in free.cancels] == ["long"] and "short" in {x.job for x in free.launches}
    slots = [s for x in free.launches for s in x.slot_ids]
    assert len(slots) == len(set(slots))


def test_finished_and_removed_jobs_release_their_runs():
    runs = [run("a", 0, [0]), run("gone", 0, [1])]
    p = plan([spec("a")], runs, finished={"a"})
    assert sorted((c.job, c.reason) for c in p.cancels) == [("a", "finished"), ("gone", "spec removed")]
    assert p.launches == []


def test_launches_carry_a_valid_allocation_with_the_core_lr_rule():
    p = plan([spec("a")], [])
    (launch,) = p.launches
    a = launch.allocation
    assert a.device == "cpu" and a.generation == 0 and a.submit_time_s == 1000.0
    assert a.lr == lr_for_batch(a.spec, a.global_batch) > 0
    text = a.to_json()
    again = RunAllocation.from_json(text)
    assert again == a and json.loads(text)["spec"]["name"] == "a"
    assert again.to_json() is text  # handed on as read, not serialised again


def test_a_run_without_an_lr_tag_gets_the_core_rule_not_zero():
    launch = Launch(RunAllocation.make(spec("a"), [0], "cpu", 32, 0), "test")
    assert "ones/lr" not in launch.tags()  # the allocation's LR follows its batch (core rule): no tag needed
    info = RunInfo.from_run("a-0", "STARTED", launch.tags(), launch.run_config(), created_s=0.0, start_s=1.0)
    p = plan([spec("a")], [info], now=10_000.0)  # Allocation refuses lr 0: this raised before the fallback
    assert p.cursor["version"] == 2 and {d.job for d in p.decisions} <= {"a"}


@pytest.mark.parametrize("change, message", [
    ({"slot_ids": ()}, "slot_ids must be distinct"),
    ({"slot_ids": (0, 0)}, "slot_ids must be distinct"),
    ({"device": "tpu"}, "allowed: gpu, cpu"),
    ({"global_batch": 0}, "outside 1.."),
    ({"global_batch": 10_000}, "outside 1.."),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"lr": float("nan")}, "lr must be a finite number > 0"),
    ({"generation": -1}, "generation must be"),
])
def test_allocation_rejects_bad_values_naming_the_field(change, message):
    good = dict(spec=spec("a"), slot_ids=(0,), device="cpu", global_batch=32, lr=0.05, generation=0)
    RunAllocation(**good)
    with pytest.raises(ValueError, match=message):
        RunAllocation(**{**good, **change})


def test_allocation_from_json_names_missing_fields():
    data = RunAllocation.make(spec("a"), [0], "cpu", 32, 0).to_dict()
    del data["lr"]
    with pytest.raises(ValueError, match="missing field.*lr"):
        RunAllocation.from_dict(data)
    with pytest.raises(ValueError, match="not JSON"):
        RunAllocation.from_json("{")


def test_the_policy_state_in_the_cursor_is_carried_on_even_with_partial_params():
    """The settings name only some parameters ({"generations": 5}); the saved ones are complete. The
    search state must still be restored (a JSON round trip of the cursor included)."""
    from ones_pipeline.scheduler.tick import _policy

    first = plan([spec("a"), spec("b")], [])
    saved = json.loads(json.dumps(first.policy_state))
    restored = _policy(saved, SchedulerSettings(params={"generations": 5}))
    assert restored.to_dict()["state"] == saved["state"] and saved["state"]
    other = _policy(saved, SchedulerSettings(params={"generations": 6}))
    assert other.to_dict()["state"] != saved["state"]  # other parameters: a fresh search
    # The cursor stays small: no search state in it, only what the next tick needs.
    assert "policy" not in first.cursor and len(json.dumps(first.cursor)) < 400


def test_a_policy_batch_beyond_what_the_processes_hold_is_clamped_not_a_crash():
    """A job-tuned batch may need gradient accumulation (simulator); the live step has none: the launch
    gets the largest batch its processes can hold, a valid RunAllocation."""
    from ones_pipeline.core.types import Allocation, Schedule

    class Greedy:
        name = "greedy"

        def decide(self, now, cluster, jobs, current):
            return Schedule({"a": Allocation("a", (0,), 200, 0.2, batch_tuned_by_job=True)})

        def to_dict(self):
            return {"name": "greedy", "seed": 0, "params": {}, "state": {}}

    from ones_pipeline.core import policies

    policies.register("greedy-test")(lambda seed=0, **kw: Greedy())
    try:
        capped = JobSpec(name="a", model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                         max_lr=0.4, max_per_gpu_batch=64, stopping=StoppingRule(StopKind.EPOCHS, epochs=5))
        inputs = TickInputs(now=0.0, specs={"a": capped}, finished=frozenset(), runs=[], progress={},
                            slot_ids=(0, 1), cluster=Cluster((2,)))
        (launch,) = plan_tick(inputs, SchedulerSettings(policy="greedy-test")).launches
        assert launch.global_batch == 64 and launch.lr == lr_for_batch(capped, 64)
    finally:
        policies.POLICIES.pop("greedy-test")


# 'long' has timed its steps on 1 and 2 slots (the scheduler predicts from them); 'short' has timed nothing.
MEASURED_LONG = {"long": ProgressInfo(samples_done=3200.0, throughput_obs=(
    ThroughputObs(1, 1, 32, 0.02, 0.0), ThroughputObs(2, 1, 32, 0.012, 0.002)))}


def test_a_job_nobody_has_timed_is_started_without_a_made_up_prediction():
    """Neither 'short' nor any earlier job of its model has timed a step: its start says it is not measured
    yet, with what the start-up costs, and carries no predicted time (none is shown as a finish time);
    'long', measured, gives up a slot for it with its predictions before and after."""
    long_run = run("long", 0, [0, 1], created=900.0, batch=64)
    short = dataclasses.replace(spec("short", 2), model="cnn-digits")  # a model nothing has measured
    p = plan([spec("long", 2000), short], [long_run], now=1000.0, min_hold_s=0.0, progress=MEASURED_LONG)
    (start,) = [d for d in p.decisions if d.job == "short"]
    assert start.reason.startswith("start: not measured yet"), start.reason
    assert "(start-up, ~" in start.reason and "predicted" not in start.reason
    assert start.why["remaining_after_s"] is None and start.why["remaining_before_s"] is None
    (shrink,) = [d for d in p.decisions if d.job == "long"]
    assert shrink.why["remaining_before_s"] > 0 and "predicted to finish in" in shrink.reason


def test_a_shrink_or_preemption_says_why_with_predictions_and_who_gets_the_slots():
    """'long' holds both slots; 'short' arrives and the policy takes a slot from 'long'. The decision of
    'long' carries the predicted time to finish before and after (the change's cost included), what that kind
    of change costs and the job its slot goes to; the cancel reason (the "preempted by ones: ..." line) says the
    same."""
    long_run = run("long", 0, [0, 1], created=900.0, batch=64)
    p = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=0.0, launcher="slurm",
             progress=MEASURED_LONG)
    (d,) = [d for d in p.decisions if d.job == "long"]
    why = d.why
    assert why["frees_for"] == ["short"] and why["change_cost_s"] > 0 and why["change"] == "restart"
    assert why["remaining_before_s"] > 0
    if why["remaining_after_s"] is not None:  # a shrink: slower, and the restart on top
        assert why["remaining_after_s"] > why["remaining_before_s"]
        assert "predicted to finish in" in d.reason and "restart" in d.reason
    assert "frees slots for short" in d.reason
    (cancel,) = [c for c in p.cancels if c.job == "long"]
    assert "frees slots for short" in cancel.reason
    assert d.to_dict()["why"] == why


def test_the_reason_quotes_what_the_kind_of_change_costs_and_says_when_the_job_itself_is_later():
    """The numbers behind a decision add what that kind of change costs where it runs (the tick's measured
    ``JobView.change_costs``, here nothing measured yet: the live prior), named: a shrink in place quotes its
    in-place cost, never a restart; through a checkpoint (Slurm) a restart. A change that leaves the job later
    than before says so instead of reading as a contradiction, and a job alone never blames the other jobs."""
    from ones_pipeline.scheduler.change_costs import PRIOR
    from ones_pipeline.scheduler.rationale import Why

    long_run = run("long", 0, [0, 1], created=900.0, batch=64)
    for launcher, kind, words in (("subprocess", "shrink", "shrink in place"),
                                  ("slurm", "restart", "restart from a checkpoint")):
        p = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=0.0, launcher=launcher,
                 progress=MEASURED_LONG)
        (d,) = [d for d in p.decisions if d.job == "long"]
        assert d.why["change"] == kind and d.why["change_cost_s"] == PRIOR[kind]
        assert f"({words}, ~" in d.reason and ("restart" in d.reason) is (kind == "restart"), d.reason
    grow = Why(53.0, 66.0, 30.0, change="grow").text()
    assert grow.startswith("predicted to finish in 53 s -> 66 s (grow in place, ~30 s)")
    assert "later for this job alone" in grow
    assert "later for this job alone" not in Why(53.0, 40.0, 30.0).text()
    # Within 5 % of each other the two predictions are "about as soon", neither sooner nor later (the demo's shrink
    # read "6.1 min -> 6.0 min" beside a grow of the same job at "5.8 min -> 5.6 min").
    close = Why(366.0, 360.0, 0.04, change="shrink", frees_for=("b",)).text()
    assert close.startswith("predicted to finish about as soon, in 6.1 min -> 6.0 min (shrink in place, ~0.04 s)")
    assert "later" not in Why(360.0, 366.0, 0.04, change="shrink").text()
    alone = Why(53.0, 66.0, 0.05, change="grow", alone=True).text()
    assert "all jobs" not in alone and "(grow in place, ~0.05 s)" in alone


def test_a_job_that_waits_says_why_and_who_holds_the_slots():
    long_run = run("long", 0, [0, 1], created=995.0, batch=64)
    p = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=30.0, launcher="slurm")
    assert p.waiting == {"short": "waiting: no free slots; held by long (cpu 0,1)"}
    from ones_pipeline.scheduler.rationale import waiting_reason

    assert waiting_reason("x", {}, [1], "gpu").startswith("waiting: 1 slot(s) free (gpu 1)")


def test_a_cancel_under_way_is_not_decided_again_every_tick():
    """(Slurm: the checkpoint path.) The apply run of the tick that cancelled a run may take a few ticks: the run is
    still in flight, and later ticks do not cancel it again nor record the same decision again."""
    runs = [run("long", 0, [0, 1], created=900.0, batch=64)]
    first = plan([spec("long", 2000), spec("short", 2)], runs, now=1000.0, min_hold_s=0.0, launcher="slurm")
    assert [c.job for c in first.cancels] == ["long"] and any(d.job == "long" for d in first.decisions)
    again = plan([spec("long", 2000), spec("short", 2)], runs, now=1010.0, cursor=first.cursor, min_hold_s=0.0,
                 launcher="slurm")
    assert not again.cancels and not [d for d in again.decisions if d.job == "long"]
    later = plan([spec("long", 2000), spec("short", 2)], runs, now=1200.0, cursor=first.cursor, min_hold_s=0.0,
                 launcher="slurm")
    assert [c.job for c in later.cancels] == ["long"]  # still running 200 s later: the cancel is retried


def test_a_job_that_has_trained_its_whole_budget_is_left_to_end_not_moved():
    """MLflow shows every sample of 'long' trained, but its materialization has not arrived: the policy
    would give a slot to 'short', yet 'long' keeps its run (a new generation would train nothing)."""
    from ones_pipeline.scheduler import ProgressInfo

    long_run = run("long", 0, [0, 1], created=900.0, batch=64)
    specs = [spec("long", 2000), spec("short", 2)]
    moved = plan(specs, [long_run], now=1000.0, min_hold_s=0.0, launcher="slurm")
    assert [c.job for c in moved.cancels] == ["long"]  # the premise: the policy moves it otherwise
    done = ProgressInfo(samples_done=2000 * 1437)
    inputs = TickInputs(now=1000.0, specs={s.name: s for s in specs}, finished=frozenset(), runs=[long_run],
                        progress={"long": done}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor={})
    kept = plan_tick(inputs, SchedulerSettings(params={"generations": 5}, min_hold_s=0.0, launcher="slurm"))
    assert not kept.cancels and not [d for d in kept.decisions if d.job == "long"]
    assert all(set(x.slot_ids).isdisjoint({0, 1}) for x in kept.launches if x.job == "long")


def test_run_worker_deaths_use_up_no_retry_but_the_job_own_failures_do():
    """Runs that failed because their run worker died (Dagster's ``dagster/failure_reason``
    UNEXPECTED_TERMINATION, e.g. a kill -9) back off but do not exhaust ``max_retries``; as many failures
    of the training itself (STEP_FAILURE) mark the job failed."""
    from ones_pipeline.scheduler.tick import INFRA_RETRY_FACTOR

    def failed(gen, reason):
        launch = Launch(RunAllocation.make(spec("a"), (0,), "cpu", 32, gen), "test")
        tags = {**launch.tags(), "dagster/failure_reason": reason}
        return RunInfo.from_run(f"a-{gen}", "FAILURE", tags, launch.run_config(), created_s=10.0 * gen,
                                start_s=10.0 * gen + 1, end_s=10.0 * gen + 5)

    killed = [failed(g, "UNEXPECTED_TERMINATION") for g in range(4)]
    assert killed[0].infra_failure and not failed(0, "STEP_FAILURE").infra_failure
    p = plan([spec("a")], killed, now=1000.0, max_retries=1, retry_backoff_s=30.0)
    assert "a" not in p.newly_failed and [launch.job for launch in p.launches] == ["a"]  # retried
    own = [failed(g, "STEP_FAILURE") for g in range(2)]
    p = plan([spec("a")], own, now=1000.0, max_retries=1, retry_backoff_s=30.0)
    assert "a" in p.newly_failed and "2 failed runs" in p.newly_failed["a"] and not p.launches
    many = [failed(g, "UNEXPECTED_TERMINATION") for g in range(INFRA_RETRY_FACTOR + 1)]
    p = plan([spec("a")], many, now=10_000.0, max_retries=1, retry_backoff_s=30.0)
    assert "runs whose run worker died" in p.newly_failed["a"]


def test_a_new_job_is_estimated_from_the_step_times_an_earlier_job_of_its_model_measured():
    """Job a measured its steps and finished; b, the same model, has measured nothing, and no active job of
    its model has: its estimates come from a's step times (kept in the cursor), not the generic prior."""
    from ones_pipeline.core import throughput as tp
    from ones_pipeline.core.goodput import GoodputModel
    from ones_pipeline.core.types import ThroughputObs
    from ones_pipeline.scheduler import tick
    from ones_pipeline.scheduler.runs import ProgressInfo, TickPlan

    obs = (ThroughputObs(1, 1, 32, 0.004, 0.0), ThroughputObs(2, 1, 32, 0.005, 0.001))
    first = TickInputs(now=100.0, specs={"a": spec("a")}, finished=frozenset(), runs=[run("a", 0, [0, 1])],
                       progress={"a": ProgressInfo(samples_done=320.0, throughput_obs=obs)}, slot_ids=(0, 1),
                       cluster=Cluster((2,)), cursor={})
    cursor = json.loads(json.dumps(plan_tick(first, SchedulerSettings(params={"generations": 5})).cursor))
    assert [r[:3] for r in cursor["model_obs"]["mlp-digits"]] == [[1, 1, 32], [2, 1, 32]]

    second = TickInputs(now=200.0, specs={"a": spec("a"), "b": spec("b")}, finished=frozenset({"a"}), runs=[],
                        progress={}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor)
    state, p = tick._State.from_cursor(cursor), TickPlan()
    current = tick.current_schedule(second, state, p)
    (view,) = tick.job_views(second, SchedulerSettings(), current, state, p)[0]
    assert view.name == "b" and view.model_obs == obs and not view.throughput_obs
    fitted = GoodputModel().prior([view]).as_array().ravel()
    assert fitted.tolist() == tp.fit_params(obs).as_array().ravel().tolist()  # the fit of a's step times
    assert fitted.tolist() != tp.DEFAULT_PARAMS.as_array().ravel().tolist()
    # A job that has measured its own steps is estimated from those alone; it still carries its model's step
    # times (``ones`` values it by them where it has not run: ``ones_goodput.memory_filled_views``), not its
    # model's noise scale.
    own = (ThroughputObs(1, 1, 32, 0.5, 0.0),)
    third = TickInputs(now=300.0, specs={"b": spec("b")}, finished=frozenset(), runs=[],
                       progress={"b": ProgressInfo(samples_done=32.0, throughput_obs=own)}, slot_ids=(0, 1),
                       cluster=Cluster((2,)), cursor=cursor)
    state = tick._State.from_cursor(cursor)
    (mine,) = tick.job_views(third, SchedulerSettings(), tick.current_schedule(third, state, p), state, p)[0]
    assert mine.throughput_obs == own and mine.model_gns is None
    assert mine.model_obs == (obs[1], own[0])  # the memory, with b's newer step times on 1 GPU (oldest first)
    assert GoodputModel().prior([mine]).as_array().ravel().tolist() == tp.fit_params(own).as_array().ravel().tolist()


def test_the_step_times_a_job_measured_after_the_last_tick_are_remembered_when_it_finishes():
    """a was seen once, before it measured anything; it re-tuned its batch and finished before the next tick.
    That tick reads its progress (``progress_wanted``: finished, and seen by the last tick) and remembers its
    step times for b, the next job of its model; a job the last tick did not see is not read."""
    from ones_pipeline.core.types import ThroughputObs
    from ones_pipeline.scheduler import progress_wanted, tick
    from ones_pipeline.scheduler.runs import ProgressInfo, TickPlan

    first = TickInputs(now=100.0, specs={"a": spec("a")}, finished=frozenset(), runs=[], progress={},
                       slot_ids=(0, 1), cluster=Cluster((2,)), cursor={})
    cursor = json.loads(json.dumps(plan_tick(first, SchedulerSettings(params={"generations": 5})).cursor))
    assert cursor["viewed"] == ["a"] and cursor["model_obs"] == {}
    specs = {"a": spec("a"), "b": spec("b"), "old": spec("old")}
    finished = frozenset({"a", "old"})
    assert progress_wanted(specs, finished, cursor) == {"a", "b"}
    assert progress_wanted(specs, finished, {}) == {"b"}
    obs = (ThroughputObs(2, 1, 32, 0.005, 0.001), ThroughputObs(2, 1, 256, 0.02, 0.001))
    second = TickInputs(now=200.0, specs=specs, finished=finished, runs=[],
                        progress={"a": ProgressInfo(samples_done=9_000.0, throughput_obs=obs)}, slot_ids=(0, 1),
                        cluster=Cluster((2,)), cursor=cursor)
    state, p = tick._State.from_cursor(cursor), TickPlan()
    views, _ = tick.job_views(second, SchedulerSettings(), tick.current_schedule(second, state, p), state, p)
    assert [v.name for v in views] == ["b"] and views[0].model_obs == obs
    assert plan_tick(second, SchedulerSettings(params={"generations": 5})).cursor["viewed"] == ["b"]


def test_the_tick_remembers_the_noise_scale_a_model_measured_earliest_for_its_next_jobs():
    from ones_pipeline.core.types import ThroughputObs
    from ones_pipeline.scheduler import tick
    from ones_pipeline.scheduler.runs import ProgressInfo, TickPlan

    obs = (ThroughputObs(1, 1, 32, 0.004, 0.0),)
    first = TickInputs(now=100.0, specs={"a": spec("a"), "b": spec("b")}, finished=frozenset(), runs=[],
                       progress={"a": ProgressInfo(samples_done=5_000.0, throughput_obs=obs, grad_noise_scale=90.0),
                                 "b": ProgressInfo(samples_done=640.0, throughput_obs=obs, grad_noise_scale=30.0)},
                       slot_ids=(0, 1), cluster=Cluster((2,)), cursor={})
    cursor = json.loads(json.dumps(plan_tick(first, SchedulerSettings(params={"generations": 5})).cursor))
    assert cursor["model_gns"] == {"mlp-digits": [640.0, 30.0]}  # b measured it earlier in its training
    second = TickInputs(now=200.0, specs={"c": spec("c")}, finished=frozenset(), runs=[], progress={},
                        slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor)
    state, p = tick._State.from_cursor(cursor), TickPlan()
    (view,) = tick.job_views(second, SchedulerSettings(), tick.current_schedule(second, state, p), state, p)[0]
    assert view.model_gns == 30.0 and view.model_obs == obs and view.grad_noise_scale is None


@pytest.mark.parametrize("bad, field", [
    ({"max_lr": float("nan")}, "max_lr"),  # issue 40: every tick failed with "cannot convert float NaN to integer"
    ({"max_lr": float("inf")}, "max_lr"),
    ({"base_lr": 1e-300, "max_lr": 1e10}, "base_lr"),
    ({"requested_gpus": 10**20, "max_gpus": 10**20}, "requested_gpus"),  # an IndexError in the ONES policy
    ({"stopping": StoppingRule(StopKind.EPOCHS, epochs=float("inf"))}, "stopping.epochs"),
])
def test_a_spec_that_would_fail_the_tick_is_quarantined_and_the_others_are_scheduled(bad, field):
    """Issue 40, finding 1: a spec no loader should let through (built here directly) marks its own job
    failed with the reason; the other job is still launched, tick after tick; a fixed spec is taken again."""
    fields = {"name": "bad", "model": "mlp-digits", "dataset_size": 1437, "per_gpu_batch": 32, "base_lr": 0.05,
              "max_lr": 0.2, "stopping": StoppingRule(StopKind.EPOCHS, epochs=5), **bad}
    broken = JobSpec(**fields)
    first = plan([spec("good"), broken], [])
    assert [x.job for x in first.launches] == ["good"]
    assert first.newly_failed["bad"].startswith("spec quarantined") and f"field '{field}'" in first.newly_failed["bad"]
    assert first.quarantined == first.newly_failed and first.cursor["failed"] == first.newly_failed
    again = plan([spec("good"), broken], [], now=1015.0, cursor=first.cursor)
    assert "bad" in again.quarantined and not again.newly_failed  # reported once, kept failed
    fixed = plan([spec("good"), spec("bad")], [], now=1030.0, cursor=again.cursor)
    assert "bad" not in fixed.cursor["failed"] and "bad" in {x.job for x in fixed.launches}


def test_the_run_of_a_job_whose_spec_turns_bad_is_cancelled():
    broken = JobSpec(name="a", model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                     max_lr=float("nan"), stopping=StoppingRule(StopKind.EPOCHS, epochs=5))
    p = plan([broken, spec("b")], [run("a", 0, [0], created=0.0)], now=10_000.0)
    assert [(c.job, c.reason) for c in p.cancels] == [("a", "job failed")]
    assert "b" in {x.job for x in p.launches}
