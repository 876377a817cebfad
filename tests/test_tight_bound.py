"""The tight lower bound (sim/tight_bound.py): below the exact optimum an exhaustive search finds on tiny
instances and within 10 % of it, below every policy, and at least today's bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.synthetic import synthetic_job
from ones_pipeline.sim.tight_bound import tight_bound
from ones_pipeline.sim.workloads import load_pollux_workload


def _rate(job, n: int) -> float:
    """Fastest samples/s of a synthetic job on ``n`` GPUs of one node, over every total batch it allows, split
    as the simulator splits it (per-GPU micro-batches, accumulation steps beyond ``max_local_batch``)."""
    best = 0.0
    for batch in range(n, job.spec.global_batch_cap + 1):
        local = -(-batch // n)
        accum = max(-(-local // job.truth.max_local_batch) - 1, 0)
        micro = -(-local // (accum + 1))
        step, sync = job.truth.step_time((n,), micro)
        best = max(best, n * micro * (accum + 1) / (step + accum * (step - sync)))
    return best


def _optimum(jobs, gpus: int, interval: float, cost: float) -> float:
    """Least mean JCT over every schedule of the simulator's model (one node of ``gpus`` GPUs): at each round
    every arrived, unfinished job gets a GPU count (total <= ``gpus``); a changed count (first start,
    resize, resume) holds its GPUs ``cost`` seconds without progress; a job finishes inside a round at its
    rate. Depth-first search, pruned by each job's end alone at the fastest rate from where it is."""
    rates = [[0.0] + [_rate(j, n) for n in range(1, gpus + 1)] for j in jobs]
    work = [j.truth.total_progress for j in jobs]
    submit = [j.spec.submit_time_s for j in jobs]
    best = [math.inf]

    def allocations(active, left):
        if not active:
            yield ()
            return
        for n in range(left, -1, -1):  # the most GPUs first: the first schedule found finishes
            for rest in allocations(active[1:], left - n):
                yield (n, *rest)

    def search(t, progress, held, done_jct):
        now = t * interval
        open_ = [i for i in range(len(jobs)) if progress[i] < work[i]]
        if not open_:
            best[0] = min(best[0], done_jct)
            return
        floor = done_jct + sum(max(now, submit[i]) + (work[i] - progress[i]) / rates[i][gpus] - submit[i]
                               for i in open_)
        if floor >= best[0] - 1e-9:
            return
        active = [i for i in open_ if submit[i] <= now]
        for alloc in allocations(active, gpus):
            prog, hold, jct = list(progress), list(held), done_jct
            for i, n in zip(active, alloc, strict=True):
                if n == 0:
                    hold[i] = 0
                    continue
                dead = cost if n != held[i] else 0.0
                hold[i] = n
                run = max(interval - dead, 0.0)
                if prog[i] + rates[i][n] * run >= work[i]:
                    jct += now + dead + (work[i] - prog[i]) / rates[i][n] - submit[i]
                    prog[i] = work[i]
                else:
                    prog[i] += rates[i][n] * run
            if jct + sum(max(now, submit[i]) - submit[i] for i in open_ if prog[i] < work[i]) < best[0]:
                search(t + 1, tuple(prog), tuple(hold), jct)

    search(0, tuple(0.0 for _ in jobs), tuple(0 for _ in jobs), 0.0)
    return best[0] / len(jobs)


TINY = [  # (jobs as (submit s, samples, sync s), GPUs, restart cost s)
    ([(0, 30_000, 0.05), (0, 12_000, 0.05), (70, 20_000, 0.05)], 4, 10.0),
    ([(0, 40_000, 0.2), (0, 40_000, 0.2), (30, 10_000, 0.2)], 4, 20.0),
    ([(0, 25_000, 0.02), (10, 8_000, 0.3), (60, 15_000, 0.02), (65, 6_000, 0.3)], 3, 5.0),
]


@pytest.mark.parametrize("case", range(len(TINY)))
def test_tight_bound_below_exhaustive_optimum_and_within_ten_percent(case):
    spec, gpus, cost = TINY[case]
    jobs = [synthetic_job(f"j{i}", s, w, requested_gpus=1, samples_per_gpu_s=100.0, sync_s=sync,
                          max_local_batch=64) for i, (s, w, sync) in enumerate(spec)]
    # Every change costs ``cost``, nothing in place: the model the exhaustive search enumerates.
    config = SimConfig(interval_s=60.0, restart_cost_s=cost, change_costs=PRESETS["pollux"])
    cluster = Cluster.uniform(1, gpus)
    opt = _optimum(jobs, gpus, 60.0, cost)
    b = tight_bound(jobs, cluster, config, time_budget_s=20.0, cell_s=0.25)
    assert b.lagrangian_s <= opt * (1 + 1e-9), (b, opt)
    assert b.mean_jct_s >= 0.9 * opt, (b, opt)
    assert b.mean_jct_s >= lower_bound(jobs, cluster, config).mean_jct_s
    print(f"case {case}: optimum {opt:.1f} s, tight {b.lagrangian_s:.1f} s ({b.lagrangian_s / opt:.3f}), "
          f"fast {b.fast_s:.1f} s ({b.fast_s / opt:.3f}), LP {b.lp_s:.1f} s")
    # The optimum is a real schedule: no policy beats it (the search is not missing schedules).
    for name in ("fifo", "pollux"):
        res = simulate(jobs, make_policy(name, seed=0), cluster, config)
        assert sum(r.jct_s for r in res.jobs) / len(jobs) >= opt * (1 - 1e-9), name


