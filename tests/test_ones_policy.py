"""Behaviour specific to the ONES policies and their placement."""

import dataclasses
import json

import numpy as np
import pytest

from ones_pipeline.core.placement import place_counts
from ones_pipeline.core.policies import OnesPaperParams, OnesPaperPolicy, OnesParams, OnesPolicy, policy_from_dict
from ones_pipeline.core.policies.ones import change_charge
from ones_pipeline.core.policies.ones_fitness import DecisionInputs, FitnessWeights, OnesContext
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    StopKind,
    StoppingRule,
    ThroughputObs,
)
from ones_pipeline.sim.synthetic import random_scheduler_state


def view(name, requested=2, obs=(), done=0.0, epochs=50.0, submit=0.0, status=JobStatus.PENDING, **kw):
    spec = JobSpec(name=name, model=name, dataset_size=10_000, per_gpu_batch=32, base_lr=0.1, max_lr=3.2,
                   requested_gpus=requested, max_per_gpu_batch=256,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs), submit_time_s=submit)
    return JobView(spec=spec, status=status, submit_time_s=submit, samples_done=done, progress_samples=done,
                   throughput_obs=tuple(obs), grad_noise_scale=1e6, **kw)


def test_time_budget_bounds_the_generations():
    rng = np.random.default_rng(0)
    cluster, jobs, current = random_scheduler_state(rng, 40, 8, 4)
    unbounded = OnesPolicy(seed=0, generations=30)
    unbounded.decide(0.0, cluster, jobs, current)
    assert unbounded.last_generations == 30
    bounded = OnesPolicy(seed=0, generations=30, time_budget_s=1e-9)
    schedule = bounded.decide(0.0, cluster, jobs, current)
    assert bounded.last_generations <= 1
    schedule.validate(cluster, {j.name: j.spec for j in jobs})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_job_that_does_not_scale_gets_few_gpus_and_one_that_scales_gets_many(seed):
    # Measured at 1, 2 and 4 GPUs: "flat" gains little from more GPUs (the all-reduce eats most of it; the
    # larger batch it tunes amortises some), "linear" scales perfectly. With 16 GPUs "linear" gets the most.
    flat = [ThroughputObs(1, 1, 32, 0.10, 0.0), ThroughputObs(2, 1, 32, 0.20, 0.10),
            ThroughputObs(4, 1, 32, 0.60, 0.50)]
    linear = [ThroughputObs(1, 1, 32, 0.10, 0.0), ThroughputObs(2, 1, 32, 0.101, 0.001)]
    jobs = [view("flat", requested=2, obs=flat), view("linear", requested=2, obs=linear)]
    schedule = OnesPolicy(seed=seed).decide(0.0, Cluster.uniform(4, 4), jobs, Schedule())
    n = {name: a.num_gpus for name, a in schedule.allocations.items()}
    assert n.get("linear", 0) > n.get("flat", 0) >= 1 and n["flat"] <= 4


def test_batch_follows_the_lr_rule_in_the_paper_policy():
    jobs = [view("a", requested=2)]
    schedule = OnesPaperPolicy(seed=0).decide(0.0, Cluster.uniform(1, 4), jobs, Schedule())
    alloc = schedule.allocations["a"]
    assert alloc.num_gpus == 2  # cap starts at the request
    assert alloc.global_batch == 64 and alloc.lr == 0.2


def test_placement_moves_as_few_running_jobs_as_possible():
    cluster = Cluster.uniform(2, 4)
    current = Schedule({"a": Allocation("a", (0, 1), 64, 0.2), "b": Allocation("b", (4, 5, 6, 7), 128, 0.4),
                        "c": Allocation("c", (2, 3), 64, 0.2)})
    held = {name: current.gpus_of(name) for name in "abcd"}
    out = place_counts(cluster, [("a", 2), ("b", 2), ("c", 3), ("d", 1)], held)
    assert out["a"] == (0, 1)  # unchanged count: same GPUs
    assert set(out["b"]) < {4, 5, 6, 7}  # shrink: a subset of what it had
    assert {2, 3} < set(out["c"])  # grow: keeps its GPUs
    flat = [g for gpus in out.values() for g in gpus]
    assert len(flat) == len(set(flat)) == 8


def test_paper_policy_scales_down_the_largest_long_running_job_when_jobs_wait():
    # One job holds all 4 GPUs, has run 3 epochs (past the 2-epoch immunity), and a new job waits.
    cluster = Cluster.uniform(1, 4)
    big = view("big", requested=4, obs=[ThroughputObs(4, 1, 32, 0.1, 0.0)], done=30_000.0,
               status=JobStatus.RUNNING, last_change_s=0.0, epochs_at_last_change=0.0)
    new = view("new", requested=1, submit=100.0)
    current = Schedule({"big": Allocation.for_spec(big.spec, (0, 1, 2, 3))})
    schedule = OnesPaperPolicy(seed=0).decide(200.0, cluster, [big, new], current)
    assert schedule.allocations["new"].num_gpus >= 1
    assert schedule.allocations["big"].num_gpus <= 2


