"""What each kind of change costs this deployment, measured from the jobs' own events: ``JobView.change_costs``.

Rank 0 of every generation writes its events to the job's ``progress.jsonl`` (``train.records``), each with
its ``time_s``. From them and the job's runs (``RunInfo``):

* ``grow`` / ``shrink``: an in-place change's ``resized`` event, its ``paused_s`` (the seconds in which no
  member trained, the run log's "without training");
* ``restart``: a generation after the first, from the later of its run's creation and its previous
  generation's ``stopped`` event (a checkpoint path change, or a preemption and its resume) to its first step
  (its ``training`` event): the Dagster run start, the launcher, the ranks, the checkpoint load;
* ``start``: a job's first generation, from its run's creation to its first step;
* ``lag`` (not a kind of change: the job trains meanwhile, at its old size): an in-place change's delay from
  the tick that decided it (the run's newest change request, ``RunInfo.resized_s``) to its ``resized`` event:
  the apply run's queueing and start, the launcher's poll, the newcomers' start-up. Nothing the job gains
  from a grow arrives before it.

Per kind, the median of the newest ``KEPT`` measurements over the project's jobs (kept in the tick's
cursor, so they outlive the jobs); a kind nothing has measured yet costs ``PRIOR``, the ``live`` preset's
figures (``sim.change_costs``: measured on 2 CPU slots, docs/live.md). Where the launcher cannot resize in
place (``scheduler.in_place``: Docker on GPUs, Slurm), a grow and a shrink cost a restart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ones_pipeline.scheduler.runs import RunInfo
from ones_pipeline.sim.change_costs import KINDS, PRESETS
from ones_pipeline.train import records

PRIOR: Mapping[str, float] = {k: float(getattr(PRESETS["live"], k)) for k in KINDS}
# An in-place change's delay before anything is measured: the median over this round's live runs on 2 CPU slots
# (``benchmarks/decision_delays.py``, docs/live.md "What a restart costs").
LAG_PRIOR_S = 5.0
KEPT = 20  # measurements kept per kind, newest by event time
EVENTS = ("training", "stopped", "resized")  # the events a measurement is made of
LONGEST_S = 3600.0  # a figure outside (0, LONGEST_S] is a clock step or a lost event, not a cost


def change_events(job_dir: Path) -> tuple[dict, ...]:
    """The events of one job's ``progress.jsonl`` a measurement is made of (``EVENTS``), oldest first."""
    return tuple(row for row in records.events(job_dir, EVENTS) if row.get("event") in EVENTS)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def measure(job: str, events: Iterable[Mapping], runs: Sequence[RunInfo]) -> list[tuple[str, float, float]]:
    """``(kind, when, seconds)`` of each change of ``job`` its ``events`` and ``runs`` show (module docstring);
    ``when``: the time of the event that ends it."""
    created = {r.generation: r.created_s for r in runs if r.job == job and r.created_s}
    asked = {r.generation: r.resized_s for r in runs if r.job == job and r.resized_s}  # its newest change's tick
    lagged: set[int] = set()
    first: dict[int, float] = {}  # generation -> its first step
    stopped: dict[int, float] = {}  # generation -> its stop (checkpoint written)
    out = []
    for row in events:
        gen, t = row.get("generation"), _number(row.get("time_s"))
        if not isinstance(gen, int) or t is None:
            continue
        kind = row.get("event")
        if kind == "resized":
            paused, old, new = _number(row.get("paused_s")), row.get("from"), row.get("to")
            if paused is not None and isinstance(old, int) and isinstance(new, int) and old != new:
                out.append(("grow" if new > old else "shrink", t, paused))
                if gen in asked and t > asked[gen] and gen not in lagged:  # the first change after the newest ask
                    out.append(("lag", t, t - asked[gen]))
                    lagged.add(gen)
        elif kind == "training":
            first.setdefault(gen, t)
        elif kind == "stopped":
            stopped[gen] = t
    for gen, t in first.items():
        if gen not in created:
            continue
        if gen == min(created):
            out.append(("start", t, t - created[gen]))
        else:
            out.append(("restart", t, t - max(created[gen], stopped.get(gen - 1, -math.inf))))
    return [(k, t, s) for k, t, s in out if (0.0 <= s <= LONGEST_S if k in ("grow", "shrink") else 0 < s <= LONGEST_S)]


def remember(kept: dict[str, list[list[float]]], measured: Iterable[tuple[str, float, float]]) -> None:
    """Add ``measured`` (``measure``'s) to ``kept`` (kind -> ``[when, seconds]`` rows, oldest first), each once,
    keeping the newest ``KEPT`` per kind (a measurement older than all of a full kind's is not added again)."""
    for kind, when, seconds in measured:
        rows = kept.setdefault(kind, [])
        row = [round(when, 3), round(seconds, 3)]
        if row in rows or (len(rows) >= KEPT and row[0] <= rows[0][0]):
            continue
        rows.append(row)
        rows.sort(key=lambda r: r[0])
        del rows[:-KEPT]


def costs(kept: Mapping[str, Sequence[Sequence[float]]], in_place: bool) -> dict[str, float]:
    """Seconds per kind of change (``sim.change_costs.KINDS``): the median of those kept, else ``PRIOR``; where
    the launcher cannot resize in place, grow and shrink cost a restart. Where it can, also ``lag``: an in-place
    change's delay to its effect (else ``LAG_PRIOR_S``)."""
    out = {k: round(statistics.median(r[1] for r in kept[k]), 3) if kept.get(k) else PRIOR[k] for k in KINDS}
    if not in_place:
        out["grow"] = out["shrink"] = out["restart"]
    else:
        out["lag"] = round(statistics.median(r[1] for r in kept["lag"]), 3) if kept.get("lag") else LAG_PRIOR_S
    return out
