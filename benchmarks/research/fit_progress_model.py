"""Refit the remaining-work predictor and print its leave-one-job-out cross-validation.

    .venv/bin/python benchmarks/research/fit_progress_model.py [--history PATH] [--trace PATH] [--out PATH] [--check]

Fits the Beta regression of ``ones_pipeline.core.progress`` (``ones_pipeline.calibration.progress_fit``) on
the ONES prototype's ``job_history.csv`` (targets and patience from ``trace_dev.csv``), writes
``ones_pipeline/core/progress_coefficients.json`` (with the CV figures in its ``meta``) and prints the CV
errors of the model and of the naive baseline (every job assumed to last the median number of epochs).
``--check`` only compares a refit with the shipped file and exits 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ones_pipeline.calibration.progress_fit import cross_validate, fit_progress_model, load_history
from ones_pipeline.core.progress import COEFFICIENTS_PATH, ProgressModel

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT.parent / "shared" / "traces" / "ones_sc21"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=Path, default=DEFAULT_DIR / "job_history.csv")
    ap.add_argument("--trace", type=Path, default=None, help="trace with target/patience (default trace_dev.csv)")
    ap.add_argument("--out", type=Path, default=COEFFICIENTS_PATH)
    ap.add_argument("--check", action="store_true", help="compare a refit with --out, write nothing")
    args = ap.parse_args(argv)

    model = fit_progress_model(args.history, args.trace)
    if args.check:
        shipped = ProgressModel.load(args.out)
        same = np.allclose(shipped.coef, model.coef, rtol=1e-6, atol=1e-9) and np.isclose(shipped.phi, model.phi)
        print("shipped coefficients", "match" if same else "DIFFER from", "a refit")
        return 0 if same else 1

    jobs = load_history(args.history, args.trace)
    cv = cross_validate(jobs)
    meta = dict(model.meta)
    meta["loo_cv"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in cv.items()}
    model = ProgressModel(model.coef, model.phi, model.prior_epochs_per_patience, model.feature_names, meta)
    model.save(args.out)

    print(f"fitted on {cv['jobs']} jobs / {cv['rows']} evaluations -> {args.out}")
    print("coefficients:", json.dumps(dict(zip(model.feature_names, np.round(model.coef, 4).tolist(), strict=False))))
    print(f"phi = {model.phi:.3f}; prior total epochs = {model.prior_epochs_per_patience:.2f} x patience")
    print("\nleave-one-job-out CV (median over held-out evaluations)")
    print(f"{'':28s}{'Beta regression':>16s}{'naive baseline':>16s}")
    rows = (
        ("abs. error of fraction", "mae_fraction", "{:16.3f}"),
        ("abs. error remaining samp.", "mae_remaining_samples", "{:16.0f}"),
        ("abs. error remaining epochs", "mae_remaining_epochs", "{:16.2f}"),
        ("rel. error remaining", "mre_remaining", "{:16.3f}"),
    )
    for label, key, fmt in rows:
        print(f"{label:28s}" + fmt.format(cv["model_" + key]) + fmt.format(cv["baseline_" + key]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