@pytest.mark.parametrize("cls,field,value,match", [
    (OnesParams, "population", 1, "ones: population must be an integer >= 2, got 1"),
    (OnesParams, "generations", -1, "ones: generations must be an integer >= 0"),
    (OnesParams, "time_budget_s", 0, "ones: time_budget_s must be a finite number > 0.0"),
    (OnesParams, "horizon_s", 0.0, "ones: horizon_s must be a finite number > 0.0"),
    (OnesParams, "gpu_time_weight", -1, "ones: gpu_time_weight must be a finite number >= 0.0"),
    (OnesParams, "tail_chain_plain", 1.5, "ones: tail_chain_plain must be a finite number >= 0.0 and <= 1.0, got 1.5"),
    (OnesParams, "min_hold_s", -1, "ones: min_hold_s must be a finite number >= 0.0, got -1"),
    (OnesParams, "wait_weight", 0, "ones: wait_weight must be a finite number > 0.0, got 0"),
    (OnesPaperParams, "children", 0, "ones-paper: children must be an integer >= 1, got 0"),
    (OnesPaperParams, "removal_p", 2.0, "ones-paper: removal_p must be a finite number >= 0.0 and <= 1.0"),
    (OnesPaperParams, "max_scale", 0, "ones-paper: max_scale must be an integer >= 1"),
])
def test_ones_parameters_are_checked_in_one_place(cls, field, value, match):
    with pytest.raises(ValueError, match=match):
        cls(**{field: value})
    policy = OnesPolicy if cls is OnesParams else OnesPaperPolicy
    with pytest.raises(ValueError, match=match):  # the policy's keywords go through the same checks
        policy(seed=0, **{field: value})


@pytest.mark.parametrize("policy,params", [
    (OnesPolicy, {"population": 8, "time_budget_s": 0.5, "wait_weight": None, "min_hold_s": 10}),
    (OnesPaperPolicy, {"children": 8, "max_scale": 2}),
])
def test_ones_parameters_round_trip(policy, params):
    pol = policy(seed=3, **params)
    saved = pol.to_dict()
    assert saved["params"] == pol.config.to_dict() and set(params) <= set(saved["params"])
    assert type(pol.config).from_dict(saved["params"]) == pol.config
    again = policy_from_dict(json.loads(json.dumps(saved)))
    assert type(again) is policy and again.config == pol.config and again.seed == 3
    with pytest.raises(TypeError, match="unknown parameter"):
        policy(seed=0, no_such_parameter=1)


def test_ones_params_are_frozen_and_normalised():
    p = OnesParams(horizon_s=600, population=np.int64(8))
    assert p.horizon_s == 600.0 and type(p.horizon_s) is float and type(p.population) is int
    assert p.to_dict()["horizon_s"] == 600.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.population = 3  # type: ignore[misc]
    assert OnesParams().tail_chain_plain == 0.3
    # A handful of options, none of them a switch for one regime (issue 37).
    assert len(dataclasses.fields(OnesParams)) <= 12
    with pytest.raises(TypeError, match="unknown parameter.*'job_batch'.*allowed: population"):
        OnesPolicy(seed=0, job_batch=False)  # deleted options are refused, naming those there are


# -- jobs that tune their own batch -------------------------------------------------------------------
def _pollux_like(name, requested=2, obs=(), gns=2000.0, submit=0.0):
    """A job with a Pollux-style batch range (M0 64, up to 4096, micro-batch 16..256)."""
    spec = JobSpec(name=name, model="m", dataset_size=50_000, per_gpu_batch=64, min_global_batch=64,
                   max_global_batch=4096, min_per_gpu_batch=16, max_per_gpu_batch=256, requested_gpus=requested,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=20.0), submit_time_s=submit)
    return JobView(spec=spec, status=JobStatus.RUNNING if obs else JobStatus.PENDING, submit_time_s=submit,
                   throughput_obs=tuple(obs), grad_noise_scale=gns if obs else None)


# Step times of one job measured in one node and across two (sync dominated when crossing nodes).
_OBS = (ThroughputObs(1, 1, 64, 0.10, 0.0), ThroughputObs(2, 1, 64, 0.12, 0.02),
        ThroughputObs(4, 1, 64, 0.13, 0.03), ThroughputObs(8, 2, 64, 0.40, 0.30))


def test_ones_lets_jobs_tune_their_batch_and_starts_them_at_the_batch_they_would_pick():
    from ones_pipeline.core.goodput import job_batch

    cluster = Cluster.uniform(2, 4)
    jobs = [_pollux_like("a", obs=_OBS), _pollux_like("b", requested=1)]
    schedule = OnesPolicy(seed=0).decide(0.0, cluster, jobs, Schedule())
    assert schedule.allocations
    for name, alloc in schedule.allocations.items():
        v = next(j for j in jobs if j.name == name)
        micro, accum = job_batch(v.spec, v.throughput_obs, v.grad_noise_scale, len(cluster.placement(alloc.gpus)),
                                 alloc.num_gpus)
        assert alloc.batch_tuned_by_job
        assert alloc.global_batch == alloc.num_gpus * micro * (accum + 1)


