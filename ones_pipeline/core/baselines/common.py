"""Pieces every baseline shares: ``BaselinePolicy`` (seed, random generator, ``to_dict`` /
``load_state``), parameter checks with precise errors, and conversion of the current schedule into the
GPUs each active job holds. Concrete GPUs for "job -> GPU count" come from ``core.placement.place_counts``,
shared with the ONES policies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ones_pipeline.core.types import Allocation, Cluster, JobSpec, JobStatus, JobView, Schedule, lr_for_batch

# --------------------------------------------------------------------------------------------------
# Parameter checks: every message names the policy, the parameter, the value and what is allowed.


def check_bool(policy: str, field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{policy}: {field} must be true or false, got {value!r}")
    return bool(value)


def check_int(policy: str, field: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{policy}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(policy: str, field: str, value: Any, minimum: float | None = None,
                maximum: float | None = None, strict_min: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok:
        value = float(value)
        ok = math.isfinite(value)
        if ok and minimum is not None:
            ok = value > minimum if strict_min else value >= minimum
        if ok and maximum is not None:
            ok = value <= maximum
    if not ok:
        lo = "" if minimum is None else f"{'>' if strict_min else '>='} {minimum}"
        hi = "" if maximum is None else f"<= {maximum}"
        allowed = " and ".join(s for s in (lo, hi) if s) or "finite"
        raise ValueError(f"{policy}: {field} must be a finite number {allowed}, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------------
# Shared base class.


class BaselinePolicy:
    """Seed, random generator and persistence shared by the baselines.

    ``to_dict()`` returns ``{"name", "seed", "params", "state"}``; ``state`` holds the generator's
    bit-generator state, so a policy rebuilt with ``policy_from_dict`` draws the same numbers next.
    """

    name = ""

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_int(self.name, "seed", seed, 0)
        self._rng = np.random.default_rng(self.seed)

    # Subclasses: constructor keyword parameters, and extra state beyond the generator.
    def params(self) -> dict[str, Any]:
        return {}

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "params": self.params(),
            "state": {"rng": self._rng.bit_generator.state, **self._extra_state()},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "rng" in state:
            try:
                self._rng.bit_generator.state = dict(state["rng"])
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"{self.name}: state['rng'] is not a {type(self._rng.bit_generator).__name__} "
                                 f"state: {exc}") from exc
        self._load_extra_state(state)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}(seed={self.seed}{', ' if args else ''}{args})"


# --------------------------------------------------------------------------------------------------
# Helpers on jobs and schedules.


def active_views(policy: str, jobs: Iterable[JobView]) -> list[JobView]:
    """The jobs a policy schedules (finalized ones dropped); duplicate names are an error."""
    out, seen = [], set()
    for view in jobs:
        if JobStatus(view.status).is_finalized:
            continue
        if view.name in seen:
            raise ValueError(f"{policy}: job {view.name!r} appears twice in the active jobs")
        seen.add(view.name)
        out.append(view)
    return out


def held_gpus(cluster: Cluster, current: Schedule, names: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """GPUs each of ``names`` holds in ``current``: slots outside the cluster or already claimed by an
    earlier job (in name order) are dropped, so the result never double-books."""
    wanted = set(names)
    claimed: set[int] = set()
    out: dict[str, tuple[int, ...]] = {}
    for name in sorted(wanted & set(current.allocations)):
        gpus = tuple(g for g in current.allocations[name].gpus if 0 <= g < cluster.num_gpus and g not in claimed)
        claimed.update(gpus)
        if gpus:
            out[name] = gpus
    return out


def rigid_gpus(spec: JobSpec, cluster: Cluster) -> int:
    """GPUs a rigid baseline gives a job: its request, capped by ``gpu_cap`` and the cluster size (a job
    asking for more GPUs than exist runs on the whole cluster instead of waiting forever)."""
    return max(1, min(spec.requested_gpus, spec.gpu_cap, cluster.num_gpus))


def workload_batch(spec: JobSpec) -> int:
    """The global batch fixed by the workload: ``per_gpu_batch * requested_gpus`` (not capped, so a
    capped GPU count trains the trace's batch with gradient accumulation)."""
    return int(spec.per_gpu_batch * spec.requested_gpus)


def new_allocation(view: JobView, gpus: Sequence[int], global_batch: int, current: Schedule) -> Allocation:
    """The allocation for ``view``; the current one itself when GPUs and batch are unchanged.

    A changed allocation gets the next generation (one more than the running one; for a job resuming
    from a pause, ``restarts + 1``; 0 for a job's first start). The live sensor keys runs by generation
    and may renumber; the simulator only compares GPUs and batch.
    """
    gpus = tuple(sorted(int(g) for g in gpus))
    old = current.allocations.get(view.name)
    if old is not None and old.gpus == gpus and old.global_batch == global_batch:
        return old
    if old is not None:
        generation = old.generation + 1
    elif JobStatus(view.status) is JobStatus.PENDING:
        generation = 0
    else:
        generation = view.restarts + 1
    return Allocation(view.name, gpus, int(global_batch), lr_for_batch(view.spec, int(global_batch)), generation)


def submit_order(views: Sequence[JobView]) -> list[JobView]:
    """Jobs by submit time, ties by name (deterministic)."""
    return sorted(views, key=lambda v: (v.submit_time_s, v.name))


# --------------------------------------------------------------------------------------------------
