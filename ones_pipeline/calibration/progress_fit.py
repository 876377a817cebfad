"""Offline fitting and cross-validation of the remaining-work predictor (:mod:`ones_pipeline.core.progress`).

The runtime model is a Beta regression of the fraction of training done, ``fraction ~ Beta(mu * phi,
(1 - mu) * phi)`` with ``logit(mu) = x . beta`` (features: :func:`~ones_pipeline.core.progress.history_features`).
Here ``beta`` and the precision ``phi`` are fitted by maximum likelihood on the ONES prototype's own training
data, ``job_history.csv`` (``shared/traces/ones_sc21``: per-epoch logs of completed jobs, ``num_samples /
total_workload`` is the fraction done; read by :func:`~ones_pipeline.sim.ones_history.read_job_history`):
damped Newton on the exact log-likelihood, deterministic, with digamma/trigamma/log-gamma implemented here
in numpy. Rows are weighted so that every history job counts equally.

``benchmarks/research/fit_progress_model.py`` refits the shipped ``progress_coefficients.json`` with this module and
prints its leave-one-job-out cross-validation (:func:`cross_validate`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ones_pipeline.core.progress import (
    DEFAULT_MIN_DELTA,
    FEATURE_NAMES,
    MIN_REMAINING_EPOCHS,
    ProgressModel,
    convergence_counters,
    history_features,
)
from ones_pipeline.sim.ones_history import read_job_history
from ones_pipeline.sim.ones_trace_reader import read_ones_trace
from ones_pipeline.sim.truth import TraceError

_RIDGE = 1e-3  # L2 penalty on the non-intercept coefficients (keeps Newton well-posed)


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
    blocks = read_job_history(path)
    trace = Path(trace_csv) if trace_csv is not None else path.with_name("trace_dev.csv")
    signatures: dict[tuple[int, float], set[tuple[float, int]]] = {}
    for r in read_ones_trace(trace):
        signatures.setdefault(_signature(r.epoch_size, r.lr, r.batch_size), set()).add((r.target_acc, r.patience))

    def lookup(es: float, lr: float, bs: float, key: str, row: int) -> tuple[float, int]:
        es_i, ratio = _signature(es, lr, bs)
        found: set[tuple[float, int]] = set()
        for (tes, tratio), vals in signatures.items():
            if tes == es_i and abs(tratio - ratio) <= 0.01 * ratio:
                found |= vals
        if len(found) != 1:
            raise TraceError(path, f"history job {key} (epoch_size {es_i}, lr/batch {ratio:.3g}) matches "
                             f"{len(found)} (target, patience) pairs in {trace}: {sorted(found)}; allowed: "
                             "exactly one", row=row, field="id")
        return found.pop()

    jobs: list[HistoryJob] = []
    seen: dict[int, int] = {}
    for block in blocks:
        jid = block.job_id
        n = seen.get(jid, 0)
        seen[jid] = n + 1
        key = str(jid) + ("" if n == 0 else "bcdefghij"[n - 1])
        target, patience = lookup(block.epoch_size, float(block.lrs[0]), float(block.batch_sizes[0]), key,
                                  block.first_row)
        if not np.all(block.samples < block.total_workload):
            bad = block.first_row + int(np.flatnonzero(block.samples >= block.total_workload)[0])
            raise TraceError(path, f"num_samples must stay below the job's total_workload "
                             f"({block.total_workload:g})", row=bad, field="num_samples")
        jobs.append(HistoryJob(key, jid, block.epoch_size, float(block.total_workload), block.samples, block.accs,
                               block.losses, float(block.initial_loss), block.batch_sizes, block.lrs,
                               block.throughputs, float(target), int(patience), block.first_row))
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
                      MIN_REMAINING_EPOCHS * epoch_size)


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
