"""Remaining-work prediction: how many base-equivalent samples a job still needs.

Epoch and sample stopping rules fix the total in advance (exact). Accuracy rules (``StopKind.ACCURACY``,
ONES's early stopping: the job ends once, for ``patience`` consecutive evaluated epochs, accuracy has
reached the target or improved by less than ``min_delta`` over the best) do not; for them this module
predicts the fraction of training already done with a **Beta regression**, the ONES prototype's idea
(Bian et al., SC'21), fitted on the prototype's own training data, ``job_history.csv``
(``shared/traces/ones_sc21``: per-epoch logs of completed jobs, ``num_samples / total_workload`` is the
fraction done).

Model: ``fraction ~ Beta(mu * phi, (1 - mu) * phi)`` with ``logit(mu) = x . beta``, ``x`` the features
of :data:`FEATURE_NAMES` computed from the job's evaluation history at its last evaluated epoch
(:func:`history_features`). ``beta`` and the precision ``phi`` are fitted by maximum likelihood (damped
Newton on the exact log-likelihood, deterministic; digamma/trigamma/log-gamma are implemented here with
numpy so the core needs nothing else). Rows are weighted so that every history job counts equally.

Prediction (:meth:`ProgressModel.remaining`): with predicted fraction ``f`` at the last evaluation
(``s_eval`` raw samples), the predicted total is ``s_eval / f`` raw samples; the remaining raw samples
``total - samples_done`` are bounded below by the stopping rule itself (the counter rises by at most one
per epoch, so at least ``patience - counter`` more epochs are needed) and converted to base-equivalent
samples with the job's own ratio ``progress_samples / samples_done`` (its average statistical efficiency
so far). Before the first evaluation the prior total is ``prior_epochs_per_patience * patience`` epochs,
the median of ``total epochs / patience`` over the history jobs (stored in the JSON file).

The fitted coefficients ship as ``progress_coefficients.json`` next to this module (regenerate and
cross-validate with ``benchmarks/fit_progress_model.py``), so nothing outside the package is read at
run time.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ones_pipeline.core.types import JobView, StopKind

COEFFICIENTS_PATH = Path(__file__).with_name("progress_coefficients.json")

FEATURE_NAMES = (
    "intercept",
    "log_epochs",  # log(epochs done at the last evaluation)
    "counter_frac",  # ONES convergence counter / patience
    "best_over_target",  # best accuracy so far / target, clipped to [0, 1.5]
    "log_loss_ratio",  # log(current loss / initial loss), clipped to [-6, 1]
    "recent_gain",  # accuracy gain over the last 3 evaluations / target, clipped to [-0.5, 1]
)
N_FEATURES = len(FEATURE_NAMES)

_HISTORY_COLUMNS = ("id", "epoch", "epoch_size", "num_samples", "total_workload", "batch_size", "lr",
                    "initial_loss", "loss", "acc", "throughput")
_TRACE_COLUMNS = ("epoch_size", "patience", "batch_size", "lr", "target_acc")
_RECENT = 3  # evaluations over which "recent_gain" is measured
_MIN_REMAINING_EPOCHS = 0.01  # floor of a prediction, in epochs
_RIDGE = 1e-3  # L2 penalty on the non-intercept coefficients (keeps Newton well-posed)
DEFAULT_MIN_DELTA = 0.01


# ----------------------------------------------------------------------------- special functions
def _shifted(x: np.ndarray, shift_to: float = 8.0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Shift x up by whole numbers until >= shift_to; returns (shifted x, list of the values passed)."""
    x = np.asarray(x, dtype=float).copy()
    passed = []
    for _ in range(int(shift_to) + 1):
        low = x < shift_to
        if not low.any():
            break
        passed.append(np.where(low, x, np.nan))
        x = np.where(low, x + 1.0, x)
    return x, passed


