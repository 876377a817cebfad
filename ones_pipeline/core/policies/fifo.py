"""FIFO with first-fit backfilling: requested GPUs, submit order, no preemption."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ones_pipeline.core.placement import keep_or_place
from ones_pipeline.core.policies.base import PolicyBase, check_bool
from ones_pipeline.core.policies.common import (
    active_views,
    held_gpus,
    new_allocation,
    rigid_gpus,
    submit_order,
    workload_batch,
)
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule


class FifoPolicy(PolicyBase):
    """First come, first served by submit time, non-preemptive, rigid.

    Every job gets ``requested_gpus`` (capped by ``gpu_cap`` and the cluster size) with the workload's
    global batch ``per_gpu_batch * requested_gpus``, placed consolidated. A running job keeps its GPUs
    until it finishes. With ``backfill`` (the default) a waiting job that does not fit in the free GPUs
    is skipped and later, smaller jobs may start (first-fit backfilling; a large job can wait long);
    without it, the queue stops at the first job that does not fit.
    """

    name = "fifo"

    def __init__(self, seed: int = 0, backfill: bool = True) -> None:
        super().__init__(seed)
        self.backfill = check_bool(self.name, "backfill", backfill)

    def params(self) -> dict[str, Any]:
        return {"backfill": self.backfill}

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = submit_order(active_views(self.name, jobs))
        held = held_gpus(cluster, current, (v.name for v in views))
        free = np.ones(cluster.num_gpus, dtype=bool)
        allocations: dict[str, Allocation] = {}
        # Running jobs are never preempted: they keep their allocation as it is.
        for view in views:
            gpus = held.get(view.name)
            if gpus is None:
                continue
            old = current.allocations[view.name]
            if len(gpus) == old.num_gpus and old.num_gpus <= view.spec.gpu_cap:
                allocations[view.name] = old
            else:  # a truncated or over-cap allocation (cluster or policy changed): re-place it below
                continue
            free[list(gpus)] = False
        for view in views:
            if view.name in allocations:
                continue
            n = rigid_gpus(view.spec, cluster)
            if n > int(free.sum()):
                if self.backfill:
                    continue
                break
            gpus = keep_or_place(cluster, free, n, held.get(view.name, ()))
            if gpus is None:  # cannot happen: enough GPUs are free
                continue
            free[gpus] = False
            allocations[view.name] = new_allocation(view, gpus, workload_batch(view.spec), current)
        return Schedule(allocations)
