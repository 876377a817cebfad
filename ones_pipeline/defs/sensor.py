"""``ones_scheduler_sensor``: the ONES search every tick, applied to Dagster runs.

Each tick (DESIGN.md section 6):
1. job specs in ``assets/jobs`` -> partitions of ``training_job`` (a bad file is reported once, with
   file, field and allowed values, and skipped; the others keep running);
2. the in-flight runs of ``train_job`` (tag ``ones/job``; generation, slots and batch from the run config and
   the generation's in-place change request, ``defs.instance.run_info``) are the current schedule;
3. progress (samples, throughput per configuration, loss/accuracy) is read from MLflow, the slots from
   the inventory resource (once);
4. ``scheduler.plan_tick`` decides (no Dagster in it);
5. runs whose allocation changes are to be cancelled, or resized in place where the launcher can
   (``scheduler.in_place``): the tick itself acts on nothing (the UI's "Preview
   tick result" evaluates it for real); it returns one run of ``ones_apply`` (``defs/apply.py``) that
   asks each to stop (the step checkpoints and its run ends green, saying it was preempted; a run that
   does not stop in time is cancelled through Dagster), then asks each in-place change of its running
   generation (the same run spans it; ``defs.slot_owner`` moves the slot tags), and writes the decision log
   and state files, launched by the daemon for committed ticks only;
6. new allocations become run requests keyed ``<job>-g<generation>``, tagged ``ones/job`` and one
   ``ones/gpu-<id>`` (``ones/cpu-<id>``) tag per slot valued ``held``, the ``RunAllocation`` as JSON in the run
   config with the reason and the slots before (``Launch.run_config``; not tags: the runs list shows every tag);
7. the cursor keeps what the next tick needs to be idempotent, of the jobs not finished (``forget_finished``:
   bounded, whatever the number of finished jobs); the policy's search state goes to
   ``policy/<ref>.json`` through the apply run (committed ticks only), the cursor names it (``policy_ref``).
Every decision is logged, put in the config and first log line of the run it creates, recorded as an
observation of the job's partition (visible in the UI), and appended to ``<state_dir>/decisions.jsonl`` by the
apply run.

No ``from __future__ import annotations`` (Dagster resolves resource annotations at runtime).
"""

import hashlib
import json
import time
from pathlib import Path

import dagster as dg

from ones_pipeline.adapters.inventory import InventoryUnavailable
from ones_pipeline.config import ConfigError, EnvConfig, job_spec_files, load_job_specs
from ones_pipeline.defs.apply import apply_job, apply_request
from ones_pipeline.defs.assets import JOBS_PARTITIONS, REPORT_JOB_NAME, TRAIN_JOB_NAME, report_job, train_job
from ones_pipeline.defs.declared import hold_for_upstream, with_declared
from ones_pipeline.defs.instance import REPORT_ASSET, TRAINING_ASSET, finished_jobs, job_run_infos
from ones_pipeline.defs.resources import InventoryResource, MlflowResource, OnesEnvResource
from ones_pipeline.defs.slot_owner import job_ledgers
from ones_pipeline.scheduler import ProgressInfo, SchedulerSettings, TickInputs, TickPlan, plan_tick, progress_wanted
from ones_pipeline.scheduler.change_costs import change_events

SENSOR_NAME = "ones_scheduler_sensor"
WATCH_S = 1  # the sensor's minimum interval: the daemon's loop (every 5 s) paces it (``watch_tick``)
WATCHING = "watching:"  # how a skip that decided nothing begins (``adapters.live_as_ran.sensor_ticks`` leaves them out)
ENDED_STATUSES = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def _progress(context, mlflow: MlflowResource, jobs) -> dict:
    if not jobs:
        return {}
    try:
        raw = mlflow.progress(sorted(jobs))
    except Exception as exc:  # an unreachable store must not stop scheduling
        context.log.warning(f"MLflow progress unavailable ({exc}); deciding without it this tick")
        return {}
    return {job: ProgressInfo(samples_done=p.samples_done, throughput_obs=p.throughput_obs,
                              loss_history=p.loss_history, accuracy_history=p.accuracy_history,
                              restarts=p.restarts, grad_noise_scale=p.grad_noise_scale,
                              epoch_end_s=p.epoch_end_s) for job, p in raw.items()}


