"""Tiresias: discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

Configured as in the Pollux authors' simulator: two priority queues, demotion after 16 GPU-hours of
attained service, no starvation promotion, consolidated placement, preemptive, rigid GPU count and batch.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ones_pipeline.core.baselines.fifo import (
    BaselinePolicy,
    active_views,
    check_bool,
    check_float,
    held_gpus,
    new_allocation,
    place_counts,
    rigid_gpus,
    workload_batch,
)
from ones_pipeline.core.policy import register
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule

DEFAULT_THRESHOLDS_GPU_S = (16 * 3600.0,)  # 2 queues: demoted after 16 GPU-hours


@register("tiresias")
class TiresiasPolicy(BaselinePolicy):
    """2D-LAS with discretised priority queues.

    Attained service is GPU-seconds (``view.attained_gpu_s``, the product of both dimensions). A job
    is in queue ``k`` = the number of ``queue_thresholds_gpu_s`` it has reached (queue 0 first). Inside a
    queue jobs go FIFO by *submit* time (Tiresias orders by start time; submit time is what the
    scheduler knows for every job, and for jobs started in arrival order the two agree).

    Each round the jobs are admitted in priority order with their rigid GPU count (request capped by
    ``gpu_cap`` and the cluster size) and the workload batch while GPUs remain. A job that does not fit
    is skipped and, with ``backfill`` (default, as Tiresias is work-conserving), lower-priority jobs that
    fit may still run; without it admission stops at the first job that does not fit. Admitted running
    jobs keep their GPUs; running jobs not admitted are preempted; the rest are placed consolidated,
    largest first. Admission counts GPUs, not node shapes: when the free GPUs are fragmented a job is
    spread over nodes rather than kept waiting for a consolidated slot.

    ``starvation_factor`` (None = off, as configured by the Pollux authors): a waiting job whose wait
    since it last ran reaches ``starvation_factor`` times its run time so far is promoted to queue 0,
    and its service is counted afresh from that moment.
    """

    name = "tiresias"

    def __init__(self, seed: int = 0, queue_thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S,
                 starvation_factor: float | None = None, backfill: bool = True) -> None:
        super().__init__(seed)
        if isinstance(queue_thresholds_gpu_s, (str, bytes)) or not hasattr(queue_thresholds_gpu_s, "__iter__"):
            raise ValueError(f"{self.name}: queue_thresholds_gpu_s must be a list of GPU-seconds, got "
                             f"{queue_thresholds_gpu_s!r}")
        thresholds = [check_float(self.name, "queue_thresholds_gpu_s[]", t, 0.0, strict_min=True)
                      for t in queue_thresholds_gpu_s]
        if any(b <= a for a, b in zip(thresholds, thresholds[1:])):
            raise ValueError(f"{self.name}: queue_thresholds_gpu_s must be strictly increasing, got {thresholds!r}")
        self.queue_thresholds_gpu_s = tuple(thresholds)
        self.starvation_factor = (None if starvation_factor is None else
                                  check_float(self.name, "starvation_factor", starvation_factor, 0.0, strict_min=True))
        self.backfill = check_bool(self.name, "backfill", backfill)
        # Starvation bookkeeping (only used with a starvation_factor), per active job:
        self._waiting_since: dict[str, float] = {}  # when it last stopped running (or was first seen)
        self._service_base: dict[str, float] = {}  # attained GPU-s at its last promotion

    def params(self) -> dict[str, Any]:
        return {"queue_thresholds_gpu_s": list(self.queue_thresholds_gpu_s),
                "starvation_factor": self.starvation_factor, "backfill": self.backfill}

    def _extra_state(self) -> dict[str, Any]:
        return {"waiting_since": dict(self._waiting_since), "service_base": dict(self._service_base)}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._waiting_since = {str(k): float(v) for k, v in state.get("waiting_since", {}).items()}
        self._service_base = {str(k): float(v) for k, v in state.get("service_base", {}).items()}

    def queue_of(self, view: JobView) -> int:
        """Priority queue of a job (0 = highest)."""
        service = view.attained_gpu_s - self._service_base.get(view.name, 0.0)
        return int(np.searchsorted(np.asarray(self.queue_thresholds_gpu_s), service, side="right"))

    def _update_starvation(self, now_s: float, views: Sequence[JobView], running: set[str]) -> None:
        names = {v.name for v in views}
        self._waiting_since = {k: t for k, t in self._waiting_since.items() if k in names}
        self._service_base = {k: s for k, s in self._service_base.items() if k in names}
        if self.starvation_factor is None:
            return
        for view in views:
            if view.name in running:
                self._waiting_since.pop(view.name, None)
                continue
            since = self._waiting_since.setdefault(view.name, float(now_s))
            if view.run_time_s > 0 and now_s - since >= self.starvation_factor * view.run_time_s:
                self._service_base[view.name] = view.attained_gpu_s
                self._waiting_since[view.name] = float(now_s)  # the next promotion needs a fresh wait

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = active_views(self.name, jobs)
        held = held_gpus(cluster, current, (v.name for v in views))
        self._update_starvation(now_s, views, set(held))
        order = sorted(views, key=lambda v: (self.queue_of(v), v.submit_time_s, v.name))
        free = cluster.num_gpus
        wanted: list[tuple[str, int]] = []
        for view in order:
            n = rigid_gpus(view.spec, cluster)
            if n > free:
                if self.backfill:
                    continue
                break
            wanted.append((view.name, n))
            free -= n
        placed = place_counts(cluster, wanted, held)
        by_name = {v.name: v for v in views}
        allocations: dict[str, Allocation] = {}
        for name, _ in wanted:
            if name in placed:
                view = by_name[name]
                allocations[name] = new_allocation(view, placed[name], workload_batch(view.spec), current)
        if self.starvation_factor is not None:  # jobs preempted now start waiting now
            for view in views:
                if view.name not in allocations:
                    self._waiting_since.setdefault(view.name, float(now_s))
                else:
                    self._waiting_since.pop(view.name, None)
        return Schedule(allocations)
