"""Each job's best goodput per GPU count along its progress, from the simulator's ground truth: the rate model
both lower bounds share (``sim.bound``, the fast one; ``sim.job_paths`` / ``sim.tight_bound``, the tight one).

At ``n`` GPUs a job runs no faster than the best, over its placements (``placements_of``) and total batches
(a geometric grid from its smallest batch to its largest, plus the workload's own batches, split as the
simulator splits them), of the samples/s times the statistical efficiency of the batch as split, at its
progress. Efficiency depends on progress; where the truth says where it changes (``next_rate_change``) the
progress axis is cut there and each piece is exact, otherwise it is cut into ``pieces`` equal parts and
each part takes the better of its two ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.truth import SimJob


def fewest_nodes(cluster: Cluster, up_to: int) -> list[tuple[int, ...]]:
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


def placements_of(cluster: Cluster, n: int, every_up_to: int = 16) -> list[tuple[int, ...]]:
    """Placements (GPUs per node, largest first) of ``n`` GPUs the rates take the best of: every one that fits
    the cluster up to ``every_up_to`` GPUs (the largest measured in the Pollux profiles, whose other
    placements are interpolated by node and GPU counts only), above it the fewest nodes and an even spread
    over each larger node count. More nodes can be faster in the profiles (up to several times, at small
    per-GPU batches), so the fewest nodes alone would not bound every policy."""
    sizes = sorted(cluster.gpus_per_node, reverse=True)
    fewest = fewest_nodes(cluster, n)[-1]
    out = {fewest}
    if n <= every_up_to:
        def parts(left, cap, k):
            if left == 0:
                yield ()
                return
            if k >= len(sizes):
                return
            for g in range(min(cap, left, sizes[k]), 0, -1):
                for rest in parts(left - g, g, k + 1):
                    yield (g, *rest)
        out.update(parts(n, sizes[0], 0))
    for m in range(len(fewest) + 1, min(n, len(sizes)) + 1):
        base, extra = divmod(n, m)
        spread = tuple(base + (i < extra) for i in range(m))
        if all(g <= c for g, c in zip(spread, sizes, strict=False)):
            out.add(spread)
    return sorted(out)


def split(truth, n: int, batch: int) -> tuple[int, int]:
    split = getattr(truth, "split_batch", None)
    if split is not None:
        micro, accum = split(n, batch)
        return int(micro), int(accum)
    local = math.ceil(batch / n)
    accum = max(math.ceil(local / truth.max_local_batch) - 1, 0)
    return math.ceil(local / (accum + 1)), accum


def batch_grid(spec, grid: int) -> set[int]:
    """Total batches on a geometric grid of ``grid`` points from the job's smallest batch (``min_global_batch``
    or ``per_gpu_batch``) to its largest (64x the smallest when uncapped)."""
    m0 = int(spec.min_global_batch or spec.per_gpu_batch)
    top = spec.global_batch_cap
    if top >= 2**60:
        top = 64 * m0
    return {int(round(b)) for b in np.geomspace(m0, max(top, m0), grid)}


def config_rate(truth, placement: tuple[int, ...], batch: int) -> tuple[int, float] | None:
    """(total batch as split, samples/s) of ``batch`` on ``placement`` (GPUs per node), split as the simulator
    splits it; None where the split leaves no sample per GPU."""
    n = sum(placement)
    micro, accum = split(truth, n, batch)
    if micro < 1:
        return None
    step, sync = truth.step_time(placement, micro)
    total = n * micro * (accum + 1)
    return total, total / (step + accum * (step - sync))


def efficiencies(truth, points: np.ndarray, batches: list[int]) -> np.ndarray:
    """``truth.efficiency(p, b)`` for every progress point (rows) and batch (columns): the truth's own
    ``efficiencies`` where it has one (one noise-scale lookup per point), else one call per pair."""
    table = getattr(truth, "efficiencies", None)
    if table is not None:
        return np.asarray(table(np.asarray(points, dtype=float), batches))
    return np.array([[truth.efficiency(float(p), b) for b in batches] for p in points])


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


class Rates:
    """``r(n, p)`` of one job type: progress cuts ``x`` (the truth's rate changes), rate per GPU count and
    piece ``rate[n, i]`` (row 0: no GPUs), the time to reach each cut at each count ``clock[n, i]`` and at
    the fastest count ``fast_clock[i]``, and the least GPU-seconds to the end ``least_gpu_s``."""

    def __init__(self, job: SimJob, cluster: Cluster, batches: set[int], grid: int = 24, pieces: int = 200):
        spec, truth = job.spec, job.truth
        n_max = max(1, min(spec.gpu_cap, cluster.num_gpus))
        all_b = sorted(batch_grid(spec, grid) | batches)
        configs: list[list[tuple[int, float]]] = []
        for n in range(1, n_max + 1):
            best: dict[int, float] = {}
            for pl in placements_of(cluster, n):
                for b in all_b:
                    rated = config_rate(truth, pl, b)
                    if rated is not None and rated[1] > best.get(rated[0], 0.0):
                        best[rated[0]] = rated[1]
            configs.append(sorted(best.items()))
        total = float(truth.total_progress)
        distinct = sorted({b for c in configs for b, _ in c})
        cuts, exact = progress_cuts(truth, distinct, pieces)
        x = np.array(cuts)
        x = x[np.concatenate(([True], np.diff(x) > 0))]
        # Efficiency per distinct batch per piece: exact at the piece's middle, else the better end.
        at = [0.5 * (x[:-1] + x[1:])] if exact else [x[:-1], x[1:]]
        table = np.max([efficiencies(truth, pts, distinct) for pts in at], axis=0).T  # (batches, pieces)
        eff = dict(zip(distinct, table, strict=True))
        rate = np.zeros((n_max + 1, len(x) - 1))
        for n, cfg in enumerate(configs, start=1):
            for b, thr in cfg:
                np.maximum(rate[n], thr * eff[b], out=rate[n])
        # A job may leave GPUs idle: n GPUs run at least as fast as fewer (optimistic, so still valid).
        rate = np.maximum.accumulate(rate, axis=0)
        self.x, self.rate, self.total, self.n_max = x, rate, total, n_max
        width = np.diff(x)
        with np.errstate(divide="ignore"):
            per = np.where(rate > 0, width / np.where(rate > 0, rate, 1.0), np.inf)
        self.clock = np.concatenate([np.zeros((n_max + 1, 1)), np.cumsum(per, axis=1)], axis=1)
        fast = rate[1:].max(axis=0)
        self.fast_clock = np.concatenate([[0.0], np.cumsum(width / fast)])
        # The least GPU-seconds to the end: at every piece the count with the best rate per GPU.
        self.least_gpu_s = float(np.sum(width / (rate[1:] / np.arange(1, n_max + 1)[:, None]).max(axis=0)))

    def time_at(self, n: int, p: np.ndarray) -> np.ndarray:
        """Seconds at ``n`` GPUs from progress 0 to ``p``."""
        return np.interp(p, self.x, self.clock[n])

    def reach(self, n: int, t: np.ndarray) -> np.ndarray:
        """Progress reached after ``t`` seconds at ``n`` GPUs from progress 0."""
        return np.interp(t, self.clock[n], self.x)


def rates_by_type(workload: Sequence[SimJob], cluster: Cluster, grid: int = 24, pieces: int = 200) -> list[Rates]:
    """Each job's ``Rates``, shared by the jobs of one truth and caps (their workload batches pooled: each
    is a batch the others could train with too, and more choices only make a bound more optimistic)."""
    groups: dict[tuple, list[SimJob]] = {}
    keys = []
    for job in workload:
        s = job.spec
        keys.append((id(job.truth), s.min_global_batch, s.per_gpu_batch, s.global_batch_cap, s.gpu_cap))
        groups.setdefault(keys[-1], []).append(job)
    rates = {key: Rates(jobs[0], cluster, {j.spec.per_gpu_batch * j.spec.requested_gpus for j in jobs}, grid, pieces)
             for key, jobs in groups.items()}
    return [rates[key] for key in keys]
