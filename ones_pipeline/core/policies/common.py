"""Helpers the baselines (``fifo``, ``tiresias``, ``optimus``, ``pollux``, ``sia``) share: the active jobs
of a round, the GPUs each holds in the current schedule, the rigid GPU count and workload batch, and the
allocation of a job on its chosen GPUs. Seed, generator, persistence and parameter checks are
``base.py``'s; concrete GPUs for "job -> GPU count" come from ``core.placement``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ones_pipeline.core.types import Allocation, Cluster, JobSpec, JobStatus, JobView, Schedule, lr_for_batch


def active_views(policy: str, jobs: Iterable[JobView]) -> list[JobView]:
    """The jobs a policy schedules (finalized ones dropped); duplicate names are an error."""
    out, seen = [], set()
    for view in jobs:
        if JobStatus(view.status).is_finalized:
            continue
        if view.name in seen:
            raise ValueError(f"{policy}: job {view.name!r} appears twice in the active jobs")
        seen.add(view.name)
        out.append(view)
    return out


def held_gpus(cluster: Cluster, current: Schedule, names: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """GPUs each of ``names`` holds in ``current``: slots outside the cluster or already claimed by an
    earlier job (in name order) are dropped, so the result never double-books."""
    wanted = set(names)
    claimed: set[int] = set()
    out: dict[str, tuple[int, ...]] = {}
    for name in sorted(wanted & set(current.allocations)):
        gpus = tuple(g for g in current.allocations[name].gpus if 0 <= g < cluster.num_gpus and g not in claimed)
        claimed.update(gpus)
        if gpus:
            out[name] = gpus
    return out


def rigid_gpus(spec: JobSpec, cluster: Cluster) -> int:
    """GPUs a rigid baseline gives a job: its request, capped by ``gpu_cap`` and the cluster size (a job
    asking for more GPUs than exist runs on the whole cluster instead of waiting forever)."""
    return max(1, min(spec.requested_gpus, spec.gpu_cap, cluster.num_gpus))


def workload_batch(spec: JobSpec) -> int:
    """The global batch fixed by the workload: ``per_gpu_batch * requested_gpus`` (not capped, so a
    capped GPU count trains the trace's batch with gradient accumulation)."""
    return int(spec.per_gpu_batch * spec.requested_gpus)


def new_allocation(view: JobView, gpus: Sequence[int], global_batch: int, current: Schedule) -> Allocation:
    """The allocation for ``view`` on ``gpus`` with ``global_batch`` (LR by ``lr_for_batch``); the current
    one itself when GPUs and batch are unchanged."""
    gpus = tuple(sorted(int(g) for g in gpus))
    old = current.allocations.get(view.name)
    if old is not None and old.gpus == gpus and old.global_batch == global_batch:
        return old
    return Allocation(view.name, gpus, int(global_batch), lr_for_batch(view.spec, int(global_batch)))


def submit_order(views: Sequence[JobView]) -> list[JobView]:
    """Jobs by submit time, ties by name (deterministic)."""
    return sorted(views, key=lambda v: (v.submit_time_s, v.name))