def lgamma(x) -> np.ndarray:
    """log Gamma(x) for x > 0 (recurrence to x >= 8, then Stirling's series; ~1e-12 accurate)."""
    z, passed = _shifted(x)
    corr = sum((np.where(np.isnan(p), 0.0, np.log(np.where(np.isnan(p), 1.0, p))) for p in passed), 0.0)
    inv = 1.0 / z
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    return (z - 0.5) * np.log(z) - z + 0.5 * math.log(2 * math.pi) + series - corr


def digamma(x) -> np.ndarray:
    """psi(x) for x > 0."""
    z, passed = _shifted(x)
    corr = sum((np.where(np.isnan(p), 0.0, 1.0 / np.where(np.isnan(p), 1.0, p)) for p in passed), 0.0)
    inv2 = 1.0 / (z * z)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return np.log(z) - 0.5 / z - series - corr


def trigamma(x) -> np.ndarray:
    """psi'(x) for x > 0."""
    z, passed = _shifted(x)
    corr = sum((np.where(np.isnan(p), 0.0, 1.0 / np.where(np.isnan(p), 1.0, p) ** 2) for p in passed), 0.0)
    inv = 1.0 / z
    inv2 = inv * inv
    series = inv + 0.5 * inv2 + inv * inv2 * (1 / 6 - inv2 * (1 / 30 - inv2 * (1 / 42 - inv2 / 30)))
    return series + corr


# ----------------------------------------------------------------------------- features
def convergence_counters(accs: Sequence[float], target: float | None, min_delta: float = DEFAULT_MIN_DELTA
                         ) -> tuple[np.ndarray, np.ndarray]:
    """ONES's early-stopping counter and best accuracy after each evaluation.

    An evaluation counts towards stopping when the accuracy has reached ``target`` or is below
    ``best + min_delta``; otherwise the counter resets. ``best`` is updated only by an accuracy at least
    ``min_delta`` above it (the first evaluation sets it).
    """
    counters = np.zeros(len(accs), dtype=int)
    bests = np.zeros(len(accs))
    best = None
    counter = 0
    for i, acc in enumerate(accs):
        acc = float(acc)
        hit = target is not None and acc >= target
        if best is not None and acc < best + min_delta:
            hit = True
        else:
            best = acc
        counter = counter + 1 if hit else 0
        counters[i] = counter
        bests[i] = best
    return counters, bests


def history_features(epochs: Sequence[float], accs: Sequence[float], losses: Sequence[float] | None,
                     initial_loss: float | None, target: float, patience: int,
                     min_delta: float = DEFAULT_MIN_DELTA) -> np.ndarray:
    """(E, N_FEATURES) feature rows, row k from evaluations 0..k (epochs done, accuracy, loss).

    Missing losses (``losses`` None or ``initial_loss`` not positive) give ``log_loss_ratio`` 0.
    """
    e = np.maximum(np.asarray(epochs, dtype=float), 1e-3)
    acc = np.asarray(accs, dtype=float)
    counters, bests = convergence_counters(acc, target, min_delta)
    out = np.empty((len(e), N_FEATURES))
    out[:, 0] = 1.0
    out[:, 1] = np.log(e)
    out[:, 2] = np.minimum(counters, patience) / patience
    out[:, 3] = np.clip(bests / target, 0.0, 1.5)
    if losses is not None and initial_loss is not None and initial_loss > 0 and len(losses) == len(e):
        ratio = np.maximum(np.asarray(losses, dtype=float), 1e-12) / initial_loss
        out[:, 4] = np.clip(np.log(ratio), -6.0, 1.0)
    else:
        out[:, 4] = 0.0
    prev = np.concatenate([np.full(_RECENT, acc[0] if len(acc) else 0.0), acc])[: len(acc)]
    out[:, 5] = np.clip((acc - prev) / target, -0.5, 1.0)
    return out


@dataclass(frozen=True)
class _Eval:
    """A job's evaluation history in the units the features need."""

    samples: np.ndarray  # raw samples at each evaluation
    accs: np.ndarray
    losses: np.ndarray | None
    counter: int  # convergence counter after the last evaluation


