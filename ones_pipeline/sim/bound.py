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
simulator's rounds are multiples of ``interval_s``), plus its restart cost (every first start pays it).
Configurations: ``n`` GPUs on the fewest nodes (an assumption the Pollux profiles do not bear out: at small
per-GPU batches more nodes can be faster, so (a) is not strictly a bound for every job; ``sim.tight_bound``
takes the best placement), total batches on a geometric grid from the job's smallest
(``min_global_batch`` or ``per_gpu_batch``) to its largest batch plus the workload's own batch, split
as the simulator splits them. Efficiency depends on progress; where the truth says where it changes
(``next_rate_change``) the progress axis is cut there and each piece is exact, otherwise it is cut into
``pieces`` equal parts and each part takes the better of its two ends.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
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


def _placements(cluster: Cluster, up_to: int) -> list[tuple[int, ...]]:
    """Fewest-nodes placement of n = 1..up_to GPUs (largest nodes first)."""
    sizes = sorted(cluster.gpus_per_node, reverse=True)
    out = []
    for n in range(1, up_to + 1):
        left, pl = n, []
        for s in sizes:
            if left <= 0:
                break
            pl.append(min(s, left))
            left -= pl[-1]
        out.append(tuple(sorted(pl, reverse=True)))
    return out


def _split(truth, n: int, batch: int) -> tuple[int, int]:
    split = getattr(truth, "split_batch", None)
    if split is not None:
        micro, accum = split(n, batch)
        return int(micro), int(accum)
    local = math.ceil(batch / n)
    accum = max(math.ceil(local / truth.max_local_batch) - 1, 0)
    return math.ceil(local / (accum + 1)), accum


def _batch_grid(spec, grid: int) -> set[int]:
    """Total batches on a geometric grid of ``grid`` points from the job's smallest batch (``min_global_batch``
    or ``per_gpu_batch``) to its largest (64x the smallest when uncapped)."""
    m0 = int(spec.min_global_batch or spec.per_gpu_batch)
    top = spec.global_batch_cap
    if top >= 2**60:
        top = 64 * m0
    return {int(round(b)) for b in np.geomspace(m0, max(top, m0), grid)}


def _config_rate(truth, placement: tuple[int, ...], batch: int) -> tuple[int, float] | None:
    """(total batch as split, samples/s) of ``batch`` on ``placement`` (GPUs per node), split as the simulator
    splits it; None where the split leaves no sample per GPU."""
    n = sum(placement)
    micro, accum = _split(truth, n, batch)
    if micro < 1:
        return None
    step, sync = truth.step_time(placement, micro)
    total = n * micro * (accum + 1)
    return total, total / (step + accum * (step - sync))


def _per_job(job: SimJob, cluster: Cluster, grid: int, pieces: int) -> tuple[float, float]:
    """(least run time alone in s, least GPU-seconds) of one job over its configurations."""
    spec, truth = job.spec, job.truth
    batches = sorted(_batch_grid(spec, grid) | {spec.per_gpu_batch * spec.requested_gpus})
    n_max = max(1, min(spec.gpu_cap, cluster.num_gpus))
    placements = _placements(cluster, n_max)
    # Per batch: the best raw throughput over GPU counts, and the best throughput per GPU.
    actual, fast, fast_b, lean = [], [], [], []
    for b in batches:
        best_t, best_g, real, real_t = 0.0, 0.0, b, b
        for pl in placements:
            n = sum(pl)
            rated = _config_rate(truth, pl, b)
            if rated is None:
                continue
            total, thr = rated
            if thr > best_t:
                best_t, real_t = thr, total
            if thr / n > best_g:
                best_g, real = thr / n, total
        actual.append(real)
        fast.append(best_t)
        fast_b.append(real_t)
        lean.append(best_g)
    # The progress axis: exact pieces where the truth says where its efficiency changes.
    cuts, exact = progress_cuts(truth, set(actual) | set(fast_b), pieces)
    time_s = gpu_s = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
        if hi <= lo:
            continue
        at = [0.5 * (lo + hi)] if exact else [lo, hi]
        rate = max(fast[i] * truth.efficiency(p, fast_b[i]) for i in range(len(batches)) for p in at)
        per_gpu = max(lean[i] * truth.efficiency(p, actual[i]) for i in range(len(batches)) for p in at)
        time_s += (hi - lo) / rate
        gpu_s += (hi - lo) / per_gpu
    return time_s, gpu_s


def progress_cuts(truth, batches, pieces: int) -> tuple[list[float], bool]:
    """Where a job's progress axis is cut into pieces of constant efficiency: every point at which the truth
    says its efficiency changes at one of ``batches`` (``next_rate_change``; exact, True), else ``pieces``
    equal pieces (False). Sorted, from 0 to the total progress."""
    total = float(truth.total_progress)
    changes = getattr(truth, "next_rate_change", None)
    cuts = {0.0, total}
    if changes is None:
        cuts.update(np.linspace(0.0, total, pieces + 1).tolist())
        return sorted(cuts), False
    for b in batches:
        p = 0.0
        while True:
            nxt = changes(p, b)
            if nxt is None or not math.isfinite(nxt) or nxt >= total:
                break
            cuts.add(float(nxt))
            p = nxt
    return sorted(cuts), True


def lower_bound(workload: Sequence[SimJob], cluster: Cluster, config: SimConfig | None = None,
                batch_grid: int = 24, pieces: int = 200) -> Bound:
    """The lower bound of the module docstring for ``workload`` on ``cluster`` under ``config`` (default
    ``SimConfig()``)."""
    config = config if config is not None else SimConfig()
    if not workload:
        raise ValueError("workload has no jobs")
    cache: dict[tuple, tuple[float, float]] = {}
    release, alone, work, submit = [], [], [], []
    for job in workload:
        s = job.spec
        key = (id(job.truth), s.min_global_batch, s.per_gpu_batch, s.requested_gpus, s.global_batch_cap, s.gpu_cap)
        if key not in cache:
            cache[key] = _per_job(job, cluster, batch_grid, pieces)
        t_alone, w = cache[key]
        start = math.ceil(s.submit_time_s / config.interval_s - 1e-9) * config.interval_s
        start += config.restart_cost_for(s.model, job.truth.restart_cost_s)
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
