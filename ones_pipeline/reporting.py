"""Tables, statistics and plots shared by the simulator's report and the live cluster report.

:mod:`ones_pipeline.sim.report` (``ones simulate --out``) and :mod:`ones_pipeline.adapters.live_report` (the
Dagster report asset) both build their outputs from these pieces: JCT statistics, duration formats, text
and markdown tables, atomic file writes, the JCT CDF plot and the two allocation-over-time plots (GPUs held
per job, stacked, when only counts are known; slots held per job as bars, when slot ids are known).
Plots use matplotlib's Agg backend (no display on a Dagster code server or in CI) and are written
atomically, so a reader never sees a half-written file.

Durations are seconds (``*_s``); plots convert to the unit they show.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_UNITS = {"h": (3600.0, "hours", ".2f"), "min": (60.0, "minutes", ".1f")}  # divisor, axis word, mean format
# A bar gets its label written on it when it spans at least this fraction of the x range.
_MIN_LABEL_FRACTION = 0.037  # of the x range per 3 label characters (fontsize 9 on the 8 in figure)
_MAX_LEGEND_JOBS = 20


# --------------------------------------------------------------------------------------------- statistics
def jct_statistics(jct_s: Sequence[float], percentiles: Sequence[int] = (95,)) -> dict[str, float]:
    """``mean_jct_s``, ``median_jct_s`` and ``p<q>_jct_s`` for each ``q`` in ``percentiles``; NaN when empty."""
    jct = np.asarray(jct_s, dtype=float)
    if not jct.size:
        return {"mean_jct_s": math.nan, "median_jct_s": math.nan, **{f"p{q}_jct_s": math.nan for q in percentiles}}
    return {"mean_jct_s": float(np.mean(jct)), "median_jct_s": float(np.median(jct)),
            **{f"p{q}_jct_s": float(np.percentile(jct, q)) for q in percentiles}}


# --------------------------------------------------------------------------------------------- formatting
def hours_or_seconds(seconds: float) -> str:
    """Compact, for fixed-width text tables: ``1.30h`` from an hour up, else ``563s``."""
    return f"{seconds / 3600:.2f}h" if seconds >= 3600 else f"{seconds:.0f}s"


def human_duration(seconds: float | None) -> str:
    """For prose and markdown: ``45 s``, ``9.4 min`` (from 2 min), ``3.10 h`` (from 3 h); ``–`` if undefined."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    if abs(seconds) < 3 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def format_number(value: float | None, fmt: str) -> str:
    """``format(value, fmt)``, or ``–`` for a missing or non-finite value."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt)


def markdown_cell(text: Any) -> str:
    """``text`` safe inside a markdown table cell (``–`` when empty)."""
    # A pipe would end the cell; a newline would end the row.
    return str(text).replace("|", "\\|").replace("\n", " ") or "–"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table; ``align`` has one letter per column, ``l`` or ``r`` (default: all left)."""
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"markdown_table: align {align!r}; expected one of 'l', 'r' per column ({len(header)})")
    lines = ["| " + " | ".join(markdown_cell(h) for h in header) + " |",
             "|" + "".join("---|" if a == "l" else "--:|" for a in align)]
    lines += ["| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width text table: ``columns`` are (title, format spec such as ``<11`` or ``>9``), cells are
    strings, joined by one space under a rule as wide as the header. A row may have fewer cells; a cell
    wider than its column is written whole (so a last, free-text cell can run on)."""
    header = " ".join(f"{title:{spec}}" for title, spec in columns)
    lines = [header, "-" * len(header)]
    lines += [" ".join(f"{cell:{spec}}" for cell, (_, spec) in zip(row, columns, strict=False)) for row in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- files
def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process's umask (read from /proc, so the umask is
    never changed, not even for a moment; elsewhere through a set-and-restore)."""
    try:
        with open("/proc/self/status") as fh:
            umask = next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, write: Callable[[Any], object]) -> Path:
    """Write through ``write(binary_file)`` into a temp file beside ``path``, then rename it over ``path``,
    so a reader (the Dagster UI, a notebook) never sees a half-written file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp's 0600 would outlive the rename
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` (UTF-8) to ``path``, atomically."""
    return write_atomic(path, lambda fh: fh.write(text.encode()))


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """``payload`` as indented JSON, atomically (NaN is written as JSON has no NaN: pass :func:`json_safe`
    values where a strict reader follows)."""
    return write_text(path, json.dumps(payload, indent=2))


def write_csv(path: str | os.PathLike, frame) -> Path:
    """A pandas DataFrame as CSV without its index, atomically."""
    return write_text(path, frame.to_csv(index=False))