def _rule(view: JobView) -> tuple[float, int, float]:
    rule = view.spec.stopping
    if rule.kind is not StopKind.ACCURACY:
        raise ValueError(f"job {view.name}: the progress model predicts accuracy rules only, got {rule.kind.value}")
    return float(rule.target_accuracy), int(rule.patience), float(rule.min_delta)


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ProgressModel:
    """Fitted Beta regression of the fraction of training done (see the module docstring)."""

    coef: tuple[float, ...]
    phi: float
    prior_epochs_per_patience: float
    feature_names: tuple[str, ...] = FEATURE_NAMES
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if tuple(self.feature_names) != FEATURE_NAMES:
            raise ValueError(f"progress model features {tuple(self.feature_names)} != {FEATURE_NAMES}")
        if len(self.coef) != N_FEATURES:
            raise ValueError(f"progress model needs {N_FEATURES} coefficients, got {len(self.coef)}")
        if not (self.phi > 0 and self.prior_epochs_per_patience > 0):
            raise ValueError("progress model: phi and prior_epochs_per_patience must be > 0")
        object.__setattr__(self, "coef", tuple(float(c) for c in self.coef))
        object.__setattr__(self, "feature_names", tuple(self.feature_names))

    # -- prediction
    def fraction_from_features(self, x: np.ndarray) -> np.ndarray:
        """Predicted mean fraction of training done, in (0, 1), for feature rows ``x``."""
        eta = np.asarray(x, dtype=float) @ np.asarray(self.coef)
        return 1.0 / (1.0 + np.exp(-np.clip(eta, -30.0, 30.0)))

    def _evaluations(self, view: JobView) -> _Eval | None:
        target, _, min_delta = _rule(view)
        hist = view.accuracy_history
        if not hist:
            return None
        samples = np.array([s for s, _ in hist], dtype=float)
        accs = np.array([a for _, a in hist], dtype=float)
        losses = None
        if len(view.loss_history) == len(hist):
            losses = np.array([v for _, v in view.loss_history], dtype=float)
        counters, _ = convergence_counters(accs, target, min_delta)
        return _Eval(samples, accs, losses, int(counters[-1]))

    def fraction(self, view: JobView) -> float | None:
        """Predicted fraction of training done at the job's last evaluation (None before the first)."""
        ev = self._evaluations(view)
        if ev is None or ev.samples[-1] <= 0:
            return None
        target, patience, min_delta = _rule(view)
        x = history_features(ev.samples / view.spec.dataset_size, ev.accs, ev.losses, view.initial_loss,
                             target, patience, min_delta)[-1]
        return float(self.fraction_from_features(x))

    def total_raw_samples(self, view: JobView) -> float:
        """Predicted raw samples processed when the job stops."""
        target, patience, _ = _rule(view)
        size = float(view.spec.dataset_size)
        ev = self._evaluations(view)
        if ev is None or ev.samples[-1] <= 0:
            return max(self.prior_epochs_per_patience * patience * size, patience * size, view.samples_done)
        f = self.fraction(view)
        return float(ev.samples[-1] / f)

    def remaining(self, view: JobView) -> float:
        """Base-equivalent samples the job still needs (> 0)."""
        target, patience, _ = _rule(view)
        size = float(view.spec.dataset_size)
        done = max(float(view.samples_done), 0.0)
        ev = self._evaluations(view)
        if ev is None or ev.samples[-1] <= 0:
            s_eval, counter = 0.0, 0
        else:
            s_eval, counter = float(ev.samples[-1]), ev.counter
        # The counter rises by one per evaluated epoch at most: at least patience - counter more epochs.
        lower = (patience - min(counter, patience - 1)) * size - max(done - s_eval, 0.0)
        remaining_raw = max(self.total_raw_samples(view) - done, lower, _MIN_REMAINING_EPOCHS * size)
        ratio = view.progress_samples / done if done > 0 and view.progress_samples > 0 else 1.0
        return float(remaining_raw * ratio)

    # -- persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "beta-regression, logit link",
            "feature_names": list(self.feature_names),
            "coef": list(self.coef),
            "phi": self.phi,
            "prior_epochs_per_patience": self.prior_epochs_per_patience,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProgressModel:
        return cls(tuple(data["coef"]), float(data["phi"]), float(data["prior_epochs_per_patience"]),
                   tuple(data["feature_names"]), dict(data.get("meta", {})))

    def save(self, path: str | Path = COEFFICIENTS_PATH) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path = COEFFICIENTS_PATH) -> ProgressModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


