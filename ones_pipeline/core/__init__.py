"""Pure scheduling core: numpy only (no dagster, mlflow, docker or torch)."""

from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    StoppingRule,
    ThroughputObs,
    batch_and_lr,
)

__all__ = [
    "Allocation",
    "Cluster",
    "JobSpec",
    "JobStatus",
    "JobView",
    "Schedule",
    "StoppingRule",
    "ThroughputObs",
    "batch_and_lr",
]
