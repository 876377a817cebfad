"""``SchedulerSettings``: everything that shapes a tick's plan besides its inputs, as one object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ones_pipeline.config import EnvConfig

def live_policy_params(policy: str, params: Mapping[str, Any], decision_budget_s: float | None = None) -> dict:
    """``params`` with what a live deployment adds unless they set it: for ``ones``, when given, the tick's
    decision budget as its search's time budget. (Its churn charge follows what the deployment measured its
    changes to cost: ``scheduler.change_costs``.) The live A/B's prediction uses it without the budget."""
    out = dict(params)
    if policy == "ones" and decision_budget_s is not None:
        out.setdefault("time_budget_s", decision_budget_s)
    return out


@dataclass(frozen=True)
class SchedulerSettings:
    policy: str = "ones"
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    max_retries: int = 3  # failed runs of a job before it is marked failed
    retry_backoff_s: float = 30.0  # doubled after each failure
    min_hold_s: float = 0.0  # a run younger than this (or changed in place since) keeps its allocation
    launcher: str = "subprocess"  # the step launcher's kind: which changes it makes in place (``in_place``)

    @classmethod
    def from_env(cls, env: EnvConfig) -> SchedulerSettings:
        """From ``resources/<env>.yaml``, the policy's params completed by ``live_policy_params`` (the tick's
        decision budget as ``ones``' time budget)."""
        params = live_policy_params(env.policy.name, env.policy.params, env.scheduler.decision_budget_s)
        s = env.scheduler
        return cls(policy=env.policy.name, seed=env.policy.seed, params=params, max_retries=s.max_retries,
                   retry_backoff_s=s.retry_backoff_s, min_hold_s=s.min_run_s, launcher=env.launcher.kind)
