"""Operations on the project's Dagster instance: its ``dagster.yaml``, opening it, reading our runs and
finished partitions, draining runs before Dagster stops, releasing runs a dead daemon left in flight.

Public Dagster APIs only (``dg.DagsterInstance``, ``dg.RunsFilter``, ``dg.DagsterRunStatus``).
"""

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import dagster as dg

from ones_pipeline.config import ConfigError, EnvConfig
from ones_pipeline.scheduler.runs import SLOT_HELD, TAG_JOB, RunInfo, slot_tag
from ones_pipeline.train.resize_control import read_resize_request

TRAINING_ASSET = "training_job"
TRAIN_JOB_NAME = "train_job"  # the Dagster job of the training runs (the sensor's run requests)
JOBS_PARTITIONS_NAME = "training_jobs"  # the training asset's partitions: one per job
REPORT_ASSET = "cluster_report"
IN_FLIGHT_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                      dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def instance_yaml(slot_ids: Iterable[int], max_runs: int, device: str) -> str:
    """The instance config: queued runs (at most ``max_runs`` at once; one in-flight run per slot whose tag says
    ``held``: a run that gave the slot back in place sets it ``free``, ``scheduler.runs``), dequeued every
    second, run monitoring on."""
    import yaml

    config = {
        "concurrency": {"runs": {"max_concurrent_runs": int(max_runs),
                                 "tag_concurrency_limits": [{"key": slot_tag(s, device), "value": SLOT_HELD, "limit": 1}
                                                            for s in slot_ids]}},
        # the queue is looked at every second, not every 5 (Dagster's default): each start and each change's
        # apply run waits in it, on the way from a tick to the training processes
        "run_queue": {"dequeue_interval_seconds": 1},
        "run_monitoring": {"enabled": True, "start_timeout_seconds": 300, "cancel_timeout_seconds": 180,
                           "poll_interval_seconds": 30},
        "telemetry": {"enabled": False},
    }
    return "# Written by `ones init` from the cluster inventory; rewritten on every init.\n" + \
        yaml.safe_dump(config, sort_keys=False)


def write_instance_yaml(env: EnvConfig, slot_ids: Iterable[int], max_runs: int, device: str) -> Path:
    path = env.layout.instance_yaml
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(instance_yaml(slot_ids, max_runs, device))
    tmp.replace(path)
    return path


def open_instance(env: EnvConfig) -> dg.DagsterInstance:
    """The project's instance (use as a context manager); ConfigError when ``ones init`` has not run."""
    home = env.layout.dagster_home
    if not env.layout.instance_yaml.exists():
        raise ConfigError(env.layout.instance_yaml, None,
                          "no Dagster instance yet: run `ones init` (or `ones up`/`ones run`)")
    return dg.DagsterInstance.from_config(str(home))


def run_info(run: dg.DagsterRun, job_dir: Callable[[str], Path], record: dg.RunRecord | None = None) -> RunInfo | None:
    """``run`` as the scheduler sees it (``RunInfo.from_run``), or None when it is not a generation of a job: no
    ``ones/job`` tag or no allocation in its config, a re-execution (Dagster copies the parent's config and tags;
    ``defs.run_guard`` ends it untrained), or a run the guard ended. Its allocation: the run config's, changed by
    its generation's newest in-place change request in ``job_dir(job)`` (``train.resize_control``)."""
    if TAG_JOB not in run.tags or run.parent_run_id is not None:
        return None
    config = ((run.run_config or {}).get("ops") or {}).get(TRAINING_ASSET, {}).get("config") or {}
    times = (record.create_timestamp.timestamp(), record.start_time, record.end_time) if record else (0.0,)
    info = RunInfo.from_run(run.run_id, run.status.value, run.tags, config, None, *times)
    if info is not None and (change := read_resize_request(job_dir(info.job), info.generation)) is not None:
        info = RunInfo.from_run(run.run_id, run.status.value, run.tags, config, change, *times)
    return info


def job_run_infos(instance: dg.DagsterInstance, job_dir: Callable[[str], Path],
                  job: str | None = None) -> list[RunInfo]:
    """Every training run (of ``job``; else of every job, a partition of ``training_job``) with start/end times
    (``run_info``). ``job_dir``: a job's state directory (``EnvConfig.job_state_dir``), where its in-place change
    requests are."""
    jobs = [job] if job is not None else instance.get_dynamic_partitions(JOBS_PARTITIONS_NAME)
    if not jobs:
        return []
    records = instance.get_run_records(dg.RunsFilter(tags={TAG_JOB: jobs if len(jobs) > 1 else jobs[0]}))
    return [info for rec in records if (info := run_info(rec.dagster_run, job_dir, rec)) is not None]


def finished_jobs(instance: dg.DagsterInstance) -> set[str]:
    """Jobs whose ``training_job`` partition is materialized."""
    return set(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET)))


def latest_report_ts(instance: dg.DagsterInstance) -> float:
    event = instance.get_latest_materialization_event(dg.AssetKey(REPORT_ASSET))
    return event.timestamp if event else 0.0


def drain(env: EnvConfig, instance: dg.DagsterInstance, timeout_s: float | None = None, log=print) -> int:
    """Before Dagster stops: pause the sensor, cancel every in-flight training run (each step checkpoints
    and its run ends CANCELED rather than FAILED) and wait for them. Returns how many were cancelled."""
    env.layout.paused.touch()
    flt = dg.RunsFilter(job_name=TRAIN_JOB_NAME, statuses=IN_FLIGHT_STATUSES)
    runs = instance.get_runs(flt)
    for run in runs:
        if run.status != dg.DagsterRunStatus.CANCELING:
            try:
                instance.run_coordinator.cancel_run(run.run_id)
            except Exception as exc:  # its worker is already gone: nothing to cancel
                log(f"could not cancel run {run.run_id}: {exc}")
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else env.launcher.grace_period_s + 20)
    while instance.get_runs(flt) and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(runs)


def release_orphaned_runs(instance: dg.DagsterInstance, process_cmdlines: str) -> list[str]:
    """Mark in-flight training runs whose run worker no longer exists as canceled.

    Dagster's default run launcher cannot check a run worker's health, so a run whose daemon was
    killed stays STARTED forever, holding its job and its GPU tags. Called before a daemon starts
    (nothing of ours runs then); a run is orphaned when no process command line (``process_cmdlines``,
    all of them joined) mentions its id.
    """
    statuses = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    runs = instance.get_runs(dg.RunsFilter(job_name=TRAIN_JOB_NAME, statuses=statuses))
    released = []
    for run in runs:
        if run.run_id in process_cmdlines:
            continue
        instance.report_run_canceled(run, message="ones: the daemon that ran it stopped; the job resumes "
                                                  "from its checkpoint in a new generation")
        released.append(run.run_id)
    return released
