"""Only the runs the ONES sensor made train, and never a finished job.

Dagster copies a run's config and tags into its re-execution ("Re-execute all", an automatic retry), so a
re-executed run of a sensor-launched generation carries the sensor's allocation and tags and would train
on slots the scheduler has since given to others; re-executed after the job finished, it overwrote the
partition's materialization (a wrong ``jct_s``, one more restart). ``why_not_train`` is the check at the
top of ``training_job``: the run ends at once, green, saying why, tagged ``ones/outcome: not trained: ...``, so
that no part of ones counts it as a generation of the job (``defs.instance.run_info``, which also leaves out every
re-execution from the start): not the scheduler's view of the runs in flight, nor the materialization's restarts
and slot-hours.

No ``from __future__ import annotations`` (Dagster resolves annotations at runtime where it meets them).
"""

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from ones_pipeline.defs.instance import TRAINING_ASSET, job_run_infos
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.scheduler.runs import OUTCOME_NOT_TRAINED, TAG_OUTCOME


def why_not_train(instance: dg.DagsterInstance, run: dg.DagsterRun, allocation: RunAllocation,
                  job_dir: Callable[[str], Path]) -> str | None:
    """None when this run is the scheduler's current run of its job; else why it must not train."""
    job = allocation.job
    if job in instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET)):
        return (f"{job} has finished: its materialization stands, and this run trains nothing. To train it "
                "again, change its spec file (a new job: `ones submit SPEC.yaml`).")
    if run.parent_run_id is not None:
        return (f"this run re-executes run {run.parent_run_id} ({job} generation {allocation.generation}), whose "
                "allocation the scheduler no longer holds: it trains nothing. The ONES sensor starts every "
                "generation of a job itself; `ones status` says where the job stands.")
    newer = sorted({r.generation for r in job_run_infos(instance, job_dir, job)
                    if r.run_id != run.run_id and r.generation > allocation.generation})
    if newer:
        return (f"{job} generation {allocation.generation} is stale: the scheduler has since started generation "
                f"{newer[-1]}; this run trains nothing.")
    return None


def end_untrained(context: dg.AssetExecutionContext, why: str) -> None:
    """Say why in the run's log and tags; drop the run from ones' view of the job's runs."""
    context.log.warning(why)
    context.instance.add_run_tags(context.run.run_id, {TAG_OUTCOME: OUTCOME_NOT_TRAINED})