def test_a_kept_allocation_keeps_its_batch_and_is_flagged_without_a_restart():
    cluster = Cluster.uniform(1, 4)
    jobs = [_pollux_like("a", requested=4, obs=_OBS)]
    current = Schedule({"a": Allocation("a", (0, 1, 2, 3), 512, 0.1)})
    schedule = OnesPolicy(seed=0).decide(0.0, cluster, jobs, current)
    alloc = schedule.allocations["a"]
    assert alloc.gpus == (0, 1, 2, 3) and alloc.global_batch == 512 and alloc.lr == 0.1
    assert alloc.batch_tuned_by_job


def test_the_goodput_table_uses_the_jobs_own_batch_at_the_consolidated_node_count():
    from ones_pipeline.core import goodput as gp
    from ones_pipeline.core.policies.ones_goodput import tuned_table

    cluster = Cluster.uniform(4, 4)
    job = _pollux_like("a", obs=_OBS)
    table = tuned_table(cluster, [job], np.array([8]))
    m0, top, lo, hi = gp.batch_limits(job.spec)
    params = gp.fitted(_OBS)
    for n, nodes in ((1, 1), (4, 1), (5, 2), (8, 2)):
        want, _, _ = gp.best_batch(params, 2000.0, m0, top, lo, hi, nodes, n)
        assert table[0, n] == pytest.approx(float(want))
    # Crossing nodes is expensive for this job: 5 GPUs (two nodes) are worth less than 4 (one).
    assert table[0, 5] < table[0, 4]


def test_a_job_kept_on_a_split_placement_is_valued_on_that_placement():
    from ones_pipeline.core.policies.ones_goodput import current_goodput, tuned_table

    cluster = Cluster.uniform(2, 4)
    job = _pollux_like("a", obs=_OBS)
    split = Schedule({"a": Allocation("a", (2, 3, 4, 5), 256, 0.1)})  # 2 + 2 GPUs on two nodes
    rate, nodes = current_goodput(cluster, [job], split)
    assert nodes.tolist() == [2]
    assert rate[0] < tuned_table(cluster, [job], np.array([4]))[0, 4]  # in one node it would run faster
    queued, _ = current_goodput(cluster, [job], Schedule())
    assert queued.tolist() == [0.0]


def test_the_chain_tail_favours_the_late_job_closest_to_done_and_values_a_job_alone_at_its_fastest():
    """``tail_chain``: a late job's leftover takes the later of its time alone at its fastest goodput and its
    place in a least-first queue of the late jobs' leftover GPU-time (at their most GPU-efficient size) on the
    whole cluster. Two linear jobs: the split that favours the one with less left wins, where the plain
    terms are indifferent; the figure is worked by hand. A job that scales badly past 2 GPUs is valued at
    its fastest count (2), not its request (1)."""
    table = np.array([[0.0, 10.0, 20.0, 30.0, 40.0]] * 2)
    args = (4, np.array([4, 4]), table, np.array([1e5, 2e5]), np.array([2, 2]), np.array([0.0, 0.0]),
            np.array([0.0, 0.0]), np.array([4, 4]))
    pop = np.array([[3, 1], [1, 3], [2, 2]])
    chain = OnesContext(DecisionInputs(*args)).fitness(pop)  # tail_chain_plain 0: the chain tail alone
    assert chain[0] < chain[2] < chain[1]
    # [3, 1]: A has 100 000 - 30 x 1800 = 46 000 left, B 200 000 - 10 x 1800 = 182 000; at 10 per GPU-second
    # they are 4 600 and 18 200 GPU-s: A ends 1150 s after the horizon (also its time at 40/s), B (4600 + 18 200) / 4.
    assert np.allclose(chain[0], 2 * 1800 + 1150 + 5700)
    # One late job: its leftover at the goodput of its fastest count (2 GPUs: 20/s; 4 GPUs only 12/s), while the
    # plain term takes the goodput of its request (1 GPU).
    slow = np.array([[0.0, 10.0, 20.0, 12.0, 12.0]])
    one = (4, np.array([4]), slow, np.array([1e5]), np.array([1]), np.array([0.0]), np.array([0.0]), np.array([1]))
    solo = np.array([[1]])
    plain = OnesContext(DecisionInputs(*one), FitnessWeights(tail_chain_plain=1.0))
    assert np.allclose(plain.fitness(solo), 1800 + (1e5 - 18000) / 10)
    assert np.allclose(OnesContext(DecisionInputs(*one)).fitness(solo), 1800 + (1e5 - 18000) / 20)


