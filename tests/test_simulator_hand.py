"""Tiny traces whose completion times are worked out by hand for every policy.

Synthetic job type (ones_pipeline.sim.synthetic): every GPU processes 100 samples/s, perfect linear
scaling, statistical efficiency 1, so ``samples / (100 * gpus)`` seconds. Rounds every 10 s, every change
free (restart_cost_s = 0 for every kind, in place too) so the arithmetic stays simple; a job's epoch is a
quarter of its samples.
"""

import pytest

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.synthetic import synthetic_job

CFG = SimConfig(interval_s=10, restart_cost_s=0, change_costs=PRESETS["pollux"])


def run(policy, jobs, gpus, **params):
    result = simulate(jobs, make_policy(policy, **params), Cluster.uniform(1, gpus), CFG)
    return {j.name: j.jct_s for j in result.jobs}, result


# Trace A: one job of 12 000 samples requesting 1 GPU, alone on a 4-GPU node.
SOLO_EXPECTED = {
    # Rigid: 1 GPU for 12 000 / 100 = 120 s.
    "fifo": 120.0,
    "tiresias": 120.0,
    # Elastic up to the cap (4x the request = 4 GPUs) at once: 12 000 / 400 = 30 s.
    "optimus": 30.0,
    "ones": 30.0,
    # Cap starts at the request (1) and doubles after a whole epoch (3 000 samples) at the cap, and a
    # job is resized at most once per epoch. The job is first seen at its cap at t=10 (1 000 samples
    # done); at t=40 it has 4 000 -> 2 GPUs; at t=60 it has 8 000 (1.33 epochs at cap 2) -> 4 GPUs;
    # the last 4 000 samples take 10 s: done at 70.
    "ones-paper": 70.0,
    # At t=0 its age is 0, so the restart factor (age - 30 restarts) / (age + 30) makes every start worth
    # nothing; NSGA-II's second objective (cluster utility) breaks the tie: it starts on 1 GPU (offered at
    # most max(2 x most GPUs run on, 1)). Speedups are over the fair share, here all 4 GPUs: 1 GPU 0.25,
    # 2 GPUs 0.5 (the fitted model, from one 1-GPU observation, scales perfectly). Growing to 2 pays once
    # 0.5 x age / (age + 30) > 0.25, i.e. age > 30: at t=40, with 4 000 samples done. On 2 GPUs (1 restart)
    # 4 GPUs pay only once 1.0 x (age - 30) / (age + 30) > 0.5, age > 90; the last 8 000 samples on 2 GPUs
    # take 40 s: done at 80 first.
    "pollux": 80.0,
}


@pytest.mark.parametrize("policy, expected", SOLO_EXPECTED.items())
def test_solo_job(policy, expected):
    jct, _ = run(policy, [synthetic_job("solo", 0, 12_000, requested_gpus=1)], gpus=4)
    assert jct["solo"] == pytest.approx(expected)


# Trace B: on 2 GPUs, "big" (8 000 samples, 2 GPUs) arrives at 0, "small" (1 000 samples, 2 GPUs) at 5.
TWO_EXPECTED = {
    # No preemption: big runs 0-40 on 2 GPUs; small starts at the round at 40, runs 5 s: JCT 45 - 5.
    "fifo": {"big": 40.0, "small": 40.0},
    # Demotion threshold 30 GPU-s: at t=20 big has 40 GPU-s -> low queue; small (queue 0) preempts it
    # and runs 20-25; big resumes at the round at 30 with 4 000 left: 20 s, done at 50.
    "tiresias": {"big": 50.0, "small": 20.0},
    # At t=10 every job gets 1 GPU first, which uses both GPUs. small runs 10-20 at 100/s; big made 2 000 (0-10)
    # + 1 000 (10-20), then 5 000 on 2 GPUs: done at 45.
    "optimus": {"big": 45.0, "small": 15.0},
    # With the true restart cost (0) in its fitness, preempting big is worth it: small 10-15 on 2 GPUs,
    # big resumes at 20 with 6 000 left: 30 s, done at 50. Sum of JCTs 60 vs 80 for FIFO.
    "ones": {"big": 50.0, "small": 10.0},
    # big is immune to removal for its first 2 epochs (2 000 samples each), so small waits until t=20,
    # when the largest long-running job (big) is halved: small runs 20-30 on 1 GPU. big, resized at
    # 20, may change again only after another epoch: at t=40 (6 000 done) it grows to 2: done at 50.
    "ones-paper": {"big": 50.0, "small": 25.0},
}
TWO_PARAMS = {"tiresias": {"queue_thresholds_gpu_s": (30.0,)}, "ones": {"min_hold_s": 0.0}}


