"""The live cluster report, built from plain records (no Dagster): per-job table, summary, CSV/JSON, plots.

The Dagster asset gathers the records (one ``RunSpan`` per run of a training job, one ``FinishedJob`` per
materialized job), calls ``build_report`` and attaches ``ClusterReport.markdown`` and ``png_markdown`` of
the plots as metadata. Everything here is a pure function of its inputs except the files it writes and
the clock read for spans still running when ``now_s`` is not given.

Times are unix seconds; durations are seconds (``*_s``). Plots show minutes since the first submit.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ones_pipeline import reporting

TABLE_COLUMNS = ("job", "model", "jct_s", "wait_s", "run_s", "restarts", "generations", "gpu_s", "accuracy",
                 "samples")
SUMMARY_KEYS = ("jobs", "mean_jct_s", "median_jct_s", "p95_jct_s", "makespan_s", "utilisation", "gpu_s",
                "restarts")
_INT_COLUMNS = ("restarts", "generations")
_DPI = 100
_FIGSIZE = (8, 4.5)
_dur = reporting.human_duration
_num = reporting.format_number


@dataclass(frozen=True)
class RunSpan:
    """One Dagster run of a training job (one generation) holding ``slot_ids`` from ``start_s`` to ``end_s``; a run
    changed in place is one span per slot set it held (``scheduler.runs.held_periods``)."""

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
    gpu_s = sum(duration x len(slot_ids)); generations = number of generations with a span that started.

    ``spans`` may hold other jobs' spans (they are ignored). Spans still running count up to ``now_s``
    (default ``time.time()``). ``wait_s`` is NaN when no span started.
    """
    now = time.time() if now_s is None else float(now_s)
    mine = [(s, iv) for s in spans if s.job == job.job and (iv := _interval(s, now)) is not None]
    intervals = [(iv, len(s.slot_ids)) for s, iv in mine]
    run_s = sum(e - s for (s, e), _ in intervals)
    gpu_s = sum((e - s) * n for (s, e), n in intervals)
    # The scheduler sees a job before it launches a run of it; a start before the submit is clock skew.
    wait_s = max(0.0, min(s for (s, _), _ in intervals) - float(job.submit_s)) if intervals else math.nan
    return {
        "jct_s": float(job.finish_s) - float(job.submit_s),
        "wait_s": float(wait_s),
        "run_s": float(run_s),
        "gpu_s": float(gpu_s),
        "generations": len({s.generation for s, _ in mine}),
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


def _pending_window(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], now_s: float) -> list[tuple[float, float]]:
    """The union of the times some work was in the system: each finished job from submit to finish, each
    run of a job not finished yet from its start to its end (or now), as sorted disjoint intervals."""
    finished = {j.job for j in jobs}
    intervals = [(float(j.submit_s), float(j.finish_s)) for j in jobs]
    intervals += [iv for s in spans if s.job not in finished and (iv := _interval(s, now_s)) is not None]
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _summary(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], table: pd.DataFrame, num_slots: int,
             now_s: float) -> dict[str, float]:
    """Summary of the finished jobs; ``utilisation`` is the share of slot-time held over the time work was
    pending (``_pending_window``: also unfinished jobs' runs, not idle gaps between jobs); ``gpu_s`` is the
    finished jobs' own slot-seconds."""
    stats = reporting.jct_statistics(table["jct_s"].to_numpy(dtype=float), percentiles=(95,))
    if not jobs:
        return {"jobs": 0, **stats, "makespan_s": 0.0, "utilisation": math.nan, "gpu_s": 0.0, "restarts": 0}
    makespan = max(float(j.finish_s) for j in jobs) - min(float(j.submit_s) for j in jobs)
    window = _pending_window(jobs, spans, now_s)
    pending_s = sum(b - a for a, b in window)
    held = 0.0
    for span in spans:
        iv = _interval(span, now_s)
        if iv is not None:
            held += sum(max(0.0, min(iv[1], b) - max(iv[0], a)) for a, b in window) * len(span.slot_ids)
    return {
        "jobs": len(jobs),
        **stats,
        "makespan_s": float(makespan),
        "utilisation": float(held / (num_slots * pending_s)) if pending_s > 0 else math.nan,
        "gpu_s": float(table["gpu_s"].sum()),
        "restarts": int(table["restarts"].sum()),
    }


# -------------------------------------------------------------------------------------------- markdown


def slot_words(device: str) -> tuple[str, str]:
    """(slots, slot-hours) in words: GPUs are GPUs; CPU slots are not called GPUs."""
    return ("GPUs", "GPU-h") if device == "gpu" else ("CPU slots", "CPU-slot-h")


def summary_line(summary: dict[str, float], num_slots: int, device: str = "gpu") -> str:
    """One bold sentence: jobs finished, JCT statistics, makespan, utilisation, slot-hours, restarts."""
    slots, hours = slot_words(device)
    if not summary["jobs"]:
        return f"**0 jobs finished** on {num_slots} {slots}."
    return (f"**{summary['jobs']} jobs finished** on {num_slots} {slots}: mean JCT {_dur(summary['mean_jct_s'])}, "
            f"median {_dur(summary['median_jct_s'])}, p95 {_dur(summary['p95_jct_s'])}; "
            f"makespan {_dur(summary['makespan_s'])}, utilisation {_num(summary['utilisation'], '.0%')} "
            f"(while work was pending), {summary['gpu_s'] / 3600:.2f} {hours}, {summary['restarts']} "
            f"restart{'' if summary['restarts'] == 1 else 's'}.")


