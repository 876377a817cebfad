"""Replay a live A/B mix through the simulator under chosen policy options, without running it live.

``benchmarks/live_ab.py --json OUT`` records the mix (specs, arrival offsets), each job's step times as
measured live, the start-up cost and, per policy, how its run ran (``as_ran``: each job's samples per
wall-clock second beside the other jobs, its gradient noise scales; ``adapters.live_as_ran``). This script
rebuilds the benchmark's own replay (``adapters.live_as_ran.replay``: one node of 2 slots, a round every 5 s;
a policy whose run the record has is replayed as that run ran: its rates, noise scales, start-up and submit
offsets; any other from the step times alone) and prints mean JCT, makespan, restarts and per-job JCT for each
policy, with the live figure where the record has one, and ``--ones`` options for ``ones`` (e.g.
``'{"min_hold_s": 0}'``), so a policy change can be checked against that mix. Changes cost what they cost
live (``adapters.live_ab.LIVE_CHANGE_COSTS``).

``--kept DIR``: a record made before ``as_ran`` was recorded, with its projects kept (``live_ab.py --keep``:
``DIR/<policy>``): read how each policy's run ran from them; ``--out PATH`` writes the record with it.

    .venv/bin/python benchmarks/live_ab_sim.py OUT.json [--policies fifo,ones,pollux] [--ones '{...}']
                                               [--kept DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ones_pipeline.adapters.live_as_ran import project_as_ran, replay
from ones_pipeline.config import load_env
from ones_pipeline.scheduler.settings import live_policy_params

SLOTS, TICK_S = 2, 5.0  # as live_ab.py runs it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the --json output of benchmarks/live_ab.py")
    ap.add_argument("--policies", default="fifo,ones,pollux")
    ap.add_argument("--ones", default="{}", help="JSON object of OnesPolicy options")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kept", type=Path, default=None, help="the kept projects of the record (DIR/<policy>)")
    ap.add_argument("--out", type=Path, default=None, help="write the record, with what --kept read, here")
    args = ap.parse_args(argv)
    recorded = json.loads(Path(args.json).read_text())
    policies = [p for p in args.policies.split(",") if p]
    if args.kept is not None:
        names = [m["spec"]["name"] for m in recorded["mix"]]
        found = [p for p in policies if (args.kept / p / "resources").is_dir()]
        if not found:
            ap.error(f"--kept {args.kept}: no project of {', '.join(policies)} there (expected {args.kept}/<policy>)")
        recorded["as_ran"] = {**recorded.get("as_ran", {}),
                              **{p: project_as_ran(load_env(args.kept / p), names) for p in found}}
    if args.out is not None:
        args.out.write_text(json.dumps(recorded, indent=1))
    options = live_policy_params("ones", json.loads(args.ones))  # as a live project runs ones
    figures = replay(recorded, policies, args.seed, options, SLOTS, TICK_S)
    for name, f in figures.items():
        live = recorded.get("live", {}).get(name, {}).get("mean_jct_s")
        vs = f" (live {live:.0f} s, replay/live {f['mean_jct_s'] / live:.2f})" if live else ""
        per_job = " ".join(f"{job} {jct:.0f}" for job, jct in f["jct_s"].items())
        how = "as it ran" if name in recorded.get("as_ran", {}) else "step times"
        print(f"{name:8s} mean JCT {f['mean_jct_s']:6.0f} s{vs}  makespan {f['makespan_s']:6.0f} s  "
              f"restarts {f['restarts']}  [{how}] | {per_job}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