@pytest.mark.parametrize("policy, expected", TWO_EXPECTED.items())
def test_two_jobs(policy, expected):
    jobs = [synthetic_job("big", 0, 8_000, requested_gpus=2), synthetic_job("small", 5, 1_000, requested_gpus=2)]
    jct, result = run(policy, jobs, gpus=2, **TWO_PARAMS.get(policy, {}))
    assert jct == pytest.approx(expected)
    assert result.makespan_s == pytest.approx(max(j.finish_s for j in result.jobs))


def test_ones_keeps_a_job_it_just_started_for_min_hold_s():
    # Trace B under ones with a 150 s hold (its default at the default 120 s charge; with the charge 0 here
    # the default hold would be 0): big, started at 0, may not be preempted before t = 150, so it runs 0-40
    # as under FIFO; small starts at the round at 40 and runs 5 s: JCT 40. small is of another model, so it is
    # valued by the prior, not by big's remembered step times (the simulator's model memory), as this trace assumes.
    jobs = [synthetic_job("big", 0, 8_000, requested_gpus=2),
            synthetic_job("small", 5, 1_000, requested_gpus=2, model="other")]
    jct, _ = run("ones", jobs, gpus=2, min_hold_s=150.0)
    assert jct == pytest.approx({"big": 40.0, "small": 40.0})


def test_restart_cost_is_paid_on_every_allocation_change():
    # Tiresias trace B with a 3 s restart: big starts at 3 (not 0) and resumes at 33; small starts at 23.
    jobs = [synthetic_job("big", 0, 8_000, requested_gpus=2), synthetic_job("small", 5, 1_000, requested_gpus=2)]
    result = simulate(jobs, make_policy("tiresias", queue_thresholds_gpu_s=(30.0,)), Cluster.uniform(1, 2),
                      SimConfig(interval_s=10, restart_cost_s=3))
    jct = {j.name: j.jct_s for j in result.jobs}
    # big: 3-20 -> 3 400 samples (34 GPU-s > 30 at t=20, demoted); small 23-28; big resumes 33 + 4 600/200.
    assert jct["small"] == pytest.approx(28 - 5)
    assert jct["big"] == pytest.approx(33 + 23)
    assert {j.name: j.restarts for j in result.jobs} == {"big": 1, "small": 0}
    # GPU-seconds held include the restart pauses: big 2x20 + 2x(56-30), small 2x(30-20)... up to its finish.
    gpu_s = {j.name: j.gpu_s for j in result.jobs}
    assert gpu_s["big"] == pytest.approx(2 * 20 + 2 * (56 - 30))
    assert gpu_s["small"] == pytest.approx(2 * (28 - 20))


def test_restart_cost_can_be_set_per_job_type():
    # As above, but only "small"'s model pays 3 s; "big" (another model) restarts for free.
    jobs = [synthetic_job("big", 0, 8_000, requested_gpus=2, model="bigmodel"),
            synthetic_job("small", 5, 1_000, requested_gpus=2, model="smallmodel")]
    config = SimConfig(interval_s=10, restart_cost_s=0, restart_cost_by_model={"smallmodel": 3})
    result = simulate(jobs, make_policy("tiresias", queue_thresholds_gpu_s=(30.0,)), Cluster.uniform(1, 2), config)
    jct = {j.name: j.jct_s for j in result.jobs}
    # big: 0-20 (4 000 done, demoted); small 20+3 .. 28; big resumes at 30, no pause: done at 50.
    assert jct == pytest.approx({"big": 50.0, "small": 23.0})
    with pytest.raises(ValueError, match="restart_cost_by_model"):
        SimConfig(restart_cost_by_model={"x": -1})
