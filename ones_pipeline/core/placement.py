"""Choosing concrete GPUs: consolidated placement (fewest nodes) shared by every policy, and the schedule
of "job -> GPU count" decisions (``schedule_from_counts``, shared by the ONES policies)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule


def free_mask(cluster: Cluster, taken: Iterable[int] = ()) -> np.ndarray:
    """(num_gpus,) bool: True where the slot is free."""
    mask = np.ones(cluster.num_gpus, dtype=bool)
    mask[list(taken)] = False
    return mask


def place_consolidated(cluster: Cluster, free: np.ndarray, n: int, prefer: Sequence[int] = ()) -> list[int] | None:
    """Pick ``n`` free slots on as few nodes as possible; None if fewer than ``n`` are free.

    Slots in ``prefer`` (e.g. the GPUs a job already holds) are taken first when they are free, so a
    job that grows keeps its old GPUs. A job that fits in one node goes to the free-est-fitting node
    with the fewest free slots (best fit), keeping large holes for large jobs.
    """
    if n <= 0:
        return []
    if int(free.sum()) < n:
        return None
    node_of = cluster.node_of
    chosen: list[int] = [g for g in prefer if free[g]][:n]
    avail = free.copy()
    avail[chosen] = False
    need = n - len(chosen)
    if need == 0:
        return sorted(chosen)
    free_per_node = np.bincount(node_of[avail], minlength=cluster.num_nodes)
    # Prefer nodes where the job already has GPUs.
    own_nodes = set(int(node_of[g]) for g in chosen)
    for node in sorted(own_nodes, key=lambda k: -free_per_node[k]):
        slots = np.flatnonzero(avail & (node_of == node))[:need]
        chosen.extend(int(s) for s in slots)
        avail[slots] = False
        need -= len(slots)
        if need == 0:
            return sorted(chosen)
    free_per_node = np.bincount(node_of[avail], minlength=cluster.num_nodes)
    fitting = np.flatnonzero(free_per_node >= need)
    if fitting.size:
        node = int(fitting[np.argmin(free_per_node[fitting])])
        chosen.extend(int(s) for s in np.flatnonzero(avail & (node_of == node))[:need])
        return sorted(chosen)
    for node in np.argsort(-free_per_node, kind="stable"):
        slots = np.flatnonzero(avail & (node_of == node))[:need]
        chosen.extend(int(s) for s in slots)
        need -= len(slots)
        if need == 0:
            return sorted(chosen)
    return None


def keep_or_place(cluster: Cluster, free: np.ndarray, n: int, current: Sequence[int]) -> list[int] | None:
    """Keep the current GPUs when the count is unchanged and they are free, else place afresh."""
    if len(current) == n and all(free[g] for g in current):
        return sorted(current)
    return place_consolidated(cluster, free, n, prefer=current)


def place_counts(cluster: Cluster, wanted: Sequence[tuple[str, int]],
                 held: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Concrete GPUs for ``(job, count)`` pairs, moving as few running jobs as possible.

    ``held`` maps a job to the GPUs it holds now (a valid schedule: no GPU twice). Jobs keeping their
    count keep their GPUs; shrinking jobs keep a subset (on their fullest nodes); the rest, largest
    first (ties in the given order), keep what they hold and add GPUs nearby, or are placed on as few
    nodes as possible. A job that finds no room (only when counts exceed the cluster) is left out.
    """
    node_of = cluster.node_of
    out: dict[str, tuple[int, ...]] = {}
    free = free_mask(cluster)
    movers: list[tuple[int, int, str, int]] = []
    for rank, (name, n) in enumerate(wanted):
        if n <= 0:
            continue
        cur = sorted(int(g) for g in held.get(name, ()))
        if len(cur) == n:
            out[name] = tuple(cur)
            free[cur] = False
        elif 0 < n < len(cur):
            per_node = np.bincount(node_of[cur], minlength=cluster.num_nodes)
            keep = sorted(sorted(cur, key=lambda g: (-per_node[node_of[g]], g))[:n])
            out[name] = tuple(keep)
            free[keep] = False
        else:
            movers.append((-n, rank, name, n))
    for _, _, name, n in sorted(movers):
        gpus = place_consolidated(cluster, free, n, prefer=[g for g in held.get(name, ()) if free[g]])
        if gpus is None:
            continue
        out[name] = tuple(gpus)
        free[gpus] = False
    return out


def schedule_from_counts(cluster: Cluster, jobs: Sequence[JobView], counts: np.ndarray, current: Schedule,
                         order: Sequence[int]) -> Schedule:
    """The schedule giving ``jobs[i]`` ``counts[i]`` GPUs (``counts`` (J,)), placed in ``order`` (job indices)
    by ``place_counts``.

    A job whose GPUs are unchanged keeps its allocation (a batch change alone would cost a restart); the
    others get the spec's batch/LR rule (``Allocation.for_spec``).
    """
    wanted = [(jobs[i].name, int(counts[i])) for i in order]
    gpus = place_counts(cluster, wanted, {j.name: current.gpus_of(j.name) for j in jobs})
    allocs = {}
    for j in jobs:
        if j.name not in gpus:
            continue
        old = current.allocations.get(j.name)
        allocs[j.name] = old if old is not None and old.gpus == gpus[j.name] else Allocation.for_spec(j.spec,
                                                                                                     gpus[j.name])
    return Schedule(allocs)
