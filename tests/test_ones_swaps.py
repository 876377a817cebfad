"""``benchmarks/ones_swaps.py``: the decisions in which ``ones`` stops a running job and starts another."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.policies.ones_fitness import OnesContext
from ones_pipeline.sim.synthetic import random_scheduler_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ones_swaps as sw  # noqa: E402


def _ctx() -> OnesContext:
    """Two jobs on a 4-GPU cluster: job a holds all 4 GPUs on a split placement (real goodput 60 against the
    table's 100), job b is queued; both have the same work left and the same table."""
    table = np.array([[0.0, 30.0, 55.0, 75.0, 100.0]] * 2)
    return OnesContext(4, np.array([4, 4]), table, np.array([1e5, 1e5]), np.array([4, 0]),
                       np.array([120.0, 120.0]), np.array([0.0, 10.0]), np.array([4, 4]),
                       cur_rate=np.array([60.0, 0.0]))


def test_explain_reports_the_swap_both_ways():
    ctx = _ctx()
    best = np.array([0, 4])
    found = sw.explain(ctx, ["a", "b"], best)
    assert found["out"] == [0] and found["in"] == [1]
    assert found["chosen"] == ctx.fitness(best[None, :])[0]
    assert found["undone"] == ctx.fitness(np.array([[4, 0]]))[0]
    a, b = found["rows"]
    assert (a["job"], a["cur"], a["new"], a["cur_rate"], a["table_rate"], a["split"]) == ("a", 4, 0, 60.0, 100.0, True)
    assert (b["job"], b["cur"], b["new"], b["table_rate"], b["split"]) == ("b", 0, 4, 100.0, False)
    terms = ctx._job_terms(best[None, :])[0][0]
    assert (a["term_chosen"], b["term_chosen"]) == (terms[0], terms[1])
    # The asymmetry the script shows: the fitness prefers stopping the split job for an identical queued one,
    # which it values on a consolidated placement.
    assert found["chosen"] < found["undone"]


def test_explain_finds_no_swap_without_a_stop_and_a_start():
    ctx = _ctx()
    assert sw.explain(ctx, ["a", "b"], np.array([4, 0])) is None  # unchanged
    assert sw.explain(ctx, ["a", "b"], np.array([2, 2])) is None  # a shrinks, b starts: no stop


def test_watch_records_every_decision_and_its_swap():
    rng = np.random.default_rng(3)
    cluster, views, current = random_scheduler_state(rng, 24, 4, 4)
    watch = sw.SwapWatch(make_policy("ones", seed=0))
    schedule = watch.policy.decide(1000.0, cluster, views, current)
    watch.policy.decide(1060.0, cluster, views, schedule)
    assert watch.decisions == 2
    held = {j.name: len(current.gpus_of(j.name)) for j in views}
    stopped = [j.name for j in views if held[j.name] > 0 and not schedule.gpus_of(j.name)]
    started = [j.name for j in views if held[j.name] == 0 and schedule.gpus_of(j.name)]
    assert stopped and started  # this state's first decision swaps (seed 3)
    first = [s for t, s in watch.swaps if t == 1000.0]
    assert len(first) == 1
    rows = first[0]["rows"]
    assert sorted(r["job"] for r in rows if r["new"] == 0) == sorted(stopped)
    assert sorted(r["job"] for r in rows if r["cur"] == 0) == sorted(started)
    assert all(t == 1060.0 for t, _ in watch.swaps[1:])
