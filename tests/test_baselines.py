"""Baseline policies (fifo, tiresias, optimus, pollux) on hand-built job views; no simulator."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import obs_for, random_spec, spec

from ones_pipeline.core import policies as policy_mod
from ones_pipeline.core.policies import (
    FifoPolicy,
    OptimusPolicy,
    PolluxPolicy,
    TiresiasPolicy,
    make_policy,
    policy_from_dict,
)
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    ThroughputObs,
    lr_for_batch,
)

NAMES = ["fifo", "tiresias", "optimus", "pollux"]


def view(s: JobSpec, running=False, **kw) -> JobView:
    status = kw.pop("status", JobStatus.PENDING)
    status = JobStatus.RUNNING if running else status
    return JobView(spec=s, status=status, submit_time_s=s.submit_time_s, **kw)


def alloc(s: JobSpec, gpus) -> Allocation:
    batch = s.per_gpu_batch * s.requested_gpus
    return Allocation(s.name, tuple(gpus), batch, lr_for_batch(s, batch))


def counts(schedule: Schedule) -> dict[str, int]:
    return {k: a.num_gpus for k, a in schedule.allocations.items()}


# ---------------------------------------------------------------------------------------------------
# fifo


def test_fifo_arrival_order_no_preemption_and_backfill():
    cluster = Cluster.uniform(1, 4)
    a, b, c, d = spec("a", 2, submit=0), spec("b", 4, submit=1), spec("c", 1, submit=2), spec("d", 1, submit=3)
    current = Schedule({"a": alloc(a, [2, 3])})
    jobs = [view(d), view(c), view(b), view(a, running=True)]
    out = FifoPolicy().decide(10.0, cluster, jobs, current)
    assert out.allocations["a"] is current.allocations["a"]  # never preempted, GPUs kept
    assert "b" not in out.allocations  # needs 4, only 2 free: waits
    assert counts(out) == {"a": 2, "c": 1, "d": 1}  # later small jobs backfill, in arrival order
    assert out.allocations["c"].global_batch == 32
    # Strict FIFO (no backfill) stops at b.
    strict = FifoPolicy(backfill=False).decide(10.0, cluster, jobs, current)
    assert counts(strict) == {"a": 2}
    # Arrival order decides between two jobs competing for the last GPUs.
    e, f = spec("e", 2, submit=5), spec("f", 2, submit=4)
    out = FifoPolicy().decide(10.0, cluster, [view(e), view(f), view(a, running=True)], current)
    assert counts(out) == {"a": 2, "f": 2}


def test_fifo_caps_request_at_cluster_size_and_keeps_workload_batch():
    cluster = Cluster.uniform(2, 2)
    big = spec("big", 8, per_gpu_batch=16)
    out = FifoPolicy().decide(0.0, cluster, [view(big)], Schedule())
    assert out.allocations["big"].num_gpus == 4
    assert out.allocations["big"].global_batch == 16 * 8


# ---------------------------------------------------------------------------------------------------
# tiresias


def test_tiresias_demotes_past_threshold_and_preempts_for_newer_job():
    cluster = Cluster.uniform(1, 4)
    old, new = spec("old", 4, submit=0), spec("new", 4, submit=100)
    current = Schedule({"old": alloc(old, [0, 1, 2, 3])})
    pol = TiresiasPolicy()
    # Below 16 GPU-hours both are in queue 0: FIFO keeps the older job running on its GPUs.
    young = view(old, running=True, attained_gpu_s=1000.0)
    out = pol.decide(1000.0, cluster, [young, view(new)], current)
    assert out.allocations["old"] is current.allocations["old"] and "new" not in out.allocations
    # Past 57600 GPU-s it is demoted to queue 1 and preempted for the newer job.
    demoted = view(old, running=True, attained_gpu_s=57_601.0)
    assert pol.queue_of(demoted) == 1 and pol.queue_of(view(new)) == 0
    out = pol.decide(20_000.0, cluster, [demoted, view(new)], current)
    assert counts(out) == {"new": 4}
    assert out.allocations["new"].global_batch == 4 * 32


def test_tiresias_backfills_lower_priority_job_and_thresholds_are_parameters():
    cluster = Cluster.uniform(1, 4)
    a, b, c = spec("a", 2, submit=0), spec("b", 4, submit=1), spec("c", 2, submit=2)
    pol = TiresiasPolicy(queue_thresholds_gpu_s=[100.0, 1000.0])
    jobs = [view(a, attained_gpu_s=5000.0, status=JobStatus.PAUSED), view(b), view(c, attained_gpu_s=500.0,
                                                                                    status=JobStatus.PAUSED)]
    assert [pol.queue_of(j) for j in jobs] == [2, 0, 1]
    out = pol.decide(0.0, cluster, jobs, Schedule())
    assert counts(out) == {"b": 4}
    # With b gone, c (queue 1) goes before a (queue 2); both fit.
    out = pol.decide(0.0, cluster, [jobs[0], jobs[2]], Schedule())
    assert counts(out) == {"a": 2, "c": 2}


# ---------------------------------------------------------------------------------------------------
# optimus


def test_optimus_gives_more_gpus_to_the_job_that_scales_better():
    cluster = Cluster.uniform(4, 4)
    cheap, dear = spec("cheap", 2, submit=0), spec("dear", 2, submit=1)
    jobs = [
        view(cheap, throughput_obs=obs_for(0.01, 0.003, 0.001, 0.0005, 0.002, 0.001, 64)),
        view(dear, throughput_obs=obs_for(0.01, 0.003, 0.03, 0.02, 0.05, 0.02, 64)),
    ]
    out = OptimusPolicy().decide(0.0, cluster, jobs, Schedule())
    n = counts(out)
    assert n == {"cheap": 8, "dear": n["dear"]} and 1 <= n["dear"] <= 4  # cheap grows to its gpu_cap
    assert out.allocations["cheap"].global_batch == out.allocations["dear"].global_batch == 64  # batch fixed
    assert len(set(out.allocations["cheap"].gpus)) == 8 and cluster.placement(out.allocations["cheap"].gpus) == (4, 4)


def test_optimus_one_gpu_each_in_submit_order_when_jobs_outnumber_gpus():
    cluster = Cluster.uniform(1, 2)
    jobs = [view(spec(f"j{i}", 2, submit=float(10 - i))) for i in range(5)]
    out = OptimusPolicy().decide(0.0, cluster, jobs, Schedule())
    assert counts(out) == {"j4": 1, "j3": 1}


# ---------------------------------------------------------------------------------------------------
# pollux


def test_pollux_jobs_tune_their_batch_larger_when_noise_scale_is_large_and_ncf_is_pinned():
    cluster = Cluster.uniform(2, 4)
    obs = obs_for(0.02, 0.001, 0.002, 0.001, 0.005, 0.002, 32)

    def batch_with(gns):
        s = spec("j", 1, per_gpu_batch=32, max_global_batch=32 * 64, max_per_gpu_batch=256)
        out = PolluxPolicy().decide(100.0, cluster, [view(s, max_gpus_seen=2, throughput_obs=obs,
                                                          grad_noise_scale=gns)], Schedule())
        return out.allocations["j"]

    small, large = batch_with(4.0), batch_with(32.0 * 200)
    assert small.batch_tuned_by_job and large.batch_tuned_by_job
    assert large.global_batch > small.global_batch
    assert small.num_gpus <= 8 and large.num_gpus <= 8  # at most 2x the largest count observed (8)

    ncf = spec("ncf-1", 1, model="ncf", per_gpu_batch=256, max_global_batch=256 * 32)
    other = spec("cifar-1", 1, submit=1.0, max_global_batch=32 * 32)
    out = PolluxPolicy().decide(100.0, cluster, [view(ncf, max_gpus_seen=8, grad_noise_scale=1e5),
                                                 view(other, max_gpus_seen=2)], Schedule())
    assert out.allocations["ncf-1"].num_gpus == 1
    assert out.allocations["ncf-1"].global_batch == 256 and not out.allocations["ncf-1"].batch_tuned_by_job
    assert out.allocations["cifar-1"].num_gpus == 1  # never run: offered max(2 x 0, 1) GPUs


def test_pollux_restart_penalty_keeps_young_running_job_and_warm_starts():
    cluster = Cluster.uniform(2, 4)
    s = spec("young", 2, submit=0.0, max_global_batch=32 * 16)
    current = Schedule({"young": alloc(s, (0, 1))})
    pol = PolluxPolicy()
    # 10 s old and already restarted: any change would zero its speedup, so it keeps its 2 GPUs and batch.
    obs = (ThroughputObs(2, 1, 32, 0.1, 0.01),)
    out = pol.decide(10.0, cluster, [view(s, running=True, max_gpus_seen=2, restarts=1, throughput_obs=obs,
                                          grad_noise_scale=100.0)], current)
    kept = out.allocations["young"]
    assert kept.gpus == (0, 1) and kept.global_batch == 64
    state = pol.to_dict()["state"]
    assert state["population_jobs"] == ["young"]
    assert np.asarray(state["population"]).shape[1:] == (1, 2)
    rebuilt = policy_mod.policy_from_dict(pol.to_dict())
    assert rebuilt._pop.shape == pol._pop.shape


def test_pollux_gives_a_multi_node_job_whole_node_shares_and_one_multi_node_job_per_node():
    cluster = Cluster.uniform(4, 4)
    obs = obs_for(0.2, 0.001, 0.002, 0.001, 0.005, 0.002, 256)
    views = [view(spec(f"j{i}", 4, per_gpu_batch=64, max_global_batch=64 * 64, max_per_gpu_batch=256),
                  max_gpus_seen=8, throughput_obs=obs, grad_noise_scale=1e5) for i in range(3)]
    out = PolluxPolicy(seed=1).decide(600.0, cluster, views, Schedule())
    out.validate(cluster)
    multi_nodes: list[set[int]] = []
    for a in out.allocations.values():
        nodes = {cluster.slot_to_gpu(g)[0] for g in a.gpus}
        if len(nodes) > 1:
            multi_nodes.append(nodes)
    for i, x in enumerate(multi_nodes):
        for y in multi_nodes[i + 1:]:
            assert not (x & y)
    assert sum(a.num_gpus for a in out.allocations.values()) >= 12  # they scale well: the cluster fills


def test_pollux_decides_64_gpus_50_jobs_quickly():
    cluster = Cluster.uniform(16, 4)
    jobs, current = random_state(np.random.default_rng(3), cluster, 50)
    pol = PolluxPolicy()
    start = time.perf_counter()
    out = pol.decide(5000.0, cluster, jobs, current)
    # Only a guard against a runaway search: the speed target is benchmarks/decision_latency.py's (a timed
    # unit test fails on a loaded CI machine; this one took 4.3 s at load 6).
    assert time.perf_counter() - start < 30.0
    out.validate(cluster, {j.name: j.spec for j in jobs})


# ---------------------------------------------------------------------------------------------------
# every policy


def random_state(rng: np.random.Generator, cluster: Cluster, num_jobs: int, max_request: int = 8):
    """Random active jobs (some running on valid GPUs, some with observations) and the schedule."""
    free = list(rng.permutation(cluster.num_gpus))
    jobs, allocations = [], {}
    for i in range(num_jobs):
        s = random_spec(rng, i, max_request)
        req, pgb = s.requested_gpus, s.per_gpu_batch
        running = rng.random() < 0.5 and len(free) >= min(req, s.gpu_cap)
        obs = ()
        if rng.random() < 0.6:
            obs = obs_for(*rng.uniform([0.005, 1e-4, 0, 0, 0, 0], [0.05, 1e-3, 0.02, 0.01, 0.1, 0.05]), pgb,
                          gpn=max(cluster.gpus_per_node))
        if running:
            n = min(req, s.gpu_cap)
            allocations[s.name] = alloc(s, [int(free.pop()) for _ in range(n)])
        jobs.append(view(s, running=running, status=JobStatus.PAUSED if rng.random() < 0.3 else JobStatus.PENDING,
                         throughput_obs=obs, grad_noise_scale=float(rng.uniform(1, 5000)) if obs else None,
                         attained_gpu_s=float(rng.uniform(0, 1e5)), restarts=int(rng.integers(0, 3)),
                         max_gpus_seen=min(req, s.gpu_cap) if running else int(rng.integers(0, 3)),
                         progress_samples=float(rng.uniform(0, 5e4))))
    return jobs, Schedule(allocations)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), nodes=st.integers(1, 4), gpn=st.sampled_from([1, 2, 4, 8]),
       num_jobs=st.integers(0, 14), max_request=st.integers(1, 40))
def test_policies_never_double_book_and_respect_caps(seed, nodes, gpn, num_jobs, max_request):
    cluster = Cluster.uniform(nodes, gpn)
    jobs, current = random_state(np.random.default_rng(seed), cluster, num_jobs, max_request)
    specs = {j.name: j.spec for j in jobs}
    for name in NAMES:
        pol = make_policy(name, seed=seed, **({"generations": 20} if name == "pollux" else {}))
        out = pol.decide(2000.0, cluster, jobs, current)
        out.validate(cluster, specs)  # no double booking, in range, gpu_cap respected
        assert set(out.allocations) <= set(specs)
        for job, a in out.allocations.items():
            assert a.num_gpus <= min(specs[job].gpu_cap, cluster.num_gpus)
            if name == "pollux" and specs[job].model == "ncf":
                assert a.num_gpus == 1
            if name in ("fifo", "tiresias", "optimus"):
                assert a.global_batch == specs[job].per_gpu_batch * specs[job].requested_gpus
        if name == "fifo":  # never preempts, never moves a running job
            assert all(out.allocations.get(k) == a for k, a in current.allocations.items())
        # A second round from the new schedule is still valid.
        make_policy(name, seed=seed).decide(2060.0, cluster, jobs, out).validate(cluster, specs)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_decision_and_state_round_trip(name):
    cluster = Cluster.uniform(4, 4)
    rng = np.random.default_rng(11)
    jobs, current = random_state(rng, cluster, 12)
    a, b = make_policy(name, seed=5), make_policy(name, seed=5)
    first = a.decide(1000.0, cluster, jobs, current)
    assert b.decide(1000.0, cluster, jobs, current).to_dict() == first.to_dict()

    saved = json.loads(json.dumps(a.to_dict()))
    assert set(saved) == {"name", "seed", "params", "state"} and saved["name"] == name
    restored = policy_from_dict(saved)
    jobs2, _ = random_state(rng, cluster, 12)
    assert (restored.decide(1060.0, cluster, jobs2, first).to_dict()
            == a.decide(1060.0, cluster, jobs2, first).to_dict())


@pytest.mark.parametrize("name", NAMES)
def test_edge_cases(name):
    pol = make_policy(name)
    one = Cluster.uniform(1, 1)
    assert pol.decide(0.0, one, [], Schedule()).allocations == {}
    jobs = [view(spec(f"j{i}", requested=3, submit=float(i)), progress_samples=10.0 * i) for i in range(3)]
    # More jobs than GPUs, requests > cluster, no observations. (At age 0 Pollux's restart factor is 0, so
    # it starts nothing; a minute later it starts one job.)
    out = pol.decide(60.0, one, jobs, Schedule())
    out.validate(one, {j.name: j.spec for j in jobs})
    assert len(out.allocations) == 1
    # A finished job's stale allocation is dropped; a current allocation outside the cluster is ignored.
    stale = Schedule({"gone": Allocation("gone", (0,), 8, 0.1), "j0": Allocation("j0", (0, 5), 96, 0.3)})
    pol.decide(0.0, one, jobs, stale).validate(one)


@pytest.mark.parametrize("name,params,match", [
    ("fifo", {"backfill": "yes"}, "fifo: backfill must be true or false"),
    ("fifo", {"seed": -1}, "fifo: seed must be an integer >= 0"),
    ("tiresias", {"queue_thresholds_gpu_s": [10.0, 5.0]}, "strictly increasing"),
    ("tiresias", {"queue_thresholds_gpu_s": [0.0]}, r"queue_thresholds_gpu_s\[\] must be a finite number > 0"),
    ("tiresias", {"starvation_factor": -2}, "starvation_factor"),
    ("pollux", {"population": 1}, "pollux: population must be an integer >= 2, got 1"),
    ("pollux", {"fairness_p": 2.0}, "fairness_p must be a finite number <= 1.0"),
    ("pollux", {"max_scale_out": 0.5}, "max_scale_out must be a finite number >= 1.0"),
    ("pollux", {"pinned_models": "ncf"}, "pinned_models must be a list"),
])
def test_parameter_errors_are_precise(name, params, match):
    params = dict(params)
    seed = params.pop("seed", 0)
    with pytest.raises(ValueError, match=match):
        make_policy(name, seed=seed, **params)
    with pytest.raises(TypeError):
        make_policy(name, no_such_parameter=1)


def test_tiresias_starvation_promotion():
    cluster = Cluster.uniform(1, 2)
    a, b = spec("a", 2, submit=0), spec("b", 2, submit=10)
    pol = TiresiasPolicy(queue_thresholds_gpu_s=[100.0], starvation_factor=2.0)
    starving = view(a, status=JobStatus.PAUSED, attained_gpu_s=500.0, run_time_s=250.0)
    hog = view(b, running=True, attained_gpu_s=50.0)
    current = Schedule({"b": alloc(b, [0, 1])})
    assert counts(pol.decide(0.0, cluster, [starving, hog], current)) == {"b": 2}
    # b has now also passed the threshold; a has waited 2x its run time: promoted back to queue 0.
    hog = view(b, running=True, attained_gpu_s=600.0)
    out = pol.decide(500.0, cluster, [starving, hog], current)
    assert counts(out) == {"a": 2}
    restored = policy_from_dict(json.loads(json.dumps(pol.to_dict())))
    assert restored.queue_of(starving) == 0


def test_pollux_starts_a_new_job_on_a_free_gpu_of_a_busy_cluster():
    """The mutation raises about one job per free node (as the authors'): a new job gets a free GPU at
    once instead of waiting while every other row is perturbed too."""
    cluster = Cluster.uniform(4, 4)
    obs = obs_for(0.2, 0.001, 0.002, 0.001, 0.005, 0.002, 128)
    views, allocations = [], {}
    slot = 0
    for i in range(7):  # 7 old jobs on 2 GPUs each: 14 of 16 GPUs busy
        s = spec(f"old-{i}", 2, per_gpu_batch=64, max_global_batch=64 * 8, max_per_gpu_batch=128)
        gpus = (slot, slot + 1)
        slot += 2
        allocations[s.name] = alloc(s, gpus)
        views.append(view(s, running=True, max_gpus_seen=2, throughput_obs=obs, grad_noise_scale=1e3,
                          restarts=1, attained_gpu_s=4000.0))
    new = spec("new", 1, submit=3000.0, max_global_batch=32 * 8)
    views.append(view(new))
    out = PolluxPolicy(seed=0).decide(3040.0, cluster, views, Schedule(allocations))
    out.validate(cluster)
    assert "new" in out.allocations


def test_pollux_mutation_touches_few_jobs():
    cluster = Cluster.uniform(8, 4)
    views = [view(spec(f"j{i}", 1), running=True) for i in range(20)]
    current = Schedule({v.name: alloc(v.spec, (i,)) for i, v in enumerate(views)})
    from ones_pipeline.core.policies.pollux import _Problem

    pol = PolluxPolicy()
    pb = _Problem(pol, 1000.0, cluster, views, current)
    rng = np.random.default_rng(0)
    children = pb.mutate(np.repeat(pb.base[None], 200, axis=0), rng)
    changed_rows = (children != pb.base[None]).any(axis=2).sum(axis=1)
    # 3 nodes with free GPUs -> about 3 raised jobs, plus 10 % resets and zeroed entries: a few, never all.
    assert changed_rows.mean() < 6
    assert changed_rows.max() < 20


def _peeled_fronts(fit: np.ndarray, util: np.ndarray, needed: int | None) -> np.ndarray:
    """NSGA-II's fronts by definition: peel the candidates no remaining one dominates, front after front,
    until ``needed`` are ranked; the rest share the next rank."""
    n = fit.size
    dom = ((fit[:, None] >= fit[None, :]) & (util[:, None] >= util[None, :])
           & ((fit[:, None] > fit[None, :]) | (util[:, None] > util[None, :])))  # [i, j]: i dominates j
    rank = np.full(n, -1)
    r = 0
    while (rank >= 0).sum() < n and (needed is None or (rank >= 0).sum() < needed):
        left = rank < 0
        now = left & ~dom[left].any(axis=0)
        rank[now] = r
        r += 1
    rank[rank < 0] = r
    return rank


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=40), st.none() | st.integers(-1, 45))
def test_pollux_fronts_match_peeling_the_dominated_candidates(points, needed):
    """The one-pass front ranking of pollux's NSGA-II selection gives the fronts that peeling gives, ties
    in either objective included (small integer objectives make many)."""
    from ones_pipeline.core.policies.pollux import _fronts_and_crowding

    fit = np.array([p[0] for p in points], dtype=float)
    util = np.array([p[1] for p in points], dtype=float)
    rank, crowd = _fronts_and_crowding(fit, util, needed)
    assert rank.tolist() == _peeled_fronts(fit, util, needed).tolist()
    assert crowd.shape == fit.shape
