"""The live tick measures what each kind of change costs from the jobs' own events (``scheduler.change_costs``),
hands the figures to the policy as ``JobView.change_costs`` and quotes them in its reasons; slots it leaves idle
beside a job that could use them are explained."""

from ones_pipeline.core.types import Cluster, JobSpec, StopKind, StoppingRule, ThroughputObs
from ones_pipeline.scheduler import Launch, RunAllocation, RunInfo, SchedulerSettings, TickInputs, plan_tick
from ones_pipeline.scheduler.change_costs import KEPT, LAG_PRIOR_S, PRIOR, costs, measure, remember
from ones_pipeline.scheduler.runs import ProgressInfo


def spec(name, epochs=50.0, max_gpus=2):
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=max_gpus, stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))


def run(job, gen, slots, status="STARTED", created=0.0):
    launch = Launch(RunAllocation.make(spec(job), slots, "cpu", 32 * len(slots), gen), "test")
    return RunInfo.from_run(f"{job}-{gen}", status, launch.tags(), launch.run_config(), created_s=created,
                            start_s=created + 1)


def ev(event, gen, t, **kw):
    return {"event": event, "generation": gen, "time_s": t, **kw}


# 'old' (finished): started 20 s after its run was created, grew in place (0.8 s without training), shrank
# (0.5 s), was preempted (stopped at 490) and resumed by a run created at 500 that trained at 512 (a 12 s
# restart). 'long' (running on both slots): started in 30 s, grew in place in 1.2 s.
RUNS = [run("old", 0, [0], "SUCCESS", created=100.0), run("old", 1, [0], "SUCCESS", created=500.0),
        run("long", 0, [0, 1], created=200.0)]
EVENTS = {"old": [ev("training", 0, 120.0), ev("resized", 0, 300.0, **{"from": 1, "to": 2, "paused_s": 0.8}),
                  ev("resized", 0, 350.0, **{"from": 2, "to": 1, "paused_s": 0.5}), ev("stopped", 0, 490.0),
                  ev("training", 1, 512.0), ev("training", 1, 600.0)],
          "long": [ev("training", 0, 230.0), ev("resized", 0, 400.0, **{"from": 1, "to": 2, "paused_s": 1.2})]}


def plan(runs, events, launcher="subprocess", cursor=None, now=1000.0, policy="ones", specs=None, progress=None,
         **settings):
    specs = specs or [spec("long", 2000), spec("short", 2)]
    inputs = TickInputs(now=now, specs={s.name: s for s in specs}, finished=frozenset({"old"}), runs=runs,
                        progress=progress or {}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor or {},
                        change_events=events)
    return plan_tick(inputs, SchedulerSettings(policy=policy, params={"generations": 5} if policy == "ones" else {},
                                               launcher=launcher, **settings))


def test_the_tick_measures_each_kind_of_change_from_the_jobs_events_and_quotes_it():
    """Per kind the median of what the events show (start 25 s, grow 1.0 s, shrink 0.5 s, restart 12 s),
    kept in the cursor after the jobs are gone; the in-place shrink of 'long' for 'short' quotes the measured
    shrink, and under Slurm (no change in place) the same shrink quotes the measured restart."""
    p = plan(RUNS, EVENTS)
    kept = p.cursor["change_costs"]
    assert costs(kept, True) == {"start": 25.0, "grow": 1.0, "shrink": 0.5, "restart": 12.0, "lag": LAG_PRIOR_S}
    (d,) = [d for d in p.decisions if d.job == "long"]
    assert d.path == "in place" and d.why["change"] == "shrink" and d.why["change_cost_s"] == 0.5
    assert "(shrink in place, ~0.50 s)" in d.reason and "restart" not in d.reason
    again = plan(RUNS, {}, cursor={"change_costs": kept})  # the events gone, the cursor remembers
    assert again.cursor["change_costs"] == kept
    slurm = plan(RUNS, EVENTS, launcher="slurm")
    (d,) = [d for d in slurm.decisions if d.job == "long"]
    assert d.path == "checkpoint" and d.why["change"] == "restart" and "(restart from a checkpoint, ~12 s)" in d.reason
    assert costs(kept, False) == {"start": 25.0, "grow": 12.0, "shrink": 12.0, "restart": 12.0}


def test_nothing_measured_costs_the_live_prior_and_old_figures_make_room_for_new_ones():
    assert costs({}, True) == {**PRIOR, "lag": LAG_PRIOR_S} and PRIOR["grow"] < 1.0 < PRIOR["restart"] < PRIOR["start"]
    assert costs({}, False)["grow"] == PRIOR["restart"]
    kept: dict = {}
    remember(kept, [("grow", float(t), 10.0) for t in range(KEPT)])
    remember(kept, [("grow", 100.0, 0.1), ("grow", 100.0, 0.1)])  # one figure, once
    assert len(kept["grow"]) == KEPT and kept["grow"][-1] == [100.0, 0.1] and kept["grow"][0][0] == 1.0
    remember(kept, [("grow", 0.0, 10.0)])  # older than every kept one: dropped, not added back
    assert kept["grow"][0][0] == 1.0
    # A clock step or a lost event measures nothing: no negative or hour-long start.
    p = plan([run("long", 0, [0, 1], created=200.0)], {"long": [ev("training", 0, 150.0)]})
    assert "start" not in p.cursor["change_costs"]