def json_safe(value: Any) -> Any:
    """``None`` for a non-finite float (JSON has no NaN), else ``value``."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


# ------------------------------------------------------------------------------------------------- plots
def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (a no-op switch when Agg is already in use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | os.PathLike, dpi: int) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG (atomically) and close it."""
    plt = pyplot()
    try:
        fig.tight_layout()
        return write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
    finally:
        plt.close(fig)


def no_data(ax, text: str) -> None:
    """A grey note in the middle of an empty plot, without ticks."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# tab20 pairs a dark and a light shade of each hue (0/1, 2/3, ...): neighbours in job order would look
# alike. The ten dark shades first, then the ten light ones: 20 jobs in a row get 20 distinct colours and
# two jobs of one hue are 10 apart.
_TAB20_ORDER = tuple(range(0, 20, 2)) + tuple(range(1, 20, 2))


def job_colors(names: Sequence[str]) -> dict[str, Any]:
    """One colour per job, in the order given: the 20 colours of tab20, dark shades first, repeating after
    20 jobs."""
    cmap = pyplot().get_cmap("tab20")
    return {name: cmap(_TAB20_ORDER[i % 20]) for i, name in enumerate(names)}


def plot_jct_cdf(jct_s: Mapping[str, Sequence[float]], path: str | os.PathLike, *, title: str, unit: str = "h",
                 log_x: bool = False, highlight: str | None = None, dashed: Collection[str] = (),
                 points: bool = False, mean_line: bool = False, ylabel: str = "fraction of jobs",
                 empty_text: str = "no data", figsize: tuple[float, float] = (7, 4.5), dpi: int = 110) -> Path:
    """Empirical CDF of job completion times, one step curve per entry of ``jct_s`` (seconds).

    ``unit``: ``"h"`` or ``"min"`` on x. A curve named ``highlight`` is drawn thicker, names in ``dashed``
    dashed; a non-empty name labels its curve with its mean. On a linear axis (``log_x`` False) each curve
    starts at (0, 0), so one job still draws a visible step, and the axes start at 0. ``points`` marks
    every job, ``mean_line`` draws each curve's mean as a vertical line. Returns ``path``.
    """
    if unit not in _UNITS:
        raise ValueError(f"plot_jct_cdf: unit {unit!r}; allowed: {', '.join(_UNITS)}")
    scale, word, mean_fmt = _UNITS[unit]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    curves = {name: np.sort(np.asarray(v, dtype=float)) / scale for name, v in jct_s.items() if len(v)}
    if not curves:
        no_data(ax, empty_text)
        ax.set_title(title)
        return save_png(fig, path, dpi)
    for i, (name, x) in enumerate(curves.items()):
        frac = np.arange(1, x.size + 1) / x.size
        color = f"C{i % 10}"
        label = f"{name} (mean {np.mean(x):{mean_fmt}} {unit})" if name else None
        xs, ys = (x, frac) if log_x else (np.r_[0.0, x], np.r_[0.0, frac])
        ax.step(xs, ys, where="post", label=label, lw=2 if name == highlight else 1.3, color=color,
                ls="--" if name in dashed else "-")
        if points:
            ax.plot(x, frac, "o", ms=3, color=color)
        if mean_line:
            ax.axvline(np.mean(x), color="k", lw=0.8, ls="--", label=f"mean {np.mean(x):{mean_fmt}} {unit}")
    if log_x:
        ax.set_xscale("log")
    else:
        last = max(float(x[-1]) for x in curves.values())
        ax.set_xlim(0, last * 1.05 if last > 0 else 1.0)
        ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"job completion time ({word}{', log scale' if log_x else ''})")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both" if log_x else "major")
    ax.legend(fontsize=8, loc="lower right")
    return save_png(fig, path, dpi)


def plot_gpus_held(times_s: np.ndarray, names: Sequence[str], held: np.ndarray, capacity: int,
                   path: str | os.PathLike, *, title: str, figsize: tuple[float, float] = (9, 4.5),
                   dpi: int = 110) -> Path:
    """Stacked area of the GPUs each job holds over time (hours on x), with the cluster's ``capacity``
    dashed. ``held`` is (jobs, times): GPUs of job ``j`` from ``times_s[t]`` until the next time."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    if np.size(times_s):
        colors = job_colors(names)
        ax.stackplot(np.asarray(times_s) / 3600.0, held, step="post", colors=[colors[n] for n in names],
                     linewidth=0)
    ax.axhline(capacity, color="k", lw=0.8, ls="--")
    ax.set_ylim(0, capacity * 1.05)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs held (one colour per job)")
    ax.set_title(title)
    return save_png(fig, path, dpi)


@dataclass(frozen=True)
class SlotBar:
    """One job holding one slot from ``start_s`` to ``end_s`` (seconds, e.g. unix time)."""

    job: str
    slot: int
    start_s: float
    end_s: float
    label: str = ""  # written on the bar when it is wide enough (e.g. the generation, "g2")
    running: bool = False  # still running: hatched
    failed: bool = False  # outlined in red


