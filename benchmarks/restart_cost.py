"""How long each scheduling decision took to reach training, read from a live project's state: for every
decision that starts a job on new slots (a start, a resume, a resize), the seconds from the decision
(``decisions.jsonl``) to the new generation's first training step (the next ``training`` event in the job's
``progress.jsonl``). The figures of docs/live.md, "What a restart costs", come from the state of
``tests/test_e2e.py`` (``pytest tests/test_e2e.py --basetemp /tmp/e2e``, then this script on
``/tmp/e2e/test_three_jobs_on_two_slots_t0/.ones/state``) or of ``scripts/demo.sh`` (``.ones/demo/.ones/state``).

    python benchmarks/restart_cost.py STATE_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE, StateLayout


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def restart_costs(state_dir: Path) -> list[tuple[str, str, float | None]]:
    """(job, what changed, seconds from the decision to the generation's first training step, None when it
    has not trained since) for every decision that gives a job slots it did not hold."""
    layout = StateLayout(state_dir)
    out, seen = [], set()
    for d in _lines(layout.decisions):
        first = d["job"] not in seen
        seen.add(d["job"])
        if not d.get("after") or d.get("after") == d.get("before"):
            continue  # a preemption, or a batch change alone
        before, after = d.get("before") or [], d["after"]
        change = (f"{len(before)} -> {len(after)} slots" if before else
                  f"{'start' if first else 'resume'} on {len(after)} slot(s)")
        starts = [e["time_s"] for e in _lines(layout.job_dir(d["job"]) / PROGRESS_FILE)
                  if e.get("event") == "training" and e.get("time_s", 0.0) > d["time_s"]]
        out.append((d["job"], change, min(starts) - d["time_s"] if starts else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dir", type=Path, help="a project's .ones/state directory")
    args = ap.parse_args()
    rows = restart_costs(args.state_dir)
    if not rows:
        raise SystemExit(f"{args.state_dir}: no decision that starts a job ({StateLayout(args.state_dir).decisions})")
    print(f"{'job':<16} {'change':<22} decision -> training")
    for job, change, took in rows:
        print(f"{job:<16} {change:<22} {'-' if took is None else f'{took:.1f} s'}")


if __name__ == "__main__":
    main()