# ----------------------------------------------------------------------------- training data
@dataclass(frozen=True)
class HistoryJob:
    """One completed job of ``job_history.csv`` (a contiguous block of rows with rising epochs)."""

    key: str  # "<id>" or "<id>b", "<id>c" for later blocks reusing an id
    job_id: int
    epoch_size: int
    total_workload: float
    samples: np.ndarray
    accs: np.ndarray
    losses: np.ndarray
    initial_loss: float
    batch_sizes: np.ndarray
    lrs: np.ndarray
    throughputs: np.ndarray
    target: float
    patience: int
    first_row: int  # 1-based data row of its first line

    @property
    def fractions(self) -> np.ndarray:
        return self.samples / self.total_workload

    @property
    def total_epochs(self) -> float:
        return self.total_workload / self.epoch_size

    def features(self, min_delta: float = DEFAULT_MIN_DELTA) -> np.ndarray:
        return history_features(self.samples / self.epoch_size, self.accs, self.losses, self.initial_loss,
                                self.target, self.patience, min_delta)


def _read_rows(path: Path, columns: Sequence[str]) -> list[dict[str, float]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}; expected {list(columns)}")
        rows = []
        for i, raw in enumerate(reader, start=1):
            row = {k.strip(): v for k, v in raw.items() if k is not None}
            try:
                rows.append({c: float(row[c]) for c in columns})
            except (TypeError, ValueError):
                raise ValueError(f"{path}, row {i}: non-numeric value in {row}") from None
    if not rows:
        raise ValueError(f"{path}: no data rows")
    return rows


def _signature(epoch_size: float, lr: float, batch: float) -> tuple[int, float]:
    return int(round(epoch_size)), lr / batch


def load_history(csv_path: str | Path, trace_csv: str | Path | None = None) -> list[HistoryJob]:
    """Split ``job_history.csv`` into jobs and attach each job's target accuracy and patience.

    The history file has no target/patience columns; they come from the trace the jobs were submitted
    from (default: ``trace_dev.csv`` next to the history file), matched by the job's *signature*
    (epoch size and LR per sample of batch, which ONES keeps constant when it scales a job). All trace
    rows with that signature must agree on (target, patience). A new job starts whenever the id changes
    or the epoch does not increase (the published file reuses id 0 for two jobs).
    """
    path = Path(csv_path)
    rows = _read_rows(path, _HISTORY_COLUMNS)
    trace = Path(trace_csv) if trace_csv is not None else path.with_name("trace_dev.csv")
    trows = [r for r in _read_rows(trace, _TRACE_COLUMNS)]
    signatures: dict[tuple[int, float], set[tuple[float, int]]] = {}
    for r in trows:
        signatures.setdefault(_signature(r["epoch_size"], r["lr"], r["batch_size"]), set()).add(
            (r["target_acc"], int(r["patience"])))

    def lookup(es: float, lr: float, bs: float, key: str) -> tuple[float, int]:
        es_i, ratio = _signature(es, lr, bs)
        found: set[tuple[float, int]] = set()
        for (tes, tratio), vals in signatures.items():
            if tes == es_i and abs(tratio - ratio) <= 0.01 * ratio:
                found |= vals
        if len(found) != 1:
            raise ValueError(f"{path}: history job {key} (epoch_size {es_i}, lr/batch {ratio:.3g}) matches "
                             f"{len(found)} (target, patience) pairs in {trace}: {sorted(found)}")
        return found.pop()

    blocks: list[list[tuple[int, dict]]] = []
    for i, r in enumerate(rows, start=1):
        if blocks and blocks[-1][-1][1]["id"] == r["id"] and r["epoch"] > blocks[-1][-1][1]["epoch"]:
            blocks[-1].append((i, r))
        else:
            blocks.append([(i, r)])
    jobs: list[HistoryJob] = []
    seen: dict[int, int] = {}
    for block in blocks:
        first = block[0][1]
        jid = int(first["id"])
        n = seen.get(jid, 0)
        seen[jid] = n + 1
        key = str(jid) + ("" if n == 0 else "bcdefghij"[n - 1])
        col = {c: np.array([r[c] for _, r in block]) for c in _HISTORY_COLUMNS}
        target, patience = lookup(first["epoch_size"], first["lr"], first["batch_size"], key)
        if not np.all(col["num_samples"] < col["total_workload"]):
            raise ValueError(f"{path}, row {block[0][0]}: num_samples must stay below total_workload")
        jobs.append(HistoryJob(key, jid, int(first["epoch_size"]), float(first["total_workload"]),
                               col["num_samples"], col["acc"], col["loss"], float(first["initial_loss"]),
                               col["batch_size"], col["lr"], col["throughput"], float(target), int(patience),
                               block[0][0]))
    return jobs


