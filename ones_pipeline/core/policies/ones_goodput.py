"""Goodput tables of the ``ones`` policy when jobs tune their own batch (``OnesParams.job_batch``).

A job that tunes its own batch (``Allocation.batch_tuned_by_job``) picks, for the GPUs it holds, the
batch ``core.goodput.job_batch`` gives: the goodput-optimal batch under its own fitted step-time model
and measured noise scale, or, before it has measured anything, its smallest batch. The fitness must
predict the goodput of *that* batch, at the node count the placement will give, or it optimises a
schedule the jobs will not run. These functions compute it with the same model and the same batch
search (``core.goodput.best_batch``), vectorised over (job, GPU count) pairs. ``fixed_batch_table`` is
the older rule (``job_batch`` off): the batch a multiple of the submitted per-GPU batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ones_pipeline.core import estimates
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


def _measured(job: JobView) -> bool:
    return bool(job.throughput_obs) and job.grad_noise_scale is not None


def _configuration(o: ThroughputObs) -> tuple[int, int, int]:
    """Where a step time was measured: (GPUs, nodes, per-GPU batch), one row per key in the model memory."""
    return o.num_gpus, o.num_nodes, o.per_gpu_batch


def pooled_views(jobs: Sequence[JobView], new_jobs: bool = False) -> list[JobView]:
    """``jobs`` with each measured job's step-time observations replaced by those of every job of its model
    (``spec.model``), one per configuration (GPUs, nodes, micro-batch; the first job in ``jobs`` to report
    it), sorted by configuration: jobs of one model on one kind of GPU share one step-time model, so a job
    that has only run on one GPU is valued elsewhere by what its model's other jobs measured there, not by
    the optimistic prior of an unmeasured network. The jobs of a model share one tuple, so one fit.
    ``new_jobs``: a job that has measured nothing yet gets them too, with the noise scale of the job of its
    model that has made the least progress and measured one (the noise scale grows as training goes on):
    it is valued as its model's jobs measured, not by the generic prior."""
    pools: dict[str, dict[tuple, object]] = {}
    young: dict[str, tuple[float, float]] = {}  # model -> (progress, noise scale) of its least-progressed job
    for j in jobs:
        pool = pools.setdefault(j.spec.model, {})
        for o in j.throughput_obs:
            pool.setdefault(_configuration(o), o)
        measured = j.throughput_obs and j.grad_noise_scale is not None
        if measured and (j.spec.model not in young or j.progress_samples < young[j.spec.model][0]):
            young[j.spec.model] = (j.progress_samples, float(j.grad_noise_scale))
    shared = {m: SharedObs(pool[k] for k in sorted(pool)) for m, pool in pools.items()}
    out = []
    for j in jobs:
        if j.throughput_obs:
            out.append(replace(j, throughput_obs=shared[j.spec.model]))
        elif new_jobs and j.spec.model in young:
            out.append(replace(j, throughput_obs=shared[j.spec.model], grad_noise_scale=young[j.spec.model][1]))
        else:
            out.append(j)
    return out


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
    at about twice the goodput (``benchmarks/jct_by_model.py --detail 0.5:4 --trace yolov3-63 --params
    '{"fill_from_memory": false}'``). The job
    itself still tunes its batch on its own steps only. Jobs without step times, or without a memory, are
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


def _untuned_goodput(jobs: Sequence[JobView], rows: np.ndarray, nodes: np.ndarray, replicas: np.ndarray,
                     use_efficiency: bool, recipe_first: bool) -> np.ndarray:
    """Goodput of not-yet-measured jobs (``rows`` index ``jobs``) at the batch they start with, from
    ``core.estimates`` (the job's own fit, else its model's mean fit, else the prior) and the prior noise
    scale. The start batch: with ``recipe_first`` the submitted recipe (``batch_and_lr``), else, as
    ``job_batch``, max(M0, smallest micro-batch x GPUs)."""
    params = estimates.fitted_params(jobs, rows)
    gns = estimates.noise_scales(jobs)[rows]
    lim = np.array([gp.batch_limits(j.spec) for j in jobs])[rows]  # (R, 4)
    if recipe_first:
        per_gpu = np.array([j.spec.per_gpu_batch for j in jobs], dtype=float)[rows]
        cap = np.array([j.spec.global_batch_cap for j in jobs], dtype=float)[rows]
        batch = np.minimum(per_gpu * replicas, cap)
    else:
        batch = np.maximum(lim[:, 0], lim[:, 2] * replicas)
    micro, accum = gp.split_for(batch, replicas, lim[:, 3], lim[:, 0])
    return estimates.goodput_of(params, gns, lim[:, 0], lim[:, 3], replicas, nodes, micro * (accum + 1) * replicas,
                                use_efficiency=use_efficiency)


