"""A lower bound on the mean JCT any policy can reach on a workload, from the simulator's ground truth.

Two relaxations, and their combination, which is the bound:

(a) **Alone.** Each job alone on the whole cluster from the moment it can first run, at every instant at
    its fastest configuration (GPU count up to ``min(gpu_cap, cluster GPUs)`` and total batch) for the
    progress it has reached. No other job exists, so no policy does better for that job.
(b) **One big server, SRPT.** The cluster as one machine processing ``G`` GPU-seconds per second; each
    job needs its least GPU-seconds ``W_j`` (at every progress the configuration using the fewest
    GPU-seconds per unit of progress) and is released when it can first run. Preemptive
    shortest-remaining-processing-time is optimal for mean completion time on one machine with release
    times (Schrage, 1968), and every real schedule maps onto this machine (a job's GPU-time is at least
    ``W_j`` and the cluster serves at most ``G`` GPU-seconds per second), so its mean JCT is a lower bound.
(c) **Both at once** (the bound). In any schedule every job ``j`` ends no earlier than ``a_j``, its end in
    (a), and the ``k``-th job to end ends no earlier than ``L_k``, the ``k``-th completion under (b): on
    one machine with release times, preemptive SRPT completes at least as many jobs as any schedule by
    every instant (the exchange argument behind its optimality for mean completion time: at any instant
    it has finished the most jobs the work served so far allows), so it minimises every order statistic
    of the completion times, and a
    real schedule maps onto that machine. The ``k``-th job to end ends no earlier than the larger of
    ``L_k`` and its own ``a``; summed over ``k``, the least this can be over all orders of the jobs is
    with both lists sorted and paired in order (the sum of ``max(a, L)`` over a pairing, which is half the
    sum of ``a + L + |a - L|``, is least when the pairing is sorted), so ``mean_k max(a_(k), L_(k))`` less
    the mean submission time is a lower bound at least as large as (a) and (b). It counts what neither
    counts alone: the big jobs that (a) lets each have the cluster also queue behind one another in (b).

Shared by both: a job can first run at the first round boundary at or after its submission (the
simulator's rounds are multiples of ``interval_s``), plus the dead time of its first start. Its rates:
``sim.rates.Rates``, the best over placements, batches and accumulation at each GPU count and progress
(the model the tight bound uses too). All placements count: at small per-GPU batches more nodes are faster
in the Pollux profiles (yolov3 alone 6171 s at best against 7258 s on the fewest nodes, deepspeech2 1656
against 1777 s), so a bound on the fewest nodes alone, as this one was until issue 38, was above what a
schedule can reach for those jobs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.rates import rates_by_type
from ones_pipeline.sim.truth import SimJob


@dataclass(frozen=True)
class Bound:
    """Mean JCT lower bounds (seconds): ``alone`` (a), ``srpt`` (b), ``combined`` (c); ``mean_jct_s`` is the
    largest (``combined`` is never below the other two; a ``Bound`` built without it takes the larger of
    (a) and (b))."""

    alone_s: float
    srpt_s: float
    jobs: int
    combined_s: float = 0.0

    @property
    def mean_jct_s(self) -> float:
        return max(self.alone_s, self.srpt_s, self.combined_s)

    def to_dict(self) -> dict[str, float]:
        return {"mean_jct_s": self.mean_jct_s, "alone_mean_jct_s": self.alone_s,
                "srpt_mean_jct_s": self.srpt_s, "combined_mean_jct_s": self.combined_s, "jobs": self.jobs}


def lower_bound(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig | None = None,
                batch_grid: int = 24, pieces: int = 200) -> Bound:
    """The lower bound of the module docstring for ``workload`` on ``cluster`` under ``config`` (default
    ``SimConfig()``)."""
    config = config if config is not None else SimConfig()
    if not workload:
        raise ValueError("workload has no jobs")
    release, alone, work, submit = [], [], [], []
    for job, rates in zip(workload, rates_by_type(workload, cluster, batch_grid, pieces), strict=True):
        s = job.spec
        t_alone, w = rates.fast_clock[-1], rates.least_gpu_s
        start = math.ceil(s.submit_time_s / config.interval_s - 1e-9) * config.interval_s
        start += config.change_costs.costs(config.restart_cost_for(s.model, job.truth.restart_cost_s), False)["start"]
        submit.append(s.submit_time_s)
        release.append(start)
        alone.append(start + t_alone - s.submit_time_s)
        work.append(w / cluster.num_gpus)  # seconds on the one big server
    done = _srpt(np.array(release), np.array(work))
    submit_a = np.array(submit)
    ends_alone = np.array(alone) + submit_a  # a_j: absolute end times under (a)
    return Bound(float(np.mean(alone)), float(np.mean(done - submit_a)), len(workload),
                 float(np.mean(_paired_max(ends_alone, done)) - np.mean(submit_a)))


def _paired_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``max(a_(k), b_(k))`` of the two lists sorted: per rank, the later of the two bounds on the ``k``-th
    completion (relaxation (c))."""
    return np.maximum(np.sort(a), np.sort(b))


def _srpt(release: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Completion times of preemptive SRPT on one machine (unit speed) with release times."""
    order = np.argsort(release, kind="stable")
    done = np.empty(len(work))
    heap: list[tuple[float, int]] = []
    t, i = 0.0, 0
    while i < len(order) or heap:
        if not heap:
            t = max(t, release[order[i]])
        while i < len(order) and release[order[i]] <= t:
            heapq.heappush(heap, (float(work[order[i]]), int(order[i])))
            i += 1
        left, j = heapq.heappop(heap)
        nxt = release[order[i]] if i < len(order) else math.inf
        if t + left <= nxt:
            t += left
            done[j] = t
        else:
            heapq.heappush(heap, (left - (nxt - t), j))
            t = nxt
    return done
