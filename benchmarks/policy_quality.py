"""Mean JCT of every policy on the 8 Pollux workloads and the ONES trace (first 50 jobs, and all 400),
against the Pollux authors' published results and a lower bound.

Prints a table and writes it as markdown to ``docs/results.md`` with a JCT CDF plot per workload under
``docs/plots/``. Columns: the published Pollux (the authors' simulator,
``../shared/traces/pollux/results-published/pollux-1.0.json``, load 1.0 workloads only), our policies,
and the lower bound of ``ones_pipeline.sim.bound``. Pollux workloads run on 16 nodes x 4 GPUs, the ONES
trace on 64 GPUs (4 per node); 60 s rounds, 30 s per start/restart/resize. Also reports the wall time of
each simulation (target: under 2 minutes) and restarts per job.

Every finished simulation is cached as JSON under ``out/policy_quality/`` (per-job JCTs, the summary and
``code_digest`` of the code it ran on), so an interrupted run continues where it stopped; a record made by
other code is simulated again, and ``--fresh`` ignores the cache.

    python benchmarks/policy_quality.py [--workloads 1,6,ones50,0.5:1] [--policies pollux,sia] [--processes 2]

By default every workload of ``docs/results.md``: the 8 at load 1.0, the ONES trace (50 and 400 jobs),
and the 8 at the authors' loads 0.5 and 1.5 and at 1.25 (a load they did not publish).

``--bound-only``: recompute the bound's figures in ``--out`` (every table's bound column and the ratios to it,
the tight-bound and regimes sections included) from the policies' mean JCTs the document shows, simulating
nothing: the bound needs only the trace (``refresh_bounds``).

``--ones-params JSON``: ``ones`` with these options (cached apart, under a name with the options' hash), to
see a candidate setting's whole table, p99 and makespan included; write it with ``--out`` elsewhere than
``docs/results.md``, which shows the defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from ones_options import ones_options  # same folder (the script's folder is on sys.path)

from ones_pipeline import bench_workloads
from ones_pipeline.config import traces_dir_from_environment
from ones_pipeline.core.types import Cluster
from ones_pipeline.reporting import (
    keep_tight_bound,
    kept_section,
    per_load_table,
    plot_jct_cdf,
    tight_bound_per_load,
    with_section,
)
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.report import host, summarise
from ones_pipeline.sim.runner import ALL_POLICIES, WorkloadSpec, run_one

ROOT = Path(__file__).resolve().parents[1]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")
CACHE = ROOT / "out" / "policy_quality"
PUBLISHED = TRACES / "pollux" / "results-published" / "pollux-1.0.json"
ORDER = ("pollux", "sia", "ones", "ones-paper", "tiresias", "optimus", "fifo")
# docs/results.md: the load-1.0 workloads, the ONES trace, the authors' loads 0.5 and 1.5, and 1.25 (unseen).
DEFAULT_WORKLOADS = ("1", "2", "3", "4", "5", "6", "7", "8", "ones50", "ones400",
                     *(f"{load}:{n}" for load in ("0.5", "1.5", "1.25") for n in range(1, 9)))


def workloads(selected: list[str]) -> dict[str, WorkloadSpec]:
    """Workloads by token (``ones_pipeline.bench_workloads``), the traces from ``TRACES``."""
    return bench_workloads.workloads(selected, TRACES, CACHE)


def checked_workloads(parser, selected: list[str], flag: str) -> dict[str, WorkloadSpec]:
    """``workloads(selected)``, a bad token ending the program through ``parser.error`` naming ``flag``."""
    try:
        return workloads(selected)
    except (ValueError, KeyError) as exc:
        parser.error(f"{flag}: {exc} (tokens: {bench_workloads.TOKENS})")


def _config() -> SimConfig:
    return bench_workloads.sim_config()


def _job(args):
    label, spec, policy, seed, params = args
    t0 = time.perf_counter()
    result = run_one(spec, policy, Cluster.uniform(16, 4), _config(), seed, params)
    wall = time.perf_counter() - t0
    record = {"summary": summarise(result), "wall_s": wall, "jct_s": [j.jct_s for j in result.jobs],
              "restarts_per_job": float(np.mean([j.restarts for j in result.jobs])), "host": host()}
    return label, policy, record


code_digest = bench_workloads.code_digest


def _cache_path(label: str, policy: str, seed: int, params: dict | None = None) -> Path:
    """Where a simulation is cached; a policy run with options (``--ones-params``) under their hash."""
    if params:
        digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
        return CACHE / f"{label}-{policy}-{digest}-s{seed}.json"
    return CACHE / f"{label}-{policy}-s{seed}.json"


def _plot(label: str, jcts: dict[str, list[float]], path: Path) -> None:
    plot_jct_cdf(jcts, path, title=f"{label}: JCT CDF", unit="h", log_x=True, highlight="ones",
                 dashed={name for name in jcts if name.startswith("published")})


def _simulate(specs: dict[str, WorkloadSpec], policies: list[str], seed: int, processes: int,
              fresh: bool, ones_params: dict | None = None) -> dict[str, dict[str, dict]]:
    """``{workload: {policy: record}}``: cached records, and the missing simulations run in parallel
    (``ones_params``: options of ``ones``)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, dict]] = {label: {} for label in specs}
    params = {p: (ones_params or None) if p == "ones" else None for p in policies}
    code = {p: code_digest(p) for p in policies}
    tasks = []
    for label, spec in specs.items():
        for p in policies:
            path = _cache_path(label, p, seed, params[p])
            cached = json.loads(path.read_text()) if path.is_file() and not fresh else {}
            if cached.get("code") == code[p]:
                records[label][p] = cached
            else:
                tasks.append((label, spec, p, seed, params[p]))
    started = time.perf_counter()
    if tasks:
        print(f"{len(tasks)} simulations to run ({sum(len(r) for r in records.values())} cached)", file=sys.stderr)
        with ProcessPoolExecutor(max_workers=processes) as pool:
            futures = [pool.submit(_job, t) for t in tasks]
            for k, fut in enumerate(as_completed(futures), 1):
                label, policy, record = fut.result()
                records[label][policy] = record | {"code": code[policy]}
                _cache_path(label, policy, seed, params[policy]).write_text(json.dumps(records[label][policy]))
                print(f"[{time.perf_counter() - started:6.0f}s] {k}/{len(tasks)} {label} {policy}: mean JCT "
                      f"{record['summary']['mean_jct_s']:.0f} s ({record['wall_s']:.0f} s wall)",
                      file=sys.stderr, flush=True)
    return records


