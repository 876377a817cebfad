"""The live cluster report, built from plain records (no Dagster): per-job table, summary, CSV/JSON, plots.

The Dagster asset gathers the records (one ``RunSpan`` per run of a training job, one ``FinishedJob`` per
materialized job), calls ``build_report`` and attaches ``ClusterReport.markdown`` and ``png_markdown`` of
the plots as metadata. Everything here is a pure function of its inputs except the files it writes and
the clock read for spans still running when ``now_s`` is not given.

Times are unix seconds; durations are seconds (``*_s``). Plots show minutes since the first submit.
"""

from __future__ import annotations

import base64
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

TABLE_COLUMNS = ("job", "model", "jct_s", "wait_s", "run_s", "restarts", "generations", "gpu_s", "accuracy",
                 "samples")
SUMMARY_KEYS = ("jobs", "mean_jct_s", "median_jct_s", "p95_jct_s", "makespan_s", "utilisation", "gpu_s",
                "restarts")
_INT_COLUMNS = ("restarts", "generations")
_DPI = 100
_FIGSIZE = (8, 4.5)
_MAX_LEGEND_JOBS = 20
# A bar gets its generation number written on it when it spans at least this fraction of the x range.
_MIN_LABEL_FRACTION = 0.035


@dataclass(frozen=True)
class RunSpan:
    """One Dagster run of a training job: one generation holding ``slot_ids`` from ``start_s`` to ``end_s``."""

    job: str
    generation: int
    slot_ids: tuple[int, ...]
    start_s: float | None  # unix seconds; None if it never started
    end_s: float | None  # None if still running
    status: str  # e.g. "SUCCESS", "CANCELED", "FAILURE", "STARTED"


@dataclass(frozen=True)
class FinishedJob:
    job: str
    submit_s: float  # unix seconds the scheduler first saw the job
    finish_s: float  # unix seconds of its materialization
    accuracy: float | None
    samples: float | None
    restarts: int
    model: str = ""


@dataclass(frozen=True)
class ClusterReport:
    table: pd.DataFrame  # one row per finished job, columns TABLE_COLUMNS, in order of finish
    summary: dict[str, float]  # SUMMARY_KEYS; NaN where undefined (no finished jobs)
    markdown: str  # markdown table of ``table`` + a summary line
    files: dict[str, Path]  # "csv", "json", "jct_cdf", "allocation" -> written paths


# --------------------------------------------------------------------------------------------- metrics


def _interval(span: RunSpan, now_s: float) -> tuple[float, float] | None:
    """(start, end) of a span that started, with a running span ending at ``now_s``; None if it never started."""
    if span.start_s is None:
        return None
    end = now_s if span.end_s is None else span.end_s
    # Clocks of the Dagster daemon and of the report may disagree by a little; never count negative time.
    return float(span.start_s), max(float(span.start_s), float(end))


def job_metrics(job: FinishedJob, spans: Sequence[RunSpan], now_s: float | None = None) -> dict[str, float]:
    """jct_s = finish - submit; wait_s = first start - submit; run_s = sum of span durations;
    gpu_s = sum(duration x len(slot_ids)); generations = number of spans that started.

    ``spans`` may hold other jobs' spans (they are ignored). Spans still running count up to ``now_s``
    (default ``time.time()``). ``wait_s`` is NaN when no span started.
    """
    now = time.time() if now_s is None else float(now_s)
    intervals = [(iv, len(s.slot_ids)) for s in spans if s.job == job.job and (iv := _interval(s, now)) is not None]
    run_s = sum(e - s for (s, e), _ in intervals)
    gpu_s = sum((e - s) * n for (s, e), n in intervals)
    # The scheduler sees a job before it launches a run of it; a start before the submit is clock skew.
    wait_s = max(0.0, min(s for (s, _), _ in intervals) - float(job.submit_s)) if intervals else math.nan
    return {
        "jct_s": float(job.finish_s) - float(job.submit_s),
        "wait_s": float(wait_s),
        "run_s": float(run_s),
        "gpu_s": float(gpu_s),
        "generations": len(intervals),
    }


def _table(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], now_s: float) -> pd.DataFrame:
    rows = []
    for job in sorted(jobs, key=lambda j: j.finish_s):
        m = job_metrics(job, spans, now_s)
        rows.append({
            "job": job.job, "model": job.model, "jct_s": m["jct_s"], "wait_s": m["wait_s"], "run_s": m["run_s"],
            "restarts": int(job.restarts), "generations": int(m["generations"]), "gpu_s": m["gpu_s"],
            "accuracy": job.accuracy, "samples": job.samples,
        })
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    for col in TABLE_COLUMNS:
        if col in ("job", "model"):
            continue
        if col in _INT_COLUMNS:
            table[col] = table[col].astype("int64")
        else:  # None (no accuracy logged) becomes NaN, so the column stays float even when all are None
            table[col] = pd.to_numeric(table[col], errors="coerce").astype("float64")
    return table


