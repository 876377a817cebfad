"""Ground truth of the six Pollux (OSDI'21) models, from the profiles the Pollux authors measured.

A profile folder ``traces/<model>/`` holds ``placements.csv`` (step times of specific GPU placements),
``scalability.csv`` (step times of larger spreads) and one ``validation-<B>.csv`` per total batch B
(per-epoch progress, validation metric and gradient statistics). See
``shared/traces/pollux/README.md`` for the data and how the Pollux simulator uses it; this module is an
independent numpy re-implementation of those rules.

Units: ``progress`` arguments are base-equivalent samples (M0-steps x M0, M0 = ``base_batch``); the
validation files count progress in M0-steps, the conversion is done here.
"""

from __future__ import annotations

import functools
import math
import re
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np
import pandas as pd

from ones_pipeline.core.limits import MAX_BATCH, MAX_GPUS
from ones_pipeline.sim.csv_fields import Field, integer, number, read_rows
from ones_pipeline.sim.truth import TraceError

POLLUX_MODELS = ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet")

_PLACEMENT_FIELDS = (integer("placement", minimum=1), integer("local_bsz", minimum=1, maximum=MAX_BATCH),
                     number("step_time", low=0, low_open=True), number("sync_time", low=0))
_SCALABILITY_FIELDS = (integer("num_nodes", minimum=1, maximum=MAX_GPUS),
                       integer("num_replicas", minimum=1, maximum=MAX_GPUS),
                       integer("local_bsz", minimum=1, maximum=MAX_BATCH), number("step_time", low=0, low_open=True),
                       number("sync_time", low=0))
_VALIDATION_FIELDS = (number("progress", low=0), integer("iteration", minimum=0), number("metric"),
                      number("grad_sqr", low=0), number("grad_var", low=0))
_VALIDATION_RE = re.compile(r"^validation-(\d+)\.csv$")

# Floors of extrapolated step/sync times, as a fraction of the smallest value measured on that curve.
_EXTRAPOLATION_FLOOR = 0.25
_MIN_TIME_S = 1e-6
_LOSS_EPS = 0.01

# How the gradient statistics of a validation file are read between its per-epoch rows:
#   "epoch": the row of the epoch in progress, constant during that epoch (the Pollux authors' simulator:
#            ``Application.get_grad_stats(batch_size, epoch)`` with the job's epoch counter); epoch ``e`` of a
#            file spans (progress[e-1], progress[e]] of that file's ``progress`` column.
#   "interpolate": linear in progress between the rows (each row placed at its epoch's end), i.e. a value
#            between the previous and the current epoch's statistics (the rule used before; it lags the
#            data by about half an epoch).
GRAD_STATS_RULES = ("epoch", "interpolate")

# How a global batch is split into per-GPU micro-batches and gradient-accumulation steps (``split_batch``):
#   "pollux": as the Pollux authors' simulator runs a job with a fixed batch (``Job.update_local_bsz``):
#             per-GPU batch ceil(M / GPUs); accumulation when it exceeds the model's micro-batch limit
#             (``POLLUX_MAX_LOCAL_BATCH`` where their simulator sets one by hand, else the largest local batch
#             in placements.csv); on a single GPU a batch above M0 always takes at least 2 micro-steps; the
#             micro-batch is then capped so that the total batch stays within the largest validated batch.
#   "plain": per-GPU batch ceil(M / GPUs), accumulation only beyond the largest profiled local batch.
BATCH_RULES = ("pollux", "plain")
# Which measured rows of placements.csv give the step time of a placement (GPUs per node, in node order):
#   "average": every ordering of the same per-node GPU counts, averaged (our allocations are unordered sets).
#   "rotation": only the row of the placement's lexicographically smallest rotation, as the Pollux simulator
#               (``Application.get_throughput``; a ring all-reduce is the same for every rotation). The
#               simulator passes placements largest node first, which is the order in which Tiresias's
#               most-free-node-first placement fills nodes in the Pollux simulator.
PLACEMENT_LOOKUPS = ("average", "rotation")
# Micro-batch limits that the Pollux simulator's ``applications.py`` sets explicitly (lower than placements.csv).
POLLUX_MAX_LOCAL_BATCH = {"yolov3": 8}


