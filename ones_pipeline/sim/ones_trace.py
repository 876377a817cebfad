"""The ONES (SC'21) artifact trace and a documented ground truth for its job types.

``trace_1.csv`` (``shared/traces/ones_sc21``) lists 400 submissions of ten (model, task) job types; the
artifact replays the first 50 on 64 GPUs. The published data carry no per-GPU-count throughput and no
learning curves beyond ``job_history.csv`` (one run of each ``trace_dev.csv`` job), so each job type is
*derived* from a measured Pollux (OSDI'21) profile (``shared/traces/pollux``) and calibrated on that
history. ``docs/ones_catalogue.md`` states every assumption and tabulates the result
(``python -m ones_pipeline.sim.ones_trace --catalogue`` prints the table, ``--sanity`` the standalone
durations of the first 50 jobs).

Per job type (:data:`JOB_TYPES`):

* **Step time.** A per-GPU batch of ``b`` samples of this model costs as much compute as
  ``sigma * b`` samples of the source profile's model (``sigma`` = multiply-accumulates per sample,
  this model / source model, at the input sizes the ONES examples use); its gradient all-reduce moves
  ``rho`` times the source's bytes (``rho`` = parameter ratio). With the profile's measured
  ``(step, sync)`` at the same placement and per-GPU batch ``sigma * b``::

      step = kappa_c * (step_P - sync_P) + kappa_net * rho * sync_P,   sync = kappa_net * rho * sync_P

  ``kappa_net`` (one for the testbed) scales the profile's all-reduce time (AWS T4 nodes, 50 Gb/s
  Ethernet) to the ONES testbed's interconnect; it is fitted on the only history that shows one model
  on one node *and* across nodes (BERT: CoLA/MRPC on 2 GPUs, SST-2 on 2 nodes x 4 GPUs; see
  :func:`fit_network_factor`). ``kappa_c`` (one per type) then makes the step time at the type's
  ``job_history.csv`` configuration(s) equal to the measured ``global batch / throughput`` (geometric
  mean over the type's runs). Placement and batch dependence come from the profile, so consolidation
  matters as measured.
* **Artifact speed.** One more factor per type, ``artifact_speed`` (step and sync times are divided by it),
  from the artifact's published real Tiresias run of the first 50 trace_1 jobs
  (``results-published/TIRESIAS_profile.csv``, read from the history's folder when present): the median over
  the type's artifact jobs of ``(model median standalone time - S) / (artifact execution time - S)``, ``S``
  the start cost (:meth:`Catalogue._calibrate_to_artifact`). It makes a typical job of each type take, alone
  on its requested GPUs, what it took in the artifact; epochs and accuracy replay stay the history's.
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

Validation is strict: any bad row or column raises :class:`TraceError` naming the file, the 1-based
data row and the field; nothing is skipped.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ones_pipeline.core.progress import convergence_counters
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
from ones_pipeline.sim.pollux_profiles import PolluxModelProfile, consolidated_placement, load_pollux_profile
from ones_pipeline.sim.truth import SimJob, TraceError

TRACE_COLUMNS = ("time", "model", "task", "epoch_size", "patience", "batch_size", "lr", "max_lr",
                 "target_acc", "num_gpus")
HISTORY_COLUMNS = ("id", "epoch", "epoch_size", "num_samples", "total_workload", "batch_size", "lr",
                   "initial_loss", "loss", "acc", "throughput")
NOISE_SEED = 20210917  # date of the ONES artifact commit; any fixed value would do
MAX_EPOCHS = 300  # a job whose stopping rule has not fired by then stops there
MIN_DELTA = 0.01  # ONES's "improved by less than 0.01" (absolute accuracy)
# The ONES artifact's published Tiresias run (kurisusnowdeng/ones_sc21 ``out/TIRESIAS_profile.csv``: per job of
# the first 50 rows of trace_1.csv, completion/execution/waiting seconds), relative to the history's folder.
ARTIFACT_PROFILE = Path("results-published") / "TIRESIAS_profile.csv"
ARTIFACT_TRACE = "trace_1.csv"
ARTIFACT_COLUMNS = ("id", "completion_time", "execution_time", "waiting_time")


@dataclass(frozen=True)
class JobType:
    """How one (model, task) of the ONES trace derives from a Pollux profile (see docs/ones_catalogue.md)."""

    model: str
    task: str
    source: str  # Pollux profile folder
    gmacs: float  # multiply-accumulates per training sample of this model at the ONES input size (G)
    source_gmacs: float
    params_m: float  # parameters (millions): all-reduce volume
    source_params_m: float
    note: str

    @property
    def key(self) -> str:
        return f"{self.model}-{self.task}"

    @property
    def sigma(self) -> float:
        return self.gmacs / self.source_gmacs

    @property
    def rho(self) -> float:
        return self.params_m / self.source_params_m


# Per-sample compute (G multiply-accumulates) and parameters (M) of the torchvision models at 224x224
# (Inception-v3 at 299x299) as counted by ptflops/thop: alexnet 0.71 / 61.10, googlenet 1.51 / 6.62
# (13.0 M with the two auxiliary heads torchvision builds by default), inception_v3 5.73 / 27.16,
# resnet18 1.82 / 11.69, resnet50 4.12 / 25.56, vgg16 15.47 / 138.36. The ONES CIFAR example feeds
# 32x32 images to these 1000-class torchvision models: convolutions scale with the image area
# (x 1/49); VGG-16's classifier (0.124 G, after the adaptive 7x7 pool) does not. The Pollux cifar10
# model is the CIFAR ResNet-18 (3x3 stem, no max-pool): 0.56 G, 11.17 M. Pollux bert is BERT-base
# (110 M) fine-tuned on SQuAD at sequence length 384; the ONES GLUE tasks use length 128 (x 1/3).
_CIFAR_AREA = (32.0 / 224.0) ** 2
JOB_TYPES: dict[tuple[str, str], JobType] = {
    (t.model, t.task): t
    for t in (
        JobType("resnet18", "cifar", "cifar10", 1.82 * _CIFAR_AREA, 0.56, 11.69, 11.17,
                "torchvision ResNet-18 (ImageNet stem) on 32x32 CIFAR-10"),
        JobType("googlenet", "cifar", "cifar10", 1.51 * _CIFAR_AREA, 0.56, 13.0, 11.17,
                "torchvision GoogLeNet with auxiliary heads on 32x32 CIFAR-10"),
        JobType("vgg16", "cifar", "cifar10", (15.47 - 0.124) * _CIFAR_AREA + 0.124, 0.56, 138.36, 11.17,
                "torchvision VGG-16 on 32x32 CIFAR-10; the 124 M-parameter classifier dominates all-reduce"),
        JobType("resnet50", "imagenet", "imagenet", 4.12, 4.12, 25.56, 25.56,
                "same model as the Pollux profile (ImageNet subset, 224x224)"),
        JobType("inception_v3", "imagenet", "imagenet", 5.73, 4.12, 27.16, 25.56,
                "torchvision Inception-v3 at 299x299"),
        JobType("vgg16", "imagenet", "imagenet", 15.47, 4.12, 138.36, 25.56, "torchvision VGG-16 at 224x224"),
        JobType("alexnet", "imagenet", "imagenet", 0.71, 4.12, 61.10, 25.56, "torchvision AlexNet at 224x224"),
        JobType("bert", "cola", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE CoLA, sequence length 128"),
        JobType("bert", "mrpc", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE MRPC, sequence length 128"),
        JobType("bert", "sst2", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE SST-2, sequence length 128"),
    )
}


def allowed_pairs() -> list[str]:
    return sorted(f"{m}/{t}" for m, t in JOB_TYPES)


def slugify(text: str) -> str:
    """Lower-case, only [a-z0-9-], runs of other characters become one '-'."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