def test_the_chain_tail_blended_with_the_plain_term_keeps_a_value_on_the_largest_jobs_progress():
    """``tail_chain_plain`` a: a late job's leftover is (1 - a) x the chain tail + a x the plain term (its leftover
    at its request's goodput). 0 is the chain tail, 1 the plain fitness; in between, the job with the most left
    still gets the least weight, but its progress now is worth a share of what the plain term gives it, so
    the split that favours the job closest to done still wins, by less. Worked by hand."""
    table = np.array([[0.0, 10.0, 20.0, 30.0, 40.0]] * 2)
    args = (4, np.array([4, 4]), table, np.array([1e5, 2e5]), np.array([2, 2]), np.array([0.0, 0.0]),
            np.array([0.0, 0.0]), np.array([4, 4]))
    pop = np.array([[3, 1], [1, 3], [2, 2]])
    chain = OnesContext(DecisionInputs(*args), FitnessWeights(tail_chain_plain=0.0)).fitness(pop)
    plain = OnesContext(DecisionInputs(*args), FitnessWeights(tail_chain_plain=1.0)).fitness(pop)
    # the plain term alone: each late job's leftover at its request's goodput (4 GPUs, 40 / s), so every
    # split of linear jobs is worth the same
    assert np.allclose(plain, plain[0]) and np.allclose(plain[0], 2 * 1800 + 1150 + 4550)
    mixed = OnesContext(DecisionInputs(*args), FitnessWeights(tail_chain_plain=0.25)).fitness(pop)
    assert mixed[0] < mixed[2] < mixed[1]
    assert mixed[1] - mixed[0] < chain[1] - chain[0]
    # [3, 1]: the chain tail adds 1150 (A) and 5700 s (B) after the horizon (the test above); the plain terms
    # are A's 46 000 and B's 182 000 left at 40 / s (the request, 4 GPUs): 1150 and 4550 s.
    assert np.allclose(mixed[0], 2 * 1800 + 0.75 * (1150 + 5700) + 0.25 * (1150 + 4550))
    # One late job on 1 GPU that is fastest on 2: 4100 s left at its fastest, 8200 s at its request.
    slow = np.array([[0.0, 10.0, 20.0, 12.0, 12.0]])
    one = (4, np.array([4]), slow, np.array([1e5]), np.array([1]), np.array([0.0]), np.array([0.0]), np.array([1]))
    fit = OnesContext(DecisionInputs(*one), FitnessWeights(tail_chain_plain=0.25)).fitness(np.array([[1]]))
    assert np.allclose(fit, 1800 + 0.75 * 4100 + 0.25 * 8200)


def test_wait_weights_favour_the_job_that_has_waited_longest_against_its_size():
    """``wait_weight`` k: a job's completion term counts 1 + waited / (k x its time left at its request) times.
    Two identical jobs (1000 s each on the one GPU), one of them waiting 2000 s longer, k = 1: unweighted
    both orders are worth the same; weighted (factors 3 and 1), running the one that waited first wins. In
    the policy a job's wait is its age less the time it has held GPUs; off (null), no weights."""
    table = np.array([[0.0, 10.0]] * 2)
    args = (1, np.array([1, 1]), table, np.array([1e4, 1e4]), np.array([0, 0]), np.array([0.0, 0.0]),
            np.array([0.0, 2000.0]), np.array([1, 1]))
    pop = np.array([[1, 0], [0, 1]])
    # Each job alone takes 1000 s; the second waits for the first: 1000 s and 2000 s, in either order.
    assert np.allclose(OnesContext(DecisionInputs(*args)).fitness(pop), [3000.0, 3000.0])
    terms = OnesContext(DecisionInputs(*args)).terms(pop)  # the queued job starts when the first frees the GPU
    assert np.allclose(terms.waiting, [[0.0, 1000.0], [1000.0, 0.0]]) and not terms.churn.any()
    assert np.allclose(terms.completion, [[1000.0, 2000.0], [2000.0, 1000.0]]) and not terms.gpu_time.any()
    waited = np.maximum(2000.0 - args[6], 0.0)  # now 2000 s
    ctx = OnesContext(DecisionInputs(*args, waited_s=waited), FitnessWeights(wait_weight=1.0))
    assert np.allclose(ctx.wait_weights, [3.0, 1.0])
    assert np.allclose(ctx.fitness(pop), [3 * 1000.0 + 2000.0, 3 * 2000.0 + 1000.0])
    rng = np.random.default_rng(1)
    cluster, jobs, current = random_scheduler_state(rng, 12, 4, 4)
    pol = OnesPolicy(seed=0)  # on by default, k = 1
    pol.decide(7200.0, cluster, jobs, current).validate(cluster, {j.name: j.spec for j in jobs})
    assert pol.params()["wait_weight"] == 1.0
    off = OnesPolicy(seed=0, wait_weight=None).context(cluster, jobs, current, 7200.0)
    assert off.wait_weights is None
    on = pol.context(cluster, jobs, current, 7200.0)
    waited = np.maximum(7200.0 - np.array([j.submit_time_s + j.run_time_s for j in jobs]), 0.0)
    assert np.allclose(on.wait_weights, 1.0 + waited / np.maximum(on.t_need, 1.0))
    assert (on.wait_weights > 1.0).any()


