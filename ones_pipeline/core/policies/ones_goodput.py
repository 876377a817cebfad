"""Goodput tables of the ``ones`` policy, whose jobs tune their own batch.

A job that tunes its own batch (``Allocation.batch_tuned_by_job``) picks, for the GPUs it holds, the
batch ``core.goodput.job_batch`` gives: the goodput-optimal batch under its own fitted step-time model
and measured noise scale, or, before it has measured anything, its smallest batch. The fitness must
predict the goodput of *that* batch, at the node count the placement will give, or it optimises a
schedule the jobs will not run. These functions compute it with the same model and the same batch
search (``core.goodput.best_batch``), vectorised over (job, GPU count) pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ones_pipeline.core import goodput as gp
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobView,
    Schedule,
    SharedObs,
    ThroughputObs,
    lr_for_batch,
    obs_key,
)


def node_counts(cluster: Cluster, max_n: int) -> np.ndarray:
    """(max_n + 1,) nodes a consolidated placement of n GPUs spans (index 0 unused): ceil(n / node size)."""
    n = np.arange(max_n + 1)
    return np.maximum(np.ceil(n / max(cluster.gpus_per_node)), 1).astype(np.int64)


def _configuration(o: ThroughputObs) -> tuple[int, int, int]:
    """Where a step time was measured: (GPUs, nodes, per-GPU batch), one row per key in the model memory."""
    return o.num_gpus, o.num_nodes, o.per_gpu_batch


def memory_views(jobs: Sequence[JobView]) -> list[JobView]:
    """``jobs`` with each job that has measured nothing yet, but whose model's earlier jobs have
    (``JobView.model_obs`` and ``model_gns``, ``core.model_memory``), given those step times and that noise
    scale as its own: the scheduler values it as they measured, and ``tuned_schedule`` starts it at the batch
    ``core.goodput.job_batch`` picks from them (the job then re-tunes from its own step times). A job with
    measurements of its own, or whose model has none remembered, is left as it is."""
    out = []
    for j in jobs:
        if not j.throughput_obs and j.model_obs and j.model_gns is not None:
            out.append(replace(j, throughput_obs=SharedObs(j.model_obs), grad_noise_scale=float(j.model_gns)))
        else:
            out.append(j)
    return out


def memory_filled_views(jobs: Sequence[JobView]) -> list[JobView]:
    """``jobs`` with each job that has measured step times of its own given, after them, those its model's
    earlier jobs measured (``JobView.model_obs``) in configurations (GPUs, nodes, per-GPU batch) it has not
    run in itself. Fitted to its own few configurations alone, a job's step-time model extrapolates: a
    yolov3 job that has run on 4 GPUs in one node and on 6 over two nodes, where the all-reduce was slow,
    is valued at 16 GPUs over four nodes no better than at 4, though its model's earlier jobs measured 16
    at about twice the goodput (yolov3-63 of workload-4 at load 0.5). The job itself still tunes its batch
    on its own steps only. Jobs without step times, or without a memory, are
    left as they are."""
    out = []
    for j in jobs:
        if j.throughput_obs and j.model_obs:
            own = {_configuration(o) for o in j.throughput_obs}
            extra = tuple(o for o in j.model_obs if _configuration(o) not in own)
            out.append(replace(j, throughput_obs=SharedObs(tuple(j.throughput_obs) + extra)) if extra else j)
        else:
            out.append(j)
    return out


class GoodputRows:
    """``tuned_table``'s memo of measured jobs' rows, owned by one policy: a measured job's row depends only on
    its observations, noise scale, batch limits, cap and the node size, so it is kept under those, and a
    decision recomputes only the rows of jobs whose statistics moved since the last (the rows of queued jobs,
    about half, rarely do). At most ``max_cells`` values (32 MiB by default): past that the oldest rows go
    until half the room is free."""

    def __init__(self, max_cells: int = 1 << 22) -> None:
        self.max_cells = max_cells
        self.cells = 0  # values held
        self._rows: dict[tuple, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: tuple) -> np.ndarray | None:
        return self._rows.get(key)

    def keep(self, items: Sequence[tuple[tuple, np.ndarray]]) -> None:
        """Keep these ``(key, row)`` pairs (rows read-only from now on), unless they alone fill half the room."""
        adding = sum(row.size for _, row in items)
        if adding > self.max_cells // 2:
            return
        if self.cells + adding > self.max_cells:  # forget the oldest rows until half the room is free
            for key in list(self._rows):
                if self.cells + adding <= self.max_cells // 2:
                    break
                self.cells -= self._rows.pop(key).size
        for key, row in items:
            row.setflags(write=False)
            old = self._rows.get(key)
            self.cells += row.size - (old.size if old is not None else 0)
            self._rows[key] = row


def tuned_table(cluster: Cluster, jobs: Sequence[JobView], caps: np.ndarray, memo: GoodputRows | None = None,
                model: gp.GoodputModel | None = None) -> np.ndarray:
    """(J, N + 1) goodput of each job on n = 0..N GPUs placed on as few nodes as possible (N = max of
    ``caps``; column 0 and n above a job's cap are 0), with the batch the job will pick itself; measured
    jobs' rows read from and kept in ``memo`` (``GoodputRows``), step-time fits in ``model``, when given."""
    J, N = len(jobs), int(caps.max())
    table = np.zeros((J, N + 1))
    gpn = max(cluster.gpus_per_node)
    keys: list[tuple | None] = [None] * J
    todo = np.ones(J, dtype=bool)
    for i, j in enumerate(jobs):
        if j.throughput_obs and j.grad_noise_scale is not None:  # measured
            keys[i] = key = (obs_key(j.throughput_obs), float(j.grad_noise_scale), gp.batch_limits(j.spec),
                             int(caps[i]), gpn)
            row = memo.get(key) if memo is not None else None
            if row is not None:
                table[i, :row.size] = row
                todo[i] = False
    pending = np.flatnonzero(todo)
    if pending.size:
        sub = caps[pending]
        rows = np.repeat(pending, sub)
        reps = np.concatenate([np.arange(1, c + 1) for c in sub])
        model = model if model is not None else gp.GoodputModel()
        table[rows, reps] = model.goodput(jobs, rows, node_counts(cluster, N)[reps], reps)
        if memo is not None:
            memo.keep([(keys[i], table[i, :caps[i] + 1].copy()) for i in pending if keys[i] is not None])
    return table


def current_goodput(cluster: Cluster, jobs: Sequence[JobView], current: Schedule,
                    table: np.ndarray | None = None,
                    model: gp.GoodputModel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(goodput, nodes)`` of each job on the GPUs it holds now, both (J,) (0 for queued jobs): a job
    whose count is unchanged keeps its GPUs, so its goodput is that of its real (maybe split) placement.
    ``table`` (``tuned_table``'s): read there where a job's placement is the consolidated one the table
    assumes (the same value), computed only for the others."""
    held = [current.gpus_of(j.name) for j in jobs]
    nodes = np.array([len(set(int(cluster.node_of[g]) for g in h)) for h in held], dtype=np.int64)
    reps = np.array([len(h) for h in held], dtype=np.int64)
    out = np.zeros(len(jobs))
    if table is not None:
        width = table.shape[1]
        inside = (reps > 0) & (reps < width)
        in_table = inside & (nodes == node_counts(cluster, width - 1)[np.minimum(reps, width - 1)])
        in_table &= np.where(inside, table[np.arange(len(jobs)), np.minimum(reps, width - 1)], 0.0) > 0
        out[in_table] = table[np.flatnonzero(in_table), reps[in_table]]
        rows = np.flatnonzero((reps > 0) & ~in_table)
    else:
        rows = np.flatnonzero(reps > 0)
    if rows.size:
        model = model if model is not None else gp.GoodputModel()
        out[rows] = model.goodput(jobs, rows, nodes[rows], reps[rows])
    return out, nodes


def scale_limits(jobs: Sequence[JobView], caps: np.ndarray) -> np.ndarray:
    """(J,) the most GPUs each job may get: its cap, at most what keeps one micro-batch per GPU within its
    largest batch."""
    out = np.array(caps, dtype=np.int64)
    for i, j in enumerate(jobs):
        _, top, lo_micro, _ = gp.batch_limits(j.spec)
        out[i] = max(1, min(out[i], max(int(top // lo_micro), 1)))
    return out


def tuned_schedule(cluster: Cluster, jobs: Sequence[JobView], schedule: Schedule, current: Schedule,
                   model: gp.GoodputModel | None = None) -> Schedule:
    """``schedule`` with allocations marked ``batch_tuned_by_job``: a job on new GPUs starts with the
    batch ``core.goodput.job_batch`` gives for its real placement (it re-tunes from there itself); a job
    on unchanged GPUs keeps its batch (setting the flag alone costs no restart)."""
    by_name = {j.name: j for j in jobs}
    out: dict[str, Allocation] = {}
    fresh: list[tuple[str, Allocation]] = []  # allocations on new GPUs whose batch the job tunes
    for name, alloc in schedule.allocations.items():
        old = current.allocations.get(name)
        if old is not None and old.gpus == alloc.gpus:
            out[name] = old if old.batch_tuned_by_job else replace(old, batch_tuned_by_job=True)
        else:
            fresh.append((name, alloc))
            out[name] = alloc  # its place in the order; replaced below
    views = [by_name[name] for name, _ in fresh]
    model = model if model is not None else gp.GoodputModel()
    picked = model.batches([v.spec for v in views], [tuple(v.throughput_obs) for v in views],
                           [v.grad_noise_scale for v in views],
                           [len(cluster.placement(a.gpus)) for _, a in fresh], [a.num_gpus for _, a in fresh])
    for (name, alloc), v, (micro, accum) in zip(fresh, views, picked, strict=True):
        batch = alloc.num_gpus * micro * (accum + 1)
        out[name] = Allocation(name, alloc.gpus, batch, lr_for_batch(v.spec, batch), batch_tuned_by_job=True)
    return Schedule(out)