def _read_csv(path: Path, fields: tuple[Field, ...]) -> pd.DataFrame:
    """The validated columns ``fields`` of one profile CSV (other columns are ignored)."""
    rows = read_rows(path, fields, what="profile file", extra_columns=True)
    return pd.DataFrame([r.values for r in rows], columns=[f.name for f in fields])


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear interpolation of one scalar on sorted ``xs``, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x)
    x0, x1 = xs[i - 1], xs[i]
    w = (x - x0) / (x1 - x0)
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


def _bracket(x: float, xs: list) -> tuple[int, int, float]:
    """Indices (lo, hi) and weight of ``hi`` for linear interpolation on sorted ``xs``; clamps outside."""
    if x <= xs[0]:
        return 0, 0, 0.0
    if x >= xs[-1]:
        n = len(xs) - 1
        return n, n, 0.0
    i = bisect_right(xs, x)
    return i - 1, i, (x - xs[i - 1]) / (xs[i] - xs[i - 1])


class _BszCurve:
    """(step_time, sync_time) against per-GPU batch: linear between measured points, linear
    extrapolation beyond them (from the two end points), floored at a fraction of the smallest measured
    value so that extrapolation never reaches zero or below."""

    __slots__ = ("xs", "step", "sync", "floor_step", "floor_sync")

    def __init__(self, xs, step, sync):
        order = np.argsort(xs)
        self.xs = [float(v) for v in np.asarray(xs, dtype=float)[order]]
        self.step = [float(v) for v in np.asarray(step, dtype=float)[order]]
        self.sync = [float(v) for v in np.asarray(sync, dtype=float)[order]]
        self.floor_step = max(_MIN_TIME_S, _EXTRAPOLATION_FLOOR * min(self.step))
        self.floor_sync = max(_MIN_TIME_S, _EXTRAPOLATION_FLOOR * min(self.sync))

    def __call__(self, b: float) -> tuple[float, float]:
        xs = self.xs
        n = len(xs)
        if n == 1:
            return self.step[0], self.sync[0]
        if b <= xs[0]:
            i = 1
        elif b >= xs[-1]:
            i = n - 1
        else:
            i = bisect_right(xs, b)
        x0, x1 = xs[i - 1], xs[i]
        w = (b - x0) / (x1 - x0)
        step = self.step[i - 1] + w * (self.step[i] - self.step[i - 1])
        sync = self.sync[i - 1] + w * (self.sync[i] - self.sync[i - 1])
        return max(step, self.floor_step), max(sync, self.floor_sync)


def _placement_key(digits) -> tuple[int, ...]:
    """Placement written as digits per node (``"1342"``) -> GPUs per node, largest first."""
    return tuple(sorted((int(c) for c in str(int(digits))), reverse=True))


