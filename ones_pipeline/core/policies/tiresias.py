"""Tiresias: discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

Configured as in the Pollux authors' simulator (``simulator/tiresias.py``, ``TiresiasPolicy.optimize``):
two priority queues, demotion after 16 GPU-hours of attained service, no starvation promotion,
preemptive, rigid GPU count and batch, each queue served in the order jobs entered it, and a newly
started job's GPUs taken node by node from the node with the most free GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ones_pipeline.core.placement import place_counts
from ones_pipeline.core.policies.base import PolicyBase, check_bool, check_float
from ones_pipeline.core.policies.common import active_views, held_gpus, new_allocation, rigid_gpus, workload_batch
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule

DEFAULT_THRESHOLDS_GPU_S = (16 * 3600.0,)  # 2 queues: demoted after 16 GPU-hours
PLACEMENTS = ("most_free", "consolidated")


def _most_free_first(cluster: Cluster, free: np.ndarray, n: int) -> list[int] | None:
    """``n`` free slots taken node by node, each time from the node with the most free GPUs (ties: the
    lowest node index), as many as it has or as are still needed; None if fewer than ``n`` are free."""
    if int(free.sum()) < n:
        return None
    avail = free.copy()
    node_of = cluster.node_of
    chosen: list[int] = []
    while len(chosen) < n:
        per_node = np.bincount(node_of[avail], minlength=cluster.num_nodes)
        node = int(np.argmax(per_node))  # first maximum = lowest index among ties
        slots = np.flatnonzero(avail & (node_of == node))[: n - len(chosen)]
        chosen.extend(int(g) for g in slots)
        avail[slots] = False
    return sorted(chosen)


class TiresiasPolicy(PolicyBase):
    """2D-LAS with discretised priority queues.

    Attained service is GPU-seconds (``view.attained_gpu_s``, the product of both dimensions). A job
    is in queue ``k`` = the number of ``queue_thresholds_gpu_s`` it has reached (queue 0 first). Each queue
    is FIFO by the time the job entered it (Tiresias keeps one list per queue and appends arriving jobs to
    queue 0 and demoted or promoted jobs to the end of their new queue), ties by submit time and name: in
    queue 0 that is arrival order, in lower queues the order of demotion.

    Each round the jobs are admitted in priority order with their rigid GPU count (request capped by
    ``gpu_cap`` and the cluster size) and the workload batch while GPUs remain. A job that does not fit
    is skipped and, with ``backfill`` (default, as Tiresias is work-conserving), lower-priority jobs that
    fit may still run; without it admission stops at the first job that does not fit. Admitted running
    jobs keep their GPUs; running jobs not admitted are preempted. Admission counts GPUs, not node
    shapes: when the free GPUs are fragmented a job is spread over nodes rather than kept waiting.

    ``placement`` of the jobs that start (or resume) this round:
      * ``"most_free"`` (default, the Pollux authors' simulator): in priority order, each job takes GPUs
        node by node from the node with the most free GPUs (ties: lowest node index), all of that node's
        free GPUs or as many as it still needs. A small job thus lands on an empty node when there is one.
      * ``"consolidated"``: largest job first, on as few nodes as possible, best fit
        (``core.placement.place_consolidated``).

    ``starvation_factor`` (None = off, as configured by the Pollux authors): a waiting job whose wait
    since it last ran reaches ``starvation_factor`` times its run time so far is promoted to queue 0,
    and its service is counted afresh from that moment.
    """

    name = "tiresias"

    def __init__(self, seed: int = 0, queue_thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S,
                 starvation_factor: float | None = None, backfill: bool = True,
                 placement: str = "most_free") -> None:
        super().__init__(seed)
        if isinstance(queue_thresholds_gpu_s, (str, bytes)) or not hasattr(queue_thresholds_gpu_s, "__iter__"):
            raise ValueError(f"{self.name}: queue_thresholds_gpu_s must be a list of GPU-seconds, got "
                             f"{queue_thresholds_gpu_s!r}")
        thresholds = [check_float(self.name, "queue_thresholds_gpu_s[]", t, 0.0, strict_min=True)
                      for t in queue_thresholds_gpu_s]
        if any(b <= a for a, b in zip(thresholds, thresholds[1:], strict=False)):
            raise ValueError(f"{self.name}: queue_thresholds_gpu_s must be strictly increasing, got {thresholds!r}")
        self.queue_thresholds_gpu_s = tuple(thresholds)
        self.starvation_factor = (None if starvation_factor is None else
                                  check_float(self.name, "starvation_factor", starvation_factor, 0.0, strict_min=True))
        self.backfill = check_bool(self.name, "backfill", backfill)
        if placement not in PLACEMENTS:
            raise ValueError(f"{self.name}: placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        self.placement = placement
        # Queue bookkeeping, per active job: (its queue, when it entered that queue) as last seen.
        self._entered: dict[str, tuple[int, float]] = {}
        # Starvation bookkeeping (only used with a starvation_factor), per active job:
        self._waiting_since: dict[str, float] = {}  # when it last stopped running (or was first seen)
        self._service_base: dict[str, float] = {}  # attained GPU-s at its last promotion

    def params(self) -> dict[str, Any]:
        return {"queue_thresholds_gpu_s": list(self.queue_thresholds_gpu_s),
                "starvation_factor": self.starvation_factor, "backfill": self.backfill,
                "placement": self.placement}

    def _extra_state(self) -> dict[str, Any]:
        return {"waiting_since": dict(self._waiting_since), "service_base": dict(self._service_base),
                "entered": {k: [q, t] for k, (q, t) in self._entered.items()}}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._entered = {str(k): (int(v[0]), float(v[1])) for k, v in state.get("entered", {}).items()}
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

    @staticmethod
    def _place_most_free(cluster: Cluster, wanted: Sequence[tuple[str, int]],
                         held: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """Admitted jobs keep the GPUs they hold (when the count is unchanged); the others, in priority
        order, take GPUs from the node with the most free GPUs first (``_most_free_first``)."""
        free = np.ones(cluster.num_gpus, dtype=bool)
        out: dict[str, list[int]] = {}
        for name, n in wanted:
            cur = list(held.get(name, ()))
            if n > 0 and len(cur) == n and free[cur].all():
                out[name] = sorted(cur)
                free[cur] = False
        for name, n in wanted:
            if name in out or n <= 0:
                continue
            gpus = _most_free_first(cluster, free, n)
            if gpus is None:
                continue
            out[name] = gpus
            free[gpus] = False
        return out

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = active_views(self.name, jobs)
        held = held_gpus(cluster, current, (v.name for v in views))
        self._update_starvation(now_s, views, set(held))
        queue = {v.name: self.queue_of(v) for v in views}
        entered = {}
        for view in views:  # a job that is new or changed queue joins the end of its queue now
            q = queue[view.name]
            prev = self._entered.get(view.name)
            entered[view.name] = prev if prev is not None and prev[0] == q else (q, float(now_s))
        self._entered = entered
        order = sorted(views, key=lambda v: (queue[v.name], entered[v.name][1], v.submit_time_s, v.name))
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
        if self.placement == "consolidated":
            placed = place_counts(cluster, wanted, held)
        else:
            placed = self._place_most_free(cluster, wanted, held)
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
