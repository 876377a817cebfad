"""The ONES-trace catalogue table and a standalone-duration sanity check of the first jobs.

Prints the job-type table of ``docs/ones_catalogue.md`` (``--catalogue``) and how long each of the first
``--jobs`` trace jobs takes alone on its requested GPUs (``--sanity``); both by default:

    .venv/bin/python -m ones_pipeline.calibration.ones_catalogue_table [TRACE] [--catalogue] [--sanity]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ones_pipeline.core.types import batch_and_lr
from ones_pipeline.reporting import markdown_table
from ones_pipeline.sim.ones_catalogue import Catalogue, catalogue
from ones_pipeline.sim.ones_trace import load_ones_trace
from ones_pipeline.sim.ones_trace_reader import read_ones_trace
from ones_pipeline.sim.ones_truth import OnesJobTruth, standalone_time_s
from ones_pipeline.sim.pollux_profiles import consolidated_placement

DEFAULT_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "ones_sc21" / "trace_1.csv"


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


def catalogue_table(trace: Path, pollux: Path | None) -> str:
    """The markdown table of docs/ones_catalogue.md: per (type, epoch size) the calibrated parameters and the
    epochs the trace's jobs of that kind simulate to."""
    cat = catalogue(trace.resolve().parent, pollux)
    by_type_es: dict[tuple[str, int], list[int]] = {}
    for r in read_ones_trace(trace):
        truth = OnesJobTruth(r, cat[(r.model, r.task)], cat.restart_cost_s)
        by_type_es.setdefault((r.job_type.key, r.epoch_size), []).append(truth.epochs)
    header = ("job type", "source", "sigma", "rho", "kappa", "history GPUs", "history samples/s", "epoch size",
              "ref. batch", "history epochs", "simulated epochs (trace_1: median [min-max], n)",
              "curve a0 -> a1, tau, delay, noise", "artifact speed (jobs)", "artifact median exec (s)")
    rows = []
    for d in catalogue_rows(cat):
        sims = by_type_es.get((d["type"], d["epoch_size"]), [])
        rows.append((
            d["type"], d["source"], f"{d['sigma']:.3f}", f"{d['rho']:.2f}", f"{d['kappa']:.3f}",
            ",".join(map(str, d["history_gpus"])), f"{d['history_thr']:.0f}", d["epoch_size"], d["ref_batch"],
            f"{d['history_epochs']:.0f}",
            f"{np.median(sims):.0f} [{min(sims)}-{max(sims)}], {len(sims)}" if sims else "-",
            f"{d['a0']:.3f} -> {d['a1']:.3f}, {d['tau']:.2f}, {d['delay']:.1f}, {d['noise_sd']:.3f}",
            f"{d['artifact_speed']:.3f} ({d['artifact_jobs']})",
            "-" if d["artifact_exec_s"] is None else format(d["artifact_exec_s"], ".0f"),
        ))
    return markdown_table(header, rows)


def sanity_table(trace: Path, pollux: Path | None, n_jobs: int) -> str:
    """Per job of the first ``n_jobs``: GPUs, batch, epochs, efficiency, speed and time alone; then totals."""
    jobs = load_ones_trace(trace, max_jobs=n_jobs, pollux_traces_dir=pollux)
    times = []
    lines = [f"{'job':28s}{'gpus':>5s}{'batch':>7s}{'epochs':>7s}{'eff_ref':>8s}{'samples/s':>11s}{'alone_s':>9s}"]
    for j in jobs:
        t = standalone_time_s(j)
        times.append(t)
        n = j.spec.requested_gpus
        gb, _ = batch_and_lr(j.spec, n)
        step, _ = j.truth.step_time(consolidated_placement(n), math.ceil(gb / n))
        lines.append(f"{j.spec.name:28s}{n:5d}{gb:7d}{j.truth.epochs:7d}{j.truth.reference_efficiency:8.3f}"
                     f"{gb / step:11.0f}{t:9.0f}")
    times = np.array(times)
    gpu_s = sum(t * j.spec.requested_gpus for t, j in zip(times, jobs, strict=False))
    lines.append(f"\n{len(jobs)} jobs alone on their requested GPUs: mean {times.mean():.0f} s "
                 f"({times.mean() / 3600:.3f} h), median {np.median(times):.0f} s ({np.median(times) / 3600:.3f} h), "
                 f"max {times.max():.0f} s; total {gpu_s / 3600:.1f} GPU-h "
                 f"(= {gpu_s / 64:.0f} s of a 64-GPU cluster)")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ONES trace catalogue and standalone-duration sanity check")
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--pollux", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--catalogue", action="store_true", help="print the markdown catalogue table")
    ap.add_argument("--sanity", action="store_true", help="print standalone durations of the first --jobs jobs")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.catalogue or not args.sanity:
        print(catalogue_table(args.trace, args.pollux))
    if args.sanity or not args.catalogue:
        print()
        print(sanity_table(args.trace, args.pollux, args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