def _jct_table(specs: dict[str, WorkloadSpec], policies: list[str], records: dict[str, dict[str, dict]],
               published: dict, plots: Path) -> tuple[list[str], list[str], dict[str, dict[str, float]]]:
    """(markdown lines, text lines, mean JCT per workload and column) of the mean-JCT table; writes the
    CDF plot of each workload into ``plots``."""
    bounds = {label: lower_bound(spec.load(), Cluster.uniform(16, 4), _config()).mean_jct_s
              for label, spec in specs.items()}
    cols = ["published Pollux"] + policies + ["bound"]
    lines = ["| workload | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    text = [f"{'workload':<15}" + "".join(f"{c[:14]:>16}" for c in cols)]
    means_by: dict[str, dict[str, float]] = {}
    for label in specs:
        pub = published["avgs"].get(label)
        means = {p: records[label][p]["summary"]["mean_jct_s"] for p in policies}
        means_by[label] = {**means, "bound": bounds[label], **({"published Pollux": pub} if pub else {})}
        ref = pub or means.get("pollux")
        cells, tcells = [], []
        for c in cols:
            v = means_by[label].get(c)
            if v is None:
                cells.append("-")
                tcells.append(f"{'-':>16}")
                continue
            cells.append(f"{v:.0f} s ({v / ref:.2f}x)" if ref else f"{v:.0f} s")
            tcells.append(f"{v:>9.0f}s {v / ref:>4.2f}x" if ref else f"{v:>15.0f}s")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        text.append(f"{label:<15}" + "".join(f"{c:>16}" for c in tcells))
        if "@" in label:  # other loads: the table only (the plots are the load-1.0 workloads' and the ONES trace's)
            continue
        jcts = {p: records[label][p]["jct_s"] for p in policies}
        if label in published["jcts"]:
            jcts = {"published Pollux": list(published["jcts"][label].values()), **jcts}
        _plot(label, jcts, plots / f"jct_cdf-{label}.png")
    return lines, text, means_by


def _document(seed: int, ones_vs: str, lines: list[str], summary: list[str], rows_restart: list[str],
              slowest: tuple[float, str, str], labels: list[str], hosts: list[str] | None = None) -> str:
    doc = [
        "# Policy quality: mean job completion time",
        "",
        f"Generated by `python benchmarks/policy_quality.py` (seed {seed}). Cells: mean JCT in seconds and its",
        "ratio to the **published Pollux** (the Pollux authors' own simulator, `results-published/pollux-1.0.json`)",
        "where it exists, else to our `pollux`. Pollux workloads (packaged `pollux:workload-N`, 160 jobs each) on",
        "16 nodes x 4 GPUs; the ONES trace (first 50 jobs of `trace_1.csv`, as the paper's artifact, and all 400)",
        "on 64 GPUs, 4 per node. 60 s scheduling rounds, 30 s lost per start, restart or resize, nothing in place",
        "(`--change-costs pollux`, as the Pollux authors' simulator). `bound` is a",
        "lower bound on the mean JCT of any policy (`docs/simulator.md`). Ground truth and assumptions:",
        "`docs/simulator.md`; how `pollux` reproduces the published numbers: `docs/pollux_fidelity.md`.",
        "",
        *([ones_vs, ""] if ones_vs else []),
        *lines,
        "",
        *summary,
        "Restarts per job:",
        "",
        *rows_restart,
        "",
        f"Slowest single simulation: {slowest[1]} under {slowest[2]}, {slowest[0]:.0f} s wall on this machine.",
        "",
        *(["Simulated on: " + "; ".join(hosts) + ". The figures depend on the machine as well as the code: "
           "numpy's floating point can differ with its version and the CPU's SIMD extensions, and a simulation "
           "is chaotic (one different rounding changes a decision and the rest of the run). The same code gave "
           "`ones` per-workload figures up to 2.6 % apart on two machines, and a load-1.0 mean 0.4 % apart: "
           "compare policies simulated on one machine, and over seeds.", ""]
          if hosts else []),
        "## JCT CDFs",
        "",
        *[f"![{label}](plots/jct_cdf-{label}.png)" for label in labels if "@" not in label],
        "",
    ]
    return "\n".join(doc)


# ------------------------------------------------------------------------------- --bound-only: the bound, alone
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _secs(cell: str) -> float | None:
    """The seconds of a cell such as ``955 s (0.46x)``; None for ``-``."""
    return float(cell.split()[0]) if cell[:1].isdigit() else None


def _table(lines: list[str], head: int) -> tuple[list[str], range]:
    """(column names, line indices of the rows) of the markdown table whose header is ``lines[head]``."""
    end = head + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return _cells(lines[head]), range(head + 2, end)


def refresh_bounds(text: str, bounds: dict[str, float], regime_bounds: dict[str, float] | None = None) -> str:
    """``docs/results.md``'s text with every figure that derives from the fast bound recomputed from ``bounds``
    (workload label -> mean JCT bound, s), the policies' mean JCTs read from the document itself (no policy is
    simulated): the first table's ``bound`` column, the load-1.0 mean's ``bound`` row, the per-load table's
    ``bound`` and ``ones / bound``, the tight-bound section's ``fast bound`` and what derives from it
    (``tight / fast``, ``binds``, each policy's ratio to the larger bound, its per-load table), and, with
    ``regime_bounds`` (cell -> bound), the regimes table's ``bound``. Ratios come from the rounded seconds
    the document shows, so they can differ from a full regeneration's in the last digit."""
    lines = text.split("\n")
    means: dict[str, dict[str, float]] = {}
    for head in [i for i, line in enumerate(lines) if line.startswith("| workload | published Pollux |")][:1]:
        cols, rows = _table(lines, head)
        for i in rows:
            cells = _cells(lines[i])
            if cells[0] not in bounds:
                continue
            means[cells[0]] = {c: v for c, cell in zip(cols, cells, strict=True) if (v := _secs(cell)) is not None}
            ref = means[cells[0]].get("published Pollux") or means[cells[0]].get("pollux")
            b = means[cells[0]]["bound"] = bounds[cells[0]]
            cells[cols.index("bound")] = f"{b:.0f} s ({b / ref:.2f}x)" if ref else f"{b:.0f} s"
            lines[i] = _row(cells)
    for i, line in enumerate(lines):
        if line.startswith("Mean over the") and "published Pollux:" in line:
            pub = float(line.split("published Pollux:")[1].split()[0])
            main8 = [lab for lab, m in means.items() if "published Pollux" in m]
            j = next(k for k in range(i, len(lines)) if lines[k].startswith("| bound |"))
            b = float(np.mean([bounds[lab] for lab in main8]))
            lines[j] = f"| bound | {b:.0f} s | {b / pub:.3f}x |"
        elif line.startswith("| load | workloads | published Pollux |"):
            cols, rows = _table(lines, i)
            for k in rows:
                cells = _cells(lines[k])
                labs = [lab for lab in means if (lab.partition("@")[2] or "1.0") == cells[0]
                        and lab.startswith("workload-")]
                if not labs:
                    continue
                b = float(np.mean([bounds[lab] for lab in labs]))
                ones = float(np.mean([means[lab]["ones"] for lab in labs]))
                cells[cols.index("bound")] = f"{b:.0f} s"
                cells[cols.index("ones / bound")] = f"{ones / b:.3f}x"
                lines[k] = _row(cells)
        elif line.startswith("| workload | fast bound | tight bound |"):
            cols, rows = _table(lines, i)
            for k in rows:
                cells = _cells(lines[k])
                if cells[0] not in bounds:
                    continue
                fast, tight = bounds[cells[0]], _secs(cells[2])
                larger = max(fast, tight)
                cells[1:5] = [f"{fast:.0f} s", cells[2], f"{tight / fast:.2f}x", "tight" if tight > fast else "fast"]
                for c in range(7, len(cols)):
                    if (v := _secs(cells[c])) is not None:
                        cells[c] = f"{v:.0f} s ({v / larger:.2f}x)" + (" BELOW" if v < larger else "")
                lines[k] = _row(cells)
        elif line.startswith("| cell |") and regime_bounds:
            cols, rows = _table(lines, i)
            for k in rows:
                cells = _cells(lines[k])
                if cells[0] in regime_bounds:
                    cells[cols.index("bound")] = f"{regime_bounds[cells[0]]:.0f}"
                    lines[k] = _row(cells)
    # The tight-bound section's per-load table, from its (first) per-workload table.
    heads = [i for i, line in enumerate(lines) if line.startswith("| load | workloads | fast bound |")]
    firsts = [i for i, line in enumerate(lines) if line.startswith("| workload | fast bound | tight bound |")]
    if heads and firsts:
        _, rows = _table(lines, firsts[0])
        _, old = _table(lines, heads[0])
        lines[old.start - 2:old.stop] = tight_bound_per_load([lines[k] for k in rows], ORDER)
    return "\n".join(lines)


def regimes_bounds(text: str) -> dict[str, float]:
    """The bound of each cell of the regimes section of ``text`` (``benchmarks/regimes.py``: workload 1 where
    the section was made with ``--quick``, else 1 and 5), computed as that script computes it."""
    import regimes  # same folder; imported only here (it loads the ONES trace's catalogue)

    section = kept_section(text, "regimes")
    if not section:
        return {}
    workloads_ = [1] if "--quick" in section else [1, 5]
    out = {}
    for cell in regimes.CELLS:
        found = regimes.instances(cell, workloads_)
        if found:
            out[cell] = float(np.mean([lower_bound(jobs, cluster, config).mean_jct_s
                                       for _, jobs, cluster, config in found]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help="comma-separated tokens (see workloads()); default: every workload of docs/results.md")
    parser.add_argument("--policies", default=",".join(p for p in ORDER if p in ALL_POLICIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--fresh", action="store_true", help="ignore cached simulations")
    parser.add_argument("--ones-params", default="{}", help="JSON object of OnesPolicy options for ones")
    parser.add_argument("--bound-only", action="store_true",
                        help="recompute only the bound's figures in --out (refresh_bounds), simulating no policy")
    args = parser.parse_args()
    specs = workloads([w for w in args.workloads.split(",") if w])
    if args.bound_only:
        text = args.out.read_text()
        bounds = {label: lower_bound(spec.load(), Cluster.uniform(16, 4), _config()).mean_jct_s
                  for label, spec in specs.items()}
        args.out.write_text(refresh_bounds(text, bounds, regimes_bounds(text)))
        print("\n".join(f"{label}: {b:.0f} s" for label, b in bounds.items()))
        print(f"wrote the bound's figures into {args.out}")
        return
    policies = [p for p in args.policies.split(",") if p]
    published = json.loads(PUBLISHED.read_text()) if PUBLISHED.is_file() else {"jcts": {}, "avgs": {}}
    records = _simulate(specs, policies, args.seed, args.processes, args.fresh,
                        ones_options(parser, args.ones_params, "--ones-params"))

    plots = args.out.parent / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines, text, means_by = _jct_table(specs, policies, records, published, plots)
    main8 = [label for label in specs if label in published["avgs"]]
    summary = []
    if main8:
        pub_mean = float(np.mean([published["avgs"][label] for label in main8]))
        for p in policies + ["bound"]:
            m = float(np.mean([means_by[label][p] for label in main8]))
            summary.append(f"| {p} | {m:.0f} s | {m / pub_mean:.3f}x |")
        summary = [f"Mean over the {len(main8)} load-1.0 workloads (published Pollux: {pub_mean:.0f} s):", "",
                   "| policy | mean JCT | vs published Pollux |", "|---|---|---|", *summary, ""]
    summary += per_load_table(policies, records, means_by)
    rows_restart = ["| workload | " + " | ".join(policies) + " |", "|---|" + "---|" * len(policies)]
    for label in specs:
        rows_restart.append(f"| {label} | " + " | ".join(f"{records[label][p]['restarts_per_job']:.1f}"
                                                           for p in policies) + " |")
    walls = [(records[label][p]["wall_s"], label, p) for label in specs for p in policies]
    slowest = max(walls)
    print("\nmean JCT per policy (ratio to the published Pollux where given, else to our pollux)")
    print("\n".join(text))
    print("\n".join(summary))
    print(f"\nslowest simulation: {slowest[1]} / {slowest[2]}: {slowest[0]:.0f} s wall (target < 120 s)")

    ones_vs = ""
    if main8 and "ones" in policies:
        ratio = float(np.mean([means_by[label]["ones"] for label in main8])) / pub_mean
        word = "better" if ratio < 1 else "worse"
        ones_vs = (f"Against the published Pollux, `ones` is {abs(1 - ratio) * 100:.1f} % {word} on average over the "
                   f"load-1.0 workloads ({ratio:.3f}x).")
    unknown = "not recorded (records made before this was noted)"
    hosts = sorted({records[label][p].get("host", unknown) for label in specs for p in policies})
    doc = _document(args.seed, ones_vs, lines, summary, rows_restart, slowest, list(specs), hosts)
    old = args.out.read_text() if args.out.is_file() else ""
    doc = keep_tight_bound(old, doc)  # benchmarks/tight_bound.py's section stays
    for name in ("regimes", "in-place"):  # and benchmarks/regimes.py's and in_place.py's
        if kept := kept_section(old, name):
            doc = with_section(doc, name, kept.split("\n", 1)[1].rsplit("\n", 1)[0])
    args.out.write_text(doc)
    print(f"wrote {args.out} and {plots}/")


if __name__ == "__main__":
    main()