# ----------------------------------------------------------------------------- fitting
def _design(jobs: Sequence[HistoryJob]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stacked (X, y, weights, job index); each job's rows share weight rows_total / (jobs * rows_job)."""
    xs, ys, ws, idx = [], [], [], []
    total = sum(len(j.samples) for j in jobs)
    for k, j in enumerate(jobs):
        xs.append(j.features())
        ys.append(j.fractions)
        ws.append(np.full(len(j.samples), total / (len(jobs) * len(j.samples))))
        idx.append(np.full(len(j.samples), k))
    return np.vstack(xs), np.concatenate(ys), np.concatenate(ws), np.concatenate(idx)


def _loglik(theta: np.ndarray, x: np.ndarray, ly: np.ndarray, l1y: np.ndarray, w: np.ndarray) -> float:
    beta, phi = theta[:-1], math.exp(theta[-1])
    mu = np.clip(1.0 / (1.0 + np.exp(-(x @ beta))), 1e-9, 1 - 1e-9)
    ll = (lgamma(phi) - lgamma(mu * phi) - lgamma((1 - mu) * phi) + (mu * phi - 1) * ly
          + ((1 - mu) * phi - 1) * l1y)
    return float(np.sum(w * ll) - 0.5 * _RIDGE * np.sum(beta[1:] ** 2) * np.sum(w))


def _grad_hess(theta: np.ndarray, x: np.ndarray, ly: np.ndarray, l1y: np.ndarray, w: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    beta, phi = theta[:-1], math.exp(theta[-1])
    mu = np.clip(1.0 / (1.0 + np.exp(-(x @ beta))), 1e-9, 1 - 1e-9)
    a, b = mu * phi, (1 - mu) * phi
    ystar = ly - l1y
    mustar = digamma(a) - digamma(b)
    ta, tb = trigamma(a), trigamma(b)
    g = mu * (1 - mu)
    l_mu = phi * (ystar - mustar)
    l_mumu = -phi * phi * (ta + tb)
    l_phi = float(digamma(phi)) - mu * digamma(a) - (1 - mu) * digamma(b) + mu * ly + (1 - mu) * l1y
    l_phiphi = float(trigamma(phi)) - mu * mu * ta - (1 - mu) ** 2 * tb
    l_muphi = (ystar - mustar) - phi * (mu * ta - (1 - mu) * tb)
    l_eta = l_mu * g
    l_etaeta = l_mumu * g * g + l_mu * g * (1 - 2 * mu)
    l_zeta = l_phi * phi
    l_zetazeta = l_phiphi * phi * phi + l_phi * phi
    l_etazeta = l_muphi * g * phi
    d = x.shape[1]
    grad = np.empty(d + 1)
    grad[:d] = x.T @ (w * l_eta)
    grad[d] = np.sum(w * l_zeta)
    hess = np.empty((d + 1, d + 1))
    hess[:d, :d] = (x * (w * l_etaeta)[:, None]).T @ x
    hess[:d, d] = hess[d, :d] = x.T @ (w * l_etazeta)
    hess[d, d] = np.sum(w * l_zetazeta)
    ridge = _RIDGE * np.sum(w)
    grad[1:d] -= ridge * beta[1:]
    hess[1:d, 1:d] -= ridge * np.eye(d - 1)
    return grad, hess


def fit_beta_regression(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None,
                        max_iter: int = 200, tol: float = 1e-9) -> tuple[np.ndarray, float]:
    """Maximum-likelihood Beta regression with logit link: returns (beta, phi).

    Damped Newton (Levenberg-style: the step solves ``(-H + lam I) d = g`` with ``lam`` raised until
    the log-likelihood rises), started from least squares on ``logit(y)``. Deterministic.
    """
    x = np.asarray(x, dtype=float)
    y = np.clip(np.asarray(y, dtype=float), 1e-6, 1 - 1e-6)
    w = np.ones(len(y)) if w is None else np.asarray(w, dtype=float)
    ly, l1y = np.log(y), np.log1p(-y)
    sw = np.sqrt(w)
    beta0 = np.linalg.lstsq(x * sw[:, None], (ly - l1y) * sw, rcond=None)[0]
    mu0 = 1.0 / (1.0 + np.exp(-(x @ beta0)))
    var = np.sum(w * (y - mu0) ** 2) / np.sum(w)
    phi0 = max(np.sum(w * mu0 * (1 - mu0)) / np.sum(w) / max(var, 1e-6) - 1.0, 1.0)
    theta = np.concatenate([beta0, [math.log(phi0)]])
    ll = _loglik(theta, x, ly, l1y, w)
    lam = 1e-3
    for _ in range(max_iter):
        grad, hess = _grad_hess(theta, x, ly, l1y, w)
        if np.max(np.abs(grad)) < tol * max(1.0, abs(ll)):
            break
        neg = -hess
        scale = np.maximum(np.abs(np.diag(neg)), 1e-12)
        improved = False
        for _ in range(60):
            try:
                step = np.linalg.solve(neg + lam * np.diag(scale), grad)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            cand = theta + step
            cand_ll = _loglik(cand, x, ly, l1y, w)
            if np.isfinite(cand_ll) and cand_ll >= ll:
                improved = True
                break
            lam *= 10.0
        if not improved:
            break
        gain = cand_ll - ll
        theta, ll = cand, cand_ll
        lam = max(lam / 10.0, 1e-12)
        if gain < tol * max(1.0, abs(ll)) and np.max(np.abs(step)) < 1e-8:
            break
    return theta[:-1], float(math.exp(theta[-1]))


def _prior_ratio(jobs: Sequence[HistoryJob]) -> float:
    return float(np.median([j.total_epochs / j.patience for j in jobs]))


def fit_jobs(jobs: Sequence[HistoryJob], meta: Mapping[str, Any] | None = None) -> ProgressModel:
    """Fit the progress model on parsed history jobs."""
    if len(jobs) < 2:
        raise ValueError("need at least 2 history jobs to fit the progress model")
    x, y, w, _ = _design(jobs)
    beta, phi = fit_beta_regression(x, y, w)
    return ProgressModel(tuple(beta), phi, _prior_ratio(jobs), FEATURE_NAMES, dict(meta or {}))


def fit_progress_model(csv_path: str | Path, trace_csv: str | Path | None = None) -> ProgressModel:
    """Fit the Beta-regression progress model on ``job_history.csv`` (see :func:`load_history`)."""
    jobs = load_history(csv_path, trace_csv)
    meta = {
        "source": "ones_sc21/traces/job_history.csv (kurisusnowdeng/ones_sc21 @ 8535358)",
        "targets_from": Path(trace_csv).name if trace_csv is not None else "trace_dev.csv",
        "jobs": len(jobs),
        "rows": int(sum(len(j.samples) for j in jobs)),
    }
    return fit_jobs(jobs, meta)


# ----------------------------------------------------------------------------- evaluation
def _remaining_from_fraction(samples_eval: np.ndarray, f: np.ndarray, lower_epochs: np.ndarray,
                             epoch_size: float) -> np.ndarray:
    total = samples_eval / f
    return np.maximum(np.maximum(total - samples_eval, lower_epochs * epoch_size),
                      _MIN_REMAINING_EPOCHS * epoch_size)


def cross_validate(jobs: Sequence[HistoryJob]) -> dict[str, float]:
    """Leave-one-job-out errors of the model and of a naive baseline, over all held-out evaluations.

    Returns median absolute errors of the fraction done, of the remaining samples, of the remaining
    epochs and the median relative error of the remaining samples. Baseline: fraction = epochs /
    (median total epochs of the training jobs), i.e. every job is assumed to take the median length.
    Both predictions get the same stopping-rule lower bound on the remaining epochs.
    """
    errs: dict[str, list[np.ndarray]] = {k: [] for k in ("f", "rem", "ep", "rel", "bf", "brem", "bep", "brel")}
    for k, held in enumerate(jobs):
        train = [j for i, j in enumerate(jobs) if i != k]
        model = fit_jobs(train)
        x = held.features()
        counters, _ = convergence_counters(held.accs, held.target)
        lower = held.patience - np.minimum(counters, held.patience - 1)
        true_f = held.fractions
        true_rem = held.total_workload - held.samples
        f = model.fraction_from_features(x)
        rem = _remaining_from_fraction(held.samples, f, lower, held.epoch_size)
        med_epochs = float(np.median([j.total_epochs for j in train]))
        bf = np.clip(held.samples / held.epoch_size / med_epochs, 1e-3, 1 - 1e-3)
        brem = _remaining_from_fraction(held.samples, bf, lower, held.epoch_size)
        for name, pf, pr in (("", f, rem), ("b", bf, brem)):
            errs[name + "f"].append(np.abs(pf - true_f))
            errs[name + "rem"].append(np.abs(pr - true_rem))
            errs[name + "ep"].append(np.abs(pr - true_rem) / held.epoch_size)
            errs[name + "rel"].append(np.abs(pr - true_rem) / true_rem)
    med = {k: float(np.median(np.concatenate(v))) for k, v in errs.items()}
    return {
        "jobs": len(jobs),
        "rows": int(sum(len(j.samples) for j in jobs)),
        "model_mae_fraction": med["f"],
        "model_mae_remaining_samples": med["rem"],
        "model_mae_remaining_epochs": med["ep"],
        "model_mre_remaining": med["rel"],
        "baseline_mae_fraction": med["bf"],
        "baseline_mae_remaining_samples": med["brem"],
        "baseline_mae_remaining_epochs": med["bep"],
        "baseline_mre_remaining": med["brel"],
    }


# ----------------------------------------------------------------------------- public entry points
@functools.lru_cache(maxsize=1)
def default_predictor() -> ProgressModel:
    """The shipped model (``progress_coefficients.json``), loaded once."""
    return ProgressModel.load(COEFFICIENTS_PATH)


def remaining_samples(view: JobView) -> float:
    """Base-equivalent samples still needed: exact for epoch/sample rules, predicted for accuracy rules."""
    total = view.known_total_samples()
    if total is not None:
        return max(total - view.progress_samples, 0.0)
    return default_predictor().remaining(view)
