"""Mean JCT per model: where each policy's mean JCT goes, from the cached runs of ``policy_quality.py``.

Default: over the chosen Pollux workloads (seed ``--seed``), per model, the number of jobs, the mean of each
job's least time alone (``sim.bound.lower_bound`` of the job alone: its relaxation (a), from the first round
boundary, the first start's cost included), each policy's mean JCT, ``ones`` against
``pollux``, the model's share of ``ones``' summed JCT and what the model adds to ``ones``' mean minus
``pollux``'s (the per-model tables of the old experiment log: ``git show e8849ac:docs/ones_policy.md``). The
runs must be cached (``out/policy_quality/``): run ``policy_quality.py`` for those workloads and policies first.

``--detail W``: simulate workload ``W`` (a ``policy_quality`` token: ``1``, ``0.5:4``) under each policy
(``--params`` JSON for ``ones``) and print the mean and p99 JCT, and per model the mean JCT, wait before the
first start, time paused after it (JCT less the wait and the time holding GPUs: preempted to zero GPUs),
restarts, wall time holding GPUs, GPUs held on average and GPU-hours per job.

    python benchmarks/research/jct_by_model.py [--workloads 1,2,3,4,5,6,7,8] [--policies pollux,sia,ones]
    python benchmarks/research/jct_by_model.py --detail 0.5:4 --policies ones,pollux [--params '{...}']

``--timeline M1,M2`` (with ``--detail``): also each job of those models, its submission, JCT and every change
of its GPU count (hours since the start, GPUs).

    python benchmarks/research/jct_by_model.py --detail 1 --policies ones,pollux --timeline imagenet

(``--scaling W``, each model's best goodput at 1-64 GPUs relative to 1 GPU, was retired with the move to
``benchmarks/research/``: it read ``sim.bound``'s private placement and batch-grid helpers.)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from ones_pipeline.bench_workloads import CLUSTER, code_digest, sim_config, workloads
from ones_pipeline.config import traces_dir_from_environment
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.runner import run_one

ROOT = Path(__file__).resolve().parents[2]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")
CACHE = ROOT / "out" / "policy_quality"  # benchmarks/policy_quality.py's cache


def by_model(tokens: list[str], policies: list[str], seed: int) -> None:
    jct: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    total = 0
    for label, spec in workloads(tokens, TRACES, CACHE).items():
        jobs = spec.load()
        total += len(jobs)
        runs = {}
        for p in policies:
            path = CACHE / f"{label}-{p}-s{seed}.json"
            record = json.loads(path.read_text()) if path.is_file() else {}
            if record.get("code") != code_digest(p):
                raise SystemExit(f"jct_by_model: {path} is missing or was made by other code: run policy_quality.py "
                                 f"--workloads {','.join(tokens)} --policies {','.join(policies)} --seed {seed} first")
            runs[p] = record["jct_s"]
        for i, job in enumerate(jobs):
            jct[job.spec.model]["alone"].append(lower_bound([job], CLUSTER, sim_config()).alone_s)
            for p in policies:
                jct[job.spec.model][p].append(runs[p][i])
    ones_sum = sum(sum(v["ones"]) for v in jct.values()) if "ones" in policies else None
    cols = ["model", "jobs", "alone"] + policies
    extra = ["ones / pollux", "share of ones' mean JCT", "ones - pollux, on the mean"]
    both = "ones" in policies and "pollux" in policies
    print("| " + " | ".join(cols + (extra if both else [])) + " |")
    print("|---" * (len(cols) + (len(extra) if both else 0)) + "|")
    for model, v in sorted(jct.items(), key=lambda kv: -sum(kv[1][policies[-1]])):
        row = [model, str(len(v["alone"])), f"{np.mean(v['alone']):.0f}"] + [f"{np.mean(v[p]):.0f}" for p in policies]
        if both:
            o, p = np.array(v["ones"]), np.array(v["pollux"])
            row += [f"{o.mean() / p.mean():.2f}x", f"{o.sum() / ones_sum * 100:.0f} %",
                    f"{(o.sum() - p.sum()) / total:+.1f} s"]
        print("| " + " | ".join(row) + " |")


def detail(token: str, policies: list[str], params: dict, seed: int, timeline: list[str] | None = None) -> None:
    (label, spec), = workloads([token], TRACES, CACHE).items()
    for policy in policies:
        res = run_one(spec, policy, CLUSTER, sim_config(), seed, params if policy == "ones" else {})
        rows: dict[str, list[tuple]] = defaultdict(list)
        for j in res.jobs:
            rows[j.model].append((j.jct_s, j.wait_s, j.restarts, j.run_s, j.gpu_s / max(j.run_s, 1e-9),
                                  j.jct_s - j.wait_s - j.run_s, j.gpu_s))
        jct = np.array([j.jct_s for j in res.jobs])
        paused = np.mean([j.jct_s - j.wait_s - j.run_s for j in res.jobs])
        print(f"{label} {policy}: mean JCT {jct.mean():.0f} s, p99 {np.percentile(jct, 99):.0f} s, paused after "
              f"the first start {paused:.0f} s per job")
        for model, v in sorted(rows.items()):
            a = np.array(v)
            print(f"  {model:12s} jobs {len(a):3d}  JCT {a[:, 0].mean():8.0f} s  wait {a[:, 1].mean():6.0f} s  "
                  f"paused {a[:, 5].mean():6.0f} s  restarts {a[:, 2].mean():5.2f}  "
                  f"holding GPUs {a[:, 3].mean():8.0f} s  GPUs {a[:, 4].mean():5.2f}  "
                  f"GPU-h {a[:, 6].mean() / 3600:6.2f}")
        print(f"  makespan {res.makespan_s / 3600:.2f} h")
        for j in res.jobs:
            if timeline and j.model in timeline:
                changes = " ".join(f"{t / 3600:.2f}h:{n}" for t, name, n in res.timeline if name == j.name)
                print(f"    {j.name}: submitted {j.submit_s / 3600:.2f} h, JCT {j.jct_s:.0f} s; {changes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--policies", default="pollux,sia,ones")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--detail", default=None, help="simulate this workload and print per-model details")
    ap.add_argument("--params", default="{}", help="JSON object of OnesPolicy options (with --detail)")
    ap.add_argument("--timeline", default="", help="models whose jobs' GPU counts to print (with --detail)")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if args.detail:
        detail(args.detail, policies, json.loads(args.params), args.seed,
               [m for m in args.timeline.split(",") if m])
    else:
        by_model([w for w in args.workloads.split(",") if w], policies, args.seed)


if __name__ == "__main__":
    main()
