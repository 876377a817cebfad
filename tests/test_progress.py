"""Remaining-work predictor: exact rules, the shipped Beta regression (core.progress) and its offline fit
(calibration.progress_fit) on the real history."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from ones_pipeline.calibration import progress_fit as F
from ones_pipeline.core import progress as P
from ones_pipeline.core.types import JobSpec, JobStatus, JobView, StopKind, StoppingRule

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
HISTORY = SHARED / "ones_sc21" / "job_history.csv"

needs_history = pytest.mark.skipif(not HISTORY.is_file(), reason=f"ONES history not found at {HISTORY}")


def _spec(rule: StoppingRule, dataset_size: int = 1000) -> JobSpec:
    return JobSpec(name="j", model="m", dataset_size=dataset_size, per_gpu_batch=32, stopping=rule)


def _view(spec: JobSpec, samples: float = 0.0, progress: float | None = None, accs=(), losses=(),
          initial_loss: float | None = None) -> JobView:
    return JobView(spec, JobStatus.RUNNING, 0.0, samples_done=samples,
                   progress_samples=samples if progress is None else progress,
                   accuracy_history=tuple(accs), loss_history=tuple(losses), initial_loss=initial_loss)


def _history_view(job: F.HistoryJob, k: int) -> JobView:
    """The view a scheduler would have of history job ``job`` after its evaluation ``k`` (0-based)."""
    spec = _spec(StoppingRule(StopKind.ACCURACY, target_accuracy=job.target, patience=job.patience),
                 job.epoch_size)
    s = job.samples[: k + 1]
    return _view(spec, float(s[-1]), accs=zip(s, job.accs[: k + 1], strict=False),
                 losses=zip(s, job.losses[: k + 1], strict=False),
                 initial_loss=job.initial_loss)


# ----------------------------------------------------------------------------- exact rules
def test_epoch_and_sample_rules_are_exact():
    spec = _spec(StoppingRule(StopKind.EPOCHS, epochs=10), dataset_size=1000)
    assert P.remaining_samples(_view(spec, samples=4000, progress=2500)) == pytest.approx(7500)
    assert P.remaining_samples(_view(spec, samples=20000, progress=12000)) == 0.0
    spec = _spec(StoppingRule(StopKind.SAMPLES, samples=5e5))
    assert P.remaining_samples(_view(spec, samples=1e5, progress=1e5)) == pytest.approx(4e5)


# ----------------------------------------------------------------------------- numerics
def test_special_functions_match_stdlib_and_identities():
    x = np.array([1e-3, 0.1, 0.5, 1.0, 2.5, 7.9, 8.0, 30.0, 1e4])
    assert np.allclose(F.lgamma(x), [math.lgamma(v) for v in x], rtol=1e-11, atol=1e-11)
    assert F.digamma(np.array([1.0]))[0] == pytest.approx(-0.5772156649015329, abs=1e-12)
    assert F.trigamma(np.array([1.0]))[0] == pytest.approx(math.pi**2 / 6, abs=1e-11)
    # psi(x + 1) = psi(x) + 1/x, psi'(x + 1) = psi'(x) - 1/x^2
    assert np.allclose(F.digamma(x + 1), F.digamma(x) + 1 / x, rtol=1e-10)
    assert np.allclose(F.trigamma(x + 1), F.trigamma(x) - 1 / x**2, rtol=1e-9)


def test_beta_regression_recovers_known_coefficients():
    rng = np.random.default_rng(7)
    n = 4000
    x = np.column_stack([np.ones(n), rng.normal(size=n), rng.uniform(-1, 1, size=n)])
    beta, phi = np.array([-0.5, 0.8, -1.2]), 30.0
    mu = 1 / (1 + np.exp(-(x @ beta)))
    y = rng.beta(mu * phi, (1 - mu) * phi)
    b_hat, phi_hat = F.fit_beta_regression(x, y)
    assert np.allclose(b_hat, beta, atol=0.05)
    assert phi_hat == pytest.approx(phi, rel=0.1)
    b2, phi2 = F.fit_beta_regression(x, y)  # deterministic
    assert np.array_equal(b_hat, b2) and phi_hat == phi2


# ----------------------------------------------------------------------------- shipped model
def test_shipped_model_loads_and_has_a_positive_prior():
    model = P.default_predictor()
    assert model is P.default_predictor()  # cached
    assert model.feature_names == P.FEATURE_NAMES
    assert model.phi > 0 and model.prior_epochs_per_patience > 0


def test_no_history_prior_is_finite_and_positive():
    model = P.default_predictor()
    spec = _spec(StoppingRule(StopKind.ACCURACY, target_accuracy=0.7, patience=10), dataset_size=20000)
    r = P.remaining_samples(_view(spec))
    assert math.isfinite(r) and r > 0
    assert r == pytest.approx(model.prior_epochs_per_patience * 10 * 20000)
    # Running but not yet evaluated: the prior minus what was done, never below the rule's minimum.
    r2 = P.remaining_samples(_view(spec, samples=5000))
    assert 0 < r2 < r and r2 >= 10 * 20000 - 5000


def test_remaining_converts_to_base_equivalent_samples():
    spec = _spec(StoppingRule(StopKind.ACCURACY, target_accuracy=0.9, patience=5), dataset_size=1000)
    accs = [(1000.0 * (k + 1), 0.3 + 0.05 * k) for k in range(6)]
    full = P.remaining_samples(_view(spec, samples=6000, progress=6000, accs=accs))
    half = P.remaining_samples(_view(spec, samples=6000, progress=3000, accs=accs))
    assert half == pytest.approx(full / 2)


def test_stopping_rule_lower_bound():
    """After an evaluation with counter c, at least patience - c more epochs remain."""
    spec = _spec(StoppingRule(StopKind.ACCURACY, target_accuracy=0.5, patience=5), dataset_size=1000)
    accs = [(1000.0, 0.2), (2000.0, 0.6), (3000.0, 0.6)]  # counter 2 (target reached twice)
    assert P.convergence_counters([a for _, a in accs], 0.5)[0].tolist() == [0, 1, 2]
    r = P.remaining_samples(_view(spec, samples=3000, accs=accs))
    assert r >= 3 * 1000 - 1e-9


def test_convergence_counter_follows_the_ones_rule():
    counters, bests = P.convergence_counters([0.10, 0.30, 0.305, 0.32, 0.25, 0.40], target=0.9, min_delta=0.01)
    assert counters.tolist() == [0, 0, 1, 0, 1, 0]
    assert bests.tolist() == [0.10, 0.30, 0.30, 0.32, 0.32, 0.40]
    counters, _ = P.convergence_counters([0.5, 0.95, 0.99], target=0.9)
    assert counters.tolist() == [0, 1, 2]  # at target: counts even while still improving


# ----------------------------------------------------------------------------- on the real history
@pytest.fixture(scope="module")
def history() -> list[F.HistoryJob]:
    if not HISTORY.is_file():
        pytest.skip(f"ONES history not found at {HISTORY}")
    return F.load_history(HISTORY)


def test_history_parses_into_jobs_with_targets(history):
    assert sum(len(j.samples) for j in history) == 590
    assert len(history) == 21  # 20 ids, id 0 used by two runs
    assert {j.key for j in history} >= {"0", "0b", "19"}
    for j in history:
        assert 0 < j.target <= 1 and j.patience >= 1
        assert np.all((j.fractions > 0) & (j.fractions < 1))
        assert np.all(np.diff(j.samples) > 0)


@needs_history
def test_shipped_json_matches_a_refit_from_the_csv():
    shipped = P.ProgressModel.load(P.COEFFICIENTS_PATH)
    refit = F.fit_progress_model(HISTORY)
    assert np.allclose(shipped.coef, refit.coef, rtol=1e-6, atol=1e-9)
    assert shipped.phi == pytest.approx(refit.phi, rel=1e-6)
    assert shipped.prior_epochs_per_patience == refit.prior_epochs_per_patience


def test_fraction_in_unit_interval(history):
    model = P.default_predictor()
    for job in history:
        f = model.fraction_from_features(job.features())
        assert np.all((f > 0) & (f < 1))
        v = _history_view(job, len(job.samples) - 1)
        assert 0 < model.fraction(v) < 1
        assert math.isfinite(model.remaining(v)) and model.remaining(v) > 0


@pytest.mark.parametrize("key", ["3", "14", "8"])
def test_remaining_decreases_as_a_held_out_job_trains(history, key):
    held = next(j for j in history if j.key == key)
    model = F.fit_jobs([j for j in history if j.key != key])
    rem = np.array([model.remaining(_history_view(held, k)) for k in range(len(held.samples))])
    assert np.all(np.isfinite(rem)) and np.all(rem > 0)
    n = len(rem)
    assert rem[-1] < rem[0] / 3
    assert rem[n // 2:].mean() < rem[: n // 2].mean()
    ranks = np.argsort(np.argsort(rem))
    assert np.corrcoef(np.arange(n), ranks)[0, 1] < -0.3  # Spearman: falls with training
    # Near the end the prediction is close to the truth (within 2 epochs).
    assert abs(rem[-1] - (held.total_workload - held.samples[-1])) <= 2 * held.epoch_size


def test_cross_validation_beats_the_naive_baseline(history):
    cv = F.cross_validate(history)
    assert cv["model_mae_fraction"] < cv["baseline_mae_fraction"]
    assert cv["model_mae_remaining_samples"] < cv["baseline_mae_remaining_samples"]


def test_fraction_is_the_last_feature_row_of_the_whole_history_bit_for_bit(history):
    """``fraction`` computes only the last feature row (it runs for every job at every decision); it must
    give exactly what the full ``history_features`` row gives, at every prefix, with and without losses."""
    model = P.default_predictor()
    checked = 0
    for job in history:
        for k in range(len(job.samples)):
            v = _history_view(job, k)
            for view in (v, dataclasses.replace(v, loss_history=())):
                rule = view.spec.stopping
                s = np.array([a for a, _ in view.accuracy_history])
                losses = np.array([b for _, b in view.loss_history]) if view.loss_history else None
                x = P.history_features(s / view.spec.dataset_size, [b for _, b in view.accuracy_history],
                                       losses, view.initial_loss, rule.target_accuracy, rule.patience,
                                       rule.min_delta)[-1]
                assert model.fraction(view) == float(model.fraction_from_features(x))
                checked += 1
    assert checked > 1000