def _summary(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], table: pd.DataFrame, num_slots: int,
             now_s: float) -> dict[str, float]:
    """Summary over the window [first submit, last finish] of the finished jobs.

    ``utilisation`` counts every span (finished jobs' and unfinished jobs') clipped to that window, so it
    is the cluster's occupancy while those jobs were in the system; ``gpu_s`` is the finished jobs' own.
    """
    if not jobs:
        return {"jobs": 0, "mean_jct_s": math.nan, "median_jct_s": math.nan, "p95_jct_s": math.nan,
                "makespan_s": 0.0, "utilisation": math.nan, "gpu_s": 0.0, "restarts": 0}
    jct = table["jct_s"].to_numpy(dtype=float)
    t0 = min(float(j.submit_s) for j in jobs)
    t1 = max(float(j.finish_s) for j in jobs)
    makespan = t1 - t0
    held = 0.0
    for span in spans:
        iv = _interval(span, now_s)
        if iv is not None:
            held += max(0.0, min(iv[1], t1) - max(iv[0], t0)) * len(span.slot_ids)
    return {
        "jobs": len(jobs),
        "mean_jct_s": float(np.mean(jct)),
        "median_jct_s": float(np.median(jct)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "makespan_s": float(makespan),
        "utilisation": float(held / (num_slots * makespan)) if makespan > 0 else math.nan,
        "gpu_s": float(table["gpu_s"].sum()),
        "restarts": int(table["restarts"].sum()),
    }


# -------------------------------------------------------------------------------------------- markdown


def _dur(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    if abs(seconds) < 3 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _num(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt)


def _cell(text: str) -> str:
    # A pipe would end the cell; a newline would end the row.
    return str(text).replace("|", "\\|").replace("\n", " ") or "–"


def summary_line(summary: dict[str, float], num_slots: int) -> str:
    if not summary["jobs"]:
        return f"**0 jobs finished** on {num_slots} slots."
    return (f"**{summary['jobs']} jobs finished** on {num_slots} slots: mean JCT {_dur(summary['mean_jct_s'])}, "
            f"median {_dur(summary['median_jct_s'])}, p95 {_dur(summary['p95_jct_s'])}; "
            f"makespan {_dur(summary['makespan_s'])}, utilisation {_num(summary['utilisation'], '.0%')}, "
            f"{summary['gpu_s'] / 3600:.2f} GPU-h, {summary['restarts']} restarts.")


def _markdown(table: pd.DataFrame, summary: dict[str, float], num_slots: int) -> str:
    header = ("| job | model | JCT | wait | run | restarts | generations | GPU-h | accuracy | samples |\n"
              "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    if table.empty:
        return f"_no finished jobs yet_\n\n{summary_line(summary, num_slots)}\n"
    lines = [header]
    for row in table.itertuples(index=False):
        lines.append(
            f"| {_cell(row.job)} | {_cell(row.model)} | {_dur(row.jct_s)} | {_dur(row.wait_s)} | {_dur(row.run_s)} "
            f"| {row.restarts} | {row.generations} | {row.gpu_s / 3600:.2f} | {_num(row.accuracy, '.4f')} "
            f"| {_num(row.samples, ',.0f')} |")
    return "\n".join(lines) + f"\n\n{summary_line(summary, num_slots)}\n"


def png_markdown(path: Path, alt: str, max_bytes: int = 400_000) -> str:
    """A markdown image with the PNG inlined as a base64 data URI (Dagster's UI renders markdown metadata),
    or a text line naming the file when it is larger than ``max_bytes``."""
    path = Path(path)
    data = path.read_bytes()
    alt = alt.replace("[", "(").replace("]", ")")
    if len(data) > max_bytes:
        return f"{alt}: `{path}` ({len(data) / 1e3:.0f} kB, over the {max_bytes / 1e3:.0f} kB inline limit)"
    return f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode('ascii')})"


# ------------------------------------------------------------------------------------------------ files


def _write_atomic(path: Path, write: Callable[[object], None]) -> Path:
    """Write through ``write(binary_file)`` into a temp file beside ``path``, then rename it over ``path``,
    so a reader (the Dagster UI, a notebook) never sees a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _json_safe(value: float) -> float | None:
    # JSON has no NaN; undefined statistics are written as null.
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on the Dagster code server; a no-op when Agg is already in use
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, path: Path) -> Path:
    plt = _pyplot()
    try:
        fig.tight_layout()
        return _write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=_DPI))
    finally:
        plt.close(fig)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_jct_cdf(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Empirical CDF of the finished jobs' JCT, minutes on x."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    jct_min = np.sort(table["jct_s"].to_numpy(dtype=float)) / 60.0
    if jct_min.size:
        frac = np.arange(1, jct_min.size + 1) / jct_min.size
        # Start the curve at (0, 0) so one job still draws a visible step.
        ax.step(np.r_[0.0, jct_min], np.r_[0.0, frac], where="post", lw=2, color="C0")
        ax.plot(jct_min, frac, "o", ms=3, color="C0")
        ax.axvline(np.mean(jct_min), color="k", lw=0.8, ls="--", label=f"mean {np.mean(jct_min):.1f} min")
        ax.set_xlim(0, jct_min[-1] * 1.05 if jct_min[-1] > 0 else 1.0)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("job completion time (minutes)")
        ax.set_ylabel("fraction of finished jobs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    else:
        _no_data(ax, "no finished jobs yet")
    ax.set_title(f"{title}: JCT CDF ({jct_min.size} finished jobs)" if title else "JCT CDF")
    return _save_figure(fig, path)


def plot_allocation(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], num_slots: int, path: Path,
                    title: str = "", now_s: float | None = None) -> Path:
    """Slots held over time: one horizontal bar per (span, slot), one colour per job, generation numbers on
    bars wide enough to hold them. Resizes and preemptions show as a job's colour moving between slots.
    Spans still running are hatched and end at ``now_s`` (default now)."""
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    now = time.time() if now_s is None else float(now_s)
    started = [(s, iv) for s in spans if (iv := _interval(s, now)) is not None and s.slot_ids]
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    if not started:
        _no_data(ax, "no finished jobs yet" if not jobs else "no run has started")
        ax.set_title(f"{title}: allocation over time" if title else "allocation over time")
        return _save_figure(fig, path)

    finished = {j.job for j in jobs}
    first_seen: dict[str, float] = {}
    for j in jobs:
        first_seen[j.job] = min(first_seen.get(j.job, math.inf), float(j.submit_s))
    for s, (t, _) in started:
        first_seen[s.job] = min(first_seen.get(s.job, math.inf), t)
    t0 = min(first_seen.values())
    order = sorted(first_seen, key=lambda name: (first_seen[name], name))
    cmap = plt.get_cmap("tab20")
    color = {name: cmap(i % 20) for i, name in enumerate(order)}

    x_max = max(e for _, (_, e) in started)
    x_max = max([x_max] + [float(j.finish_s) for j in jobs])
    x_range_min = max((x_max - t0) / 60.0, 1e-9)
    any_running = False
    for span, (start, end) in started:
        running = span.end_s is None
        any_running |= running
        left, width = (start - t0) / 60.0, (end - start) / 60.0
        for slot in span.slot_ids:
            ax.barh(slot, width, left=left, height=0.8, color=color[span.job], hatch="//" if running else None,
                    edgecolor="red" if span.status.upper() == "FAILURE" else "white", linewidth=0.6)
            if width / x_range_min >= _MIN_LABEL_FRACTION:
                ax.text(left + width / 2, slot, f"g{span.generation}", ha="center", va="center", fontsize=7,
                        color="black", clip_on=True)
    if any_running:
        ax.axvline((now - t0) / 60.0, color="k", lw=0.8, ls=":")

    slots_seen = [slot for s, _ in started for slot in s.slot_ids]
    lo, hi = min([0] + slots_seen), max([num_slots - 1] + slots_seen)
    ax.set_ylim(lo - 0.6, hi + 0.6)
    if hi - lo < 16:
        ax.set_yticks(range(lo, hi + 1))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
    ax.set_xlim(0, x_range_min * 1.02)
    ax.set_xlabel("minutes since the first submit")
    ax.set_ylabel("slot")
    ax.grid(axis="x", alpha=0.3)

    shown = order[:_MAX_LEGEND_JOBS]
    handles = [Patch(facecolor=color[n], label=n if n in finished else f"{n} (not finished)") for n in shown]
    if len(order) > len(shown):
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"+{len(order) - len(shown)} more"))
    if any_running:
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="still running"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{title}: allocation over time ({num_slots} slots)" if title
                 else f"allocation over time ({num_slots} slots)")
    return _save_figure(fig, path)


# ------------------------------------------------------------------------------------------------ report


def build_report(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], num_slots: int, out_dir: Path,
                 title: str = "ONES live cluster", *, now_s: float | None = None) -> ClusterReport:
    """Write ``out_dir``/jobs.csv, summary.json, jct_cdf.png and allocation.png (each atomically) and return
    the report. Works with no finished jobs and with spans of unfinished jobs (they appear in the
    allocation plot and count towards utilisation). Spans still running end at ``now_s`` (default now)."""
    if int(num_slots) != num_slots or num_slots < 1:
        raise ValueError(f"build_report: num_slots={num_slots!r}; expected a positive integer (cluster slots)")
    num_slots = int(num_slots)
    now = time.time() if now_s is None else float(now_s)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    table = _table(jobs, spans, now)
    summary = _summary(jobs, spans, table, num_slots, now)
    files = {
        "csv": _write_atomic(out_dir / "jobs.csv", lambda fh: fh.write(table.to_csv(index=False).encode())),
        "json": _write_atomic(out_dir / "summary.json", lambda fh: fh.write(json.dumps(
            {"title": title, "num_slots": num_slots, "summary": {k: _json_safe(v) for k, v in summary.items()}},
            indent=2).encode())),
        "jct_cdf": plot_jct_cdf(table, out_dir / "jct_cdf.png", title=title),
        "allocation": plot_allocation(jobs, spans, num_slots, out_dir / "allocation.png", title=title, now_s=now),
    }
    return ClusterReport(table=table, summary=summary, markdown=_markdown(table, summary, num_slots), files=files)
