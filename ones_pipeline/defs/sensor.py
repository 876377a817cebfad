"""``ones_scheduler_sensor``: the ONES search every tick, applied to Dagster runs.

Each tick (DESIGN.md section 6):
1. job specs in ``assets/jobs`` -> partitions of ``training_job`` (a bad file is reported once, with
   file, field and allowed values, and skipped; the others keep running);
2. the in-flight runs (tags ``ones/job``, ``ones/gpus``, ``ones/generation``) are the current schedule;
3. progress (samples, throughput per configuration, loss/accuracy) is read from MLflow;
4. the policy decides within its time budget;
5. runs whose allocation changes are cancelled (``instance.run_coordinator.cancel_run``: the step
   checkpoints on SIGINT/SIGTERM);
6. new allocations become run requests keyed ``<job>-g<generation>``, one ``ones/gpu-<id>`` tag per slot;
7. the policy state goes into the cursor.
The plan itself is ``ones_pipeline.live.plan_tick`` (no Dagster). Every decision is logged, tagged on
the run it creates, recorded as an observation of the job's partition (visible in the UI), and appended
to ``<state_dir>/decisions.jsonl``.

No ``from __future__ import annotations`` (Dagster resolves resource annotations at runtime).
"""

import hashlib
import json
import time

import dagster as dg

from ones_pipeline.config import ConfigError, EnvConfig, load_job_specs
from ones_pipeline.core.types import spec_to_dict
from ones_pipeline.defs.assets import (
    JOBS_PARTITIONS,
    REPORT_ASSET,
    REPORT_JOB_NAME,
    TRAIN_JOB_NAME,
    TRAINING_ASSET,
    job_run_infos,
    report_job,
    train_job,
)
from ones_pipeline.defs.resources import MlflowResource, OnesEnvResource
from ones_pipeline.live import ProgressInfo, plan_tick

SENSOR_NAME = "ones_scheduler_sensor"


def _append_jsonl(path, rows) -> None:
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _progress(context, mlflow: MlflowResource, jobs) -> dict:
    if not jobs:
        return {}
    try:
        raw = mlflow.progress(sorted(jobs))
    except Exception as exc:  # an unreachable store must not stop scheduling  # noqa: BLE001
        context.log.warning(f"MLflow progress unavailable ({exc}); deciding without it this tick")
        return {}
    return {job: ProgressInfo(samples_done=p.samples_done, throughput_obs=p.throughput_obs,
                              loss_history=p.loss_history, accuracy_history=p.accuracy_history,
                              restarts=p.restarts) for job, p in raw.items()}


def policy_params(env: EnvConfig) -> dict:
    params = dict(env.policy.params)
    if env.policy.name == "ones":
        params.setdefault("time_budget_s", env.scheduler.decision_budget_s)
    return params