# What each kind of change costs: every change 30 s (the Pollux simulator's), or in place as measured live.
EVERY_CHANGE_30_S = {"start": 30.0, "grow": 30.0, "shrink": 30.0, "restart": 30.0}
IN_PLACE = {"start": 30.0, "grow": 0.05, "shrink": 0.04, "restart": 30.0}


def _long_and_short(costs):
    """The live A/B mix: a long job holds both slots with about 3 minutes left (25 samples/s, 5000 samples
    left) and a short job arrives; each change costs ``costs`` (``JobView.change_costs``)."""
    from policy_helpers import spec as make_spec

    long = JobView(spec=make_spec("long", per_gpu_batch=16, model="resnet18", epochs=1.0), status=JobStatus.RUNNING,
                   submit_time_s=0.0, samples_done=5000, progress_samples=5000,
                   throughput_obs=(ThroughputObs(2, 1, 16, 1.27, 0.1),), change_costs=costs)
    short = JobView(spec=make_spec("short", model="mlp", epochs=1.0, submit=100.0), status=JobStatus.PENDING,
                    submit_time_s=100.0, change_costs=costs)
    return long, short


def test_ones_charges_what_the_kind_of_change_costs():
    """Where every change costs 30 s (charged 100 s: half the long job's time left, within [30, 120]) ones
    keeps the long job on both slots and the short job waits; where a shrink is made in place (0.04 s,
    charged at most 0.16 s) the long job gives the short one a slot. The wait weight is off so that the
    charge alone decides."""
    from ones_pipeline.core.policies import make_policy

    cluster = Cluster.uniform(1, 2)
    current = Schedule({"long": Allocation("long", (0, 1), 32, 0.1)})
    got = {}
    for name, costs in (("restart", EVERY_CHANGE_30_S), ("in place", IN_PLACE), ("unknown", {})):
        got[name] = make_policy("ones", seed=0, wait_weight=None).decide(110.0, cluster, _long_and_short(costs),
                                                                         current)
    assert got["restart"].allocations["long"].gpus == (0, 1) and "short" not in got["restart"].allocations
    assert got["unknown"] == got["restart"]  # nothing measured: every change taken to cost 30 s
    assert len(got["in place"].allocations["long"].gpus) == 1 and len(got["in place"].allocations["short"].gpus) == 1
    # The charge itself: half the time left, within [the cost, 4 x the cost]: 30 s per change charges 30-120 s.
    left = [50.0, 2000.0, 10.0]
    assert change_charge(30.0, left).tolist() == [30.0, 120.0, 30.0]
    assert np.allclose(change_charge(0.05, left), [0.2, 0.2, 0.2]) and change_charge(0.0, left).tolist() == [0.0] * 3


def test_a_job_keeps_its_count_for_min_hold_s_after_a_change():
    """With shrinks in place the long job gives the short one a slot (above). With ``min_hold_s`` 300 the long
    job, which this policy started at t = 0, keeps both slots until t = 300, then gives one up; the state
    (when each job last changed) survives a save and load."""
    from ones_pipeline.core.policies import make_policy

    cluster = Cluster.uniform(1, 2)
    long, short = _long_and_short(IN_PLACE)
    queued = dataclasses.replace(long, status=JobStatus.PENDING, samples_done=0, progress_samples=0)
    for hold, kept_at_110 in ((0.0, False), (300.0, True)):
        pol = make_policy("ones", seed=0, min_hold_s=hold)
        first = pol.decide(0.0, cluster, [queued], Schedule())
        assert len(first.allocations["long"].gpus) == 2
        current = Schedule({"long": Allocation("long", (0, 1), 32, 0.1)})
        again = policy_from_dict(json.loads(json.dumps(pol.to_dict())))
        assert again.changed_at == pol.changed_at == {"long": 0.0}
        at_110 = again.decide(110.0, cluster, [long, short], current)
        assert (at_110.allocations["long"].gpus == (0, 1)) is kept_at_110
        assert ("short" in at_110.allocations) is not kept_at_110
    at_310 = again.decide(310.0, cluster, [long, short], current)
    assert len(at_310.allocations["long"].gpus) == 1 and len(at_310.allocations["short"].gpus) == 1
    assert again.changed_at == {"long": 310.0, "short": 310.0}


def test_the_default_hold_follows_the_cheapest_next_change():
    """``min_hold_s`` null (the default): 1.25 x the most the job's cheapest next change (grow, shrink, restart)
    is charged (4 x its cost): 150 s where every change costs 30 s (or nothing is measured), 0.2 s where a
    shrink in place costs 0.04 s; a number overrides it and the null survives a save and load."""
    from ones_pipeline.core.policies import make_policy

    assert OnesParams().min_hold_s is None and OnesParams().hold_s() == 150.0
    assert OnesParams().hold_s(EVERY_CHANGE_30_S) == 150.0
    assert np.isclose(OnesParams().hold_s(IN_PLACE), 0.2)
    assert OnesParams(min_hold_s=300.0).hold_s(IN_PLACE) == 300.0 and OnesParams(min_hold_s=0.0).hold_s() == 0.0
    pol = policy_from_dict(json.loads(json.dumps(make_policy("ones", seed=0).to_dict())))
    assert pol.config.min_hold_s is None