def _spec_errors(context, errors: list[ConfigError], reported: set[str]) -> tuple[list[str], list[dict] | None]:
    """Log each bad spec file once per content; return their keys and, when the set changed since the
    last committed tick, the new content of ``spec_errors.json`` (else None)."""
    keys = []
    for err in errors:
        key = hashlib.sha256(str(err).encode()).hexdigest()[:12]
        keys.append(key)
        if key not in reported:
            context.log.error(f"skipped job spec: {err}")
    if errors:  # every tick, for as long as a file stays bad: the tick's log in the UI shows it
        context.log.warning(_bad_specs_line(errors))
    changed = set(keys) != reported
    return keys, ([{"file": e.path, "field": e.field, "message": str(e)} for e in errors] if changed else None)


def _bad_specs_line(errors: list[ConfigError]) -> str:
    names = ", ".join(sorted({Path(e.path).name for e in errors}))
    return f"{len(errors)} job spec file(s) skipped until fixed: {names} (`ones status` says why)"


def _log_plan(context, plan: TickPlan, held: dict[str, str]) -> None:
    """The plan's lines; ``held``: declared jobs waiting for upstream assets (they wait in the plan too)."""
    plan.waiting.update(held)
    for job, why in sorted(held.items()):
        context.log.info(f"{job} {why}")
    for c in plan.cancels:
        context.log.info(f"plan: cancel run {c.run_id} ({c.job} generation {c.generation}): {c.reason}")
    for r in plan.resizes:
        context.log.info(f"plan: resize run {r.run_id} in place ({r.job} generation {r.generation}): {r.reason}")
    for job, why in sorted(plan.idle.items()):
        context.log.info(f"{job} {why}")
    for job, why in plan.newly_failed.items():
        context.log.error(f"job {job} marked failed: {why}")
    for d in plan.decisions:
        context.log.info(f"decision: {d.line()}")


def _run_requests(plan: TickPlan) -> list[dg.RunRequest]:
    return [dg.RunRequest(run_key=launch.run_key, job_name=TRAIN_JOB_NAME, partition_key=launch.job,
                          run_config={"ops": {TRAINING_ASSET: {"config": launch.run_config()}}},
                          tags=launch.tags()) for launch in plan.launches]


def _why_metadata(why) -> dict:
    if not why:
        return {}
    out = {"change_cost_s": dg.MetadataValue.float(float(why["change_cost_s"]))}
    for key in ("remaining_before_s", "remaining_after_s"):
        if why.get(key) is not None:
            out[f"predicted_{key}"] = dg.MetadataValue.float(float(why[key]))
    if why.get("frees_for"):
        out["frees_slots_for"] = ", ".join(why["frees_for"])
    return out


def _observations(env: EnvConfig, plan: TickPlan, waiting_seen: dict[str, str]) -> list[dg.AssetObservation]:
    """One per decision (its numbers included), and one per job whose reason to wait changed since the last
    tick. The daemon stores these before adding partitions; an observation of a partition created in the
    same tick still shows once the partition exists."""
    events = [dg.AssetObservation(asset_key=TRAINING_ASSET, partition=d.job, metadata={
        "decision": d.line(), "slots_before": ",".join(map(str, d.before)) or "-",
        "slots_after": ",".join(map(str, d.after)) or "-", "global_batch": d.global_batch, "reason": d.reason,
        **({"path": d.path} if d.path else {}),
        "policy": env.policy.name, **_why_metadata(d.why)}) for d in plan.decisions]
    for job, why in sorted(plan.waiting.items()):
        key = hashlib.sha256(why.encode()).hexdigest()[:12]
        if waiting_seen.get(job) != key:
            events.append(dg.AssetObservation(asset_key=TRAINING_ASSET, partition=job,
                                              metadata={"job": job, "waiting": why, "policy": env.policy.name}))
    return events


