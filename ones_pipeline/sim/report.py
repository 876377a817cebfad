"""Simulation outputs: per-job tables, summary statistics, comparison table, CSV/JSON and PNG plots.

The statistics, tables and plots themselves are the shared ones of :mod:`ones_pipeline.reporting`.
"""

from __future__ import annotations

import hashlib
import math
import platform
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ones_pipeline.reporting import (
    hours_or_seconds,
    jct_statistics,
    plot_gpus_held,
    text_table,
    write_csv,
    write_json,
)
from ones_pipeline.reporting import plot_jct_cdf as plot_jct_cdf_of
from ones_pipeline.sim.engine import SimResult

SUMMARY_KEYS = ("mean_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s", "mean_wait_s", "makespan_s",
                "utilisation", "restarts", "gpu_hours")


def jobs_frame(result: SimResult) -> pd.DataFrame:
    """One row per job: JCT, wait, run time, restarts, GPU-seconds."""
    rows = [
        {
            "job": j.name, "model": j.model, "submit_s": j.submit_s, "start_s": j.first_start_s,
            "finish_s": j.finish_s, "jct_s": j.jct_s, "wait_s": j.wait_s, "run_s": j.run_s,
            "restarts": j.restarts, "gpu_s": j.gpu_s, "requested_gpus": j.requested_gpus,
            "max_gpus": j.max_gpus, "samples": j.samples,
        }
        for j in result.jobs
    ]
    return pd.DataFrame(rows)


def summarise(result: SimResult) -> dict[str, float]:
    """The keys of :data:`SUMMARY_KEYS` plus ``jobs`` and ``median_decide_ms`` (the policy's decision time)."""
    decide = np.array(result.decide_s) if result.decide_s else np.zeros(1)
    return {
        "jobs": len(result.jobs),
        **jct_statistics([j.jct_s for j in result.jobs], percentiles=(95, 99)),
        "mean_wait_s": float(np.mean(np.array([j.wait_s for j in result.jobs], dtype=float))),
        "makespan_s": float(result.makespan_s),
        "utilisation": float(result.utilisation),
        "restarts": int(sum(j.restarts for j in result.jobs)),
        "gpu_hours": float(sum(j.gpu_s for j in result.jobs) / 3600.0),
        "median_decide_ms": float(np.median(decide) * 1e3),
    }


def schedule_digest(result: SimResult) -> str:
    """A digest of every decision of a simulation (each change of a job's GPU count, with its time) and of
    every job's finish time: two runs with the same digest made the same decisions. Changes of code that
    must not change decisions are checked with it (``tests/test_ones_frozen.py``)."""
    h = hashlib.sha1()
    for t, job, n in result.timeline:
        h.update(f"{t!r},{job},{n};".encode())
    for r in sorted(result.jobs, key=lambda r: r.name):
        h.update(f"{r.name},{r.finish_s!r};".encode())
    return h.hexdigest()[:16]