def tuned_goodput(jobs: Sequence[JobView], rows: np.ndarray, nodes: np.ndarray, replicas: np.ndarray,
                  use_efficiency: bool = True, recipe_first: bool = False) -> np.ndarray:
    """(R,) goodput (base-equivalent samples/s) of ``jobs[rows[i]]`` on ``nodes[i]`` nodes x
    ``replicas[i]`` GPUs with the batch the job will pick there itself (``core.goodput.job_batch``).

    Measured jobs: ``best_batch`` under their fitted Pollux model and noise scale (the job's own choice);
    ``use_efficiency`` False counts raw samples/s of that batch. Others: ``_untuned_goodput``.
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(rows))
    measured = np.array([_measured(j) for j in jobs], dtype=bool)
    m = measured[rows]
    if m.any():
        rj = rows[m]
        uniq, inv = np.unique(rj, return_inverse=True)
        gp.fit_many(jobs[j].throughput_obs for j in uniq)  # all new fits in one batch
        params = np.stack([gp.fitted(obs_key(jobs[j].throughput_obs)) for j in uniq])[inv]  # (R', 7)
        gns = np.array([jobs[j].grad_noise_scale for j in uniq], dtype=float)[inv]
        lim = np.array([gp.batch_limits(jobs[j].spec) for j in uniq])[inv]  # (R', 4)
        good, micro, accum = gp.best_batch(params, gns, lim[:, 0], lim[:, 1], lim[:, 2], lim[:, 3],
                                           nodes[m].astype(float), replicas[m].astype(float))
        if not use_efficiency:
            good = gp.throughput(params, nodes[m], replicas[m], micro, accum)
        out[m] = good
    if (~m).any():
        out[~m] = _untuned_goodput(jobs, rows[~m], nodes[~m].astype(float), replicas[~m].astype(float),
                                   use_efficiency, recipe_first)
    return np.where(np.isfinite(out), np.maximum(out, 0.0), 0.0)


def tuned_table(cluster: Cluster, jobs: Sequence[JobView], caps: np.ndarray,
                use_efficiency: bool = True, recipe_first: bool = False) -> np.ndarray:
    """(J, N + 1) goodput of each job on n = 0..N GPUs placed on as few nodes as possible (N = max of
    ``caps``; column 0 and n above a job's cap are 0), with the batch the job will pick itself.

    A measured job's row depends only on its observations, noise scale, batch limits, cap and the node
    size, so it is memoised on those (``_ROWS``): a decision recomputes only the rows of jobs whose
    statistics moved since the last (the rows of queued jobs, about half, rarely do)."""
    J, N = len(jobs), int(caps.max())
    table = np.zeros((J, N + 1))
    gpn = max(cluster.gpus_per_node)
    keys: list[tuple | None] = [None] * J
    todo = np.ones(J, dtype=bool)
    for i, j in enumerate(jobs):
        if _measured(j):
            keys[i] = key = (obs_key(j.throughput_obs), float(j.grad_noise_scale), gp.batch_limits(j.spec),
                             int(caps[i]), gpn, use_efficiency)
            row = _ROWS.get(key)
            if row is not None:
                table[i, :row.size] = row
                todo[i] = False
    pending = np.flatnonzero(todo)
    if pending.size:
        sub = caps[pending]
        rows = np.repeat(pending, sub)
        reps = np.concatenate([np.arange(1, c + 1) for c in sub])
        table[rows, reps] = tuned_goodput(jobs, rows, node_counts(cluster, N)[reps], reps, use_efficiency,
                                          recipe_first)
        global _row_cells
        adding = int(sum(caps[i] + 1 for i in pending if keys[i] is not None))
        if _row_cells + adding > _MAX_ROW_CELLS:  # forget the oldest rows until half the room is free
            for key in list(_ROWS):
                if _row_cells + adding <= _MAX_ROW_CELLS // 2:
                    break
                _row_cells -= _ROWS.pop(key).size
        for i in pending:
            if keys[i] is not None and adding <= _MAX_ROW_CELLS // 2:
                row = table[i, :caps[i] + 1].copy()
                row.setflags(write=False)
                _row_cells += row.size - (old.size if (old := _ROWS.get(keys[i])) is not None else 0)
                _ROWS[keys[i]] = row
    return table


_ROWS: dict[tuple, np.ndarray] = {}  # ``tuned_table``'s memo of measured jobs' rows
_MAX_ROW_CELLS = 1 << 22  # values kept at most (32 MiB)
_row_cells = 0


def forget_rows() -> None:
    """Drop ``tuned_table``'s memoised rows (with the fits: ``estimates.forget_fits``)."""
    global _row_cells
    _ROWS.clear()
    _row_cells = 0


estimates.on_forget(forget_rows)


def current_goodput(cluster: Cluster, jobs: Sequence[JobView], current: Schedule,
                    use_efficiency: bool = True, recipe_first: bool = False,
                    table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(goodput, nodes)`` of each job on the GPUs it holds now, both (J,) (0 for queued jobs): a job
    whose count is unchanged keeps its GPUs, so its goodput is that of its real (maybe split) placement.
    ``table`` (``tuned_table``'s, same options): read there where a job's placement is the consolidated one
    the table assumes (the same value), computed only for the others."""
    held = [current.gpus_of(j.name) for j in jobs]
    nodes = np.array([len(set(int(cluster.node_of[g]) for g in h)) for h in held], dtype=np.int64)
    reps = np.array([len(h) for h in held], dtype=np.int64)
    out = np.zeros(len(jobs))
    if table is not None:
        width = table.shape[1]
        inside = (reps > 0) & (reps < width)
        fits = inside & (nodes == node_counts(cluster, width - 1)[np.minimum(reps, width - 1)])
        fits &= np.where(inside, table[np.arange(len(jobs)), np.minimum(reps, width - 1)], 0.0) > 0
        out[fits] = table[np.flatnonzero(fits), reps[fits]]
        rows = np.flatnonzero((reps > 0) & ~fits)
    else:
        rows = np.flatnonzero(reps > 0)
    if rows.size:
        out[rows] = tuned_goodput(jobs, rows, nodes[rows], reps[rows], use_efficiency, recipe_first)
    return out, nodes


def placed_goodput(cluster: Cluster, jobs: Sequence[JobView], counts: np.ndarray, nodes: np.ndarray,
                   table: np.ndarray, use_efficiency: bool = True, recipe_first: bool = False) -> np.ndarray:
    """(K, J) goodput of each job on ``counts[k, j]`` GPUs spread over ``nodes[k, j]`` nodes (a real
    placement; both (K, J)): the table's (``tuned_table``) where that is a consolidated placement, else
    the batch the job picks on those nodes; 0 for queued jobs and for jobs the placement left out."""
    idx = np.arange(counts.shape[1])[None, :]
    out = np.where(counts > 0, table[idx, counts], 0.0)
    out = np.where(nodes > 0, out, 0.0)
    k, j = np.nonzero((counts > 0) & (nodes > 0) & (nodes != node_counts(cluster, table.shape[1] - 1)[counts]))
    if k.size:
        out[k, j] = tuned_goodput(jobs, j, nodes[k, j], counts[k, j], use_efficiency, recipe_first)
    return out


def scale_limits(jobs: Sequence[JobView], caps: np.ndarray, scale_out: float | None,
                 unmeasured: int | str | None = None) -> np.ndarray:
    """(J,) the most GPUs each job may get: its cap, at most what keeps one micro-batch per GPU within its
    largest batch, and, with ``scale_out``, at most ``scale_out`` x the most GPUs it has measured (but
    never below its request): the fitted model is optimistic about sizes the job has not tried.
    ``unmeasured`` (an int, or ``"request"``): a job that has measured no step time yet gets at most that
    many GPUs (its request), so that its first measurement is at a size it asked for or fewer."""
    out = np.array(caps, dtype=np.int64)
    for i, j in enumerate(jobs):
        _, top, lo_micro, _ = gp.batch_limits(j.spec)
        limit = max(int(top // lo_micro), 1)
        seen = max((o.num_gpus for o in j.throughput_obs), default=0)
        if scale_out is not None:
            limit = min(limit, max(int(math.ceil(scale_out * seen)), j.spec.requested_gpus, 1))
        if unmeasured is not None and seen == 0:
            limit = min(limit, max(j.spec.requested_gpus, 1) if unmeasured == "request" else int(unmeasured))
        out[i] = max(1, min(out[i], limit))
    return out


def tuned_schedule(cluster: Cluster, jobs: Sequence[JobView], schedule: Schedule, current: Schedule,
                   recipe_first: bool = False) -> Schedule:
    """``schedule`` with allocations marked ``batch_tuned_by_job``: a job on new GPUs starts with the
    batch ``core.goodput.job_batch`` gives for its real placement (it re-tunes from there itself); a job
    on unchanged GPUs keeps its batch (setting the flag alone costs no restart). With ``recipe_first`` a
    job that has not measured its throughput and noise scale yet runs its submitted recipe, untuned."""
    by_name = {j.name: j for j in jobs}
    out: dict[str, Allocation] = {}
    fresh: list[tuple[str, Allocation]] = []  # allocations on new GPUs whose batch the job tunes
    for name, alloc in schedule.allocations.items():
        v = by_name[name]
        tune = not recipe_first or _measured(v)
        old = current.allocations.get(name)
        if old is not None and old.gpus == alloc.gpus:
            out[name] = old if old.batch_tuned_by_job or not tune else replace(old, batch_tuned_by_job=True)
        elif not tune:
            out[name] = Allocation.for_spec(v.spec, alloc.gpus)
        else:
            fresh.append((name, alloc))
            out[name] = alloc  # its place in the order; replaced below
    views = [by_name[name] for name, _ in fresh]
    picked = gp.job_batches([v.spec for v in views], [tuple(v.throughput_obs) for v in views],
                            [v.grad_noise_scale for v in views],
                            [len(cluster.placement(a.gpus)) for _, a in fresh], [a.num_gpus for _, a in fresh])
    for (name, alloc), v, (micro, accum) in zip(fresh, views, picked, strict=True):
        batch = alloc.num_gpus * micro * (accum + 1)
        out[name] = Allocation(name, alloc.gpus, batch, lr_for_batch(v.spec, batch), batch_tuned_by_job=True)
    return Schedule(out)


def fixed_batch_table(cluster: Cluster, jobs: Sequence[JobView], max_n: int, use_efficiency: bool,
                      batch_factors: Sequence[float] = (1.0,)) -> tuple[np.ndarray, np.ndarray]:
    """``OnesParams.job_batch`` off: goodput and global batch of each job at 0..max_n GPUs, two
    (J, max_n + 1) arrays (column 0 unused).

    For each count the global batch is ``factor * per_gpu_batch * n`` (capped by the job's global batch
    cap), for the factor in ``batch_factors`` that gives the most base-equivalent samples/s.
    ``(1.0,)`` is ONES's rule: the per-GPU batch stays as submitted.
    """
    params = estimates.fitted_params(jobs).select(np.s_[:, None, None])  # (J, 1, 1) fields
    gns = estimates.noise_scales(jobs)[:, None, None]  # (J, 1, 1)
    n = np.arange(1, max_n + 1)[None, :, None]  # (1, N, 1)
    nodes = np.ceil(n / max(cluster.gpus_per_node))
    factors = np.asarray(batch_factors, dtype=float)[None, None, :]  # (1, 1, F)
    per_gpu = np.array([j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    cap = np.array([j.spec.global_batch_cap for j in jobs], dtype=float)[:, None, None]
    max_local = np.array([j.spec.max_per_gpu_batch or j.spec.per_gpu_batch for j in jobs], dtype=float)[:, None, None]
    batch = np.maximum(np.minimum(np.round(per_gpu * factors) * n, cap), 1.0)  # (J, N, F)
    gp = estimates.goodput_of(params, gns, per_gpu, max_local, n, nodes, batch,
                              use_efficiency=use_efficiency)  # (J, N, F)
    best = np.argmax(gp, axis=2)  # (J, N)
    good = np.take_along_axis(gp, best[:, :, None], axis=2)[:, :, 0]
    chosen = np.take_along_axis(batch, best[:, :, None], axis=2)[:, :, 0]
    zeros = np.zeros((len(jobs), 1))
    return np.concatenate([zeros, good], axis=1), np.concatenate([zeros, chosen], axis=1).astype(np.int64)
