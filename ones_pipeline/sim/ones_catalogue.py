"""The calibrated catalogue of ONES trace job types: each type's parameters fitted on ``job_history.csv``.

``kappa_net`` (shared) scales the Pollux profiles' all-reduce time to the ONES testbed's interconnect
(:func:`fit_network_factor`); each type's ``kappa_compute`` then matches its measured step times; its
learning curves are fitted to its history runs (:func:`fit_curve`); when the artifact's published Tiresias
run is present, one speed factor per type matches the artifact's execution times
(:meth:`Catalogue._calibrate_to_artifact`). The model these parameters feed is stated in
:mod:`ones_pipeline.sim.ones_truth`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ones_pipeline.sim.ones_history import (
    ARTIFACT_PROFILE,
    ARTIFACT_TRACE,
    HistoryRun,
    read_artifact_profile,
    read_history_runs,
)
from ones_pipeline.sim.ones_job_types import COMPUTE_GROUPS, JOB_TYPES, JobType
from ones_pipeline.sim.ones_trace_reader import read_ones_trace
from ones_pipeline.sim.ones_truth import CalibratedType, CurveFit, OnesJobTruth, make_spec, standalone_time_s
from ones_pipeline.sim.pollux_profiles import PolluxModelProfile, consolidated_placement, load_pollux_profile
from ones_pipeline.sim.truth import SimJob, TraceError


def fit_curve(run: HistoryRun) -> CurveFit:
    """Least squares over a (tau, delay) grid with (a0, a1) solved in closed form. Deterministic."""
    e, y = np.asarray(run.epochs, dtype=float), np.asarray(run.accs, dtype=float)
    n = len(e)
    taus = np.geomspace(0.1, 500.0, 80)
    delays = np.linspace(0.0, max(float(e[-1]) - 1.0, 0.0), 40)
    dd, tt = (a.ravel() for a in np.meshgrid(delays, taus, indexing="ij"))
    g = 1.0 - np.exp(-np.maximum(e[None, :] - dd[:, None], 0.0) / tt[:, None])  # (grid, n)
    sg, sgg, sgy, sy = g.sum(1), (g * g).sum(1), g @ y, y.sum()
    det = n * sgg - sg * sg
    ok = det > 1e-12 * max(n, 1)
    slope = np.where(ok, (n * sgy - sg * sy) / np.where(ok, det, 1.0), 0.0)
    a0 = np.clip((sy - slope * sg) / n, 0.0, 1.0)
    a1 = np.clip(a0 + slope, 0.0, 1.0)
    sse = (((a0[:, None] + (a1 - a0)[:, None] * g) - y[None, :]) ** 2).sum(1)
    k = int(np.argmin(sse))  # first minimum: deterministic
    sse, a0, a1, tau, d = float(sse[k]), float(a0[k]), float(a1[k]), float(tt[k]), float(dd[k])
    noise = math.sqrt(sse / max(n - 3, 1))
    lx = np.column_stack([np.ones(n), y])
    (la, lb), *_ = np.linalg.lstsq(lx, np.log(np.maximum(run.losses, 1e-9)), rcond=None)
    return CurveFit(a0, a1, tau, d, noise, float(la), float(lb), run.initial_loss, run.total_epochs,
                    run.reference_batch)


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured configuration of a history run: the profile's split of its step time and the truth."""

    key: tuple[str, str]
    gpus: int
    nodes: int
    global_batch: int
    compute_s: float  # profile step - sync at (placement, sigma * local batch)
    comm_s: float  # rho * profile sync
    measured_step_s: float  # global batch / measured throughput (median over the run's epochs at this batch)


def _calibration_points(run: HistoryRun, jt: JobType, profile: PolluxModelProfile,
                        gpus_per_node: int = 4) -> list[CalibrationPoint]:
    out = []
    for bsz in sorted(set(int(b) for b in run.batch_sizes)):
        thr = float(np.median(run.throughputs[run.batch_sizes == bsz]))
        n = bsz // run.dev_row.batch_size
        placement = consolidated_placement(n, gpus_per_node)
        step, sync = profile.step_time(placement, jt.sigma * bsz / n)
        out.append(CalibrationPoint((jt.model, jt.task), n, len(placement), bsz, step - sync, jt.rho * sync,
                                    bsz / thr))
    return out


