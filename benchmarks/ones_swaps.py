"""Why ``ones`` swaps jobs: the decisions that stop a running job and start (or resume) another in its place.

Simulates one workload (a ``policy_quality`` token) under ``ones`` and watches every decision. A *swap* is a
decision that takes at least one running job to zero GPUs and gives GPUs to at least one job that held none.
For the first ``--show`` swaps after ``--after`` hours it prints the search's fitness of the schedule it chose
and of the same schedule with the swap undone (the stopped jobs back on their GPU counts, the started ones
back in the queue), and per job of the swap its GPU counts, work left, its goodput on the GPUs it holds
(``cur_rate``: its real placement) against the table's (a consolidated placement of that many GPUs; for a
started job, of the GPUs it is given), its wait
weight, churn charge and completion term both ways. A stopped job whose real goodput is below the table's is
on a split placement: the fitness expects it to restart consolidated, while the job started in its place
will get the same freed GPUs (the asymmetry found with this script: ``docs/ones_policy.md``, "Swaps").

    python benchmarks/ones_swaps.py --workload 1.5:3 --after 9 --show 5 [--seed 0] [--params '{...}']
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import numpy as np
from jct_by_model import CLUSTER  # same folder (the script's folder is on sys.path)
from ones_options import ones_options
from policy_quality import _config, checked_workloads

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.policies.ones import OnesPolicy
from ones_pipeline.core.policies.ones_fitness import OnesContext
from ones_pipeline.sim.engine import simulate

SPLIT = 0.99  # a held job whose real goodput is below this fraction of the table's is on a split placement


def explain(ctx: OnesContext, names: list[str], best: np.ndarray) -> dict | None:
    """The swap in ``best`` (the chosen GPU counts, (J,)) against ``ctx.cur``: None when there is none, else
    ``{"out", "in": [job index], "chosen", "undone": fitness (undone None when infeasible), "rows": [...]}``."""
    out = [i for i in range(len(names)) if ctx.cur[i] > 0 and best[i] == 0]
    into = [i for i in range(len(names)) if ctx.cur[i] == 0 and best[i] > 0]
    if not out or not into:
        return None
    alt = best.copy()
    alt[out] = ctx.cur[out]
    alt[into] = 0
    feasible = int(alt.sum()) <= ctx.G
    chosen_terms = ctx._job_terms(best[None, :])[0][0]
    undone_terms = ctx._job_terms(alt[None, :])[0][0] if feasible else None
    rows = []
    for i in out + into:
        held = int(ctx.cur[i])
        at = held if held else int(best[i])  # the table's goodput where it holds GPUs, or will
        table = float(ctx.table[i, min(at, ctx.table.shape[1] - 1)])
        real = float(ctx.cur_rate[i]) if ctx.cur_rate is not None else table
        rows.append({
            "job": names[i], "cur": held, "new": int(best[i]), "remaining": float(ctx.remaining[i]),
            "cur_rate": real if held else 0.0, "table_rate": table,
            "split": bool(held and real < SPLIT * table),
            "wait_weight": float(ctx.wait_weights[i]) if ctx.wait_weights is not None else 1.0,
            "charge": float(ctx.change_cost[i]), "term_chosen": float(chosen_terms[i]),
            "term_undone": float(undone_terms[i]) if feasible else None,
        })
    return {"out": out, "in": into, "chosen": float(ctx.fitness(best[None, :])[0]),
            "undone": float(ctx.fitness(alt[None, :])[0]) if feasible else None, "rows": rows}


@dataclass
class SwapWatch:
    """Wraps a ``OnesPolicy``'s search and decision to record each decision's swap (``explain``)."""

    policy: OnesPolicy
    decisions: int = 0
    swaps: list[tuple[float, dict]] = field(default_factory=list)  # (time s, explain()) per swap

    def __post_init__(self) -> None:
        search, decide, seen = self.policy._search, self.policy.decide, {}

        def watched_search(ctx, jobs):
            pop, fit = search(ctx, jobs)
            seen.update(ctx=ctx, names=[j.name for j in jobs], best=pop[int(np.argmin(fit))].copy())
            return pop, fit

        def watched_decide(now_s, cluster, jobs, current):
            seen.clear()
            schedule = decide(now_s, cluster, jobs, current)
            self.decisions += 1
            if seen:  # the search ran (no jobs: no search)
                found = explain(seen["ctx"], seen["names"], seen["best"])
                if found is not None:
                    self.swaps.append((float(now_s), found))
            return schedule

        self.policy._search, self.policy.decide = watched_search, watched_decide


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="1.5:3", help="a policy_quality token (1-8, 0.5:N, 1.5:N, ones50, ...)")
    ap.add_argument("--after", type=float, default=0.0, help="explain swaps from this many hours on")
    ap.add_argument("--show", type=int, default=5, help="how many swaps to explain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params", default="{}", help="JSON object of ones options")
    args = ap.parse_args()
    params = ones_options(ap, args.params, "--params")
    (label, spec), = checked_workloads(ap, [args.workload], "--workload").items()
    watch = SwapWatch(make_policy("ones", seed=args.seed, **params))
    res = simulate(spec.load(), watch.policy, CLUSTER, _config())
    jct = np.array([j.jct_s for j in res.jobs])
    split = sum(any(r["split"] for r in s["rows"] if r["new"] == 0) for _, s in watch.swaps)
    worse = sum(s["undone"] is not None and s["undone"] < s["chosen"] for _, s in watch.swaps)
    print(f"{label} ones: mean JCT {jct.mean():.0f} s, {watch.decisions} decisions, {len(watch.swaps)} swaps "
          f"({split} stopping a job on a split placement; {worse} the search's fitness would rank below "
          f"undoing them)")
    shown = [(t, s) for t, s in watch.swaps if t >= args.after * 3600.0][:max(args.show, 0)]
    for t, s in shown:
        undone = "infeasible" if s["undone"] is None else f"{s['undone']:.0f}"
        print(f"--- {t / 3600:.2f} h  fitness chosen {s['chosen']:.0f}, swap undone {undone}")
        for r in s["rows"]:
            term = "-" if r["term_undone"] is None else f"{r['term_undone']:.0f}"
            print(f"  {r['job']:<18} GPUs {r['cur']:>2} -> {r['new']:>2}  left {r['remaining']:.3g}  goodput held "
                  f"{r['cur_rate']:.1f} / table {r['table_rate']:.1f}{'  split' if r['split'] else ''}  wait weight "
                  f"{r['wait_weight']:.2f}  charge {r['charge']:.0f}  term {r['term_chosen']:.0f} (undone {term})")


if __name__ == "__main__":
    main()
