"""Mean JCT per model: where each policy's mean JCT goes, from the cached runs of ``policy_quality.py``.

Default: over the chosen Pollux workloads (seed ``--seed``), per model, the number of jobs, the mean of each
job's least time alone (``sim.bound``'s relaxation (a)), each policy's mean JCT, ``ones`` against
``pollux``, the model's share of ``ones``' summed JCT and what the model adds to ``ones``' mean minus
``pollux``'s (the per-model tables of the old experiment log: ``git show e8849ac:docs/ones_policy.md``). The
runs must be cached (``out/policy_quality/``): run ``policy_quality.py`` for those workloads and policies first.

``--detail W``: simulate workload ``W`` (a ``policy_quality`` token: ``1``, ``0.5:4``) under each policy
(``--params`` JSON for ``ones``) and print the mean and p99 JCT, and per model the mean JCT, wait before the
first start, time paused after it (JCT less the wait and the time holding GPUs: preempted to zero GPUs),
restarts, wall time holding GPUs, GPUs held on average and GPU-hours per job.

    python benchmarks/jct_by_model.py [--workloads 1,2,3,4,5,6,7,8] [--policies pollux,sia,ones]
    python benchmarks/jct_by_model.py --detail 0.5:4 --policies ones,pollux [--params '{...}']

``--timeline M1,M2`` (with ``--detail``): also each job of those models, its submission, JCT and every change
of its GPU count (hours since the start, GPUs). ``--scaling W``: per model of workload ``W``, its best
goodput (over the batch grid of ``sim.bound``) at 1-64 GPUs relative to 1 GPU, at 10, 50 and 90 % of its
progress: how close to linear each model scales, and when.

    python benchmarks/jct_by_model.py --detail 1 --policies ones,pollux --timeline imagenet
    python benchmarks/jct_by_model.py --scaling 1
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from policy_quality import CACHE, _config, code_digest, workloads  # same folder (the script's folder is on sys.path)

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.rates import Rates, batch_grid, config_rate, fewest_nodes
from ones_pipeline.sim.runner import run_one

CLUSTER = Cluster.uniform(16, 4)


def by_model(tokens: list[str], policies: list[str], seed: int) -> None:
    jct: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    total = 0
    for label, spec in workloads(tokens).items():
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
            jct[job.spec.model]["alone"].append(Rates(job, CLUSTER, {job.spec.per_gpu_batch * job.spec.requested_gpus})
                                                .fast_clock[-1])
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


def scaling(token: str) -> None:
    (label, spec), = workloads([token]).items()
    counts = (1, 2, 4, 8, 16, 32, 64)
    placements = fewest_nodes(CLUSTER, max(counts))
    print(f"{label}: best goodput at n GPUs / at 1 GPU, at 10 % | 50 % | 90 % of the progress; n = {counts}")
    seen = set()
    for job in spec.load():
        if job.spec.model in seen:
            continue
        seen.add(job.spec.model)
        truth, s = job.truth, job.spec
        batches = sorted(batch_grid(s, 24))
        parts = []
        for frac in (0.1, 0.5, 0.9):
            at = frac * truth.total_progress
            best = []
            for n in counts:
                rated = [r for r in (config_rate(truth, placements[n - 1], b) for b in batches) if r is not None]
                best.append(max([thr * truth.efficiency(at, total) for total, thr in rated], default=0.0))
            parts.append(" ".join(f"{g / best[0]:5.1f}" for g in best))
        print(f"  {s.model:12s} | " + " | ".join(parts))


def detail(token: str, policies: list[str], params: dict, seed: int, timeline: list[str] | None = None) -> None:
    (label, spec), = workloads([token]).items()
    for policy in policies:
        res = run_one(spec, policy, CLUSTER, _config(), seed, params if policy == "ones" else {})
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
    ap.add_argument("--scaling", default=None, help="print how each model of this workload scales")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if args.scaling:
        scaling(args.scaling)
    elif args.detail:
        detail(args.detail, policies, json.loads(args.params), args.seed,
               [m for m in args.timeline.split(",") if m])
    else:
        by_model([w for w in args.workloads.split(",") if w], policies, args.seed)


if __name__ == "__main__":
    main()