def fit_network_factor(points: Sequence[CalibrationPoint]) -> float:
    """The interconnect factor ``kappa_net``, from job-type groups measured on one node *and* across nodes.

    Types of one ``COMPUTE_GROUPS`` group (:mod:`~ones_pipeline.sim.ones_job_types`) share a compute
    factor; least squares of the relative step-time error ``(kappa_group * compute + kappa_net * comm) /
    measured - 1`` over the points of every group that was measured at two or more node counts (in the
    ONES history: BERT, CoLA/MRPC on one node and SST-2 on two).
    """
    groups: dict[str, list[CalibrationPoint]] = {}
    for p in points:
        g = COMPUTE_GROUPS.get(p.key)
        if g is not None:
            groups.setdefault(g, []).append(p)
    usable = [g for g, ps in groups.items() if len({p.nodes for p in ps}) >= 2]
    if not usable:
        raise ValueError("no job-type group was measured on one node and across nodes: cannot fit kappa_net")
    rows, rhs = [], []
    for gi, g in enumerate(usable):
        for p in groups[g]:
            row = np.zeros(len(usable) + 1)
            row[gi] = p.compute_s / p.measured_step_s
            row[-1] = p.comm_s / p.measured_step_s
            rows.append(row)
            rhs.append(1.0)
    sol, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    if not sol[-1] > 0:
        raise ValueError(f"fitted interconnect factor is not positive ({sol[-1]:.3g})")
    return float(sol[-1])


