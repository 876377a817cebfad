"""Ground truth of one ONES (SC'21) trace job, derived from a Pollux profile and its calibrated parameters.

The parameters of a job type (:class:`CalibratedType`) are fitted by :mod:`ones_pipeline.sim.ones_catalogue`;
``docs/ones_catalogue.md`` states every assumption and tabulates them.

Per job type (:data:`~ones_pipeline.sim.ones_job_types.JOB_TYPES`):

* **Step time.** A per-GPU batch of ``b`` samples of this model costs as much compute as
  ``sigma * b`` samples of the source profile's model (``sigma`` = multiply-accumulates per sample,
  this model / source model, at the input sizes the ONES examples use); its gradient all-reduce moves
  ``rho`` times the source's bytes (``rho`` = parameter ratio). With the profile's measured
  ``(step, sync)`` at the same placement and per-GPU batch ``sigma * b``::

      step = kappa_c * (step_P - sync_P) + kappa_net * rho * sync_P,   sync = kappa_net * rho * sync_P

  ``kappa_net`` (one for the testbed) scales the profile's all-reduce time (AWS T4 nodes, 50 Gb/s
  Ethernet) to the ONES testbed's interconnect; it is fitted on the only history that shows one model
  on one node *and* across nodes (BERT: CoLA/MRPC on 2 GPUs, SST-2 on 2 nodes x 4 GPUs; see
  ``ones_catalogue.fit_network_factor``). ``kappa_c`` (one per type) then makes the step time at the type's
  ``job_history.csv`` configuration(s) equal to the measured ``global batch / throughput`` (geometric
  mean over the type's runs). Placement and batch dependence come from the profile, so consolidation
  matters as measured.
* **Artifact speed.** One more factor per type, ``artifact_speed`` (step and sync times are divided by it),
  from the artifact's published real Tiresias run of the first 50 trace_1 jobs
  (``results-published/TIRESIAS_profile.csv``, read from the history's folder when present): the median over
  the type's artifact jobs of ``(model median standalone time - S) / (artifact execution time - S)``, ``S``
  the start cost (``ones_catalogue.Catalogue._calibrate_to_artifact``). It makes a typical job of each type
  take, alone on its requested GPUs, what it took in the artifact; epochs and accuracy replay stay the
  history's.
* **Memory.** ``max_local_batch = max(per_gpu_batch, floor(profile max_local_batch / sigma))`` (both
  testbeds have 16 GB GPUs; activation memory taken proportional to compute per sample).
* **Statistical efficiency.** The profile's gradient noise scale at the same *fraction* of training,
  scaled by ``per_gpu_batch / M0`` (so that efficiency against the job's own base batch has the shape
  the profile has against its base batch M0): ``eff = (gns + b0) / (gns + M)``, 1 at ``M = b0``.
* **Learning curve and length.** ``acc(e) = a0 + (a1 - a0) * (1 - exp(-max(e - d, 0) / tau))`` over
  epochs ``e`` at the *reference batch* (the global batch of the matching history run), least-squares
  fitted to the history job with the same (type, epoch size); per-epoch accuracies of job ``i`` are that
  curve plus Gaussian noise with the fit's residual deviation, drawn from
  ``numpy.random.default_rng([NOISE_SEED, i])`` (``i`` = 0-based trace row), clipped to [0, 1]. The
  ONES stopping rule run on those accuracies gives the job's epoch count ``E`` (at most
  :data:`MAX_EPOCHS`). ``total_progress = E * epoch_size * eff_ref`` where ``eff_ref`` is the harmonic
  mean efficiency at the reference batch over the run, so a job trained at the reference batch needs
  exactly ``E`` epochs and sees exactly those accuracies at its epoch ends. Loss: ``log(loss)`` linear in
  accuracy, fitted on the same history job; ``metrics(0)`` gives that job's ``initial_loss``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ones_pipeline.core.progress import convergence_counters
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule, batch_and_lr
from ones_pipeline.sim.ones_job_types import JobType
from ones_pipeline.sim.ones_trace_reader import TraceRow
from ones_pipeline.sim.pollux_profiles import PolluxModelProfile, consolidated_placement
from ones_pipeline.sim.truth import SimJob

NOISE_SEED = 20210917  # date of the ONES artifact commit; any fixed value would do
MAX_EPOCHS = 300  # a job whose stopping rule has not fired by then stops there
MIN_DELTA = 0.01  # ONES's "improved by less than 0.01" (absolute accuracy)
_EFF_GRID = 256  # points over the fraction of training for the reference-epoch mapping


@dataclass(frozen=True)
class CurveFit:
    """Accuracy against reference-batch epochs fitted to one history run."""

    a0: float
    a1: float
    tau: float
    delay: float
    noise_sd: float
    loss_a: float  # log(loss) = loss_a + loss_b * acc
    loss_b: float
    initial_loss: float
    history_epochs: float
    reference_batch: int

    def __call__(self, e) -> np.ndarray:
        e = np.asarray(e, dtype=float)
        g = 1.0 - np.exp(-np.maximum(e - self.delay, 0.0) / self.tau)
        return np.clip(self.a0 + (self.a1 - self.a0) * g, 0.0, 1.0)


@dataclass(frozen=True)
class CalibratedType:
    """A job type's parameters as the catalogue fitted them (the inputs of :class:`OnesJobTruth`)."""

    job_type: JobType
    profile: PolluxModelProfile
    kappa_compute: float
    kappa_net: float
    curves: dict[int, CurveFit]  # epoch_size -> fit
    history_thr: float  # geometric mean of the runs' measured median throughputs (samples/s)
    history_gpus: tuple[int, ...]
    # Speed on the artifact's trace_1 run relative to the history calibration (step times are divided by it;
    # 1.0 = history only). See ``ones_catalogue.Catalogue._calibrate_to_artifact`` and docs/ones_catalogue.md.
    artifact_speed: float = 1.0
    artifact_jobs: int = 0  # artifact Tiresias jobs of this type the factor was taken from
    artifact_exec_s: dict[int, float] = field(default_factory=dict)  # epoch size -> median artifact execution (s)

    def curve_for(self, epoch_size: int) -> CurveFit:
        """The fit of the history run with this epoch size, else of the nearest one (documented fallback)."""
        if epoch_size in self.curves:
            return self.curves[epoch_size]
        nearest = min(self.curves, key=lambda s: (abs(math.log(s / epoch_size)), s))
        return self.curves[nearest]


