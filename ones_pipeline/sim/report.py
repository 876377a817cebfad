"""Simulation outputs: per-job tables, summary statistics, comparison table, CSV/JSON and PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

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
    jct = np.array([j.jct_s for j in result.jobs], dtype=float)
    wait = np.array([j.wait_s for j in result.jobs], dtype=float)
    decide = np.array(result.decide_s) if result.decide_s else np.zeros(1)
    return {
        "jobs": len(result.jobs),
        "mean_jct_s": float(np.mean(jct)),
        "median_jct_s": float(np.median(jct)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "mean_wait_s": float(np.mean(wait)),
        "makespan_s": float(result.makespan_s),
        "utilisation": float(result.utilisation),
        "restarts": int(sum(j.restarts for j in result.jobs)),
        "gpu_hours": float(sum(j.gpu_s for j in result.jobs) / 3600.0),
        "median_decide_ms": float(np.median(decide) * 1e3),
    }


def comparison_table(summaries: Mapping[str, Mapping[str, float]], baseline: str = "ones",
                     bound: Mapping[str, float] | None = None) -> str:
    """Plain-text table, one row per policy, with mean-JCT ratio to ``baseline`` and, when ``bound`` (a
    ``Bound.to_dict()``) is given, to the lower bound, which gets a row of its own."""
    base = summaries.get(baseline, {}).get("mean_jct_s")
    low = bound.get("mean_jct_s") if bound else None
    header = f"{'policy':<11} {'mean JCT':>10} {'vs ' + baseline:>9} " + (f"{'vs bound':>9} " if low else "") + \
             f"{'median':>9} {'p95':>9} {'p99':>9} {'makespan':>9} {'util':>6} {'restarts':>8}"
    lines = [header, "-" * len(header)]
    for name, s in summaries.items():
        ratio = s["mean_jct_s"] / base if base else math.nan
        vs_bound = f"{s['mean_jct_s'] / low:>8.2f}x " if low else ""
        lines.append(
            f"{name:<11} {_h(s['mean_jct_s']):>10} {ratio:>8.2f}x {vs_bound}{_h(s['median_jct_s']):>9} "
            f"{_h(s['p95_jct_s']):>9} {_h(s['p99_jct_s']):>9} {_h(s['makespan_s']):>9} "
            f"{s['utilisation']:>6.1%} {s['restarts']:>8d}"
        )
    if low:
        ratio = low / base if base else math.nan
        lines.append(f"{'bound':<11} {_h(low):>10} {ratio:>8.2f}x {1.0:>8.2f}x   (lower bound: max of alone "
                     f"{_h(bound['alone_mean_jct_s'])}, one-server SRPT {_h(bound['srpt_mean_jct_s'])})")
    return "\n".join(lines)


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}h" if seconds >= 3600 else f"{seconds:.0f}s"


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        jct = np.sort([j.jct_s for j in res.jobs]) / 3600.0
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post",
                label=f"{name} (mean {np.mean(jct):.2f} h)", lw=2 if name == "ones" else 1.3)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "JCT CDF per policy")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gpus_over_time(result: SimResult, path: Path) -> None:
    """Stacked area of GPUs held per job over time (the cluster's occupancy, by job)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, names, held = gpus_over_time(result)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if times.size:
        cmap = plt.get_cmap("tab20")
        colors = [cmap(i % 20) for i in range(len(names))]
        ax.stackplot(times / 3600.0, held, step="post", colors=colors, linewidth=0)
    ax.axhline(result.cluster.num_gpus, color="k", lw=0.8, ls="--")
    ax.set_ylim(0, result.cluster.num_gpus * 1.05)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs held (one colour per job)")
    ax.set_title(f"{result.policy}: GPUs held over time ({len(names)} jobs, {result.cluster.num_gpus} GPUs, "
                 f"utilisation {result.utilisation:.0%})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: Mapping[str, SimResult], out_dir: Path, meta: Mapping | None = None,
                  title: str = "", bound: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Write per-job CSVs, summary.json (with the lower bound ``bound`` and each policy's ``vs_bound``
    when given) and the plots into ``out_dir``; return the summaries."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {name: summarise(res) for name, res in results.items()}
    for name, res in results.items():
        jobs_frame(res).to_csv(out_dir / f"jobs-{name}.csv", index=False)
        plot_gpus_over_time(res, out_dir / f"gpus-{name}.png")
    plot_jct_cdf(results, out_dir / "jct_cdf.png", title=title)
    if bound:
        for summary in summaries.values():
            summary["vs_bound"] = summary["mean_jct_s"] / bound["mean_jct_s"]
    payload = {"meta": dict(meta or {}), "policies": summaries}
    if bound:
        payload["bound"] = dict(bound)
    (out_dir / "summary.json").write_text(json.dumps(payload, indent=2, sort_keys=False))
    return summaries