class Catalogue:
    """Job types calibrated on ``job_history.csv`` (built once per set of input files, see :func:`catalogue`).

    ``kappa_net`` (shared) scales the profile's all-reduce time to the ONES testbed's interconnect;
    each type's ``kappa_compute`` then makes its step time at every measured history configuration
    match on average (geometric mean of ``(measured - kappa_net * comm) / compute``).
    """

    def __init__(self, pollux_traces_dir: Path, history_csv: Path, dev_trace: Path, restart_cost_s: float,
                 artifact: bool = True):
        self.pollux_traces_dir = Path(pollux_traces_dir)
        self.restart_cost_s = float(restart_cost_s)
        runs = read_history_runs(history_csv, dev_trace)
        mine: dict[tuple[str, str], list[HistoryRun]] = {}
        points: dict[tuple[str, str], list[CalibrationPoint]] = {}
        profiles: dict[tuple[str, str], PolluxModelProfile] = {}
        for key, jt in JOB_TYPES.items():
            mine[key] = [r for r in runs if (r.dev_row.model, r.dev_row.task) == key]
            if not mine[key]:
                raise TraceError(history_csv, f"no history run of job type {jt.key} to calibrate it", field="id")
            profiles[key] = load_pollux_profile(self.pollux_traces_dir, jt.source, self.restart_cost_s)
            points[key] = [p for r in mine[key] for p in _calibration_points(r, jt, profiles[key])]
        self.points = [p for ps in points.values() for p in ps]
        self.kappa_net = fit_network_factor(self.points)
        self.types: dict[tuple[str, str], CalibratedType] = {}
        for key, jt in JOB_TYPES.items():
            ratios = [(p.measured_step_s - self.kappa_net * p.comm_s) / p.compute_s for p in points[key]]
            if min(ratios) <= 0:
                raise TraceError(history_csv, f"job type {jt.key}: measured step shorter than its all-reduce "
                                 f"alone (kappa_net {self.kappa_net:.3g}); cannot calibrate", field="throughput")
            kappa_c = math.exp(float(np.mean(np.log(ratios))))
            curves: dict[int, CurveFit] = {}
            for r in sorted(mine[key], key=lambda r: r.dev_row.index):
                curves.setdefault(r.dev_row.epoch_size, fit_curve(r))
            thr = math.exp(float(np.mean([math.log(float(np.median(r.throughputs))) for r in mine[key]])))
            self.types[key] = CalibratedType(jt, profiles[key], kappa_c, self.kappa_net, curves, thr,
                                             tuple(sorted({p.gpus for p in points[key]})))

        self.artifact_profile: Path | None = None
        if artifact:
            self._calibrate_to_artifact(Path(history_csv).parent)

    def _calibrate_to_artifact(self, ones_dir: Path) -> None:
        """Per job type (model, task), one speed factor from the artifact's real Tiresias run of trace_1.

        Under Tiresias every job of the artifact ran on its requested GPUs at its submitted batch, so its
        ``execution_time`` (which the artifact's controller counts from the launch of the job's processes to
        their exit, summed over runs: process start, data and model loading, NCCL set-up, evaluations and
        training) is what this catalogue's truth gives the same job alone on its requested GPUs
        (:func:`standalone_time_s`: one start of ``restart_cost_s`` plus training). The history calibration
        fixes the epochs to converge (the curves) and the *shape* of the step time; the factor rescales the
        step time so that, per type, ``median_j (model_es_j - S) / (artifact_j - S) = factor`` where
        ``model_es`` is the median standalone time of all trace_1 rows of that (type, epoch size) under the
        history calibration, ``artifact_j`` the execution time of artifact job ``j`` of the type and
        ``S = restart_cost_s``. The median keeps a few very long artifact jobs (unexplained by their type:
        see docs/ones_catalogue.md) from setting their type's speed. Without the artifact files the history
        calibration stands (factor 1).
        """
        prof, trace = ones_dir / ARTIFACT_PROFILE, ones_dir / ARTIFACT_TRACE
        if not (prof.is_file() and trace.is_file()):
            return
        executed = read_artifact_profile(prof)
        rows = read_ones_trace(trace)
        if max(executed) >= len(rows):
            raise TraceError(prof, f"job id {max(executed)} is not a row of {trace.name} ({len(rows)} rows)",
                             field="id")
        s = self.restart_cost_s
        wanted = {(rows[i].model, rows[i].task, rows[i].epoch_size) for i in executed}
        times: dict[tuple[str, str, int], list[float]] = {k: [] for k in wanted}
        for r in rows:
            k = (r.model, r.task, r.epoch_size)
            if k in times:
                t = OnesJobTruth(r, self.types[(r.model, r.task)], s)
                times[k].append(standalone_time_s(SimJob(make_spec(r, t), t)))
        model_median = {k: float(np.median(v)) for k, v in times.items()}
        for key, ct in list(self.types.items()):
            mine = [(rows[i], e) for i, e in sorted(executed.items()) if (rows[i].model, rows[i].task) == key]
            if not mine:
                continue
            ratios = [(model_median[(r.model, r.task, r.epoch_size)] - s) / max(e - s, 0.2 * e) for r, e in mine]
            exec_by_es = {es: float(np.median([e for r, e in mine if r.epoch_size == es]))
                          for es in sorted({r.epoch_size for r, _ in mine})}
            self.types[key] = replace(ct, artifact_speed=float(np.median(ratios)), artifact_jobs=len(mine),
                                      artifact_exec_s=exec_by_es)
        self.artifact_profile = prof

    def __getitem__(self, key: tuple[str, str]) -> CalibratedType:
        return self.types[key]


@functools.lru_cache(maxsize=8)
def _catalogue_cached(pollux_dir: str, history_csv: str, dev_trace: str, restart_cost_s: float) -> Catalogue:
    return Catalogue(Path(pollux_dir), Path(history_csv), Path(dev_trace), restart_cost_s)


def catalogue(ones_dir: str | Path, pollux_traces_dir: str | Path | None = None,
              restart_cost_s: float = 30.0) -> Catalogue:
    """The calibrated catalogue from ``ones_dir`` (job_history.csv, trace_dev.csv) and the Pollux profiles
    (default: the packaged ones, ``ones_pipeline/data/pollux/traces``)."""
    from ones_pipeline.sim.packaged import profiles_dir

    ones_dir = Path(ones_dir).resolve()
    pollux = Path(pollux_traces_dir) if pollux_traces_dir is not None else profiles_dir()
    if not pollux.is_dir():
        raise TraceError(pollux, "Pollux profile folder not found (give one with ones simulate --profiles DIR)")
    return _catalogue_cached(str(pollux.resolve()), str(ones_dir / "job_history.csv"),
                             str(ones_dir / "trace_dev.csv"), float(restart_cost_s))
