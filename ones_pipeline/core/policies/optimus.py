"""Optimus: greedy marginal-gain allocation on a fitted speed model (Peng et al., EuroSys'18).

Configured as in the Pollux authors' simulator: every job first gets one GPU, then GPUs go one at a time
to the job whose predicted remaining time drops the most; the batch stays the workload's, with gradient
accumulation when the GPUs are too few to hold it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.goodput import GoodputModel
from ones_pipeline.core.placement import place_counts
from ones_pipeline.core.policies.base import PolicyBase
from ones_pipeline.core.policies.common import active_views, held_gpus, new_allocation, submit_order, workload_batch
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule


class OptimusPolicy(PolicyBase):
    """Greedy allocation by marginal reduction of predicted remaining time.

    Remaining time with ``n`` GPUs = ``remaining_work / throughput(n)``: the remaining base-equivalent
    samples (``estimates.remaining_work``) over the samples/s of the fitted step-time model
    (``GoodputModel.prior``; priors for jobs never observed) at the fixed global batch
    ``per_gpu_batch * requested_gpus``, on ``ceil(n / gpus_per_node)`` nodes (consolidated). Every job gets
    one GPU in submit order while GPUs last; each further GPU goes to the job with the largest
    ``T(n) - T(n + 1)`` (a heap, ties to the earlier job), up to ``min(gpu_cap, cluster size, batch)`` GPUs
    per job, until the GPUs run out or no job gains. The gain is myopic, as in Optimus: a job whose next
    GPU crosses a node boundary and slows it stops growing there.

    Placement: jobs whose GPU count is unchanged keep their GPUs, the others are placed consolidated,
    largest first.
    """

    name = "optimus"

    def __init__(self, seed: int = 0, model: GoodputModel | None = None) -> None:
        super().__init__(seed)
        self.model = model if model is not None else GoodputModel()  # values the jobs; fits kept between decisions

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = submit_order(active_views(self.name, jobs))
        if not views:
            return Schedule({})
        counts = self.gpu_counts(cluster, views)
        held = held_gpus(cluster, current, (v.name for v in views))
        placed = place_counts(cluster, [(v.name, int(c)) for v, c in zip(views, counts, strict=False)], held)
        allocations: dict[str, Allocation] = {}
        for view in views:
            if view.name in placed:
                allocations[view.name] = new_allocation(view, placed[view.name], workload_batch(view.spec), current)
        return Schedule(allocations)

    def gpu_counts(self, cluster: Cluster, views: Sequence[JobView]) -> np.ndarray:
        """(J,) GPUs per job, for jobs in submit order."""
        J = len(views)
        gpn = max(cluster.gpus_per_node)
        params = self.model.prior(views)  # (J,) fields
        work = estimates.remaining_work(views)  # (J,) base-equivalent samples
        gns = estimates.noise_scales(views)  # unused without efficiency, but keeps goodput_of's signature
        base = np.array([v.spec.per_gpu_batch for v in views], dtype=float)
        batch = np.array([workload_batch(v.spec) for v in views], dtype=float)
        max_local = np.array([v.spec.max_per_gpu_batch or np.inf for v in views], dtype=float)
        caps = np.array([max(1, min(v.spec.gpu_cap, cluster.num_gpus, workload_batch(v.spec))) for v in views])

        def remaining_time(idx: np.ndarray, n: np.ndarray) -> np.ndarray:
            nodes = np.ceil(n / gpn)
            thr = estimates.goodput_of(params.select(idx), gns[idx], base[idx], max_local[idx], n, nodes, batch[idx],
                                       use_efficiency=False)
            return work[idx] / thr

        counts = np.zeros(J, dtype=np.int64)
        first = min(J, cluster.num_gpus)
        counts[:first] = 1
        left = cluster.num_gpus - first
        if left == 0:
            return counts
        idx = np.arange(first)
        t1 = remaining_time(idx, np.ones(first))
        growable = caps[idx] > 1
        t2 = np.where(growable, remaining_time(idx, np.minimum(2.0, caps[idx])), np.inf)
        t_now = t1.copy()  # (first,) predicted remaining time at the current count
        heap = [(-(t1[i] - t2[i]), i, float(t2[i])) for i in range(first) if growable[i] and t1[i] - t2[i] > 0]
        heapq.heapify(heap)
        while left > 0 and heap:
            _, i, t_next = heapq.heappop(heap)
            counts[i] += 1
            left -= 1
            t_now[i] = t_next
            n = int(counts[i])
            if n >= caps[i]:
                continue
            t_after = float(remaining_time(np.array([i]), np.array([n + 1.0]))[0])
            gain = t_now[i] - t_after
            if gain > 0 and math.isfinite(gain):
                heapq.heappush(heap, (-gain, i, t_after))
        return counts
