"""``ones_apply``: the job that carries out what a scheduler tick decided.

A sensor evaluation must act only through what it returns: the UI's "Preview tick result" runs the
sensor function for real against the real instance (even with the sensor stopped) and discards only the
returned run requests. So the tick cancels nothing and writes no file itself. It returns, next to the
training runs it requests, one run of ``ones_apply`` whose config is the rest of its plan: the runs to
stop (with the reason, logged on each as "preempted by ones: ..."; a running one is asked to stop with a
checkpoint and ends green, see ``_cancel_all``), the decision records
to append to ``decisions.jsonl``, the state files to rewrite (``failed_jobs.json``,
``spec_errors.json``) and the policy's search state (``policy/<ref>.json``; the cursor holds only ``ref``).
The daemon launches it only for a committed tick; a preview launches nothing.
Its run key is a hash of that content, so a re-evaluated tick applies nothing twice.

No ``from __future__ import annotations``: Dagster resolves Config and resource annotations at runtime.
"""

import hashlib
import json
import time

import dagster as dg

from ones_pipeline.config.layout import preempt_request_file
from ones_pipeline.defs.resources import OnesEnvResource
from ones_pipeline.defs.slot_owner import claim
from ones_pipeline.scheduler.runs import IN_FLIGHT
from ones_pipeline.train.resize_control import DEFAULT_RESIZE_TIMEOUT_S

APPLY_JOB_NAME = "ones_apply"
APPLY_TAG = "ones/apply"


class ApplyConfig(dg.Config):
    plan: str = "{}"  # JSON: {"cancels", "resizes", "decisions": [...], "failed": {...}, "spec_errors": [...]}


KEEP_POLICY_STATES = 5  # saved search states kept beside the current one


def apply_request(cancels: list, decisions: list, failed: dict | None, spec_errors: list | None,
                  policy: dict | None = None, resizes: list | None = None) -> dg.RunRequest | None:
    """The run request that applies a tick's acts, or None when there is nothing to do. ``failed`` and
    ``spec_errors``: the new content of their files, None when unchanged. ``policy``: ``{"ref", "state"}``,
    the policy's search state to save under its reference (carried only along with acts: it is not a
    reason for a run by itself)."""
    plan: dict = {}
    if cancels:
        plan["cancels"] = cancels
    if resizes:
        plan["resizes"] = resizes
    if decisions:
        plan["decisions"] = decisions
    if failed is not None:
        plan["failed"] = failed
    if spec_errors is not None:
        plan["spec_errors"] = spec_errors
    if not plan:
        return None
    # The key leaves out the clock (decision time, decide time) and the search state (it depends on the
    # search's wall-clock budget): a tick re-evaluated after a crash, before its cursor was committed,
    # plans the same acts and must get the same key, so they run once.
    timeless = {**plan, "decisions": [{k: v for k, v in d.items() if k not in ("time_s", "decide_s")}
                                      for d in plan.get("decisions", [])]}
    if "resizes" in plan:
        timeless["resizes"] = [{k: v for k, v in r.items() if k != "decided_s"} for r in plan["resizes"]]
    key = hashlib.sha256(json.dumps(timeless, sort_keys=True).encode()).hexdigest()[:16]
    if policy is not None:
        plan["policy"] = policy
    text = json.dumps(plan, sort_keys=True)
    summary = f"{len(cancels)} cancel(s), {len(resizes or ())} in-place change(s), {len(decisions)} decision(s)"
    return dg.RunRequest(run_key=f"apply-{key}", job_name=APPLY_JOB_NAME,
                         run_config={"ops": {"apply_tick": {"config": {"plan": text}}}},
                         tags={APPLY_TAG: summary})


# Cancel reasons after which the job does not go on (scheduler.tick.current_schedule): no "it resumes" then.
_ENDED = {"finished": "the job already finished in an earlier generation; this run is not needed",
          "spec removed": "its spec file was removed; the checkpoint is kept",
          "job failed": "the job is marked failed; the checkpoint is kept"}


def cancel_message(cancel: dict) -> str:
    """The line logged on a run the scheduler cancels: a preemption or resize resumes in a new generation; a
    run of a job that ended does not."""
    where = f"job {cancel['job']} generation {cancel['generation']}"
    if cancel["reason"] in _ENDED:
        return f"cancelled by ones: {cancel['reason']} ({where}; {_ENDED[cancel['reason']]})"
    return (f"preempted by ones: {cancel['reason']} ({where}; "
            "the step checkpoints and the job resumes in a new generation)")


# A run asked to stop has this long beyond the step's grace period (a run still starting imports torch
# first) before it is cancelled through Dagster instead.
STOP_MARGIN_S = 60.0
_RUNNING = ("STARTING", "STARTED")