def plot_slot_bars(bars: Sequence[SlotBar], jobs: Sequence[str], num_slots: int, path: str | os.PathLike, *,
                   title: str, origin_s: float, end_s: float, now_s: float | None = None,
                   unfinished: Collection[str] = (), figsize: tuple[float, float] = (8, 4.5), dpi: int = 100,
                   slot_label: str = "slot") -> Path:
    """Slots held over time, minutes since ``origin_s`` on x up to ``end_s``: one horizontal bar per (job,
    slot) interval, one colour per job in the order of ``jobs`` (the legend lists at most 20, marking those
    in ``unfinished``), labels on bars wide enough to hold them and, when a bar is still running, a dotted
    line at ``now_s``. ``bars`` must not be empty (draw :func:`no_data` instead)."""
    plt = pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=figsize)
    color = job_colors(jobs)
    x_range_min = max((end_s - origin_s) / 60.0, 1e-9)
    for bar in bars:
        left, width = (bar.start_s - origin_s) / 60.0, (bar.end_s - bar.start_s) / 60.0
        ax.barh(bar.slot, width, left=left, height=0.8, color=color[bar.job], hatch="//" if bar.running else None,
                edgecolor="red" if bar.failed else "white", linewidth=0.6)
        if bar.label and width / x_range_min >= _MIN_LABEL_FRACTION * max(1.0, len(bar.label) / 3):  # fits
            ax.text(left + width / 2, bar.slot, bar.label, ha="center", va="center", fontsize=9, color="black",
                    clip_on=True)
    any_running = any(b.running for b in bars)
    if any_running and now_s is not None:
        ax.axvline((now_s - origin_s) / 60.0, color="k", lw=0.8, ls=":")

    slots_seen = [b.slot for b in bars]
    lo, hi = min([0] + slots_seen), max([num_slots - 1] + slots_seen)
    ax.set_ylim(lo - 0.6, hi + 0.6)
    if hi - lo < 16:
        ax.set_yticks(range(lo, hi + 1))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
    ax.set_xlim(0, x_range_min * 1.02)
    ax.set_xlabel("minutes since the first submit")
    ax.set_ylabel(slot_label)
    ax.grid(axis="x", alpha=0.3)

    shown = list(jobs[:_MAX_LEGEND_JOBS])
    handles = [Patch(facecolor=color[n], label=f"{n} (not finished)" if n in unfinished else n) for n in shown]
    if len(jobs) > len(shown):
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"+{len(jobs) - len(shown)} more"))
    if any_running:
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="still running"))
    ax.legend(handles=handles, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title)
    return save_png(fig, path, dpi)