def scheduler_tick(context: dg.SensorEvaluationContext, env: EnvConfig, mlflow: MlflowResource) -> dg.SensorResult:
    from ones_pipeline.adapters.gpus import discover

    t_start = time.perf_counter()
    if (env.state_dir / "scheduler.paused").exists():  # `ones up`/`ones run` are draining before a stop
        return dg.SensorResult(skip_reason="paused: the runs are being cancelled before Dagster stops",
                               cursor=context.cursor)
    instance = context.instance
    cursor = json.loads(context.cursor) if context.cursor else {}
    now = time.time()

    # 1. specs -> partitions; bad files reported once per content and skipped.
    specs, errors = load_job_specs(env.jobs_dir)
    reported = set(cursor.get("errors", []))
    current_errors = []
    for err in errors:
        key = hashlib.sha256(str(err).encode()).hexdigest()[:12]
        current_errors.append(key)
        if key not in reported:
            context.log.error(f"skipped job spec: {err}")
    _write_errors(env, errors)
    existing = set(instance.get_dynamic_partitions(JOBS_PARTITIONS.name))
    new_keys = sorted(set(specs) - existing)
    partition_requests = [JOBS_PARTITIONS.build_add_request(new_keys)] if new_keys else []

    # 2.-4. the runs, the progress, the decision.
    runs = job_run_infos(instance)
    finished = set(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET)))
    progress = _progress(context, mlflow, set(specs) - finished)
    inventory = discover(cpu_slots=env.cluster.cpu_slots, gpus=env.cluster.gpus,
                         gpus_per_node=env.cluster.gpus_per_node)
    plan = plan_tick(now=now, specs=specs, finished=finished, runs=runs, progress=progress,
                     slot_ids=inventory.slot_ids, cluster=inventory.cluster(), cursor=cursor,
                     policy_name=env.policy.name, policy_seed=env.policy.seed, policy_params=policy_params(env),
                     max_retries=env.scheduler.max_retries, retry_backoff_s=env.scheduler.retry_backoff_s,
                     min_hold_s=env.scheduler.min_run_s)

    # 5. cancel what changes (idempotent: only in-flight runs are in the plan).
    for c in plan.cancels:
        context.log.info(f"cancel run {c.run_id} ({c.job} generation {c.generation}): {c.reason}")
        try:
            instance.run_coordinator.cancel_run(c.run_id)
        except Exception as exc:  # noqa: BLE001 - a run that ended meanwhile
            context.log.warning(f"could not cancel run {c.run_id}: {exc}")
    for job, why in plan.newly_failed.items():
        context.log.error(f"job {job} marked failed: {why}")
    if plan.newly_failed:
        _write_json(env.state_dir / "failed_jobs.json", plan.cursor["failed"])

    # 6. run requests for the new allocations.
    requests = []
    for launch in plan.launches:
        config = {"spec_json": json.dumps(spec_to_dict(specs[launch.job])), "slot_ids": list(launch.slot_ids),
                  "slot_kind": inventory.kind, "global_batch": launch.global_batch, "lr": launch.lr,
                  "generation": launch.generation, "submit_time_s": plan.cursor["submit"][launch.job]}
        requests.append(dg.RunRequest(run_key=launch.run_key, job_name=TRAIN_JOB_NAME, partition_key=launch.job,
                                      run_config={"ops": {TRAINING_ASSET: {"config": config}}}, tags=launch.tags()))
    for d in plan.decisions:
        context.log.info(f"decision: {d.line()}")
    events = [dg.AssetObservation(asset_key=TRAINING_ASSET, partition=d.job, metadata={
        "decision": d.line(), "gpus_before": ",".join(map(str, d.before)) or "-",
        "gpus_after": ",".join(map(str, d.after)) or "-", "global_batch": d.global_batch, "reason": d.reason,
        "policy": env.policy.name}) for d in plan.decisions]  # the daemon stores these before adding partitions;
    # an observation of a partition created in the same tick still shows once the partition exists
    _append_jsonl(env.state_dir / "decisions.jsonl",
                  [{**d.to_dict(), "policy": env.policy.name, "decide_s": round(plan.decide_s, 4)}
                   for d in plan.decisions])

    # The report, once everything submitted has ended.
    active_runs = [r for r in runs if r.in_flight]
    if specs and set(specs) <= finished | set(plan.cursor["failed"]) and not active_runs and not plan.launches:
        done_key = hashlib.sha256(",".join(sorted(finished)).encode()).hexdigest()[:12]
        requests.append(dg.RunRequest(run_key=f"report-{done_key}", job_name=REPORT_JOB_NAME,
                                      tags={"ones/report": "true"}))

    # 7. the cursor.
    plan.cursor["errors"] = current_errors
    plan.cursor["last_tick"] = {"time_s": now, "decide_s": round(plan.decide_s, 4),
                                "tick_s": round(time.perf_counter() - t_start, 4), "jobs": len(specs),
                                "slots": inventory.num_slots, "inventory": inventory.reason}
    skip = None
    if not requests and not plan.cancels:
        skip = (f"no change: {len(specs)} job(s), {len(finished & set(specs))} finished, "
                f"{len(active_runs)} run(s) in flight")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(plan.cursor),
                           dynamic_partitions_requests=partition_requests, asset_events=events, skip_reason=skip)


def _write_json(path, data) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass


def _write_errors(env: EnvConfig, errors: list[ConfigError]) -> None:
    _write_json(env.state_dir / "spec_errors.json",
                [{"file": e.path, "field": e.field, "message": str(e)} for e in errors])


def build_scheduler_sensor(tick_interval_s: int) -> dg.SensorDefinition:
    @dg.sensor(name=SENSOR_NAME, jobs=[train_job, report_job], minimum_interval_seconds=int(tick_interval_s),
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="ONES: every tick, decide GPUs and batch size for every job; start, resize, preempt runs")
    def ones_scheduler_sensor(context: dg.SensorEvaluationContext, ones_env: OnesEnvResource, mlflow: MlflowResource):
        return scheduler_tick(context, ones_env.config(), mlflow)

    return ones_scheduler_sensor


__all__ = ["build_scheduler_sensor", "scheduler_tick", "SENSOR_NAME", "REPORT_ASSET"]
