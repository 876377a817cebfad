"""The tight lower bound (``sim/tight_bound.py``) per workload of ``docs/results.md``, against today's (fast)
bound and every policy's mean JCT there.

For each workload: the fast bound, the tight (Lagrangian) bound, their ratio, the seconds the tight one took
(wall and process CPU), the master LP's value (the relaxation's optimum lies between it and the bound), and
each policy's mean JCT read from ``docs/results.md`` (no policy is simulated) with its ratio to the larger
bound. A policy below the bound (impossible for a valid bound) is flagged. Writes the markdown table to
``--out`` when given (default: print only).

    python benchmarks/tight_bound.py [--workloads 1,6,0.5:2,ones50] [--budget 90] [--out FILE]
    python benchmarks/tight_bound.py --summarise FILE...   # per-load table from tables written by --out
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from policy_quality import DEFAULT_WORKLOADS, ORDER, _config, workloads  # same folder (on sys.path)

from ones_pipeline.core.types import Cluster
from ones_pipeline.reporting import tight_bound_per_load
from ones_pipeline.sim.tight_bound import tight_bound

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"


def published_means(path: Path = RESULTS) -> dict[str, dict[str, float]]:
    """``{workload: {policy: mean JCT}}`` from the first table of ``docs/results.md``."""
    lines = path.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| workload |"))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    out: dict[str, dict[str, float]] = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = {c: float(m.group(1)) for c, v in zip(cols[1:], cells[1:], strict=True)
                         if (m := re.match(r"([\d.]+) s", v))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--budget", type=float, default=90.0, help="seconds of column generation per workload")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    ap.add_argument("--summarise", type=Path, nargs="+", default=None,
                    help="print the per-load table of these tables (written by --out) and stop")
    args = ap.parse_args(argv)
    if args.summarise:
        rows = [line for f in args.summarise for line in f.read_text().splitlines()]
        print("\n".join(tight_bound_per_load(rows, ORDER)))
        return 0
    specs = workloads(args.workloads.split(","))
    means = published_means()
    policies = [p for p in ("published Pollux", *ORDER)]
    md = ["| workload | fast bound | tight bound | tight / fast | binds | LP | seconds (wall / CPU) | "
          + " | ".join(policies) + " |", "|---|" + "---|" * (6 + len(policies))]
    invalid = 0
    for label, spec in specs.items():
        jobs = spec.load()
        t0, c0 = time.perf_counter(), time.process_time()
        b = tight_bound(jobs, Cluster.uniform(16, 4), _config(), time_budget_s=args.budget)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row = means.get(label, {})
        cells = []
        for p in policies:
            if p in row:
                r = row[p] / b.mean_jct_s
                invalid += r < 1
                cells.append(f"{row[p]:.0f} s ({r:.2f}x){' BELOW' if r < 1 else ''}")
            else:
                cells.append("-")
        md.append(f"| {label} | {b.fast_s:.0f} s | {b.lagrangian_s:.0f} s | {b.lagrangian_s / b.fast_s:.2f}x | "
                  f"{b.binds} | {b.lp_s:.0f} s | {wall:.0f} / {cpu:.0f} | " + " | ".join(cells) + " |")
        print(md[-1], flush=True)
    print("\n".join(tight_bound_per_load(md, ORDER)))
    if args.out:
        args.out.write_text("\n".join(md) + "\n")
    if invalid:
        print(f"{invalid} policy means below the bound", file=sys.stderr)
    return 1 if invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
