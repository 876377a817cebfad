"""The ``resize`` kind of ``benchmarks/chaos.py``: kill -9 a piece of a job while it changes its ranks in place.

The benchmark asks for in-place resizes itself, as a control plane would, through ``request_resize``, and only
within what the generation's Dagster run holds (no double booking: its slot tags stay as they were; its requests
carry no run id, so the scheduler does not take them for the run's allocation, ``RunInfo.from_run``): a generation
of 2 ranks (on the 2-slot cluster, it holds both) is asked to shrink to 1 slot, then to grow back to both. Each
kill of this kind is drawn as one of:

* **during the shrink** (about a third): 0-1 s after the shrink's request, kill -9 rank 0, rank 1 (the leaver) or
  the launcher;
* **during the grow**: once the shrink is done (the job trains on 1 process), the grow is requested, and rank 0,
  the newcomer (warming up: importing torch, loading data; or already joined) or the launcher is killed: half the
  time 0.2-4 s after the request (mostly the warm-up), half the time as soon as the launcher's plan is seen
  (the group re-forming), or 20 s after the request if neither comes.

Each kill is recorded with the change's stage, read from the launcher's resize directory (``warm-up``: nothing
of the change written yet, or the newcomer not ready; ``change``: its plan written, the group not re-formed;
``after``: the change done). Draws use the benchmark's numpy Generator.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from chaos_procs import Proc

from ones_pipeline.train.resize_control import request_resize

SHRINK_SHARE = 0.35


@dataclass
class Resizing:
    job: str
    generation: int
    mode: str  # "shrink": kill during the shrink; "grow": shrink, then kill during the grow
    phase: str  # "shrink" | "grow"
    kill_at: float | None  # monotonic time of the kill (None: not drawn yet)
    launcher: int
    at_change: bool = False  # kill as soon as the change's plan is written (by kill_at at the latest)
    k0: int = 0  # the launcher's last change number when the current change was requested
    requested: list[str] = field(default_factory=list)


class ResizeKills:
    def __init__(self, jobs_dir: Path, rng: np.random.Generator, say):
        self.jobs_dir, self.rng, self.say = jobs_dir, rng, say
        self.current: Resizing | None = None
        self.requests = 0
        self.stages: dict[str, int] = {}

    def abandon(self) -> None:
        self.current = None

    def step(self, procs: list[Proc], born_before: float) -> tuple[int, str] | None:
        """One poll: start a resize, request its next change, or kill; (PID, what) once a process was killed."""
        now = time.monotonic()
        cur = self.current
        if cur is None:
            return self._start(procs, born_before, now)
        mine = [p for p in procs if p.role == "rank" and p.job == cur.job and p.generation == cur.generation]
        if not mine:  # the generation ended meanwhile (finished, preempted, killed by another kind)
            self.say(f"resize: {cur.job} generation {cur.generation} ended before its kill; drawing again")
            self.current = None
            return None
        if cur.phase == "shrink" and cur.mode == "grow":
            if len(mine) == 1 and self._stage(cur) == "after":
                self._request(cur, [0, 1])
                cur.at_change = bool(self.rng.random() < 0.5)
                cur.phase, cur.kill_at = "grow", now + (20.0 if cur.at_change else float(self.rng.uniform(0.2, 4.0)))
            return None
        if now < cur.kill_at and not (cur.at_change and self._stage(cur) == "change"):
            return None
        targets = [(p.pid, f"rank {p.rank}{' (newcomer)' if p.joining else ''}") for p in mine]
        targets.append((cur.launcher, "launcher"))
        pid, who = targets[int(self.rng.integers(len(targets)))]
        stage = self._stage(cur)
        self.stages[f"{cur.phase}/{stage}"] = self.stages.get(f"{cur.phase}/{stage}", 0) + 1
        self.current = None
        return pid, (f"{cur.job} generation {cur.generation}: {who}, during its in-place {cur.phase} "
                     f"({' then '.join(cur.requested)}), stage {stage}")

    def _start(self, procs: list[Proc], born_before: float, now: float) -> None:
        groups: dict[tuple[str, int], list[Proc]] = {}
        for p in procs:
            if p.role == "rank":
                groups.setdefault((p.job, p.generation), []).append(p)
        ready = [(key, ranks) for key, ranks in sorted(groups.items()) if len(ranks) == 2 and
                 not any(p.joining or p.started_s > born_before for p in ranks) and ranks[0].launcher]
        if not ready:
            return None
        (job, gen), ranks = ready[int(self.rng.integers(len(ready)))]
        mode = "shrink" if self.rng.random() < SHRINK_SHARE else "grow"
        cur = Resizing(job, gen, mode, "shrink", None, ranks[0].launcher)
        self._request(cur, [0])
        if mode == "shrink":
            cur.kill_at = now + float(self.rng.uniform(0.0, 1.0))
        self.current = cur
        return None

    def _request(self, cur: Resizing, slots: list[int]) -> None:
        cur.k0 = self._last_change(cur)[0]
        request_resize(self.jobs_dir / cur.job, cur.generation, slots, reason="chaos")
        self.requests += 1
        cur.requested.append(f"{'2 -> 1' if len(slots) == 1 else '1 -> 2'}")

    def _last_change(self, cur: Resizing) -> tuple[int, list[str]]:
        """The launcher's newest change number in its resize directory (``.resize-<launcher PID>-<port>``; 0: none)
        and the directory's file names."""
        try:
            names = [f.name for d in self.jobs_dir.joinpath(cur.job).glob(f".resize-{cur.launcher}-*")
                     for f in d.iterdir()]
        except OSError:  # removed as the launcher ended
            return 0, []
        ks = [int(m.group(1)) for n in names if (m := re.match(r"(?:ready|plan|began|done)-(\d+)", n))]
        return max(ks, default=0), names

    def _stage(self, cur: Resizing) -> str:
        """The requested change's stage: ``warm-up`` until its first file (a newcomer's ``ready``, or a shrink's
        plan), then ``change`` (plan written) and ``after`` (``done``)."""
        k, names = self._last_change(cur)
        if k <= cur.k0:
            return "warm-up"
        if f"done-{k}" in names:
            return "after"
        return "change" if f"plan-{k}.json" in names else "warm-up"