def kept_section(text: str, name: str) -> str:
    """The block of ``text`` between ``<!-- name -->`` and ``<!-- /name -->`` (markers included), "" if
    there is none: a section one script writes into a document another script regenerates."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    i, j = text.find(start), text.find(end)
    return text[i:j + len(end)] if 0 <= i < j else ""


def with_section(text: str, name: str, body: str) -> str:
    """``text`` with its ``name`` section (``kept_section``) replaced by ``body`` between the markers, or
    the section appended when there is none."""
    block = f"<!-- {name} -->\n{body.strip()}\n<!-- /{name} -->"
    old = kept_section(text, name)
    return text.replace(old, block) if old else text.rstrip() + "\n\n" + block + "\n"


def keep_tight_bound(old: str, new: str) -> str:
    """``new`` with the tight-bound section of ``old`` (written by ``benchmarks/tight_bound.py``, which this
    script does not compute) kept before the JCT CDFs."""
    start = old.find("## The tight lower bound")
    if start < 0:
        return new
    end = old.find("## JCT CDFs", start)
    section = old[start:end if end >= 0 else len(old)].rstrip() + "\n\n"
    at = new.find("## JCT CDFs")
    return new[:at] + section + new[at:] if at >= 0 else new + "\n" + section


# ------------------------------------------------------------------------------------------------- per-load table
def tight_bound_per_load(rows: Sequence[str], policies: Sequence[str]) -> list[str]:
    """Markdown per load from the per-workload rows: the mean bound (the larger of the two), each policy's
    mean JCT over the load's workloads as a ratio of the means to it, and the best schedule we have (per
    workload the policy with the least mean JCT) against it. ``rows``: the tight-bound section's per-workload
    lines (workload, fast bound, tight bound, four columns, then published Pollux and ``policies``' mean JCTs)."""
    groups: dict[str, list[list[str]]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not cells[0].startswith(("workload-", "ones-trace")):
            continue
        load = cells[0].split("@")[1] if "@" in cells[0] else ("1.0" if cells[0].startswith("workload-") else cells[0])
        groups.setdefault(load, []).append(cells)
    names = ("published Pollux", *policies)
    out = ["| load | workloads | fast bound | tight bound | tight / fast | " + " | ".join(names)
           + " | best schedule / bound |", "|---|" + "---|" * (5 + len(names))]
    for load, rows_ in groups.items():
        num = lambda c: float(c.split()[0]) if c[:1].isdigit() else None  # noqa: E731
        fast = [num(r[1]) for r in rows_]
        tight = [num(r[2]) for r in rows_]
        bound = sum(max(f, t) for f, t in zip(fast, tight, strict=True)) / len(rows_)
        cells = []
        for i in range(len(names)):
            vals = [num(r[7 + i]) for r in rows_]
            cells.append("-" if None in vals else f"{sum(vals) / len(vals) / bound:.2f}x")
        best = sum(min(v for v in (num(c) for c in r[7:]) if v is not None) for r in rows_) / len(rows_)
        out.append(f"| {load} | {len(rows_)} | {sum(fast) / len(fast):.0f} s | {sum(tight) / len(tight):.0f} s | "
                   f"{sum(tight) / sum(fast):.2f}x | " + " | ".join(cells) + f" | {best / bound:.2f}x |")
    return out


def _load_of(label: str) -> str | None:
    """The load of a Pollux workload label of ``benchmarks/policy_quality.py`` (``workload-3`` -> ``1.0``,
    ``workload-3@1.5`` -> ``1.5``); None for another workload."""
    if not label.startswith("workload-"):
        return None
    return label.partition("@")[2] or "1.0"


def _ratio(value: float, ref: float | None) -> str:
    return f"{value / ref:.3f}x" if ref else "-"


def _tail(records: dict[str, dict[str, dict]], labels: list[str], key: str) -> str:
    """``ones``'s summary ``key`` against ``pollux``'s over ``labels``: the worst workload's ratio, then the
    ratio of the means over the workloads (``1.10x / 1.03x``)."""
    ones = np.array([records[x]["ones"]["summary"][key] for x in labels])
    pollux = np.array([records[x]["pollux"]["summary"][key] for x in labels])
    return f"{float(np.max(ones / pollux)):.2f}x / {float(ones.mean() / pollux.mean()):.2f}x"


def per_load_table(policies: list[str], records: dict[str, dict[str, dict]],
                means_by: dict[str, dict[str, float]]) -> list[str]:
    """Markdown lines of ``benchmarks/policy_quality.py``'s per-load table (``records``: workload label ->
    policy -> its cached record, with ``summary`` and ``restarts_per_job``; ``means_by``: workload label ->
    column -> mean JCT, the bound and the published Pollux among the columns): per load, each policy's mean
    JCT over that load's workloads; ``ones`` against the
    published Pollux (load 1.0), our ``pollux`` and ``sia`` and the bound (ratios of the means), its p99 JCT
    and makespan against ``pollux``'s (worst workload, and ratio of the means), and restarts per job of
    ``pollux``, ``sia`` and ``ones`` (mean over the workloads)."""
    groups: dict[str, list[str]] = {}
    for label in means_by:
        if (load := _load_of(label)) is not None:
            groups.setdefault(load, []).append(label)
    if not groups or "ones" not in policies:
        return []
    cols = [p for p in policies if p in ("pollux", "sia", "ones")]
    lines = ["Per load (mean over the load's Pollux workloads; ratios of the means; p99 and makespan: worst "
             "workload / ratio of the means; restarts per job, mean over the workloads):", "",
             "| load | workloads | published Pollux | " + " | ".join(cols)
             + " | bound | ones / published | ones / pollux | ones / sia | ones / bound | p99 / pollux | "
             "makespan / pollux | restarts per job (" + ", ".join(cols) + ") |", "|---|" + "---|" * (len(cols) + 10)]
    for load in sorted(groups, key=float):
        labs = groups[load]
        mean = {c: float(np.mean([means_by[lab][c] for lab in labs])) for c in cols + ["bound"]}
        pubs = [means_by[lab].get("published Pollux") for lab in labs]
        pub = float(np.mean(pubs)) if all(pubs) else None
        ratios = [_ratio(mean["ones"], ref) for ref in (pub, mean.get("pollux"), mean.get("sia"), mean["bound"])]
        tails = [_tail(records, labs, key) if "pollux" in cols else "-" for key in ("p99_jct_s", "makespan_s")]
        restarts = " / ".join(f"{np.mean([records[lab][c]['restarts_per_job'] for lab in labs]):.1f}" for c in cols)
        lines.append(f"| {load} | {len(labs)} | {f'{pub:.0f} s' if pub else '-'} | "
                     + " | ".join(f"{mean[c]:.0f} s" for c in cols) + f" | {mean['bound']:.0f} s | "
                     + " | ".join(ratios + tails) + f" | {restarts} |")
    return lines + [""]