def _spec_file(env: EnvConfig, job: str) -> Path:
    yml = env.jobs_dir / f"{job}.yml"
    return yml if yml.exists() else env.jobs_dir / f"{job}.yaml"


def _apply(env: EnvConfig, plan: TickPlan, spec_errors: list[dict] | None,
           previous_failed=()) -> dg.RunRequest | None:
    cancels = [{"run_id": c.run_id, "job": c.job, "generation": c.generation, "reason": c.reason}
               for c in plan.cancels]
    decisions = [{**d.to_dict(), "policy": env.policy.name, "decide_s": round(plan.decide_s, 4)}
                 for d in plan.decisions]
    failed_changed = plan.newly_failed or set(plan.cursor["failed"]) != set(previous_failed)  # also a job let go
    return apply_request(cancels, decisions, dict(plan.cursor["failed"]) if failed_changed else None,
                         spec_errors, {"ref": plan.policy_ref, "state": plan.policy_state},
                         [r.to_dict() for r in plan.resizes])


def _saved_policy_state(context, env: EnvConfig, cursor: dict) -> dict | None:
    """The search state the committed cursor names (``policy/<ref>.json``). Missing (its apply run has not
    run yet, or the state was never saved): None, and the search starts afresh this tick: that costs search
    quality, never a decision already made."""
    ref = cursor.get("policy_ref")
    if not ref:
        return None
    try:
        state = env.layout.read_json(env.layout.policy_state(ref), None)
    except ValueError:
        state = None
    if state is None:
        context.log.info(f"policy state {ref} not saved (yet); the search starts afresh this tick")
    return state


def forget_finished(cursor: dict, finished) -> None:
    """Keep the cursor bounded: drop the finished jobs' submit times, spec hashes and launch epochs. No tick reads
    them (a finished job is neither viewed nor launched again), and each finished job added about 100 bytes to the
    cursor forever (the sensor's page shows it raw); its submit time and figures stay in its materialization
    (``submit_time_s``, ``jct_s``) and ``decisions.jsonl``. The cursor grows with the active jobs and the models
    only (``model_obs`` keeps a bounded number of step times per model, here to 4 significant digits: a measured
    step time varies far more than that, and the 17-digit floats were half the cursor on the sensor's page)."""
    for key in ("submit", "spec_hash", "launch_epochs"):
        cursor[key] = {job: value for job, value in cursor.get(key, {}).items() if job not in finished}
    cursor["model_obs"] = {model: [[*row[:3], *(float(f"{v:.4g}") for v in row[3:])] for row in rows]
                           for model, rows in cursor.get("model_obs", {}).items()}


