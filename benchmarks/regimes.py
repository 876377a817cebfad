"""Does ``ones`` win in every regime, with the same defaults? A grid of simulated regimes, each policy's mean
JCT per cell (averaged over the cell's workloads and seeds), ``ones`` against the best of the others.

Cells (issue 37; the Pollux workloads and profiles are the packaged ones, the ONES trace is read from
``../shared/traces`` or ``ONES_TRACES``):

* ``pollux@L``: Pollux workloads at load ``L`` (0.5, 1.0, 1.5) on 16 nodes x 4 GPUs, 30 s per change;
* ``small-G``: a cluster of ``G`` GPUs (4: one 4-GPU node, 8: two), the Pollux jobs of the load-1.0
  workloads thinned to the same relative load (each job kept with probability ``G / 64``, drawn from
  ``numpy.random.default_rng(workload)``; requests above ``G`` lowered to ``G``);
* ``ones50`` / ``ones400``: the ONES trace (first 50 jobs, all 400), minute-long jobs on 64 GPUs;
* ``changes-x2`` / ``changes-x4``: the load-1.0 workloads with every start, resize or preemption costing 2x
  and 4x the 30 s;
* ``cold``: the load-1.0 workloads without model memory (no job is valued by what its model's earlier
  jobs measured: every job's first minutes are unmeasured).

A recorded live mix (``benchmarks/live_ab.py --json``) is not in the repository; ``live_ab_sim.py`` replays
one. Rounds are 60 s. ``--quick``: one workload per cell and seed 0 (a smoke run, minutes); the default is
``--workloads 1,5`` and ``--seeds 0,1,2``.

    python benchmarks/regimes.py [--cells pollux@1.0,small-4,cold] [--workloads 1,5] [--seeds 0,1,2]
                                 [--policies ones,fifo,tiresias,pollux,sia] [--processes 2] [--json OUT]
                                 [--results RUNS.jsonl]

``--results RUNS.jsonl``: each simulation's mean JCT is appended there as it finishes (one JSON line: cell
instance, policy, seed, mean JCT, wall seconds, a digest of the code it ran: ``code``), and a rerun with the
same file simulates only what is missing, so a grid of hours survives an interrupted run and one policy's
change re-runs that policy only. Lines of other code are not used (the script says how many it ignored). A
policy that drew no number from its random generator on an instance (its ``to_dict()`` state did not move:
``fifo``, ``tiresias``, ``sia``) is simulated there for the first seed only; that line (``"any_seed": true``)
stands for every seed.

``--json OUT`` writes ``{"cells": {cell: {policy: mean_jct_s, "bound": s}}, "worst_ratio": x,
"geo_vs_pollux": y}``: ``worst_ratio`` the largest over cells of ``ones`` / the best other policy,
``geo_vs_pollux`` the geometric mean over cells of ``ones`` / ``pollux``. Targets (issue 37): at most 1.02
and at most 0.90.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import numpy as np

from ones_pipeline.bench_workloads import code_digest
from ones_pipeline.config import traces_dir_from_environment
from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.reporting import with_section
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.report import host
from ones_pipeline.sim.runner import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")
CELLS = ("pollux@0.5", "pollux@1.0", "pollux@1.5", "small-4", "small-8", "ones50", "ones400", "changes-x2",
         "changes-x4", "cold")
POLICIES = ("ones", "fifo", "tiresias", "pollux", "sia")
RESTART_S = 30.0


def _pollux(load: str, n: int) -> list:
    prefix = "pollux" if load == "1.0" else f"pollux-{load}"
    return WorkloadSpec(workload_path(f"{prefix}:workload-{n}"), "pollux").load()


def _thinned(n: int, gpus: int) -> list:
    """Workload-n's jobs, each kept with probability gpus / 64, requests capped at ``gpus``."""
    rng = np.random.default_rng(n)
    jobs = [j for j in _pollux("1.0", n) if rng.random() < gpus / 64]
    return [replace(j, spec=replace(j.spec, requested_gpus=min(j.spec.requested_gpus, gpus))) for j in jobs]