def _cancel_all(context: dg.OpExecutionContext, cancels: list[dict], ones_env: OnesEnvResource) -> None:
    """Stop the runs of ``cancels``. A running one is asked to stop (``preempt-g<N>.json`` in its job's
    directory): its step checkpoints and ends normally, and the run ends green saying it was preempted. A
    run not started yet, or one that has not ended ``grace_period_s + STOP_MARGIN_S`` after the request,
    is cancelled through Dagster (its step, if any, still checkpoints on the interrupt)."""
    instance = context.instance
    env = ones_env.config()
    asked: dict[str, dict] = {}
    for cancel in cancels:
        run = instance.get_run_by_id(cancel["run_id"])
        if run is None or run.status.value not in IN_FLIGHT:
            context.log.info(f"run {cancel['run_id']} ({cancel['job']}) already ended; nothing to cancel")
            continue
        message = cancel_message(cancel)
        instance.report_engine_event(message, run)
        if run.status.value in _RUNNING:
            _write_preempt_request(env, cancel)
            context.log.info(f"stop run {run.run_id}: {message}")
            asked[run.run_id] = cancel
        else:
            context.log.info(f"cancel run {run.run_id} (not started): {message}")
            _dagster_cancel(context, run.run_id)
    deadline = time.monotonic() + env.launcher.grace_period_s + STOP_MARGIN_S
    while asked and time.monotonic() < deadline:
        time.sleep(0.5)
        for run_id in list(asked):
            run = instance.get_run_by_id(run_id)
            if run is None or run.status.value not in IN_FLIGHT:
                context.log.info(f"run {run_id} ({asked.pop(run_id)['job']}) ended: "
                                 f"{run.status.value if run else 'gone'}")
    for run_id, cancel in asked.items():
        context.log.warning(f"run {run_id} ({cancel['job']}) did not stop within "
                            f"{env.launcher.grace_period_s + STOP_MARGIN_S:.0f} s of the request: cancelling it")
        _dagster_cancel(context, run_id)


def _resize_all(context: dg.OpExecutionContext, resizes: list[dict], ones_env: OnesEnvResource) -> None:
    """Ask each running generation of ``resizes`` for its new slots in place (``slot_owner.claim``, which writes
    ``resize_control.request_resize``), shrinks first: a grow claims its new slots on its run's tags once no other
    run holds them, which a shrink of the same tick does once its change is done. A run that is no
    longer running is left alone (the next tick sees it and decides again)."""
    instance = context.instance
    env = ones_env.config()
    for r in sorted(resizes, key=lambda r: len(r["after"]) - len(r["before"])):
        run = instance.get_run_by_id(r["run_id"])
        if run is None or run.status.value != "STARTED":
            context.log.info(f"run {r['run_id']} ({r['job']}) is {run.status.value if run else 'gone'}: "
                             f"in-place change not made")
            continue
        job_dir = env.job_state_dir(r["job"])
        if not claim(instance, r, job_dir, DEFAULT_RESIZE_TIMEOUT_S + STOP_MARGIN_S, context.log.warning):
            continue
        message = (f"resized in place by ones: {r['reason']} (job {r['job']} generation {r['generation']}: slots "
                   f"{r['before']} -> {r['after']}, global batch {r['global_batch']}; same run)")
        instance.report_engine_event(message, run)
        context.log.info(message)


def _write_preempt_request(env, cancel: dict) -> None:
    """The request every launcher of the generation polls; written atomically (a half file reads as none)."""
    path = preempt_request_file(env.job_state_dir(cancel["job"]), cancel["generation"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": cancel["run_id"], "reason": cancel["reason"], "time_s": time.time()}))
    tmp.replace(path)


def _dagster_cancel(context: dg.OpExecutionContext, run_id: str) -> None:
    try:
        context.instance.run_coordinator.cancel_run(run_id)
    except Exception as exc:  # it ended meanwhile
        context.log.warning(f"could not cancel run {run_id}: {exc}")


@dg.op(name="apply_tick", description="Cancel the runs a scheduler tick preempted or moved through a checkpoint, "
                                      "resize in place those it changes in place; record its decisions and files")
def apply_tick(context: dg.OpExecutionContext, config: ApplyConfig, ones_env: OnesEnvResource) -> None:
    plan = json.loads(config.plan)
    layout = ones_env.config().layout
    _cancel_all(context, plan.get("cancels", []), ones_env)  # first: they free slots a grow may take
    _resize_all(context, plan.get("resizes", []), ones_env)
    layout.append_jsonl(layout.decisions, plan.get("decisions", []))
    if "failed" in plan:
        layout.write_json(layout.failed_jobs, plan["failed"])
    if "spec_errors" in plan:
        layout.write_json(layout.spec_errors, plan["spec_errors"])
    if "policy" in plan:
        _save_policy_state(layout, plan["policy"]["ref"], plan["policy"]["state"])


def _save_policy_state(layout, ref: str, state: dict) -> None:
    """Write the search state under its reference (atomically); keep the newest few, drop older ones."""
    layout.write_json(layout.policy_state(ref), state)
    saved = sorted(layout.policy_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in saved[KEEP_POLICY_STATES + 1:]:
        old.unlink(missing_ok=True)


# One step, run in the run worker as the training job's (``assets.train_job``): a second process per apply run
# would add its start-up to every change's way from the tick to the training processes.
@dg.job(name=APPLY_JOB_NAME, executor_def=dg.in_process_executor,
        description="What a ONES scheduler tick decided: cancel, record (launched by the sensor for committed "
                    "ticks only)")
def apply_job():
    apply_tick()