def test_tight_bound_below_every_policy_on_a_contended_pollux_sample():
    """The first 24 jobs of workload-6 on 2 nodes of 4 GPUs: with every change a restart, contention makes the
    tight bound bind, and no policy gets below it; with in-place changes (the default change costs) the
    bound charges a change the least it can cost, and ``ones``, resizing in place, stays above it too."""
    jobs = load_pollux_workload(workload_path("pollux:workload-6"))[:24]
    cluster, config = Cluster.uniform(2, 4), SimConfig(interval_s=120.0, change_costs=PRESETS["pollux"])
    b = tight_bound(jobs, cluster, config, time_budget_s=4.0)
    assert b.binds == "tight" and b.lagrangian_s > b.fast_s
    assert b.to_dict()["mean_jct_s"] == b.mean_jct_s
    for name in ("fifo", "tiresias"):
        res = simulate(jobs, make_policy(name, seed=0), cluster, config)
        assert sum(r.jct_s for r in res.jobs) / len(jobs) >= b.mean_jct_s, name
    in_place = SimConfig(interval_s=120.0)
    b = tight_bound(jobs, cluster, in_place, time_budget_s=4.0)
    res = simulate(jobs, make_policy("ones", seed=0), cluster, in_place)
    assert sum(r.in_place for r in res.jobs) > 0  # it resized in place
    assert sum(r.jct_s for r in res.jobs) / len(jobs) >= b.mean_jct_s


def test_tight_bound_never_below_each_job_alone_though_its_grid_rounds_up():
    """The progress grid rounds a job up after every round, so its shortest relaxed path alone ends before its
    continuous end alone (the fast bound's part (a)); every completion the programme values counts as at
    least that end, so the tight bound is at least the fast one on a job alone, and strictly above it when
    jobs contend for the GPUs (each alone would take all of them)."""
    config = SimConfig(interval_s=60.0, restart_cost_s=10.0, change_costs=PRESETS["pollux"])
    cluster = Cluster.uniform(1, 4)

    def job(name, submit, samples, sync):
        return synthetic_job(name, submit, samples, requested_gpus=1, samples_per_gpu_s=100.0, sync_s=sync,
                             max_local_batch=64)

    # ~38 rounds alone on 4 GPUs, cells of 4 s at its fastest: rounded up by up to a cell a round.
    alone = tight_bound([job("a", 0, 900_000, 0.05)], cluster, config, time_budget_s=5.0)
    assert alone.lagrangian_s >= alone.fast_s * (1 - 1e-9), alone
    contended = [job("a", 0, 300_000, 0.3), job("b", 0, 300_000, 0.3), job("c", 120, 300_000, 0.3)]
    b = tight_bound(contended, cluster, config, time_budget_s=10.0)
    fast = lower_bound(contended, cluster, config)
    assert fast.mean_jct_s == b.fast_s
    assert b.lagrangian_s > 1.01 * b.fast_s and b.binds == "tight", (b, fast)
    res = simulate(contended, make_policy("fifo", seed=0), cluster, config)
    assert sum(r.jct_s for r in res.jobs) / len(contended) >= b.mean_jct_s


def test_tight_bound_rejects_an_empty_workload():
    with pytest.raises(ValueError, match="no jobs"):
        tight_bound([], Cluster.uniform(1, 4))


def test_simulate_prints_both_bounds_with_bound_tight(tmp_path, capsys):
    import json

    from ones_pipeline.cli import main

    rc = main(["simulate", "--workload", "pollux:workload-6", "--jobs", "6", "--gpus", "8", "--policies", "fifo",
               "--bound", "tight", "--bound-budget", "2", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tight/fast" in out and "binds" in out
    bound = json.loads((tmp_path / "summary.json").read_text())["bound"]
    assert bound["mean_jct_s"] == max(bound["tight_mean_jct_s"], bound["fast_mean_jct_s"])
    assert bound["binds"] in ("tight", "fast")



def test_rates_take_the_best_placement_not_only_the_fewest_nodes():
    """Every placement of up to 16 GPUs, and spreads above: on the Pollux profiles more nodes can be faster
    (yolov3 at its own per-GPU batch on 16 GPUs), and the rates both bounds share take the best of them."""
    from ones_pipeline.sim.rates import Rates, config_rate, fewest_nodes, placements_of

    cluster = Cluster.uniform(16, 4)
    assert placements_of(cluster, 5) == [(1, 1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1), (3, 1, 1), (3, 2), (4, 1)]
    big = placements_of(cluster, 33)
    assert (4, 4, 4, 4, 4, 4, 4, 4, 1) in big and (3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2) in big
    assert all(sum(p) == 33 and len(p) <= 16 and max(p) <= 4 for p in big)
    job = next(j for j in load_pollux_workload(workload_path("pollux:workload-6")) if j.spec.model == "yolov3")
    batch = 16 * job.spec.per_gpu_batch
    on_fewest = config_rate(job.truth, fewest_nodes(cluster, 16)[-1], batch)[1]
    total, on_best = max(config_rate(job.truth, pl, batch) for pl in placements_of(cluster, 16))
    assert on_best > 1.1 * on_fewest
    rates = Rates(job, cluster, {batch})
    middles = 0.5 * (rates.x[:-1] + rates.x[1:])  # the Pollux profiles say where efficiency changes: exact
    assert np.all(rates.rate[16] >= on_best * np.array([job.truth.efficiency(p, total) for p in middles]) * (1 - 1e-9))