class PolluxModelProfile:
    """Measured behaviour of one Pollux model (implements ``JobTruth``).

    * ``step_time``: exact placements from ``placements.csv``, interpolated linearly in ``local_batch``.
      With ``placement_lookup="average"`` (default) the orderings of the same per-node GPU counts, e.g.
      ``1342`` and ``1234``, are averaged (our placements are unordered); with ``"rotation"`` only the
      lexicographically smallest rotation of the placement as given is used, as the Pollux simulator.
      Unmeasured placements (5+ nodes, or more than 4 GPUs on a node) use the union of
      ``scalability.csv`` and the per-(nodes, replicas, bsz) mean of ``placements.csv``: linear in local
      batch within each measured (nodes, replicas), then linear in replicas between the nearest measured
      replica counts of the same node count (clamped to that node count's measured range), then linear in
      nodes (clamped to 1..16). (The Pollux simulator interpolates that table with a Delaunay-based
      ``LinearNDInterpolator`` instead; both agree at the measured points.)
    * ``efficiency``: README section 3 with the gradient statistics of the epoch in progress
      (``grad_stats="epoch"``, as the Pollux simulator) or interpolated along progress
      (``grad_stats="interpolate"``) within a validation file, linearly in batch between the two nearest
      files. With ``"epoch"`` the efficiency is constant between epoch ends; :meth:`next_rate_change` tells
      the simulator where it changes next.
    * ``grad_noise_scale``: from the M0 file, interpolated along progress.
    * ``split_batch``: how a global batch becomes per-GPU micro-batches and accumulation steps
      (``batch_rule``, default ``"pollux"``: the Pollux simulator's rule, see ``BATCH_RULES``).
    * ``next_epoch_end``: a job's epoch ends (least progress over the validation files at each epoch),
      for simulators that count epoch times in whole seconds as the Pollux simulator does.
    * ``metrics``: see :meth:`metrics`.
    """

    def __init__(self, traces_dir: str | Path, model: str, restart_cost_s: float = 30.0,
                 grad_stats: str = "epoch", batch_rule: str = "pollux", placement_lookup: str = "average"):
        self.model = str(model)
        self.restart_cost_s = float(restart_cost_s)
        if not self.restart_cost_s >= 0:
            raise ValueError(f"restart_cost_s must be >= 0, got {restart_cost_s!r}")
        if grad_stats not in GRAD_STATS_RULES:
            raise ValueError(f"grad_stats must be one of {', '.join(GRAD_STATS_RULES)}, got {grad_stats!r}")
        self.grad_stats = grad_stats
        if batch_rule not in BATCH_RULES:
            raise ValueError(f"batch_rule must be one of {', '.join(BATCH_RULES)}, got {batch_rule!r}")
        self.batch_rule = batch_rule
        if placement_lookup not in PLACEMENT_LOOKUPS:
            raise ValueError(
                f"placement_lookup must be one of {', '.join(PLACEMENT_LOOKUPS)}, got {placement_lookup!r}")
        self.placement_lookup = placement_lookup
        folder = Path(traces_dir) / self.model
        self.profile_dir = folder
        if not folder.is_dir():
            raise TraceError(folder, f"profile folder of model {self.model!r} not found")
        self._load_validation(folder)
        self._load_step_times(folder)
        self._step_cache: dict[tuple, tuple[float, float]] = {}

    # ------------------------------------------------------------------ loading
    def _load_validation(self, folder: Path) -> None:
        files = sorted(
            ((int(m.group(1)), p) for p in folder.iterdir() if (m := _VALIDATION_RE.match(p.name))),
        )
        if not files:
            raise TraceError(folder / "validation-<B>.csv", "no validation files")
        self.validation_batches: tuple[int, ...] = tuple(b for b, _ in files)
        self.base_batch = int(files[0][0])
        self.max_batch = int(files[-1][0])
        # Per batch: progress (M0-steps), grad_sqr, grad_var as Python lists (fast scalar lookups).
        self._val_prog: list[list[float]] = []
        self._val_sqr: list[list[float]] = []
        self._val_var: list[list[float]] = []
        metric_mins: list[float] = []
        for batch, path in files:
            df = _read_csv(path, _VALIDATION_FIELDS).sort_values("progress", kind="stable")
            self._val_prog.append(df["progress"].tolist())
            self._val_sqr.append(df["grad_sqr"].tolist())
            self._val_var.append(df["grad_var"].tolist())
            metric_mins.append(float(df["metric"].min()))
            if batch == self.base_batch:
                base = df
        m0 = self.base_batch
        # Epoch ends of every file in base-equivalent samples (where the "epoch" rule changes rows).
        self._val_ends: list[list[float]] = [[p * m0 for p in prog] for prog in self._val_prog]
        self.epochs = int(len(base))
        self.dataset_size = int(round(m0 * float(base["progress"].iloc[0])))
        self.total_progress = float(m0 * float(base["progress"].iloc[-1]))
        # A job's epoch ends (the Pollux simulator's ``Application.get_progress``: the least progress over the
        # validation files at that epoch), the last one being completion.
        n_ep = min(len(e) for e in self._val_ends)
        self._epoch_ends = [min(e[k] for e in self._val_ends) for k in range(n_ep - 1)] + [self.total_progress]
        self._metric_prog = base["progress"].tolist()
        acc, loss = self._normalise_metric(base["metric"].to_numpy(dtype=float), min(metric_mins))
        self._acc = [float(v) for v in acc]
        self._loss = [float(v) for v in loss]

    def _normalise_metric(self, metric: np.ndarray, metric_min: float) -> tuple[np.ndarray, np.ndarray]:
        if self.model == "bert":  # SQuAD F1 in percent
            acc = metric / 100.0
        elif self.model == "deepspeech2":  # word error rate in percent (lower is better)
            acc = 1.0 - metric / 100.0
        elif self.model == "yolov3":  # validation loss (lower is better, ~25 -> ~12)
            acc = metric_min / np.maximum(metric, 1e-12)
        else:  # cifar10 / imagenet top-1 accuracy, ncf hit rate: fractions already
            acc = metric
        acc = np.clip(acc, 0.0, 1.0)
        loss = metric.copy() if self.model == "yolov3" else 1.0 - acc + _LOSS_EPS
        return acc, loss

    def _load_step_times(self, folder: Path) -> None:
        pl = _read_csv(folder / "placements.csv", _PLACEMENT_FIELDS)
        sc = _read_csv(folder / "scalability.csv", _SCALABILITY_FIELDS)
        pl["key"] = [_placement_key(p) for p in pl["placement"]]
        self.max_local_batch = int(pl["local_bsz"].max())
        self.min_local_batch = int(pl["local_bsz"].min())
        self.accum_local_batch = min(self.max_local_batch, POLLUX_MAX_LOCAL_BATCH.get(self.model, self.max_local_batch))
        # Exact placements: orderings of the same multiset averaged per local batch.
        self._exact: dict[tuple[int, ...], _BszCurve] = {}
        for key, g in pl.groupby("key", sort=False):
            m = g.groupby("local_bsz")[["step_time", "sync_time"]].mean()
            self._exact[key] = _BszCurve(m.index.to_numpy(), m["step_time"], m["sync_time"])
        # Each measured placement string as written (digits in node order), for the "rotation" lookup.
        self._rotations: dict[tuple[int, ...], _BszCurve] = {}
        for digits, g in pl.groupby(pl["placement"].map(lambda v: tuple(int(c) for c in str(int(v)))), sort=False):
            m = g.groupby("local_bsz")[["step_time", "sync_time"]].mean()
            self._rotations[digits] = _BszCurve(m.index.to_numpy(), m["step_time"], m["sync_time"])
        # Spread table: (nodes, replicas) -> curve over local batch.
        pl["num_nodes"] = [len(k) for k in pl["key"]]
        pl["num_replicas"] = [sum(k) for k in pl["key"]]
        cols = ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"]
        mean = pl.groupby(["num_nodes", "num_replicas", "local_bsz"], as_index=False)[["step_time", "sync_time"]].mean()
        union = pd.concat([mean[cols], sc[cols]], ignore_index=True)
        union = union.groupby(["num_nodes", "num_replicas", "local_bsz"], as_index=False).mean()
        by_nodes: dict[int, dict[int, _BszCurve]] = {}
        for (n, r), g in union.groupby(["num_nodes", "num_replicas"]):
            by_nodes.setdefault(int(n), {})[int(r)] = _BszCurve(g["local_bsz"], g["step_time"], g["sync_time"])
        self._spread_nodes = sorted(by_nodes)
        self._spread = {n: (sorted(d), [d[r] for r in sorted(d)]) for n, d in by_nodes.items()}

    # ------------------------------------------------------------------ JobTruth
    def step_time(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        """(step_time_s, sync_time_s) of one optimizer step with ``local_batch`` samples per GPU."""
        cache_key = (tuple(placement), local_batch)
        hit = self._step_cache.get(cache_key)
        if hit is not None:
            return hit
        key = tuple(sorted((int(g) for g in placement if g), reverse=True))
        if not key:
            raise ValueError(f"{self.model}: empty placement {placement!r}")
        b = float(local_batch)
        if not b > 0:
            raise ValueError(f"{self.model}: local_batch must be > 0, got {local_batch!r}")
        curve = None
        if self.placement_lookup == "rotation":
            ordered = tuple(int(g) for g in placement if g)
            curve = self._rotations.get(min(ordered[i:] + ordered[:i] for i in range(len(ordered))))
        if curve is None:
            curve = self._exact.get(key)
        if curve is not None:
            step, sync = curve(b)
        else:
            step, sync = self._spread_time(len(key), sum(key), b)
        step = max(step, _MIN_TIME_S)
        sync = min(max(sync, _MIN_TIME_S), step)
        out = (step, sync)
        self._step_cache[cache_key] = out
        return out

    def _spread_time(self, nodes: int, replicas: int, b: float) -> tuple[float, float]:
        ns = self._spread_nodes
        lo, hi, w = _bracket(nodes, ns)
        s0, y0 = self._at_nodes(ns[lo], replicas, b)
        if hi == lo or w == 0.0:
            return s0, y0
        s1, y1 = self._at_nodes(ns[hi], replicas, b)
        return s0 + w * (s1 - s0), y0 + w * (y1 - y0)

    def _at_nodes(self, nodes: int, replicas: int, b: float) -> tuple[float, float]:
        rs, curves = self._spread[nodes]
        lo, hi, w = _bracket(replicas, rs)
        s0, y0 = curves[lo](b)
        if hi == lo or w == 0.0:
            return s0, y0
        s1, y1 = curves[hi](b)
        return s0 + w * (s1 - s0), y0 + w * (y1 - y0)

    def split_batch(self, num_gpus: int, global_batch: int) -> tuple[int, int]:
        """(per-GPU micro-batch, accumulation steps) with which ``num_gpus`` GPUs train ``global_batch``;
        one optimizer step is ``accum + 1`` micro-steps. See ``BATCH_RULES``."""
        n, m = int(num_gpus), int(global_batch)
        if n < 1 or m < 1:
            raise ValueError(
                f"{self.model}: num_gpus and global_batch must be >= 1, got {num_gpus!r}, {global_batch!r}")
        local = -(-m // n)
        if self.batch_rule == "plain":
            accum = max(-(-local // self.max_local_batch) - 1, 0)
            return -(-local // (accum + 1)), accum
        accum = max(-(-local // self.accum_local_batch) - 1, 0)
        if n == 1 and m > self.base_batch:
            accum = max(accum, 1)
        micro = min(-(-local // (accum + 1)), self.max_batch // (n * (accum + 1)))
        return max(micro, 1), accum

    def _stats_of_file(self, i: int, progress: float) -> tuple[float, float]:
        """(grad_sqr, grad_var) of validation file ``i`` at ``progress`` base-equivalent samples."""
        if self.grad_stats == "epoch":
            ends = self._val_ends[i]
            k = min(bisect_left(ends, progress), len(ends) - 1)  # the epoch whose end is the first >= progress
            return self._val_sqr[i][k], self._val_var[i][k]
        steps = progress / self.base_batch
        prog = self._val_prog[i]
        return _interp(steps, prog, self._val_sqr[i]), _interp(steps, prog, self._val_var[i])

    def _grad_stats(self, progress: float, global_batch: float) -> tuple[float, float]:
        """(grad_sqr, grad_var) at ``progress`` base-equivalent samples and total batch ``global_batch``."""
        lo, hi, w = _bracket(global_batch, self.validation_batches)
        sqr, var = self._stats_of_file(lo, progress)
        if hi != lo and w != 0.0:
            sqr1, var1 = self._stats_of_file(hi, progress)
            sqr += w * (sqr1 - sqr)
            var += w * (var1 - var)
        return sqr, var

    def next_rate_change(self, progress: float, global_batch: float) -> float | None:
        """Where ``efficiency`` at ``global_batch`` next changes: the smallest epoch end (base-equivalent
        samples) of the validation files in use that lies above ``progress``; ``math.inf`` when it stays
        constant from here on. None with ``grad_stats="interpolate"``: that rule varies continuously, and
        the simulator then evaluates it once per round."""
        if self.grad_stats != "epoch":
            return None
        lo, hi, w = _bracket(global_batch, self.validation_batches)
        nxt = math.inf
        for i in ((lo,) if hi == lo or w == 0.0 else (lo, hi)):
            ends = self._val_ends[i]
            k = bisect_right(ends, progress)  # first epoch end strictly above; past the last one nothing changes
            if k < len(ends) - 1:
                nxt = min(nxt, ends[k])
        return nxt

    def next_epoch_end(self, progress: float) -> float:
        """The first epoch end (base-equivalent samples) above ``progress``; ``math.inf`` past the last."""
        k = bisect_right(self._epoch_ends, progress)
        return self._epoch_ends[k] if k < len(self._epoch_ends) else math.inf

    def efficiency(self, progress: float, global_batch: float) -> float:
        """gain / s with s = M / M0 and gain = (var + sqr) / (var / s + sqr) (README section 3)."""
        if not global_batch > 0:
            raise ValueError(f"{self.model}: global_batch must be > 0, got {global_batch!r}")
        sqr, var = self._grad_stats(progress, global_batch)
        s = global_batch / self.base_batch
        denom = var / s + sqr
        if denom <= 0:  # both statistics zero: no information, treat as perfectly scalable
            return 1.0
        return (var + sqr) / denom / s

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
        """Pre-conditioned gradient noise scale grad_var / grad_sqr x M0 (samples).

        With ``global_batch``: what a job training at that batch measures, from the gradient statistics
        of that batch and the epoch in progress (the statistics ``efficiency`` uses, so
        ``core.efficiency.efficiency(gns, M0, global_batch)`` equals :meth:`efficiency`); this is what
        the Pollux authors' simulator hands its policy. Without: the M0 file, interpolated along progress.
        """
        if global_batch is not None:
            sqr, var = self._grad_stats(progress, global_batch)
            return max(var, 1e-12) / max(sqr, 1e-300) * self.base_batch
        steps = progress / self.base_batch
        sqr = _interp(steps, self._val_prog[0], self._val_sqr[0])
        var = _interp(steps, self._val_prog[0], self._val_var[0])
        return max(var, 1e-12) / max(sqr, 1e-300) * self.base_batch

    def metrics(self, progress: float) -> tuple[float, float]:
        """(loss, accuracy) after ``progress`` base-equivalent samples, from the M0 validation file.

        The metric is interpolated linearly in progress between epochs (held at the first epoch's value
        before it and the last after). Accuracy in [0, 1]: cifar10/imagenet top-1 and ncf hit rate are
        fractions already; bert F1 / 100; deepspeech2 1 - WER / 100; yolov3's metric is a validation
        loss (~25 -> ~12), accuracy = (smallest loss over all its validation files) / loss, so it ends
        near 1. Loss: yolov3 its real validation loss; the others 1 - accuracy + 0.01.
        """
        steps = progress / self.base_batch
        return (_interp(steps, self._metric_prog, self._loss), _interp(steps, self._metric_prog, self._acc))

    # ------------------------------------------------------------------ helpers
    def is_measured(self, placement: tuple[int, ...]) -> bool:
        """Whether ``placement`` (any order) was measured exactly in ``placements.csv``."""
        return tuple(sorted((int(g) for g in placement if g), reverse=True)) in self._exact

    def __repr__(self) -> str:
        return (f"PolluxModelProfile({self.model!r}, M0={self.base_batch}, epochs={self.epochs}, "
                f"total_progress={self.total_progress:.4g})")


@functools.cache
def _load_cached(traces_dir: str, model: str, restart_cost_s: float, grad_stats: str,
                 batch_rule: str, placement_lookup: str) -> PolluxModelProfile:
    return PolluxModelProfile(traces_dir, model, restart_cost_s, grad_stats=grad_stats, batch_rule=batch_rule,
                              placement_lookup=placement_lookup)


def load_pollux_profile(traces_dir: str | Path, model: str, restart_cost_s: float = 30.0,
                        grad_stats: str = "epoch", batch_rule: str = "pollux",
                        placement_lookup: str = "average") -> PolluxModelProfile:
    """The profile of ``model`` under ``traces_dir`` (``.../pollux/traces``), cached per arguments.

    The cached object is shared: its step-time cache is the only state and it is a pure memo.
    """
    return _load_cached(str(traces_dir), str(model), float(restart_cost_s), str(grad_stats), str(batch_rule),
                        str(placement_lookup))


def consolidated_placement(num_gpus: int, gpus_per_node: int = 4) -> tuple[int, ...]:
    """Fewest-nodes placement of ``num_gpus`` GPUs, largest first, e.g. 6 -> (4, 2)."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    full, rest = divmod(int(num_gpus), int(gpus_per_node))
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def ideal_run_time_s(profile: PolluxModelProfile, num_gpus: int, global_batch: int,
                     gpus_per_node: int = 4, steps: int = 50) -> float:
    """Seconds to finish on ``num_gpus`` consolidated GPUs at a fixed ``global_batch`` with no waiting
    and no restarts, integrating 1 / goodput over progress with the midpoint rule in ``steps`` pieces.

    The batch is split into micro-batches and accumulation steps as the simulator does
    (:meth:`PolluxModelProfile.split_batch`): a step is ``accum + 1`` micro-batches and costs
    ``step_time + accum * (step_time - sync_time)``; the batch actually trained may be slightly smaller
    or larger than ``global_batch`` (per-GPU rounding up, the cap at the largest validated batch).
    """
    placement = consolidated_placement(num_gpus, gpus_per_node)
    micro, accum = profile.split_batch(num_gpus, global_batch)
    global_batch = num_gpus * micro * (accum + 1)
    step, sync = profile.step_time(placement, micro)
    step_s = step + accum * (step - sync)
    throughput = global_batch / step_s  # samples / s
    total = profile.total_progress
    dp = total / steps
    return float(sum(dp / (throughput * profile.efficiency((i + 0.5) * dp, global_batch)) for i in range(steps)))