def test_a_slot_left_idle_beside_a_job_that_could_use_it_says_why():
    """fifo keeps 'long' on the 1 slot it requested while the other stays idle: the plan says why (the
    estimate on both slots, the grow included); a run the tick holds young says that instead."""
    runs = [run("long", 0, [0], created=900.0)]
    timed = {"long": ProgressInfo(samples_done=3200.0, throughput_obs=(ThroughputObs(1, 1, 32, 0.02, 0.0),))}
    untimed = plan(runs, {}, policy="fifo", specs=[spec("long", 2000)])
    assert untimed.idle["long"].startswith("1 slot(s) idle beside it: not measured yet")  # nothing to predict from
    p = plan(runs, {}, policy="fifo", specs=[spec("long", 2000)], progress=timed)
    assert set(p.idle) == {"long"}
    assert p.idle["long"].startswith("1 slot(s) idle beside it: predicted to finish in ") and "on 2 incl. the grow" \
        in p.idle["long"]
    # ones grows it; under Slurm the grow would restart a young run, so the tick holds it and says so; where
    # the grow is made in place nothing holds it (fifo above wants no grow: held or not, its reason is fifo's)
    held = plan(runs, {}, launcher="slurm", specs=[spec("long", 2000)], progress=timed, min_hold_s=300.0)
    assert held.idle["long"] == "1 slot(s) idle beside it: its run started less than 300 s ago (min_run_s)"
    grown = plan(runs, {}, specs=[spec("long", 2000)], progress=timed, min_hold_s=300.0)
    assert grown.idle == {} and [(r.job, r.after) for r in grown.resizes] == [("long", (0, 1))]
    young_fifo = plan(runs, {}, policy="fifo", specs=[spec("long", 2000)], progress=timed, min_hold_s=300.0)
    assert young_fifo.idle == p.idle
    full = plan([run("long", 0, [0, 1], created=900.0)], {}, policy="fifo", specs=[spec("long", 2000)])
    assert full.idle == {}


def test_a_slot_idle_beside_a_job_that_has_no_noise_scale_yet_says_which_batch_it_would_train_at():
    """The demo's long job alone on 1 of 2 slots, its steps timed on 1 slot at batch 4 and on 2 at 2 per slot (as
    slow), its noise scale not measured yet: on 2 slots it would keep its smallest batch, so ``ones`` leaves the
    slot idle and the reason says so, with the estimate at that batch; it does not claim the job would be sooner
    there (the estimate at a batch it would not run said so, beside the policy's verdict)."""
    long = JobSpec(name="long", model="resnet18-cifar-synthetic", dataset_size=10000, per_gpu_batch=4, base_lr=0.02,
                   max_lr=0.08, max_gpus=2, max_global_batch=8, stopping=StoppingRule(StopKind.SAMPLES, samples=10000))
    runs = [RunInfo.from_run("long-0", "STARTED", *(lambda la: (la.tags(), la.run_config()))(
        Launch(RunAllocation.make(long, [0], "cpu", 4, 0), "test")), created_s=900.0, start_s=901.0)]
    timed = {"long": ProgressInfo(samples_done=4000.0, throughput_obs=(ThroughputObs(1, 1, 4, 0.151),
                                                                       ThroughputObs(2, 1, 2, 0.169)))}
    p = plan(runs, {}, specs=[long], progress=timed)
    assert not p.resizes and not p.launches and not p.cancels
    assert p.idle["long"].startswith("1 slot(s) idle beside it: predicted to finish in ")
    assert p.idle["long"].endswith("no sooner there: on 2 it would train at batch 4, its smallest, until it has "
                                   "measured its noise scale")


def test_an_in_place_changes_delay_from_the_tick_that_decided_it_is_measured():
    """'long' was asked at the tick of 395 s (the request's ``decided_s``; the apply run wrote it at 399 s) to
    grow, and its ``resized`` event came at 400 s: a lag of 5 s, kept in the cursor and handed to the policy
    beside the kinds (where the launcher resizes in place); before any is measured, ``LAG_PRIOR_S``."""
    launch = Launch(RunAllocation.make(spec("long"), [0], "cpu", 32, 0), "test")
    request = {"slots": [0, 1], "global_batch": 64, "time_s": 399.0, "decided_s": 395.0, "run_id": "long-0"}
    grown = RunInfo.from_run("long-0", "STARTED", launch.tags(), launch.run_config(), request, created_s=200.0,
                             start_s=201.0)
    assert grown.resized_s == 395.0 and grown.slot_ids == (0, 1)
    got = measure("long", EVENTS["long"], [grown])
    assert ("lag", 400.0, 5.0) in got and ("grow", 400.0, 1.2) in got
    kept: dict = {}
    remember(kept, got)
    assert costs(kept, True)["lag"] == 5.0 and "lag" not in costs(kept, False)
    assert costs({}, True)["lag"] == LAG_PRIOR_S
