"""plan_tick without Dagster: the schedule comes from the runs, generations and run keys, young runs held."""

from ones_pipeline.core.types import Cluster, JobSpec, StopKind, StoppingRule
from ones_pipeline.live import Launch, RunInfo, plan_tick


def spec(name, epochs=50.0, max_gpus=2):
    return JobSpec(name=name, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05, max_lr=0.2,
                   max_gpus=max_gpus, stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))


def run(job, gen, slots, status="STARTED", created=0.0, batch=32):
    tags = Launch(job, gen, tuple(slots), batch, 0.05, "test").tags()
    return RunInfo.from_tags(f"{job}-{gen}", status, tags, created_s=created, start_s=created + 1)


def plan(specs, runs, now=1000.0, cursor=None, **kw):
    return plan_tick(now=now, specs={s.name: s for s in specs}, finished=kw.pop("finished", set()), runs=runs,
                     progress={}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor=cursor or {},
                     policy_params={"generations": 5}, **kw)


def test_generation_follows_every_run_ever_and_stale_runs_are_cancelled():
    runs = [run("a", 0, [0], "CANCELED"), run("a", 3, [0], "FAILURE", created=10.0),
            run("b", 0, [1], "QUEUED"), run("b", 1, [1], "STARTED")]
    p = plan([spec("a"), spec("b")], runs, now=10_000.0, retry_backoff_s=0.0)
    assert [c.run_id for c in p.cancels if c.reason.startswith("superseded")] == ["b-0"]
    (launch,) = [item for item in p.launches if item.job == "a"]  # slot 0 is free and the backoff is over
    assert launch.generation == 4 and launch.run_key == "a-g4"


def test_a_young_run_keeps_its_slots_and_blocks_what_would_need_them():
    """'long' (2000 epochs) holds both slots; 'short' arrives. With min_hold the long job's run, created
    5 s ago, is left alone; once it is older, the policy may take a slot for 'short'."""
    long_run = run("long", 0, [0, 1], created=995.0, batch=64)
    held = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=30.0)
    assert not held.cancels and not held.launches
    free = plan([spec("long", 2000), spec("short", 2)], [long_run], now=1000.0, min_hold_s=0.0)
    assert [c.job for c in free.cancels] == ["long"] and "short" in {x.job for x in free.launches}
    slots = [s for x in free.launches for s in x.slot_ids]
    assert len(slots) == len(set(slots))


def test_finished_and_removed_jobs_release_their_runs():
    runs = [run("a", 0, [0]), run("gone", 0, [1])]
    p = plan([spec("a")], runs, finished={"a"})
    assert sorted((c.job, c.reason) for c in p.cancels) == [("a", "finished"), ("gone", "spec removed")]
    assert p.launches == []