def host() -> str:
    """The CPU model, numpy version and the widest SIMD extension numpy finds here. A simulation's figures
    can depend on them (floating point differs with numpy's code paths, and a small difference changes a
    decision somewhere and the rest of the run with it: the same code gave workload-1 / ``ones`` 1954 s on
    an earlier machine and 1903 s on an AMD EPYC with AVX2, numpy 2.4.6)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 platform.processor() or platform.machine())
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
        simd = "AVX512F" if features.get("AVX512F") else "AVX2" if features.get("AVX2") else "no AVX2"
    except ImportError:  # another numpy layout: name no extension rather than guess
        simd = "SIMD unknown"
    return f"{model}, numpy {np.__version__}, {simd}"


def comparison_table(summaries: Mapping[str, Mapping[str, float]], baseline: str = "ones",
                     bound: Mapping[str, float] | None = None) -> str:
    """Plain-text table, one row per policy, with mean-JCT ratio to ``baseline`` and, when ``bound`` (a
    ``Bound.to_dict()``) is given, to the lower bound, which gets a row of its own."""
    base = summaries.get(baseline, {}).get("mean_jct_s")
    low = bound.get("mean_jct_s") if bound else None
    _h = hours_or_seconds
    columns = [("policy", "<11"), ("mean JCT", ">10"), ("vs " + baseline, ">9"), *([("vs bound", ">9")] if low else []),
               ("median", ">9"), ("p95", ">9"), ("p99", ">9"), ("makespan", ">9"), ("util", ">6"), ("restarts", ">8")]
    rows = []
    for name, s in summaries.items():
        ratio = s["mean_jct_s"] / base if base else math.nan
        rows.append([name, _h(s["mean_jct_s"]), f"{ratio:.2f}x", *([f"{s['mean_jct_s'] / low:.2f}x"] if low else []),
                     _h(s["median_jct_s"]), _h(s["p95_jct_s"]), _h(s["p99_jct_s"]), _h(s["makespan_s"]),
                     f"{s['utilisation']:.1%}", f"{s['restarts']:d}"])
    if low:
        ratio = low / base if base else math.nan
        note = (f"  (lower bound: max of alone {_h(bound['alone_mean_jct_s'])}, one-server SRPT "
                f"{_h(bound['srpt_mean_jct_s'])})")
        if "tight_mean_jct_s" in bound:  # sim/tight_bound.py's TightBound.to_dict()
            note = (f"  (lower bound: tight {_h(bound['tight_mean_jct_s'])}, fast {_h(bound['fast_mean_jct_s'])}, "
                    f"tight/fast {bound['tight_mean_jct_s'] / bound['fast_mean_jct_s']:.2f}x, {bound['binds']} binds)")
        rows.append(["bound", _h(low), f"{ratio:.2f}x", f"{1.0:.2f}x", note])
    return text_table(columns, rows)


def gpus_over_time(result: SimResult) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(times (T,), job names, gpus (J, T)): GPUs held by each job as a step function."""
    names = [j.name for j in result.jobs]
    index = {n: i for i, n in enumerate(names)}
    times = np.array(sorted({t for t, _, _ in result.timeline}), dtype=float)
    held = np.zeros((len(names), len(times)))
    events = sorted(result.timeline, key=lambda e: e[0])
    current = np.zeros(len(names))
    k = 0
    for ti, t in enumerate(times):
        while k < len(events) and events[k][0] == t:
            current[index[events[k][1]]] = events[k][2]
            k += 1
        held[:, ti] = current
    return times, names, held


def plot_jct_cdf(results: Mapping[str, SimResult], path: Path, title: str = "") -> None:
    """CDF of every policy's JCTs (hours, log scale), ``ones`` drawn thicker."""
    plot_jct_cdf_of({name: [j.jct_s for j in res.jobs] for name, res in results.items()}, path,
                    title=title or "JCT CDF per policy", unit="h", log_x=True, highlight="ones")


def plot_gpus_over_time(result: SimResult, path: Path) -> None:
    """Stacked area of GPUs held per job over time (the cluster's occupancy, by job)."""
    times, names, held = gpus_over_time(result)
    plot_gpus_held(times, names, held, result.cluster.num_gpus, path,
                   title=f"{result.policy}: GPUs held over time ({len(names)} jobs, {result.cluster.num_gpus} "
                         f"GPUs, utilisation {result.utilisation:.0%})")


def write_outputs(results: Mapping[str, SimResult], out_dir: Path, meta: Mapping | None = None,
                  title: str = "", bound: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Write per-job CSVs, summary.json (with the lower bound ``bound`` and each policy's ``vs_bound``
    when given) and the plots into ``out_dir``; return the summaries."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {name: summarise(res) for name, res in results.items()}
    for name, res in results.items():
        write_csv(out_dir / f"jobs-{name}.csv", jobs_frame(res))
        plot_gpus_over_time(res, out_dir / f"gpus-{name}.png")
    plot_jct_cdf(results, out_dir / "jct_cdf.png", title=title)
    if bound:
        for summary in summaries.values():
            summary["vs_bound"] = summary["mean_jct_s"] / bound["mean_jct_s"]
    payload = {"meta": dict(meta or {}), "policies": summaries}
    if bound:
        payload["bound"] = dict(bound)
    write_json(out_dir / "summary.json", payload)
    return summaries
