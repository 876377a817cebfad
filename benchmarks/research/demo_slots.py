"""How long each slot stood idle in a finished live project: for every slot a job freed, the seconds until the
next job claimed it, and the decisions with their reasons (time from the first claim).

Reads the project's state directory (``<project>/.ones/state``: ``jobs/<job>/slots.jsonl``, ``progress.jsonl``
and ``decisions.jsonl``), e.g. after ``scripts/demo.sh``: ``python benchmarks/research/demo_slots.py
.ones/demo/.ones/state``. A job's slots still held at its last progress record count as freed then.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def idle_gaps(state: Path) -> tuple[float, list[tuple[float, str, float]]]:
    """``(t0, [(freed at - t0, what, idle s)])``: each slot freed by one job and later claimed by another."""
    events = []
    for job_dir in sorted(p for p in (state / "jobs").iterdir() if p.is_dir()):
        slots, progress = _lines(job_dir / "slots.jsonl"), _lines(job_dir / "progress.jsonl")
        held: set = set()
        for row in slots:
            events += [(row["time_s"], 1, job_dir.name, s) for s in row["claimed"]]
            events += [(row["time_s"], 0, job_dir.name, s) for s in row["freed"]]
            held = (held | set(row["claimed"])) - set(row["freed"])
        end = max(row["time_s"] for row in progress) if progress else None
        events += [(end, 0, job_dir.name, s) for s in held if end is not None]
    events.sort()
    t0, free, gaps = events[0][0], {}, []
    for t, claim, job, slot in events:
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
    for row in _lines(decisions) if decisions.is_file() else []:
        print(f"{row['time_s'] - t0:7.1f} s  {row['job']}: {row['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
