"""``ones simulate``: replay a trace under several policies, compare JCT against each other and the bound."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ones_pipeline.cli.live import SubcommandAdder
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.runner import ALL_POLICIES, detect_workload, run_policies


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad) or '(none)'}; allowed: {','.join(ALL_POLICIES)}")
    return list(dict.fromkeys(names))


def _change_costs(text: str):
    from ones_pipeline.sim.change_costs import parse_change_costs

    try:
        return parse_change_costs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _costs_by_model(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, sep, value = part.partition("=")
        try:
            cost = float(value)
        except ValueError:
            cost = -1.0
        if not sep or not model.strip() or not cost >= 0:
            raise argparse.ArgumentTypeError(
                f"expected MODEL=SECONDS[,MODEL=SECONDS...] with seconds >= 0, got {part!r}")
        out[model.strip()] = cost
    return out


def add_command(sub: SubcommandAdder) -> None:
    sim = sub.add_parser("simulate", help="replay a trace under several policies and compare JCT")
    sim.add_argument("--workload", required=True, metavar="NAME|PATH",
                     help="a packaged Pollux workload (pollux:workload-1 ... 8, pollux-0.5:workload-N, "
                          "pollux-1.5:workload-N), a Pollux workload CSV (name,time,application,num_replicas,"
                          "batch_size) or an ONES trace CSV")
    sim.add_argument("--profiles", type=Path, default=None, metavar="DIR",
                     help="Pollux profile folder (<model>/placements.csv, ...) the jobs are derived from "
                          "(default: the packaged profiles; for a Pollux workload CSV <its folder>/../traces "
                          "when that exists)")
    sim.add_argument("--history", type=Path, default=None, metavar="DIR",
                     help="ONES trace only: folder of the ONES artifact's job_history.csv and trace_dev.csv "
                          "(default: the trace's folder)")
    sim.add_argument("--policies", type=_policies, default=list(ALL_POLICIES),
                     help=f"comma-separated, from {','.join(ALL_POLICIES)} (default: all)")
    sim.add_argument("--gpus", type=_positive_int, default=None, help="cluster GPUs (default 64)")
    sim.add_argument("--gpus-per-node", type=_positive_int, default=None, help="GPUs per node (default 4)")
    sim.add_argument("--jobs", type=_positive_int, default=None, help="simulate only the first N jobs")
    sim.add_argument("--interval", type=_positive_float, default=60.0, help="scheduling round in seconds (60)")
    sim.add_argument("--restart-cost", type=float, default=30.0,
                     help="seconds without progress after a start or a restart from a checkpoint (30), and after "
                          "every change where --change-costs leaves a kind to the job type's own ('own')")
    sim.add_argument("--change-costs", type=_change_costs, default="default", metavar="PRESET[,KIND=S,...]",
                     help="seconds without progress per kind of change (start, grow, shrink: in place; restart: "
                          "through a checkpoint) and the policies resizing in place (in_place=ones+ones-paper): "
                          "default (grow 0.05, shrink 0.04 in place, as benchmarks/resize_cost.py measured, for "
                          "ones and ones-paper; start and restart --restart-cost), pollux (every change "
                          "--restart-cost, nothing in place: the Pollux comparison), live (start 11.7, grow "
                          "0.05, shrink 0.04, restart 11.3: 2 CPU slots); e.g. default,grow=2,shrink=1")
    sim.add_argument("--restart-cost-by-model", type=_costs_by_model, default={}, metavar="MODEL=S,...",
                     help="per job type restart costs, e.g. imagenet=60,ncf=10 (override --restart-cost)")
    sim.add_argument("--seed", type=int, default=0, help="random seed of the policies (0)")
    sim.add_argument("--processes", type=_positive_int, default=None,
                     help="parallel processes (default: one per policy, at most the CPU count)")
    sim.add_argument("--bound", choices=("fast", "tight"), default="fast",
                     help="lower bound printed: fast (sim/bound.py, seconds) or tight (also the Lagrangian bound "
                          "of sim/tight_bound.py, up to --bound-budget CPU seconds; the larger is the bound)")
    sim.add_argument("--bound-budget", type=_positive_float, default=90.0,
                     help="CPU seconds the tight bound may take, setup included (90)")
    sim.add_argument("--out", type=Path, default=None, help="directory for CSVs, summary.json and PNG plots")
    sim.add_argument("--no-progress", action="store_true", help="do not draw the progress line")


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.restart_cost < 0:
        print(f"ones simulate: --restart-cost must be >= 0, got {args.restart_cost}", file=sys.stderr)
        return 2
    workload = detect_workload(args.workload, max_jobs=args.jobs, restart_cost_s=args.restart_cost,
                               profiles=args.profiles, history=args.history)
    default_gpus, default_gpn = workload.default_cluster()
    gpus = args.gpus or default_gpus
    gpn = min(args.gpus_per_node or default_gpn, gpus)
    cluster = Cluster.from_total(gpus, gpn)
    config = SimConfig(interval_s=args.interval, restart_cost_s=args.restart_cost,
                       restart_cost_by_model=args.restart_cost_by_model, change_costs=args.change_costs)
    print(f"simulating {workload.label} ({workload.kind}, {args.jobs or 'all'} jobs) on {gpus} GPUs "
          f"({gpn} per node), {args.interval:.0f} s rounds, policies: {','.join(args.policies)}", file=sys.stderr)
    results = run_policies(workload, args.policies, cluster, config, seed=args.seed, processes=args.processes,
                           show_progress=not args.no_progress)
    from ones_pipeline.sim.bound import lower_bound
    from ones_pipeline.sim.report import comparison_table, summarise, write_outputs

    bound = lower_bound(workload.load(), cluster, config).to_dict()
    if args.bound == "tight":
        from ones_pipeline.sim.tight_bound import tight_bound

        tight = tight_bound(workload.load(), cluster, config, time_budget_s=args.bound_budget)
        bound = {**bound, **tight.to_dict()}

    baseline = "ones" if "ones" in results else args.policies[0]
    if args.out:
        meta = {"workload": str(workload.path), "workload_name": workload.name, "profiles": str(workload.profiles),
                "kind": workload.kind, "jobs": args.jobs, "gpus": gpus,
                "gpus_per_node": gpn, "interval_s": args.interval, "restart_cost_s": args.restart_cost,
                "restart_cost_by_model": args.restart_cost_by_model,
                "change_costs": {**{k: getattr(args.change_costs, k) for k in ("start", "grow", "shrink", "restart")},
                                 "in_place": list(args.change_costs.in_place)},
                "seed": args.seed}
        summaries = write_outputs(results, args.out, meta, title=f"{workload.label}: JCT CDF", bound=bound)
    else:
        summaries = {name: summarise(res) for name, res in results.items()}
    print(comparison_table(summaries, baseline=baseline, bound=bound))
    if args.out:
        print(f"\nwrote per-job CSVs, summary.json, jct_cdf.png and gpus-<policy>.png to {args.out}")
    return 0


