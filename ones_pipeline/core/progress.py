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
(:func:`history_features`). ``beta`` and the precision ``phi`` are fitted offline by maximum likelihood
(:mod:`ones_pipeline.calibration.progress_fit`); this module holds only the fitted model.

Prediction (:meth:`ProgressModel.remaining`): with predicted fraction ``f`` at the last evaluation
(``s_eval`` raw samples), the predicted total is ``s_eval / f`` raw samples; the remaining raw samples
``total - samples_done`` are bounded below by the stopping rule itself (the counter rises by at most one
per epoch, so at least ``patience - counter`` more epochs are needed) and converted to base-equivalent
samples with the job's own ratio ``progress_samples / samples_done`` (its average statistical efficiency
so far). Before the first evaluation the prior total is ``prior_epochs_per_patience * patience`` epochs,
the median of ``total epochs / patience`` over the history jobs (stored in the JSON file).

The fitted coefficients ship as ``progress_coefficients.json`` next to this module (regenerate and
cross-validate with ``benchmarks/research/fit_progress_model.py``), so nothing outside the package is read at
run time.
"""

from __future__ import annotations

import functools
import json
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

_RECENT = 3  # evaluations over which "recent_gain" is measured
MIN_REMAINING_EPOCHS = 0.01  # floor of a prediction, in epochs
DEFAULT_MIN_DELTA = 0.01


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
    best: float  # best accuracy after the last evaluation (``convergence_counters``)


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
        counters, bests = convergence_counters(accs, target, min_delta)
        return _Eval(samples, accs, losses, int(counters[-1]), float(bests[-1]))

    def _fraction(self, view: JobView, ev: _Eval) -> float:
        """``fraction`` from the evaluations ``ev`` (at least one, at positive samples): the last row of
        ``history_features`` computed alone, element by element as that function computes it."""
        target, patience, _ = _rule(view)
        n = len(ev.accs)
        x = np.empty(N_FEATURES)
        x[0] = 1.0
        x[1] = np.log(np.maximum(ev.samples[-1:] / view.spec.dataset_size, 1e-3))[0]
        x[2] = min(ev.counter, patience) / patience
        x[3] = min(max(ev.best / target, 0.0), 1.5)
        loss0 = view.initial_loss
        if ev.losses is not None and loss0 is not None and loss0 > 0:
            x[4] = np.clip(np.log(np.maximum(ev.losses[-1:], 1e-12) / loss0), -6.0, 1.0)[0]
        else:
            x[4] = 0.0
        prev = ev.accs[n - 1 - _RECENT] if n > _RECENT else ev.accs[0]
        x[5] = min(max((ev.accs[-1] - prev) / target, -0.5), 1.0)
        return float(self.fraction_from_features(x))

    def fraction(self, view: JobView) -> float | None:
        """Predicted fraction of training done at the job's last evaluation (None before the first)."""
        ev = self._evaluations(view)
        if ev is None or ev.samples[-1] <= 0:
            return None
        return self._fraction(view, ev)

    def total_raw_samples(self, view: JobView) -> float:
        """Predicted raw samples processed when the job stops."""
        return self._total_raw(view, self._evaluations(view))

    def _total_raw(self, view: JobView, ev: _Eval | None) -> float:
        """``total_raw_samples`` from the evaluations ``ev`` already read from the view."""
        target, patience, _ = _rule(view)
        size = float(view.spec.dataset_size)
        if ev is None or ev.samples[-1] <= 0:
            return max(self.prior_epochs_per_patience * patience * size, patience * size, view.samples_done)
        return float(ev.samples[-1] / self._fraction(view, ev))

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
        remaining_raw = max(self._total_raw(view, ev) - done, lower, MIN_REMAINING_EPOCHS * size)
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