def scheduler_tick(context: dg.SensorEvaluationContext, env: EnvConfig, mlflow: MlflowResource,
                   inventory: InventoryResource, declared=None) -> dg.SensorResult:
    """One tick: gather the inputs, plan, apply (the numbered steps of the module docstring). ``declared``:
    jobs declared in code or a component's YAML (``defs.declared``), scheduled once their upstream assets
    are materialized."""
    t_start = time.perf_counter()
    if env.layout.paused.exists():  # `ones up`/`ones run` are draining before a stop
        return dg.SensorResult(skip_reason="paused: the runs are being cancelled before Dagster stops",
                               cursor=context.cursor)
    instance = context.instance
    cursor = json.loads(context.cursor) if context.cursor else {}
    now = time.time()
    specs, errors = load_job_specs(env.jobs_dir)
    specs, held = with_declared(instance, specs, errors, declared, env.jobs_dir)
    new_keys = sorted((set(specs) | set(held)) - set(instance.get_dynamic_partitions(JOBS_PARTITIONS.name)))
    runs = job_run_infos(instance, env.job_state_dir)
    finished = finished_jobs(instance)
    try:
        slots = inventory.discover()
    except InventoryUnavailable as exc:  # e.g. slurmctld down: decide nothing, cancel nothing
        context.log.warning(f"slot inventory unavailable: {exc}; tick skipped, nothing changed")
        return dg.SensorResult(skip_reason=f"slot inventory unavailable: {exc}; nothing changed this tick",
                               cursor=context.cursor)
    wanted = progress_wanted(specs, finished, cursor)
    active_runs = [r for r in runs if r.in_flight]  # (only their jobs write events that measure a change)
    inputs = TickInputs(now=now, specs=specs, finished=frozenset(finished), runs=runs,
                        progress=_progress(context, mlflow, wanted), slot_ids=slots.slot_ids,
                        change_events={job: change_events(env.layout.job_dir(job)) for job in sorted(wanted & (
                            {r.job for r in active_runs} | set(finished)))},
                        cluster=slots.cluster(), cursor=cursor, device=slots.kind,
                        policy_state=_saved_policy_state(context, env, cursor),
                        ledgers=job_ledgers(runs, env.job_state_dir, finished))
    plan = plan_tick(inputs, SchedulerSettings.from_env(env))
    # a spec the tick quarantined is listed with the bad files (spec_errors.json, `ones status`)
    errors = errors + [ConfigError(_spec_file(env, job), None, why) for job, why in sorted(plan.quarantined.items())]
    error_keys, spec_errors = _spec_errors(context, errors, set(cursor.get("errors", [])))
    _log_plan(context, plan, held)
    requests = _run_requests(plan)
    apply = _apply(env, plan, spec_errors, cursor.get("failed", {}))
    if apply is not None:
        requests.insert(0, apply)  # the cancellations first: they free the slots the new runs wait for
    events = _observations(env, plan, dict(cursor.get("waiting", {})))
    all_done = specs and not held and set(specs) <= finished | set(plan.cursor["failed"])
    if all_done and not active_runs and not plan.launches:
        done_key = hashlib.sha256(",".join(sorted(finished)).encode()).hexdigest()[:12]
        requests.append(dg.RunRequest(run_key=f"report-{done_key}", job_name=REPORT_JOB_NAME,
                                      tags={"ones/report": "true"}))
    next_cursor = _next_cursor(plan, cursor, apply is not None, error_keys, finished,
                               {"time_s": round(now, 2), "decide_s": round(plan.decide_s, 4),
                                "tick_s": round(time.perf_counter() - t_start, 4), "jobs": len(specs),
                                "slots": slots.num_slots})
    skip = None
    if not requests:
        skip = (f"no change: {len(specs)} job(s), {len(finished & set(specs))} finished, "
                f"{len(active_runs)} run(s) in flight" + (f"; {_bad_specs_line(errors)}" if errors else "")
                + (f"; {len(held)} waiting for upstream assets" if held else ""))
    return dg.SensorResult(
        run_requests=requests, cursor=json.dumps(next_cursor), asset_events=events, skip_reason=skip,
        dynamic_partitions_requests=[JOBS_PARTITIONS.build_add_request(new_keys)] if new_keys else [])


def _next_cursor(plan, cursor: dict, applies: bool, error_keys, finished, last_tick: dict) -> dict:
    """The plan's cursor with what the sensor adds: the search state the apply run saves (without an apply
    run, the last saved one), the bad specs already logged, the waiting reasons' hashes and ``last_tick``;
    finished jobs' entries forgotten (the cursor stays bounded)."""
    out = plan.cursor
    out["policy_ref"] = plan.policy_ref if applies else cursor.get("policy_ref")
    out["errors"] = error_keys
    forget_finished(out, finished)
    out["waiting"] = {j: hashlib.sha256(w.encode()).hexdigest()[:12] for j, w in plan.waiting.items()}
    out["last_tick"] = last_tick
    return out