def stopping_epoch(accs: Sequence[float], target: float, patience: int, min_delta: float = MIN_DELTA) -> int:
    """1-based epoch at which ONES's rule fires (``len(accs)`` if it never does)."""
    counters, _ = convergence_counters(accs, target, min_delta)
    hit = np.flatnonzero(counters >= patience)
    return int(hit[0]) + 1 if hit.size else len(accs)


class OnesJobTruth:
    """Ground truth of one ONES trace job (implements ``JobTruth``; see the module docstring)."""

    def __init__(self, row: TraceRow, cal: CalibratedType, restart_cost_s: float):
        jt = cal.job_type
        self.model = jt.key
        self.job_type = jt
        self.profile = cal.profile
        self.kappa_compute = cal.kappa_compute
        self.kappa_net = cal.kappa_net
        self.speed = float(cal.artifact_speed)
        self.restart_cost_s = float(restart_cost_s)
        self.base_batch = int(row.batch_size)
        self.max_local_batch = max(self.base_batch, int(cal.profile.max_local_batch / jt.sigma))
        self.epoch_size = int(row.epoch_size)
        curve = cal.curve_for(row.epoch_size)
        self.curve = curve
        self.reference_batch = int(curve.reference_batch)
        self._gns_scale = self.base_batch / cal.profile.base_batch
        # Per-epoch accuracies of this job and the epoch its stopping rule fires.
        rng = np.random.default_rng([NOISE_SEED, int(row.index)])
        k = np.arange(1, MAX_EPOCHS + 1, dtype=float)
        accs = np.clip(curve(k) + curve.noise_sd * rng.standard_normal(MAX_EPOCHS), 0.0, 1.0)
        self.epochs = stopping_epoch(accs, row.target_acc, row.patience)
        self._knot_acc = np.concatenate([[float(curve(0.0))], accs[: self.epochs + 1]])
        losses = np.exp(curve.loss_a + curve.loss_b * self._knot_acc)
        losses[0] = curve.initial_loss
        self._knot_loss = losses
        # Reference-batch epochs as a function of the fraction of training done: dr/df = total / eff.
        f = np.linspace(0.0, 1.0, _EFF_GRID + 1)
        inv = 1.0 / self._eff_at_fraction(f, self.reference_batch)
        cum = np.concatenate([[0.0], np.cumsum(0.5 * (inv[1:] + inv[:-1]) * np.diff(f))])
        self._frac_grid = f
        self._epoch_of_frac = self.epochs * cum / cum[-1]
        self.reference_efficiency = float(1.0 / cum[-1])
        self.total_progress = float(self.epochs * self.epoch_size * self.reference_efficiency)

    # -- helpers
    def _gns_at_fraction(self, frac) -> np.ndarray:
        frac = np.clip(np.asarray(frac, dtype=float), 0.0, 1.0)
        p = self.profile
        return np.array([p.grad_noise_scale(float(x) * p.total_progress) for x in np.atleast_1d(frac)]
                        ).reshape(np.shape(frac)) * self._gns_scale

    def _eff_at_fraction(self, frac, global_batch: float) -> np.ndarray:
        gns = self._gns_at_fraction(frac)
        return (gns + self.base_batch) / (gns + float(global_batch))

    def _fraction(self, progress: float) -> float:
        return min(max(float(progress) / self.total_progress, 0.0), 1.0)

    def reference_epochs(self, progress: float) -> float:
        """Epochs at the reference batch that make ``progress`` base-equivalent samples."""
        if progress >= self.total_progress:
            return self.epochs + (progress - self.total_progress) / (self.epoch_size * self.reference_efficiency)
        return float(np.interp(self._fraction(progress), self._frac_grid, self._epoch_of_frac))

    # -- JobTruth
    def step_time(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        step, sync = self.profile.step_time(tuple(placement), self.job_type.sigma * float(local_batch))
        comm = self.kappa_net * self.job_type.rho * sync
        step_s = (self.kappa_compute * (step - sync) + comm) / self.speed
        return step_s, comm / self.speed

    def efficiency(self, progress: float, global_batch: float) -> float:
        if not global_batch > 0:
            raise ValueError(f"{self.model}: global_batch must be > 0, got {global_batch!r}")
        return float(self._eff_at_fraction(self._fraction(progress), global_batch))

    def efficiencies(self, progress: np.ndarray, batches) -> np.ndarray:
        """``efficiency(p, b)`` for every progress ``p`` (rows) and batch ``b`` (columns), the same arithmetic:
        the noise scale looked up once per progress (``sim.rates``' tables)."""
        gns = self._gns_at_fraction(np.clip(np.asarray(progress, dtype=float) / self.total_progress, 0.0, 1.0))
        return (gns[:, None] + self.base_batch) / (gns[:, None] + np.asarray(batches, dtype=float)[None, :])

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
        return float(self._gns_at_fraction(self._fraction(progress)))

    def metrics(self, progress: float) -> tuple[float, float]:
        e = min(self.reference_epochs(max(float(progress), 0.0)), float(len(self._knot_acc) - 1))
        knots = np.arange(len(self._knot_acc), dtype=float)
        return float(np.interp(e, knots, self._knot_loss)), float(np.interp(e, knots, self._knot_acc))

    def __repr__(self) -> str:
        return (f"OnesJobTruth({self.model!r}, b0={self.base_batch}, epochs={self.epochs}, "
                f"total_progress={self.total_progress:.4g})")


def slugify(text: str) -> str:
    """Lower-case, only [a-z0-9-], runs of other characters become one '-'."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


def make_spec(row: TraceRow, truth: OnesJobTruth) -> JobSpec:
    """What the user submitted for trace row ``row`` (the per-GPU micro-batch limit comes from ``truth``)."""
    return JobSpec(
        name=slugify(f"{row.model}-{row.task}-{row.index}"),
        model=row.job_type.key,
        dataset_size=row.epoch_size,
        per_gpu_batch=row.batch_size,
        base_lr=row.lr,
        max_lr=row.max_lr,
        max_per_gpu_batch=truth.max_local_batch,
        requested_gpus=row.num_gpus,
        stopping=StoppingRule(StopKind.ACCURACY, target_accuracy=row.target_acc, patience=row.patience,
                              min_delta=MIN_DELTA),
        submit_time_s=row.time,
    )


def standalone_time_s(job: SimJob, num_gpus: int | None = None, gpus_per_node: int = 4, steps: int = 200,
                      include_restart: bool = True) -> float:
    """Seconds a job takes alone on ``num_gpus`` (default: requested) consolidated GPUs with ONES's
    batch rule (global batch = per-GPU batch x GPUs, capped by max_lr / lr), integrating 1 / goodput
    over progress (midpoint rule), plus one start cost."""
    spec, truth = job.spec, job.truth
    n = int(num_gpus or spec.requested_gpus)
    global_batch, _ = batch_and_lr(spec, n)
    local = math.ceil(global_batch / n)
    accum = max(0, math.ceil(local / truth.max_local_batch) - 1)
    micro = math.ceil(local / (accum + 1))
    step, sync = truth.step_time(consolidated_placement(n, gpus_per_node), micro)
    batch = n * micro * (accum + 1)
    thr = batch / (step + accum * (step - sync))
    dp = truth.total_progress / steps
    t = sum(dp / (thr * truth.efficiency((i + 0.5) * dp, batch)) for i in range(steps))
    return float(t + (truth.restart_cost_s if include_restart else 0.0))