# ----------------------------------------------------------------------------- trace reading
@dataclass(frozen=True)
class TraceRow:
    index: int  # 0-based data row
    time: float
    model: str
    task: str
    epoch_size: int
    patience: int
    batch_size: int
    lr: float
    max_lr: float
    target_acc: float
    num_gpus: int

    @property
    def job_type(self) -> JobType:
        return JOB_TYPES[(self.model, self.task)]


def _number(path: Path, raw, row: int, field: str) -> float:
    try:
        value = float(str(raw).strip())
    except (TypeError, ValueError):
        raise TraceError(path, f"non-numeric value {raw!r}", row=row, field=field) from None
    if not math.isfinite(value):
        raise TraceError(path, f"non-finite value {raw!r}", row=row, field=field)
    return value


def _integer(path: Path, raw, row: int, field: str, minimum: int) -> int:
    value = _number(path, raw, row, field)
    if value != int(value):
        raise TraceError(path, f"must be an integer, got {raw!r}", row=row, field=field)
    if value < minimum:
        raise TraceError(path, f"must be >= {minimum}, got {raw!r}", row=row, field=field)
    return int(value)


def read_ones_trace(path: str | Path) -> list[TraceRow]:
    """Parse and validate an ONES trace CSV (every row; raises TraceError on the first problem)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(path, "trace file not found")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            lines = [r for r in csv.reader(fh)]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(path, f"cannot parse CSV: {exc}") from None
    if not lines or not any(lines[0]):
        raise TraceError(path, "empty file (no header)")
    cols = [c.strip() for c in lines[0]]
    missing = [c for c in TRACE_COLUMNS if c not in cols]
    if missing:
        raise TraceError(path, f"missing column(s) {missing}; allowed columns: {list(TRACE_COLUMNS)}",
                         field=missing[0])
    unknown = [c for c in cols if c not in TRACE_COLUMNS]
    if unknown:
        raise TraceError(path, f"unknown column(s) {unknown}; allowed columns: {list(TRACE_COLUMNS)}",
                         field=unknown[0])
    if len(set(cols)) != len(cols):
        raise TraceError(path, f"duplicate columns in {cols}", field=next(c for c in cols if cols.count(c) > 1))
    models = {m for m, _ in JOB_TYPES}
    rows: list[TraceRow] = []
    if len(lines) < 2:
        raise TraceError(path, "no data rows")
    for i, fields in enumerate(lines[1:]):
        r = i + 1
        if len(fields) != len(cols):
            raise TraceError(path, f"{len(fields)} fields, expected {len(cols)} ({','.join(cols)})", row=r)
        rec = dict(zip(cols, fields, strict=False))
        time = _number(path, rec["time"], r, "time")
        if time < 0:
            raise TraceError(path, f"must be >= 0, got {rec['time']!r}", row=r, field="time")
        model, task = str(rec["model"]).strip(), str(rec["task"]).strip()
        if (model, task) not in JOB_TYPES:
            field = "model" if model not in models else "task"
            raise TraceError(path, f"unknown model/task {model}/{task}; allowed: {', '.join(allowed_pairs())}",
                             row=r, field=field)
        epoch_size = _integer(path, rec["epoch_size"], r, "epoch_size", 1)
        patience = _integer(path, rec["patience"], r, "patience", 1)
        batch = _integer(path, rec["batch_size"], r, "batch_size", 1)
        gpus = _integer(path, rec["num_gpus"], r, "num_gpus", 1)
        lr = _number(path, rec["lr"], r, "lr")
        if not lr > 0:
            raise TraceError(path, f"must be > 0, got {rec['lr']!r}", row=r, field="lr")
        max_lr = _number(path, rec["max_lr"], r, "max_lr")
        if not max_lr >= lr:
            raise TraceError(path, f"must be >= lr ({lr:g}), got {rec['max_lr']!r}", row=r, field="max_lr")
        target = _number(path, rec["target_acc"], r, "target_acc")
        if not 0 < target <= 1:
            raise TraceError(path, f"must be in (0, 1], got {rec['target_acc']!r}", row=r, field="target_acc")
        rows.append(TraceRow(i, time, model, task, epoch_size, patience, batch, lr, max_lr, target, gpus))
    return rows


# ----------------------------------------------------------------------------- history and calibration
@dataclass(frozen=True)
class HistoryRun:
    """One ``job_history.csv`` run matched to a ``trace_dev.csv`` row (history id = dev row index)."""

    dev_row: TraceRow
    epochs: np.ndarray  # epochs done at each evaluation (num_samples / epoch_size)
    accs: np.ndarray
    losses: np.ndarray
    initial_loss: float
    batch_sizes: np.ndarray
    throughputs: np.ndarray
    total_epochs: float  # total_workload / epoch_size

    @property
    def reference_batch(self) -> int:
        return int(self.batch_sizes[0])


def read_artifact_profile(path: str | Path) -> dict[int, float]:
    """``{trace row id: execution_time s}`` from an ONES artifact ``*_profile.csv`` (validated)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(path, "artifact profile not found")
    df = pd.read_csv(path)
    missing = [c for c in ARTIFACT_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(path, f"missing column(s) {missing}; expected {list(ARTIFACT_COLUMNS)}", field=missing[0])
    out: dict[int, float] = {}
    for i, (jid, ex) in enumerate(zip(df["id"], df["execution_time"], strict=False), start=1):
        jid_f, ex_f = _number(path, jid, i, "id"), _number(path, ex, i, "execution_time")
        if jid_f != int(jid_f) or jid_f < 0 or int(jid_f) in out:
            raise TraceError(path, f"bad or repeated job id {jid!r}", row=i, field="id")
        if not ex_f > 0:
            raise TraceError(path, f"must be > 0, got {ex!r}", row=i, field="execution_time")
        out[int(jid_f)] = ex_f
    if not out:
        raise TraceError(path, "no data rows")
    return out


def read_history_runs(history_csv: str | Path, dev_trace: str | Path) -> list[HistoryRun]:
    """Match ``job_history.csv`` runs to ``trace_dev.csv`` rows.

    The history ids are the dev trace's row indices: a run (contiguous rows of one id with rising
    epochs) belongs to dev row ``id`` when its signature agrees with the row (same epoch size, LR per
    sample of batch equal within 1 %, batch a multiple of the row's per-GPU batch). Exactly one run per
    dev row must agree; runs that agree with no row (the file reuses id 0 for an extra CIFAR run) are
    not used here.
    """
    history_csv, dev_trace = Path(history_csv), Path(dev_trace)
    dev = read_ones_trace(dev_trace)
    if not history_csv.is_file():
        raise TraceError(history_csv, "history file not found")
    df = pd.read_csv(history_csv)
    missing = [c for c in HISTORY_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(history_csv, f"missing column(s) {missing}; expected {list(HISTORY_COLUMNS)}",
                         field=missing[0])
    for c in HISTORY_COLUMNS:
        vals = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(vals))
        if bad.size:
            raise TraceError(history_csv, "non-numeric value", row=int(bad[0]) + 1, field=c)
        df[c] = vals
    ids, epochs = df["id"].to_numpy(), df["epoch"].to_numpy()
    starts = [0] + [i for i in range(1, len(df)) if ids[i] != ids[i - 1] or epochs[i] <= epochs[i - 1]]
    bounds = list(zip(starts, starts[1:] + [len(df)], strict=False))
    by_row: dict[int, list[HistoryRun]] = {}
    for a, b in bounds:
        block = df.iloc[a:b]
        jid = int(block["id"].iloc[0])
        if not 0 <= jid < len(dev):
            continue
        row = dev[jid]
        es = int(block["epoch_size"].iloc[0])
        bs = block["batch_size"].to_numpy()
        ratio = block["lr"].to_numpy() / bs
        if (es != row.epoch_size or np.any(np.abs(ratio - row.lr / row.batch_size) > 0.01 * row.lr / row.batch_size)
                or np.any(bs % row.batch_size != 0)):
            continue
        by_row.setdefault(jid, []).append(HistoryRun(
            row, block["num_samples"].to_numpy() / es, block["acc"].to_numpy(), block["loss"].to_numpy(),
            float(block["initial_loss"].iloc[0]), bs.astype(int), block["throughput"].to_numpy(),
            float(block["total_workload"].iloc[0]) / es))
    runs = []
    for jid, row in enumerate(dev):
        found = by_row.get(jid, [])
        if len(found) != 1:
            raise TraceError(history_csv, f"{len(found)} runs match {dev_trace.name} row {jid + 1} "
                             f"({row.model}/{row.task}, epoch_size {row.epoch_size}); expected exactly 1",
                             field="id")
        runs.append(found[0])
    return runs


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


def stopping_epoch(accs: Sequence[float], target: float, patience: int, min_delta: float = MIN_DELTA) -> int:
    """1-based epoch at which ONES's rule fires (``len(accs)`` if it never does)."""
    counters, _ = convergence_counters(accs, target, min_delta)
    hit = np.flatnonzero(counters >= patience)
    return int(hit[0]) + 1 if hit.size else len(accs)


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

    Types of one :data:`COMPUTE_GROUPS` group share a compute factor; least squares of the relative
    step-time error ``(kappa_group * compute + kappa_net * comm) / measured - 1`` over the points of
    every group that was measured at two or more node counts (in the ONES history: BERT, CoLA/MRPC on
    one node and SST-2 on two).
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


# Types that run the same network on the same inputs (so the same compute factor): used only to fit
# the interconnect factor.
COMPUTE_GROUPS: dict[tuple[str, str], str] = {
    ("bert", "cola"): "bert-base-seq128", ("bert", "mrpc"): "bert-base-seq128", ("bert", "sst2"): "bert-base-seq128",
}


@dataclass(frozen=True)
class CalibratedType:
    job_type: JobType
    profile: PolluxModelProfile
    kappa_compute: float
    kappa_net: float
    curves: dict[int, CurveFit]  # epoch_size -> fit
    history_thr: float  # geometric mean of the runs' measured median throughputs (samples/s)
    history_gpus: tuple[int, ...]
    # Speed on the artifact's trace_1 run relative to the history calibration (step times are divided by it;
    # 1.0 = history only). See :meth:`Catalogue._calibrate_to_artifact` and docs/ones_catalogue.md.
    artifact_speed: float = 1.0
    artifact_jobs: int = 0  # artifact Tiresias jobs of this type the factor was taken from
    artifact_exec_s: dict[int, float] = field(default_factory=dict)  # epoch size -> median artifact execution (s)

    def curve_for(self, epoch_size: int) -> CurveFit:
        """The fit of the history run with this epoch size, else of the nearest one (documented fallback)."""
        if epoch_size in self.curves:
            return self.curves[epoch_size]
        nearest = min(self.curves, key=lambda s: (abs(math.log(s / epoch_size)), s))
        return self.curves[nearest]


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


# ----------------------------------------------------------------------------- ground truth
_EFF_GRID = 256  # points over the fraction of training for the reference-epoch mapping


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

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
        return float(self._gns_at_fraction(self._fraction(progress)))

    def metrics(self, progress: float) -> tuple[float, float]:
        e = min(self.reference_epochs(max(float(progress), 0.0)), float(len(self._knot_acc) - 1))
        knots = np.arange(len(self._knot_acc), dtype=float)
        return float(np.interp(e, knots, self._knot_loss)), float(np.interp(e, knots, self._knot_acc))

    def __repr__(self) -> str:
        return (f"OnesJobTruth({self.model!r}, b0={self.base_batch}, epochs={self.epochs}, "
                f"total_progress={self.total_progress:.4g})")


# ----------------------------------------------------------------------------- loader
def make_spec(row: TraceRow, truth: OnesJobTruth) -> JobSpec:
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


def load_ones_trace(path: str | Path, max_jobs: int | None = None, pollux_traces_dir: str | Path | None = None,
                    restart_cost_s: float = 30.0, history_dir: str | Path | None = None) -> list[SimJob]:
    """Jobs of an ONES trace (``time,model,task,epoch_size,patience,batch_size,lr,max_lr,target_acc,
    num_gpus``) with their derived ground truth.

    Every row is validated (also those past ``max_jobs``); the first ``max_jobs`` rows are returned.
    The calibration data (``job_history.csv``, ``trace_dev.csv``) are read from ``history_dir`` (default:
    the trace's folder), the Pollux profiles from ``pollux_traces_dir`` (default: the packaged profiles;
    ``ones simulate --profiles DIR``).
    """
    path = Path(path)
    if max_jobs is not None and max_jobs < 1:
        raise ValueError(f"max_jobs must be >= 1, got {max_jobs!r}")
    if not restart_cost_s >= 0:
        raise ValueError(f"restart_cost_s must be >= 0, got {restart_cost_s!r}")
    rows = read_ones_trace(path)
    if max_jobs is not None:
        rows = rows[:max_jobs]
    cat = catalogue(Path(history_dir) if history_dir is not None else path.resolve().parent, pollux_traces_dir,
                    restart_cost_s)
    jobs = []
    for row in rows:
        truth = OnesJobTruth(row, cat[(row.model, row.task)], restart_cost_s)
        jobs.append(SimJob(make_spec(row, truth), truth))
    return jobs


# ----------------------------------------------------------------------------- sanity helpers
def standalone_time_s(job: SimJob, num_gpus: int | None = None, gpus_per_node: int = 4, steps: int = 200,
                      include_restart: bool = True) -> float:
    """Seconds a job takes alone on ``num_gpus`` (default: requested) consolidated GPUs with ONES's
    batch rule (global batch = per-GPU batch x GPUs, capped by max_lr / lr), integrating 1 / goodput
    over progress (midpoint rule), plus one start cost."""
    from ones_pipeline.core.types import batch_and_lr

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


def catalogue_rows(cat: Catalogue) -> list[dict]:
    """One dict per (type, epoch size): the numbers tabulated in docs/ones_catalogue.md."""
    out = []
    for _key, ct in cat.types.items():
        jt = ct.job_type
        for es, c in sorted(ct.curves.items()):
            out.append({
                "type": jt.key, "source": jt.source, "sigma": jt.sigma, "rho": jt.rho, "kappa": ct.kappa_compute,
                "history_thr": ct.history_thr, "history_gpus": ct.history_gpus, "epoch_size": es,
                "ref_batch": c.reference_batch, "history_epochs": c.history_epochs, "a0": c.a0, "a1": c.a1,
                "tau": c.tau, "delay": c.delay, "noise_sd": c.noise_sd, "artifact_speed": ct.artifact_speed,
                "artifact_jobs": ct.artifact_jobs, "artifact_exec_s": ct.artifact_exec_s.get(es),
            })
    return out


def _print_catalogue(trace: Path, pollux: Path | None) -> None:
    cat = catalogue(trace.resolve().parent, pollux)
    rows = read_ones_trace(trace)
    by_type_es: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        truth = OnesJobTruth(r, cat[(r.model, r.task)], cat.restart_cost_s)
        by_type_es.setdefault((r.job_type.key, r.epoch_size), []).append(truth.epochs)
    print("| job type | source | sigma | rho | kappa | history GPUs | history samples/s | epoch size | "
          "ref. batch | history epochs | simulated epochs (trace_1: median [min-max], n) | "
          "curve a0 -> a1, tau, delay, noise | artifact speed (jobs) | artifact median exec (s) |")
    print("|" + "---|" * 14)
    for d in catalogue_rows(cat):
        sims = by_type_es.get((d["type"], d["epoch_size"]), [])
        sim = f"{np.median(sims):.0f} [{min(sims)}-{max(sims)}], {len(sims)}" if sims else "-"
        print(f"| {d['type']} | {d['source']} | {d['sigma']:.3f} | {d['rho']:.2f} | {d['kappa']:.3f} | "
              f"{','.join(map(str, d['history_gpus']))} | {d['history_thr']:.0f} | {d['epoch_size']} | "
              f"{d['ref_batch']} | {d['history_epochs']:.0f} | {sim} | "
              f"{d['a0']:.3f} -> {d['a1']:.3f}, {d['tau']:.2f}, {d['delay']:.1f}, {d['noise_sd']:.3f} | "
              f"{d['artifact_speed']:.3f} ({d['artifact_jobs']}) | "
              f"{'-' if d['artifact_exec_s'] is None else format(d['artifact_exec_s'], '.0f')} |")


def _print_sanity(trace: Path, pollux: Path | None, n_jobs: int) -> None:
    jobs = load_ones_trace(trace, max_jobs=n_jobs, pollux_traces_dir=pollux)
    times = []
    print(f"{'job':28s}{'gpus':>5s}{'batch':>7s}{'epochs':>7s}{'eff_ref':>8s}{'samples/s':>11s}{'alone_s':>9s}")
    from ones_pipeline.core.types import batch_and_lr

    for j in jobs:
        t = standalone_time_s(j)
        times.append(t)
        n = j.spec.requested_gpus
        gb, _ = batch_and_lr(j.spec, n)
        step, _ = j.truth.step_time(consolidated_placement(n), math.ceil(gb / n))
        print(f"{j.spec.name:28s}{n:5d}{gb:7d}{j.truth.epochs:7d}{j.truth.reference_efficiency:8.3f}"
              f"{gb / step:11.0f}{t:9.0f}")
    times = np.array(times)
    gpu_s = sum(t * j.spec.requested_gpus for t, j in zip(times, jobs, strict=False))
    print(f"\n{len(jobs)} jobs alone on their requested GPUs: mean {times.mean():.0f} s "
          f"({times.mean() / 3600:.3f} h), median {np.median(times):.0f} s ({np.median(times) / 3600:.3f} h), "
          f"max {times.max():.0f} s; total {gpu_s / 3600:.1f} GPU-h "
          f"(= {gpu_s / 64:.0f} s of a 64-GPU cluster)")


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    default = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "ones_sc21" / "trace_1.csv"
    ap = argparse.ArgumentParser(description="ONES trace catalogue and standalone-duration sanity check")
    ap.add_argument("trace", nargs="?", type=Path, default=default)
    ap.add_argument("--pollux", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--catalogue", action="store_true", help="print the markdown catalogue table")
    ap.add_argument("--sanity", action="store_true", help="print standalone durations of the first --jobs jobs")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.catalogue or not args.sanity:
        _print_catalogue(args.trace, args.pollux)
    if args.sanity or not args.catalogue:
        print()
        _print_sanity(args.trace, args.pollux, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