def watched(instance: dg.DagsterInstance, env: EnvConfig, declared=None) -> dict:
    """What makes the sensor decide before ``tick_interval_s`` has passed: a training run that ended (its job
    finished, failed or stopped: its slots are free), a job that finished, a job spec file added, changed or
    removed, or a declared job's upstream assets materialized."""
    ended = instance.get_runs_count(dg.RunsFilter(job_name=TRAIN_JOB_NAME, statuses=ENDED_STATUSES))
    files = [[p.name, p.stat().st_mtime_ns] for p in job_spec_files(env.jobs_dir)]
    return {"ended_runs": ended, "finished": len(finished_jobs(instance)),
            "specs": hashlib.sha256(json.dumps(files).encode()).hexdigest()[:12],
            "held": len(hold_for_upstream(instance, declared)[1]) if declared else 0}


def watch_tick(context: dg.SensorEvaluationContext, env: EnvConfig, decide, declared=None) -> dg.SensorResult:
    """The sensor's evaluation, every few seconds: ``decide()`` (``scheduler_tick``) when ``tick_interval_s`` has
    passed since the last decision or what ``watched`` sees changed since then, else a skip (``WATCHING``) that
    reads nothing else. A slot a job frees is given out seconds after its run ends, not up to a tick interval
    later (a sensor ticks every ``tick_interval_s`` plus up to the daemon's 5 s loop)."""
    cursor = json.loads(context.cursor) if context.cursor else {}
    try:
        seen = watched(context.instance, env, declared)
    except OSError:  # the jobs directory moved or is unreadable: decide, which reports it
        seen = None
    last = cursor.get("last_tick", {})
    waited = time.time() - float(last.get("time_s", 0.0))
    if seen is not None and cursor.get("watch") == seen and waited < env.scheduler.tick_interval_s:
        bad, nxt = len(cursor.get("errors", ())), env.scheduler.tick_interval_s - waited
        why = (f"{WATCHING} no run ended and no job spec changed since the decision {waited:.0f} s ago; the next in "
               f"{nxt:.0f} s" + (f"; {bad} job spec file(s) skipped until fixed (`ones status`)" if bad else "")
               + (f"; {seen['held']} waiting for upstream assets" if seen["held"] else ""))
        return dg.SensorResult(skip_reason=why, cursor=context.cursor)
    result = decide()
    if seen is not None and result.cursor and result.cursor != context.cursor:
        result = dg.SensorResult(run_requests=result.run_requests, skip_reason=result.skip_reason,
                                 cursor=json.dumps({**json.loads(result.cursor), "watch": seen}),
                                 asset_events=result.asset_events,
                                 dynamic_partitions_requests=result.dynamic_partitions_requests)
    return result


def build_scheduler_sensor(declared=None) -> dg.SensorDefinition:
    """The scheduler sensor. The daemon evaluates it every loop (5 s); it decides every ``scheduler.tick_interval_s``
    of the environment and whenever a run ends or a spec changes (``watch_tick``)."""
    @dg.sensor(name=SENSOR_NAME, jobs=[train_job, report_job, apply_job],
               minimum_interval_seconds=WATCH_S,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="ONES: every tick, decide GPUs and batch size for every job; start, resize, preempt runs")
    def ones_scheduler_sensor(context: dg.SensorEvaluationContext, ones_env: OnesEnvResource, mlflow: MlflowResource,
                              inventory: InventoryResource):
        env = ones_env.config()
        return watch_tick(context, env, lambda: scheduler_tick(context, env, mlflow, inventory, declared),
                          declared)

    return ones_scheduler_sensor


__all__ = ["build_scheduler_sensor", "scheduler_tick", "watch_tick", "watched", "SENSOR_NAME", "WATCHING",
           "REPORT_ASSET"]
