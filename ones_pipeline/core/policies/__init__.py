"""Scheduling policies: the ``Policy`` interface the simulator and the live sensor call, and the registry
of every built-in policy by the name users give it.

``ones`` (``ones.py``, the default) and ``ones-paper`` (``ones_paper.py``) are this project's ONES; the
baselines ``fifo``, ``tiresias``, ``optimus``, ``pollux`` and ``sia`` are written from their papers (and,
for ``pollux`` and ``sia``, from reading their authors' simulators), configured as the Pollux authors'
simulator configures them. Every policy derives from ``base.PolicyBase`` (seed, generator, parameters,
persistence); ``common.py`` holds helpers the baselines share.

The policy modules never import this package's ``__init__``: ``POLICIES`` is plain data built from their
classes, with no lazy import and no cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ones_pipeline.core.policies.fifo import FifoPolicy
from ones_pipeline.core.policies.ones import OnesParams, OnesPolicy
from ones_pipeline.core.policies.ones_paper import OnesPaperParams, OnesPaperPolicy
from ones_pipeline.core.policies.optimus import OptimusPolicy
from ones_pipeline.core.policies.pollux import PolluxPolicy
from ones_pipeline.core.policies.sia import SiaPolicy
from ones_pipeline.core.policies.tiresias import TiresiasPolicy
from ones_pipeline.core.types import Cluster, JobView, Schedule

__all__ = [
    "POLICIES",
    "FifoPolicy",
    "OnesPaperParams",
    "OnesPaperPolicy",
    "OnesParams",
    "OnesPolicy",
    "OptimusPolicy",
    "Policy",
    "PolluxPolicy",
    "SiaPolicy",
    "TiresiasPolicy",
    "make_policy",
    "policy_from_dict",
    "policy_names",
    "register",
]


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. It may keep state between calls; ``to_dict``/``load_state`` persist it.

    ``decide`` gets every active (submitted, unfinished) job and the schedule now in force and returns
    the schedule to apply. It must never double-book a GPU nor exceed a job's ``gpu_cap``.
    """

    name: str

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule: ...

    def to_dict(self) -> dict[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


# Every built-in policy, by the name users give it; ``register`` adds a policy of one's own at runtime.
POLICIES: dict[str, Callable[..., Policy]] = {
    "ones": OnesPolicy,
    "ones-paper": OnesPaperPolicy,
    "fifo": FifoPolicy,
    "tiresias": TiresiasPolicy,
    "optimus": OptimusPolicy,
    "pollux": PolluxPolicy,
    "sia": SiaPolicy,
}


def register(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    """Class decorator adding a policy of one's own to ``POLICIES`` under ``name``."""
    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        POLICIES[name] = factory
        return factory

    return deco


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str, seed: int = 0, **params: Any) -> Policy:
    """Build a policy by name (a key of ``POLICIES``) with its keyword parameters."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; allowed: {', '.join(sorted(POLICIES))}")
    return POLICIES[name](seed=seed, **params)


def policy_from_dict(state: Mapping[str, Any]) -> Policy:
    """Rebuild a policy saved with ``to_dict`` (which stores ``name``, ``seed``, ``params``, ``state``)."""
    policy = make_policy(state["name"], seed=int(state.get("seed", 0)), **dict(state.get("params", {})))
    policy.load_state(state.get("state", {}))
    return policy