def _unit(seconds: Sequence[float]) -> tuple[str, float]:
    """One unit for a whole column, from its largest value: (name, seconds per unit)."""
    top = max((abs(v) for v in seconds if math.isfinite(v)), default=0.0)
    return ("s", 1.0) if top < 120 else ("min", 60.0) if top < 3 * 3600 else ("h", 3600.0)


def _markdown(table: pd.DataFrame, summary: dict[str, float], num_slots: int, device: str = "gpu") -> str:
    if table.empty:
        return f"_no finished jobs yet_\n\n{summary_line(summary, num_slots, device)}\n"
    unit, per = _unit(list(table["jct_s"]))  # JCT, wait and run in one unit
    digits = ".0f" if unit == "s" else ".1f" if unit == "min" else ".2f"
    rows = [(row.job, row.model, _num(row.jct_s / per, digits), _num(row.wait_s / per, digits),
             _num(row.run_s / per, digits), row.restarts, row.generations, f"{row.gpu_s / 3600:.2f}",
             _num(row.accuracy, ".4f"), _num(row.samples, ",.0f"))
            for row in table.itertuples(index=False)]
    header = ("job", "model", f"JCT ({unit})", f"wait ({unit})", f"run ({unit})", "restarts", "generations",
              slot_words(device)[1], "accuracy", "samples")
    return (reporting.markdown_table(header, rows, align="llrrrrrrrr")
            + f"\n\n{summary_line(summary, num_slots, device)}\n")


def png_markdown(path: Path, alt: str, max_bytes: int = 400_000) -> str:
    """A markdown image with the PNG inlined as a base64 data URI (Dagster's UI renders markdown metadata),
    or a text line naming the file when it is larger than ``max_bytes``."""
    path = Path(path)
    data = path.read_bytes()
    alt = alt.replace("[", "(").replace("]", ")")
    if len(data) > max_bytes:
        return f"{alt}: `{path}` ({len(data) / 1e3:.0f} kB, over the {max_bytes / 1e3:.0f} kB inline limit)"
    return f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode('ascii')})"


# ------------------------------------------------------------------------------------------------ plots


def plot_jct_cdf(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Empirical CDF of the finished jobs' JCT, minutes on x."""
    n = len(table)
    return reporting.plot_jct_cdf(
        {"": table["jct_s"].to_numpy(dtype=float)}, path, unit="min", highlight="", points=True, mean_line=True,
        ylabel="fraction of finished jobs", empty_text="no finished jobs yet",
        title=f"{title}: JCT CDF ({n} finished jobs)" if title else "JCT CDF", figsize=_FIGSIZE, dpi=_DPI)


def plot_allocation(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], num_slots: int, path: Path,
                    title: str = "", now_s: float | None = None, device: str = "gpu") -> Path:
    """Slots held over time: one horizontal bar per (span, slot), one colour per job (in order of first
    submit or start), generation numbers on bars wide enough to hold them. Resizes and preemptions show as
    a job's colour moving between slots. Spans still running are hatched and end at ``now_s`` (default
    now)."""
    now = time.time() if now_s is None else float(now_s)
    started = [(s, iv) for s in spans if (iv := _interval(s, now)) is not None and s.slot_ids]
    if not started:
        fig, ax = reporting.pyplot().subplots(figsize=_FIGSIZE)
        reporting.no_data(ax, "no finished jobs yet" if not jobs else "no run has started")
        ax.set_title(f"{title}: allocation over time" if title else "allocation over time")
        return reporting.save_png(fig, path, _DPI)

    first_seen: dict[str, float] = {}
    for j in jobs:
        first_seen[j.job] = min(first_seen.get(j.job, math.inf), float(j.submit_s))
    for s, (t, _) in started:
        first_seen[s.job] = min(first_seen.get(s.job, math.inf), t)
    order = sorted(first_seen, key=lambda name: (first_seen[name], name))
    # The job's name on its bars (with the generation), so a plot of 12+ jobs reads without the legend.
    bars = [reporting.SlotBar(span.job, slot, start, end, f"{span.job} g{span.generation}", running=span.end_s is None,
                              failed=span.status.upper() == "FAILURE")
            for span, (start, end) in started for slot in span.slot_ids]
    end_s = max([max(e for _, (_, e) in started)] + [float(j.finish_s) for j in jobs])
    finished = {j.job for j in jobs}
    return reporting.plot_slot_bars(
        bars, order, num_slots, path, origin_s=min(first_seen.values()), end_s=end_s, now_s=now,
        unfinished=[n for n in order if n not in finished], figsize=_FIGSIZE, dpi=_DPI,
        slot_label="GPU" if device == "gpu" else "CPU slot",
        title=f"{title + ': ' if title else ''}allocation over time ({num_slots} {slot_words(device)[0]})")


# ------------------------------------------------------------------------------------------------ report


def build_report(jobs: Sequence[FinishedJob], spans: Sequence[RunSpan], num_slots: int, out_dir: Path,
                 title: str = "ONES live cluster", *, now_s: float | None = None, device: str = "gpu") -> ClusterReport:
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
        "csv": reporting.write_csv(out_dir / "jobs.csv", table),
        "json": reporting.write_json(out_dir / "summary.json", {
            "title": title, "num_slots": num_slots,
            "summary": {k: reporting.json_safe(v) for k, v in summary.items()}}),
        "jct_cdf": plot_jct_cdf(table, out_dir / "jct_cdf.png", title=title),
        "allocation": plot_allocation(jobs, spans, num_slots, out_dir / "allocation.png", title=title, now_s=now,
                                      device=device),
    }
    return ClusterReport(table=table, summary=summary, markdown=_markdown(table, summary, num_slots, device),
                         files=files)