def test_the_only_job_left_is_never_shrunk():
    """A job alone on the cluster keeps at least the GPUs it holds, even where ones' goodput model has it
    faster on fewer (here its measured steps slow down past 1 slot), whatever it holds."""
    from policy_helpers import spec as make_spec

    from ones_pipeline.core.policies import make_policy

    cluster = Cluster.uniform(1, 4)
    obs = tuple(ThroughputObs(n, 1, 16, 0.5 + 0.4 * (n - 1), 0.4 * (n - 1)) for n in (1, 2, 4))  # slower on more
    view = JobView(spec=make_spec("alone", per_gpu_batch=16, model="resnet18", epochs=50.0, max_gpus=4),
                   status=JobStatus.RUNNING, submit_time_s=0.0, samples_done=5000, progress_samples=5000,
                   throughput_obs=obs, change_costs=IN_PLACE)
    for held in ((0, 1), (0, 1, 2, 3)):
        current = Schedule({"alone": Allocation("alone", held, 16 * len(held), 0.1)})
        out = make_policy("ones", seed=0).decide(1000.0, cluster, [view], current)
        assert len(out.allocations["alone"].gpus) >= len(held), held
    # With another job queued the same job may be shrunk: its GPUs then serve someone.
    other = JobView(spec=make_spec("other", per_gpu_batch=16, model="resnet18", epochs=1.0), status=JobStatus.PENDING,
                    submit_time_s=900.0, throughput_obs=obs, change_costs=IN_PLACE)
    current = Schedule({"alone": Allocation("alone", (0, 1, 2, 3), 64, 0.1)})
    out = make_policy("ones", seed=0).decide(1000.0, cluster, [view, other], current)
    assert len(out.allocations["alone"].gpus) < 4


def test_the_repair_keeps_locked_jobs_at_the_count_they_hold():
    table = np.array([[0.0] + [10.0 * n for n in range(1, 9)]] * 3)
    inputs = DecisionInputs(8, np.array([8, 8, 8]), table, np.array([1e5, 2e5, 10.0]), np.array([4, 2, 0]),
                            np.array([30.0] * 3), np.zeros(3), np.array([4, 4, 4]))
    ctx = OnesContext(inputs._replace(locked=np.array([True, False, False])))
    pop = np.array([[0, 8, 8], [8, 0, 0], [4, 2, 2], [2, 6, 0]])
    out = ctx.repair(pop, np.random.default_rng(0))
    assert (out[:, 0] == 4).all() and (out.sum(axis=1) <= 8).all() and (out >= 0).all()
    unlocked = OnesContext(inputs)  # the same rows may move job 0
    assert (unlocked.repair(pop, np.random.default_rng(0))[:, 0] != 4).any()

def test_prior_params_of_some_rows_are_those_of_all_jobs():
    """``GoodputModel.prior(jobs, rows)`` (the goodput of unmeasured jobs asks only for theirs) gives the
    rows of ``prior(jobs)``: a job's own fit, its model's mean fit, the prior, value for value."""
    from ones_pipeline.core.goodput import GoodputModel

    cluster, jobs, _ = random_scheduler_state(np.random.default_rng(11), 60, 8, 4)
    full = GoodputModel().prior(jobs).as_array()
    bare = np.array([i for i, j in enumerate(jobs) if not j.throughput_obs])
    assert bare.size and bare.size < len(jobs)
    for rows in (bare, np.arange(len(jobs))[::-3], np.array([0])):
        assert np.array_equal(GoodputModel().prior(jobs, rows).as_array(), full[rows])


def test_memoised_goodput_rows_and_current_goodput_read_from_the_table_are_the_values_computed_afresh():
    """``tuned_table`` keeps measured jobs' rows in a ``GoodputRows`` memo and ``current_goodput`` reads
    consolidated placements from the table: both give exactly what computing every value again gives, and a
    job whose noise scale moved gets a new row, not the memoised one."""
    from dataclasses import replace

    from ones_pipeline.core.policies import ones_goodput as og

    cluster, jobs, current = random_scheduler_state(np.random.default_rng(12), 60, 8, 4)
    caps = np.array([min(j.spec.gpu_cap, cluster.num_gpus) for j in jobs])
    memo = og.GoodputRows()
    fresh = og.tuned_table(cluster, jobs, caps)
    assert np.array_equal(og.tuned_table(cluster, jobs, caps, memo), fresh)
    assert len(memo) == sum(j.throughput_obs != () and j.grad_noise_scale is not None for j in jobs) > 0
    assert np.array_equal(og.tuned_table(cluster, jobs, caps, memo), fresh)  # read back from the memo
    assert np.array_equal(og.current_goodput(cluster, jobs, current, table=fresh)[0],
                          og.current_goodput(cluster, jobs, current)[0])
    i = next(i for i, j in enumerate(jobs) if j.throughput_obs and j.grad_noise_scale is not None)
    moved = list(jobs)
    moved[i] = replace(jobs[i], grad_noise_scale=jobs[i].grad_noise_scale * 50)
    table = og.tuned_table(cluster, moved, caps, memo)
    assert not np.array_equal(table[i], fresh[i])
    assert np.array_equal(og.tuned_table(cluster, moved, caps), table)


