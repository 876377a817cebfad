"""How long each slot stood idle in a finished live project: for every slot a job freed, the seconds until the
next job claimed it, and the decisions with their reasons (time from the first claim).

Reads the project's state directory (``<project>/.ones/state``: ``jobs/<job>/slots.jsonl``, ``progress.jsonl``
and ``decisions.jsonl``), e.g. after ``scripts/demo.sh``: ``python benchmarks/research/demo_slots.py
.ones/demo/.ones/state``. A job's slots still held at its last progress record count as freed then; unreadable lines
are skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ones_pipeline.defs.slot_owner import read_ledger
from ones_pipeline.train.records import events


def idle_gaps(state: Path) -> tuple[float, list[tuple[float, str, float]]]:
    """``(t0, [(freed at - t0, what, idle s)])``: each slot freed by one job and later claimed by another."""
    moves = []  # (time, 1: claimed / 0: freed, job, slot)
    for job_dir in sorted(p for p in (state / "jobs").iterdir() if p.is_dir()):
        held: set = set()
        for row in read_ledger(job_dir):
            claimed, freed = row.get("claimed", []), row.get("freed", [])
            moves += [(row["time_s"], 1, job_dir.name, s) for s in claimed]
            moves += [(row["time_s"], 0, job_dir.name, s) for s in freed]
            held = (held | set(claimed)) - set(freed)
        end = max((row["time_s"] for row in events(job_dir) if "time_s" in row), default=None)
        moves += [(end, 0, job_dir.name, s) for s in held if end is not None]
    if not moves:
        return 0.0, []
    moves.sort()
    t0, free, gaps = moves[0][0], {}, []
    for t, claim, job, slot in moves:
        if not claim:
            free[slot] = (t, job)
        elif slot in free:
            freed_at, by = free.pop(slot)
            gaps.append((freed_at - t0, f"slot {slot} freed by {by}, claimed by {job}", t - freed_at))
    return t0, gaps


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "jobs").is_dir():
        print("usage: demo_slots.py STATE_DIR (a project's .ones/state, with jobs/ in it)", file=sys.stderr)
        return 2
    state = Path(args[0])
    t0, gaps = idle_gaps(state)
    for at, what, idle in gaps:
        print(f"{at:7.1f} s  {what}: idle {idle:.1f} s")
    decisions = state / "decisions.jsonl"
    for line in decisions.read_text().splitlines() if decisions.is_file() else []:
        try:
            row = json.loads(line)
            print(f"{row['time_s'] - t0:7.1f} s  {row['job']}: {row['reason']}")
        except (ValueError, KeyError, TypeError):  # a line cut by a kill
            continue
    return 0


if __name__ == "__main__":
    sys.exit(main())