def instances(cell: str, workloads: list[int]) -> list[tuple[str, list, Cluster, SimConfig]]:
    """``(label, jobs, cluster, config)`` of each simulation instance of ``cell`` (one per workload)."""
    big = Cluster.uniform(16, 4)
    base = SimConfig(interval_s=60.0, restart_cost_s=RESTART_S, change_costs=PRESETS["pollux"])
    if cell.startswith("pollux@"):
        load = cell.split("@")[1]
        return [(f"{cell}/w{n}", _pollux(load, n), big, base) for n in workloads]
    if cell.startswith("small-"):
        gpus = int(cell.split("-")[1])
        return [(f"{cell}/w{n}", _thinned(n, gpus), Cluster.uniform(gpus // 4, 4), base) for n in workloads]
    if cell in ("ones50", "ones400"):
        path = TRACES / "ones_sc21" / "trace_1.csv"
        if not path.is_file():
            return []
        jobs = WorkloadSpec(path, "ones", max_jobs=50 if cell == "ones50" else None).load()
        return [(cell, jobs, big, base)]
    if cell.startswith("changes-x"):
        cost = RESTART_S * float(cell.split("x")[1])
        return [(f"{cell}/w{n}", _pollux("1.0", n), big, replace(base, restart_cost_s=cost)) for n in workloads]
    if cell == "cold":
        return [(f"{cell}/w{n}", _pollux("1.0", n), big, replace(base, model_memory=False)) for n in workloads]
    raise ValueError(f"unknown cell {cell!r}; allowed: {', '.join(CELLS)}")


def _run(args) -> tuple[str, str, int, float, float, bool]:
    """One simulation: ``(instance, policy, seed, mean JCT, wall s, drew)``; ``drew``: the policy took a number
    from its random generator (its ``to_dict()`` state moved), so another seed may decide otherwise."""
    label, jobs, cluster, config, policy, seed = args
    t0 = time.perf_counter()
    chosen = make_policy(policy, seed=seed)
    untouched = chosen.to_dict()["state"]["rng"]
    result = simulate(jobs, chosen, cluster, config)
    drew = chosen.to_dict()["state"]["rng"] != untouched
    return label, policy, seed, float(np.mean([j.jct_s for j in result.jobs])), time.perf_counter() - t0, drew


def code(policy: str) -> str:
    """What a ``--results`` line of ``policy`` is valid for: ``bench_workloads.code_digest`` (the simulator, the
    core and the policy's own modules) and the source of what defines a cell's simulations here (``instances``
    and its helpers, ``_run``, the constants), not the rest of this script (its table, its arguments); a line of
    other code is simulated again."""
    cells = "".join(inspect.getsource(f) for f in (instances, _pollux, _thinned, _run)) + repr((CELLS, RESTART_S))
    return f"{code_digest(policy)}-{hashlib.sha1(cells.encode()).hexdigest()[:8]}"


def _earlier(results: Path | None, codes: dict[str, str]) -> dict[tuple[str, str, int | None], float]:
    """``{(instance, policy, seed): mean JCT}`` of the ``--results`` lines made by the code of now (``codes``:
    policy -> ``code``); seed ``None``: a run whose policy drew no random number, valid for every seed."""
    if results is None or not results.is_file():
        return {}
    found, other = {}, 0
    for n, line in enumerate(results.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key, mean = (str(row["instance"]), str(row["policy"]), int(row["seed"])), float(row["mean_jct_s"])
        except (ValueError, KeyError, TypeError) as exc:  # a line cut short by a crash: simulated again
            print(f"regimes: {results}:{n}: ignored ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            continue
        if row.get("code") != codes.get(key[1]):
            other += 1
            continue
        found[(key[0], key[1], None) if row.get("any_seed") else key] = mean
    if other:
        print(f"regimes: {results}: {other} line(s) of other code ignored", file=sys.stderr)
    return found


def run_grid(cells: list[str], workloads: list[int], seeds: list[int], policies: list[str],
             processes: int, results: Path | None = None) -> dict[str, dict[str, float]]:
    """``{cell: {policy: mean JCT over its instances and seeds, "bound": mean of the instances' bounds}}``;
    with ``results`` (JSON lines), the simulations found there for this code are not run again and each new
    one is appended as it finishes. A policy that drew no random number on an instance (``fifo``, ``tiresias``,
    ``sia``: their decisions do not use the seed) is simulated there once and that run stands for every seed."""
    codes = {p: code(p) for p in policies}
    earlier = _earlier(results, codes)
    values: dict[tuple[str, str], dict[int, float]] = {}
    first, later, bounds, members, read = [], {}, {}, {}, 0
    for cell in cells:
        found = instances(cell, workloads)
        if not found:
            print(f"regimes: {cell}: skipped (the ONES trace is not at {TRACES / 'ones_sc21'})", file=sys.stderr)
            continue
        members[cell] = [label for label, *_ in found]
        for label, jobs, cluster, config in found:
            bounds[label] = lower_bound(jobs, cluster, config).mean_jct_s
            for p in policies:
                got = values.setdefault((label, p), {})
                if (label, p, None) in earlier:
                    got.update({s: earlier[(label, p, None)] for s in seeds})
                else:
                    got.update({s: earlier[(label, p, s)] for s in seeds if (label, p, s) in earlier})
                read += len(got)
                missing = [(label, jobs, cluster, config, p, s) for s in seeds if s not in got]
                if missing and got:  # a seed already ran and drew: the others run now
                    first.extend(missing)
                elif missing:  # the rest only if the first one drew a random number
                    first.append(missing[0])
                    later[(label, p)] = missing[1:]
    if earlier:
        print(f"regimes: {read} simulation(s) read from {results}, {len(first) + sum(map(len, later.values()))} "
              "at most to run", file=sys.stderr)
    if results is not None and results.is_file() and not results.read_bytes().endswith(b"\n"):
        with results.open("a") as f:  # a line cut short by a crash ends here, so the next one starts whole
            f.write("\n")
    started, k = time.perf_counter(), 0
    with ProcessPoolExecutor(max_workers=processes) as pool:
        pending = {pool.submit(_run, task) for task in first}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                label, policy, seed, mean, wall, drew = future.result()
                rest = later.pop((label, policy), [])
                if drew:
                    pending |= {pool.submit(_run, task) for task in rest}
                    values[(label, policy)][seed] = mean
                else:
                    values[(label, policy)].update({s: mean for s in seeds})
                if results is not None:
                    with results.open("a") as f:
                        f.write(json.dumps({"instance": label, "policy": policy, "seed": seed, "mean_jct_s": mean,
                                            "wall_s": round(wall, 1), "code": codes[policy],
                                            **({} if drew else {"any_seed": True})}) + "\n")
                k += 1
                print(f"[{time.perf_counter() - started:6.0f} s] {k} done, {len(pending)} running or queued: "
                      f"{label} {policy} seed {seed}: {mean:.0f} s ({wall:.0f} s wall)"
                      + ("" if drew else "; no random draw: stands for every seed"), file=sys.stderr, flush=True)
    return {cell: {**{p: float(np.mean([np.mean(list(values[(label, p)].values())) for label in labels]))
                      for p in policies},
                   "bound": float(np.mean([bounds[label] for label in labels]))}
            for cell, labels in members.items()}


def summary(cells: dict[str, dict[str, float]]) -> dict:
    """The JSON document: the cells, ``worst_ratio`` (ones / the best other policy, worst cell) and
    ``geo_vs_pollux`` (geometric mean of ones / pollux over the cells); null where a policy is missing."""
    others = [{p: v for p, v in row.items() if p not in ("ones", "bound")} for row in cells.values()]
    ratios = [row["ones"] / min(o.values()) for row, o in zip(cells.values(), others, strict=True)
              if "ones" in row and o]
    vs = [row["ones"] / row["pollux"] for row in cells.values() if "ones" in row and "pollux" in row]
    return {"cells": cells, "worst_ratio": max(ratios) if ratios else None,
            "geo_vs_pollux": math.exp(float(np.mean(np.log(vs)))) if vs else None}


def table(doc: dict, policies: list[str]) -> str:
    head = f"| cell | {' | '.join(policies)} | bound | ones / best other |"
    lines = [head, "|" + "---|" * (len(policies) + 3)]
    for cell, row in doc["cells"].items():
        others = [row[p] for p in policies if p != "ones" and p in row]
        ratio = f"{row['ones'] / min(others):.3f}x" if "ones" in row and others else "-"
        lines.append(f"| {cell} | " + " | ".join(f"{row[p]:.0f}" for p in policies)
                     + f" | {row['bound']:.0f} | {ratio} |")
    lines.append(f"\nworst cell, ones / best other: {_x(doc['worst_ratio'])} (target <= 1.02x); geometric mean "
                 f"ones / pollux: {_x(doc['geo_vs_pollux'])} (target <= 0.90x)")
    return "\n".join(lines)


def section(doc: dict, policies: list[str], args: str) -> str:
    """The markdown section ``--doc`` writes: what was run, on what, and the table."""
    return "\n".join([
        "## Regimes", "",
        f"Generated by `python benchmarks/regimes.py {args}` on {host()}. Each cell: mean JCT (s) per policy,",
        "averaged over the cell's workloads and seeds (the script's docstring defines the cells), next to the",
        "bound; `ones` against the best other policy. Targets (issue 37): every cell at most 1.02x, the geometric",
        "mean against `pollux` at most 0.90x.", "", table(doc, policies)])


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def _ints(parser, text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t]
    except ValueError:
        parser.error(f"{flag}: {text!r} is not a comma-separated list of integers")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated from {','.join(CELLS)}")
    ap.add_argument("--workloads", default="1,5", help="Pollux workload numbers 1-8 per cell (1,5)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="one workload, seed 0")
    ap.add_argument("--json", default=None, help="write the cells and the two ratios here")
    ap.add_argument("--results", type=Path, default=None,
                    help="JSON lines: each simulation appended as it finishes; a rerun runs only what is missing")
    ap.add_argument("--doc", default=None, help="write the table as the 'regimes' section of this markdown file "
                                                 "(docs/results.md; policy_quality.py keeps it)")
    args = ap.parse_args(argv)
    cells = [c for c in args.cells.split(",") if c]
    if bad := [c for c in cells if c not in CELLS]:
        ap.error(f"--cells: unknown {', '.join(bad)}; allowed: {', '.join(CELLS)}")
    policies = [p for p in args.policies.split(",") if p]
    try:
        for p in policies:
            make_policy(p)
    except ValueError as exc:
        ap.error(f"--policies: {exc}")
    workloads = _ints(ap, args.workloads, "--workloads")
    if bad := [n for n in workloads if not 1 <= n <= 8]:
        ap.error(f"--workloads: {bad} outside 1-8")
    seeds = _ints(ap, args.seeds, "--seeds")
    if args.quick:
        workloads, seeds = workloads[:1], seeds[:1]
    doc = summary(run_grid(cells, workloads, seeds, policies, max(args.processes, 1), args.results))
    print(table(doc, policies))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if args.doc:
        path = Path(args.doc)
        old = path.read_text() if path.is_file() else ""
        path.write_text(with_section(old, "regimes", section(doc, policies, " ".join(sys.argv[1:]))))


if __name__ == "__main__":
    main()