def test_the_goodput_row_memo_stays_within_its_cell_budget():
    from ones_pipeline.core.policies import ones_goodput as og

    cluster, jobs, _ = random_scheduler_state(np.random.default_rng(13), 60, 8, 4)
    caps = np.array([min(j.spec.gpu_cap, cluster.num_gpus) for j in jobs])
    everything = og.GoodputRows()
    expected = og.tuned_table(cluster, jobs, caps, everything)
    full = everything.cells
    memo = og.GoodputRows(max_cells=full // 2)  # room for half of them
    kept = []
    for start in range(0, 60, 15):  # a quarter of the jobs at a time: the memo fills, then drops old rows
        sub = np.arange(start, start + 15)
        table = og.tuned_table(cluster, [jobs[i] for i in sub], caps[sub], memo)
        measured = np.array([jobs[i].throughput_obs != () and jobs[i].grad_noise_scale is not None for i in sub])
        # memoised or made again (an unmeasured job's row depends on the other jobs of its model present)
        assert np.array_equal(table[measured], expected[sub][measured])
        assert 0 < memo.cells <= full // 2
        kept.append(len(memo))
    assert max(kept) < len(everything) and kept[-1] < sum(kept[:1]) + 15  # old rows were dropped
    again = og.tuned_table(cluster, jobs, caps, memo)  # everything once more, through the smaller memo
    assert np.array_equal(again, expected)


def test_a_new_job_starts_at_the_batch_its_models_earlier_jobs_measured_best():
    from ones_pipeline.core import goodput as gp
    from ones_pipeline.core.policies.ones_goodput import memory_views
    # What earlier jobs of the model measured: compute barely grows with the batch, and a large noise scale.
    mem = (ThroughputObs(1, 1, 32, 0.010, 0.0), ThroughputObs(1, 1, 256, 0.012, 0.0))
    new = dataclasses.replace(view("new", requested=1), grad_noise_scale=None, model_obs=mem, model_gns=5e4)
    own = dataclasses.replace(view("own", requested=1, obs=[ThroughputObs(1, 1, 32, 0.05, 0.0)]), model_obs=mem,
                              model_gns=5e4)  # measured itself: its own steps count
    bare = dataclasses.replace(new, model_gns=None)  # no noise scale remembered: nothing to pick a batch by
    v_new, v_own, v_bare = memory_views([new, own, bare])
    assert v_new.throughput_obs == mem and v_new.grad_noise_scale == 5e4 and v_new.spec is new.spec
    assert v_own is own and v_bare is bare
    cluster = Cluster.uniform(1, 4)
    batches = {}
    for remembered in (False, True):  # the same job, with and without its model's memory
        job = new if remembered else dataclasses.replace(new, model_obs=(), model_gns=None)
        alloc = OnesPolicy(seed=0).decide(0.0, cluster, [job], Schedule()).allocations["new"]
        assert alloc.batch_tuned_by_job
        n = alloc.num_gpus
        micro, accum = gp.job_batch(new.spec, mem if remembered else (), 5e4 if remembered else None, 1, n)
        assert alloc.global_batch == n * micro * (accum + 1)
        batches[remembered] = alloc.global_batch
    assert batches[True] >= 4 * batches[False]  # not the smallest, from which it would climb


def test_a_job_is_valued_where_it_has_not_run_by_what_its_models_earlier_jobs_measured():
    from ones_pipeline.core.policies.ones_goodput import memory_filled_views
    # "a" has run on 1 and 4 GPUs in one node and on 8 over two nodes, where the all-reduce was slow: fitted to
    # that alone, 16 GPUs over four nodes look worse than 4. Its model's earlier jobs measured 16 over four
    # nodes fast, and 4 GPUs slower than "a" did (its own step times count where it has run).
    own = (ThroughputObs(1, 1, 32, 0.10, 0.0), ThroughputObs(4, 1, 32, 0.12, 0.02), ThroughputObs(8, 2, 32, 0.60, 0.50))
    mem = (ThroughputObs(4, 1, 32, 0.50, 0.40), ThroughputObs(16, 4, 32, 0.13, 0.03))
    a = dataclasses.replace(view("a", requested=4, obs=own), model_obs=mem)
    new = dataclasses.replace(view("new", requested=4), model_obs=mem)  # unmeasured: ``memory_views``' business
    alone = view("alone", obs=own)  # nothing remembered
    fa, fnew, falone = memory_filled_views([a, new, alone])
    assert fa.throughput_obs == own + mem[1:] and fa.spec is a.spec and fa.grad_noise_scale == a.grad_noise_scale
    assert fnew is new and falone is alone
    cluster = Cluster.uniform(4, 4)
    tables = {fill: OnesPolicy(seed=0).context(cluster, [fa] if fill else [a], Schedule(), 0.0).table[0]
              for fill in (False, True)}
    assert tables[False][16] < tables[False][4] < tables[True][16]
    assert tables[True][[1, 4]] == pytest.approx(tables[False][[1, 4]], rel=0.01)  # where it ran: its own times
    forgotten = dataclasses.replace(a, model_obs=())
    gpus = {fill: OnesPolicy(seed=0).decide(0.0, cluster, [a if fill else forgotten], Schedule()).allocations["a"]
            for fill in (False, True)}
    assert gpus[False].num_gpus == 4 and gpus[True].num_gpus == 16
    # the job still tunes its batch on its own steps: the allocation is the job's to tune either way
    assert gpus[True].batch_tuned_by_job and gpus[False].batch_tuned_by_job




def test_a_job_of_unknown_size_is_started_before_a_job_known_to_be_long():
    """The live A/B's seed-0 mix at 61 s: 'long' holds both slots, 'known' (its step times measured: about
    2.5 min on one slot) and 'new' (nothing measured by it or its model: the generic prior puts it at 3 min)
    queue. Until its first steps are timed, 'new''s size is unknown: ones starts it beside 'long' rather than
    the job it knows to be long (live, such a job trained 42 s and waited 3 min behind the known one)."""
    from policy_helpers import spec as make_spec

    from ones_pipeline.core.policies import make_policy

    cluster = Cluster.uniform(1, 2)
    steps = (ThroughputObs(1, 1, 32, 0.53, 0.0), ThroughputObs(2, 1, 32, 0.6, 0.07))  # 60 samples/s on 1 slot
    long = JobView(spec=make_spec("long", model="resnet18", epochs=1.0, max_gpus=2), status=JobStatus.RUNNING,
                   submit_time_s=0.0, samples_done=5000, progress_samples=5000, throughput_obs=steps,
                   change_costs=IN_PLACE)
    known = JobView(spec=make_spec("known", model="resnet18", epochs=0.9, submit=50.0), status=JobStatus.PENDING,
                    submit_time_s=50.0, throughput_obs=steps, change_costs=IN_PLACE)
    new = JobView(spec=make_spec("new", model="cnn", epochs=18.0, submit=50.0), status=JobStatus.PENDING,
                  submit_time_s=50.0, change_costs=IN_PLACE)
    current = Schedule({"long": Allocation("long", (0, 1), 64, 0.1)})
    out = make_policy("ones", seed=0).decide(61.0, cluster, [long, known, new], current)
    assert "new" in out.allocations and "known" not in out.allocations, out.allocations


def test_a_job_nobody_has_timed_gets_what_its_user_requested_on_an_idle_cluster():
    """The ONES trace's first two jobs each request 16 GPUs of an empty 64-GPU cluster; nothing of their
    models has been timed. On the generic prior's all-reduce they were worth no more on 16 GPUs than on 4, and
    ones started them on 4 (twice FIFO's time); the request is what is known of how they scale."""
    jobs = [view("first", requested=16, epochs=5.0), view("second", requested=16, epochs=5.0)]
    out = OnesPolicy(seed=0).decide(0.0, Cluster.uniform(16, 4), jobs, Schedule())
    assert {name: a.num_gpus for name, a in out.allocations.items()} == {"first": 16, "second": 16}


def test_a_job_that_finishes_before_its_grow_would_land_is_not_grown():
    """A job alone on 1 of 2 GPUs that scales perfectly, with about 8 s left there: ones grows it in place where a
    change is made when decided; where the grow takes effect 10 s after the decision (``change_costs["lag"]``,
    measured live), the job would have finished first, and it is kept (live, a job 7 s from its end was grown
    while a long job was stopped to free the slot; it finished before the slot was free). A job with minutes
    left is grown either way."""
    from policy_helpers import spec as make_spec

    from ones_pipeline.core.policies import make_policy

    cluster = Cluster.uniform(1, 2)
    obs = (ThroughputObs(1, 1, 32, 0.10, 0.0), ThroughputObs(2, 1, 32, 0.101, 0.001))  # 320 samples/s per GPU
    current = Schedule({"near": Allocation("near", (0,), 32, 0.1)})

    def grown(total_samples, lag):
        spec = make_spec("near", per_gpu_batch=32, model="cnn", epochs=1.0, max_gpus=2)
        spec = dataclasses.replace(spec, stopping=StoppingRule(StopKind.SAMPLES, samples=total_samples))
        v = JobView(spec=spec, status=JobStatus.RUNNING, submit_time_s=0.0, samples_done=0.0, progress_samples=0.0,
                    throughput_obs=obs, grad_noise_scale=1e6, change_costs={**IN_PLACE, "lag": lag})
        out = make_policy("ones", seed=0).decide(1000.0, cluster, [v], current)
        return len(out.allocations["near"].gpus) == 2

    assert grown(2560, 0.0) and not grown(2560, 10.0)  # 8 s left on 1 GPU
    assert grown(64000, 0.0) and grown(64000, 10.0)  # 200 s left
