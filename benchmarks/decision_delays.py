"""How long each scheduling decision took to take effect, read from a live project's state: for every
decision (``decisions.jsonl``), the seconds from the decision to the event in the job's ``progress.jsonl``
that shows it made: a start, a resume or a change through a checkpoint, the new generation's first training
step (``training``); an in-place change, the job's ``resized``; a preemption, its ``stopped`` (checkpoint
written, the slots free). The figures of docs/live.md, "What a restart costs", come from the state of
``tests/test_e2e.py`` (``pytest tests/test_e2e.py --basetemp /tmp/e2e``, then this script on
``/tmp/e2e/test_three_jobs_on_two_slots_t0/.ones/state``) or of ``scripts/demo.sh`` (``.ones/demo/.ones/state``).

    python benchmarks/decision_delays.py STATE_DIR [STATE_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE, StateLayout


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _kind(d: dict, first: bool) -> tuple[str, str]:
    """(what changed, the event that shows it made) of one decision record."""
    before, after = d.get("before") or [], d.get("after") or []
    if not after:
        return "preempt", "stopped"
    if not before:
        return f"{'start' if first else 'resume'} on {len(after)} slot(s)", "training"
    in_place = d.get("path") == "in place" or " in place" in d.get("reason", "")
    return f"{len(before)} -> {len(after)} slots {'in place' if in_place else 'restart'}", \
        "resized" if in_place else "training"


def decision_delays(state_dir: Path) -> list[tuple[str, str, float | None]]:
    """(job, what changed, seconds from the decision to the event that shows it made, None when none has come
    since) for every decision that changes a job's slots."""
    layout = StateLayout(state_dir)
    out, seen = [], set()
    for d in _lines(layout.decisions):
        first = d["job"] not in seen
        seen.add(d["job"])
        if d.get("after") == d.get("before"):
            continue  # a batch change alone
        change, event = _kind(d, first)
        times = [e["time_s"] for e in _lines(layout.job_dir(d["job"]) / PROGRESS_FILE)
                 if e.get("event") == event and e.get("time_s", 0.0) > d["time_s"]]
        out.append((d["job"], change, min(times) - d["time_s"] if times else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dirs", type=Path, nargs="+", help="a project's .ones/state directory")
    args = ap.parse_args()
    by_kind: dict[str, list[float]] = {}
    for state_dir in args.state_dirs:
        rows = decision_delays(state_dir)
        if not rows:
            raise SystemExit(f"{state_dir}: no decision that changes a job's slots "
                             f"({StateLayout(state_dir).decisions})")
        print(f"{state_dir}\n{'job':<16} {'change':<26} decision -> made")
        for job, change, took in rows:
            print(f"{job:<16} {change:<26} {'-' if took is None else f'{took:.1f} s'}")
            if took is not None:
                by_kind.setdefault(change.split(" on ")[0].replace("resume", "start"), []).append(took)
    print(f"\n{'kind':<26} {'n':>3} {'median s':>9} {'max s':>7}")
    for kind, xs in sorted(by_kind.items()):
        print(f"{kind:<26} {len(xs):>3} {statistics.median(xs):>9.1f} {max(xs):>7.1f}")


if __name__ == "__main__":
    main()
