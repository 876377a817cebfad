"""The live scheduler without Dagster: run records and tags, the allocation record, settings, one tick's plan."""

from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.scheduler.runs import (
    IN_FLIGHT,
    TAG_JOB,
    Cancel,
    Decision,
    Launch,
    ProgressInfo,
    Resize,
    RunInfo,
    TickPlan,
    slot_tag,
)
from ones_pipeline.scheduler.settings import SchedulerSettings
from ones_pipeline.scheduler.tick import TickInputs, plan_tick, progress_wanted

__all__ = ["IN_FLIGHT", "TAG_JOB", "Cancel", "Decision", "Launch", "ProgressInfo", "RunAllocation",
           "Resize", "RunInfo", "SchedulerSettings", "TickInputs", "TickPlan", "plan_tick", "progress_wanted",
           "slot_tag"]
