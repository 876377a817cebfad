"""What each kind of change of a job's allocation costs in the simulator: the seconds it holds its GPUs
without training (issue 36).

Kinds (``KINDS``):

* ``start``: its first start (no process of the job exists yet);
* ``grow``: in place, members join a running job (new processes warm up while the old ones train, then a
  short pause, rank 0's state broadcast to the newcomers, the group re-formed); any change with a newcomer
  and at least one member that stays;
* ``shrink``: in place, no newcomer: members leave, or the same members change only the batch;
* ``restart``: through a checkpoint: the job stops (checkpoint, processes exit) and starts again at the new
  allocation from it. A resume after a preemption, a move to GPUs none of its members holds, and every
  change of a policy whose environment cannot resize in place.

Which environment resizes in place is the policy's (``in_place``): the ONES prototype resized in place
(``ones-paper``), and so does this project's subprocess launcher (``ones``, issue 36); AdaptDL/Pollux and
Sia restart from checkpoints, and so do the others modelled here (Optimus's parameter servers, Tiresias's
preemptions, FIFO). A cost left ``None`` is the job type's own restart cost (``truth.restart_cost_s``, or
``SimConfig.restart_cost_s`` / ``restart_cost_by_model``): 30 s for the Pollux profiles and the ONES trace.

Presets (``PRESETS``):

* ``default``: in place ``grow`` 0.05 s and ``shrink`` 0.04 s, as ``benchmarks/resize_cost.py --slots 2``
  measured them (training lost, medians of 3, cnn-digits on 1 <-> 2 CPU slots, gloo; docs/live.md), for
  the policies above; a start and a restart cost the job type's own restart cost.
* ``pollux``: every change (start, resize, move, resume) the job type's own restart cost, in place for no
  policy: the Pollux authors' simulator (30 s per reallocation), which ``docs/results.md``'s comparison with
  the published Pollux keeps.
* ``live``: all four as measured here on 2 CPU slots through Dagster (``benchmarks/decision_delays.py`` on the
  kept projects of a three-seed ``benchmarks/live_ab.py`` round, commit bd5078e, docs/live.md "What a restart
  costs"): ``start`` 11.7 s (median of 54 first starts, from the tick's decision to the first step: queueing,
  run worker, launcher, ranks), ``grow`` 0.05 s and ``shrink`` 0.04 s (in place, ``benchmarks/resize_cost.py``)
  and ``restart`` 11.3 s (median of 5 resumes after a preemption, decision to first step: a new run's start
  plus the checkpoint load). The checkpoint path of a change that does not wait (the new run starts while the
  old one checkpoints) costs less, 5.6 s (``resize_cost.py``); on these slots every change is in place, so a
  restart is a resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ones_pipeline.core.limits import shown
from ones_pipeline.core.policies import POLICIES

KINDS = ("start", "grow", "shrink", "restart")
IN_PLACE_POLICIES = ("ones", "ones-paper")


@dataclass(frozen=True)
class ChangeCosts:
    """Seconds without training per kind of change (``None``: the job type's own restart cost), and the
    policies whose environment resizes in place (the others pay ``restart`` for every change after the
    start)."""

    start: float | None = None
    grow: float | None = 0.05
    shrink: float | None = 0.04
    restart: float | None = None
    in_place: tuple[str, ...] = IN_PLACE_POLICIES

    def __post_init__(self) -> None:
        for kind in KINDS:
            v = getattr(self, kind)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"change cost {kind!r} must be a finite number >= 0 or None, got {v!r}")
        object.__setattr__(self, "in_place", tuple(self.in_place))

    def costs(self, own_s: float, in_place: bool) -> dict[str, float]:
        """Seconds per kind for a job whose type's own restart cost is ``own_s``, in an environment that
        resizes in place or not (where not, a grow and a shrink are restarts)."""
        own = {k: float(own_s) if getattr(self, k) is None else float(getattr(self, k)) for k in KINDS}
        if not in_place:
            own["grow"] = own["shrink"] = own["restart"]
        return own

    def least_change(self, own_s: float) -> float:
        """The least a change after the first start can cost in any environment modelled (a bound on every
        policy's schedule may charge no more)."""
        c = self.costs(own_s, bool(self.in_place))
        return min(c["grow"], c["shrink"], c["restart"])


PRESETS: Mapping[str, ChangeCosts] = {
    "default": ChangeCosts(),
    "pollux": ChangeCosts(grow=None, shrink=None, in_place=()),
    "live": ChangeCosts(start=11.7, grow=0.05, shrink=0.04, restart=11.3),
}


def change_kind(old_gpus: tuple[int, ...], new_gpus: tuple[int, ...], started: bool, in_place: bool) -> str:
    """The kind of a change from ``old_gpus`` (empty: holds none) to ``new_gpus`` (non-empty) of a job that
    has ``started`` before, in an environment that resizes in place or not."""
    if not started:
        return "start"
    stay = set(old_gpus) & set(new_gpus)
    if not in_place or not stay:
        return "restart"
    return "grow" if set(new_gpus) - set(old_gpus) else "shrink"


def parse_change_costs(text: str) -> ChangeCosts:
    """``ChangeCosts`` from ``PRESET[,KIND=SECONDS...][,in_place=POLICY+POLICY]`` (or only the overrides,
    over ``default``); ``SECONDS`` may be ``own`` (the job type's restart cost). One-line ValueError naming
    the part and the allowed values."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    base = PRESETS["default"]
    if parts and "=" not in parts[0]:
        if parts[0] not in PRESETS:
            raise ValueError(f"change costs: unknown preset {parts[0]!r}; allowed: {', '.join(PRESETS)}")
        base = PRESETS[parts.pop(0)]
    changes: dict = {}
    for part in parts:
        key, _, value = part.partition("=")
        key = key.strip()
        if key == "in_place":
            changes[key] = tuple(p for p in value.strip().split("+") if p)
            if bad := [p for p in changes[key] if p not in POLICIES]:
                raise ValueError(f"change costs: in_place names unknown policy {shown(bad[0])}; allowed: "
                                 f"{', '.join(sorted(POLICIES))}")
        elif key in KINDS:
            if value.strip() == "own":
                changes[key] = None
                continue
            try:
                changes[key] = float(value)
            except ValueError:
                raise ValueError(f"change costs: {key}={value!r} is not a number of seconds or 'own'") from None
        else:
            raise ValueError(f"change costs: unknown part {part!r}; allowed: a preset ({', '.join(PRESETS)}), "
                             f"{', '.join(k + '=S' for k in KINDS)}, in_place=POLICY+POLICY")
    return replace(base, **changes)
