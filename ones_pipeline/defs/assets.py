"""Assets: ``training_job`` (one dynamic partition per job spec) and ``cluster_report``.

A run of ``training_job`` trains one job on one allocation (run config: the ``RunAllocation`` the
sensor made, as JSON) through the step launcher resource until the job finishes (materialization) or
the scheduler preempts it: the apply run asks the generation to stop (``preempt-g<N>.json``), the step
checkpoints, and the run ends successfully without a materialization, saying it was preempted and
resumes (tag ``ones/outcome``). Only when the step does not stop in time does the apply run cancel the
run through Dagster (the step still checkpoints on the interrupt, and the run ends CANCELED). The next
generation resumes from the checkpoint.

No ``from __future__ import annotations``: Dagster resolves Config and resource annotations at runtime.
"""

import contextlib
import os
import signal
import threading
import time

import dagster as dg

from ones_pipeline.config.layout import PROGRESS_FILE, newest_row, preempt_request_file
from ones_pipeline.defs.instance import (
    JOBS_PARTITIONS_NAME,
    REPORT_ASSET,
    TRAIN_JOB_NAME,
    TRAINING_ASSET,
    job_run_infos,
)
from ones_pipeline.defs.launchers import StepLauncher
from ones_pipeline.defs.progress_events import ProgressObserver
from ones_pipeline.defs.resources import InventoryResource, MlflowResource, OnesEnvResource
from ones_pipeline.defs.run_guard import end_untrained, why_not_train
from ones_pipeline.defs.slot_owner import read_ledger
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.scheduler.runs import TAG_OUTCOME, held_periods

JOBS_PARTITIONS = dg.DynamicPartitionsDefinition(name=JOBS_PARTITIONS_NAME)
REPORT_JOB_NAME = "report_job"


class TrainingRunConfig(dg.Config):
    """The allocation of one run, set by the scheduling sensor."""

    allocation: str = ""  # scheduler.allocation.RunAllocation.to_json()
    reason: str = ""  # why the scheduler made this run (``scheduler.runs.Launch``)
    previous_slots: str = ""  # the job's slots before this run, "-" for none


def _allocation(job: str, config: TrainingRunConfig) -> RunAllocation:
    try:
        allocation = RunAllocation.from_json(config.allocation)
    except ValueError as exc:
        raise dg.Failure(f"{job}: bad allocation in the run config: {exc}") from None
    if allocation.job != job:
        raise dg.Failure(f"run config allocation of job {allocation.job!r} does not match partition {job!r}")
    return allocation


def _refuse_manual_launch(context: dg.AssetExecutionContext, job: str) -> None:
    trained = job in context.instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET))
    state = "is already trained (its materialization stands)" if trained else "is scheduled by the ONES sensor"
    context.log.warning(f"{job} {state}: runs of training_job carry the allocation the ones_scheduler_sensor "
                        "chose, so this run launched by hand does nothing. To train a job, add its spec with "
                        "`ones submit SPEC.yaml`; to retrain one, change its spec file.")


@dg.asset(
    name=TRAINING_ASSET,
    partitions_def=JOBS_PARTITIONS,
    description="One training job per partition (a spec file in assets/jobs). Materialized when the job "
                "has met its stopping rule; the ONES sensor starts, resizes and preempts its runs.",
    kinds={"pytorch", "mlflow"},
    output_required=False,  # a run launched by hand (no allocation) ends without touching the partition
)
def training_job(context: dg.AssetExecutionContext, config: TrainingRunConfig, launcher: StepLauncher,
                 mlflow: MlflowResource):
    job = context.partition_key
    if not config.allocation:
        _refuse_manual_launch(context, job)
        return
    allocation = _allocation(job, config)
    if (why := why_not_train(context.instance, context.run, allocation,
                             launcher.ones_env.config().job_state_dir)) is not None:
        end_untrained(context, why)  # a re-execution, a stale generation, a finished job: ends at once
        return
    context.log.info(f"{allocation.describe()}, launcher {type(launcher).__name__}")
    if config.reason:  # why the scheduler made this run, first in its log (also in its config)
        before = f"; slots before: {config.previous_slots}" if config.previous_slots not in ("", "-") else ""
        context.log.info(f"why this run: {config.reason}{before}")
    started_s = time.time()
    try:
        progress = launcher.ones_env.config().job_state_dir(job) / PROGRESS_FILE
        with _interrupt_when_orphaned(), ProgressObserver(context, progress, allocation, mlflow.run_link,
                                                             tracking_uri=mlflow.tracking_uri,
                                                             decisions=launcher.ones_env.config().layout.decisions):
            results = [r for r in launcher.run(context, allocation) if isinstance(r, dg.MaterializeResult)]
    except dg.DagsterExecutionInterruptedError:
        stopped = _checkpointed_stop(launcher, allocation, started_s)
        if stopped is not None:
            _report_preempted(context, allocation, stopped)
        # Re-raised even after a clean checkpoint: the run was cancelled through Dagster (the fallback when
        # the step did not stop on the scheduler's request in time), and Dagster ends it CANCELED.
        raise
    if not results and (planned := _planned_stop(launcher, allocation, started_s)) is not None:
        _report_preempted(context, allocation, planned)  # the scheduler asked, the step checkpointed: green
        if _no_output_allowed(context):
            return
        raise dg.Failure(f"{job} generation {allocation.generation}: preempted with a checkpoint; this Dagster "
                         "version requires an output after a Pipes session, so the run shows as failed")
    if not results:
        raise dg.Failure(f"{job} generation {allocation.generation}: the training step ended without finishing "
                         "the job (stopped outside the scheduler?); its checkpoint is kept and the sensor "
                         "relaunches it")
    last_epoch = _last_event(launcher, allocation, started_s, "epoch") or {}
    env = launcher.ones_env.config()
    yield _materialization(context, allocation, mlflow, results[0], env.job_state_dir,
                           last_epoch.get("global_batch"), read_ledger(env.job_state_dir(job)))


@contextlib.contextmanager
def _interrupt_when_orphaned(poll_s: float = 1.0):
    """Interrupt the step (SIGINT to its own process: how Dagster itself terminates a step) if the process
    that started it goes away. When a run worker is killed, Dagster marks its run failed at once but its
    step process lives on: its training would go on outside any run, beside the generation the scheduler
    starts next on the same checkpoint. Interrupted, the step stops its training with a checkpoint."""
    parent = os.getppid()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGINT)
                return

    threading.Thread(target=watch, name="ones-orphan-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _checkpointed_stop(launcher: StepLauncher, allocation: RunAllocation, since_s: float) -> dict | None:
    """The step's "stopped" event of this generation since ``since_s`` (its rank 0 wrote a checkpoint), or
    None."""
    return _last_event(launcher, allocation, since_s, "stopped")


def _no_output_allowed(context: dg.AssetExecutionContext) -> bool:
    """Let the step end without the asset's output. Once a Pipes session ran in an asset, Dagster demands
    the asset's output even with ``output_required=False`` (its "typed event stream" mode; reported as
    dagster-io/dagster#28491 and #22117, open), and a planned preemption has none to give: a
    materialization would say the job finished. No public API turns the mode off, so this resets the one
    flag on the step's context that switches it on (``_requires_typed_event_stream``). False when this
    Dagster has no such flag: the caller then fails the step, as before. ``tests/test_defs.py`` runs a
    real Pipes session, so a Dagster upgrade that changes this fails a test, not a user's runs."""
    step = getattr(getattr(context, "op_execution_context", None), "_step_execution_context", None)
    if step is None or not isinstance(getattr(step, "_requires_typed_event_stream", None), bool):
        return False
    step._requires_typed_event_stream = False
    return True


def _planned_stop(launcher: StepLauncher, allocation: RunAllocation, since_s: float) -> dict | None:
    """The "stopped" event when this generation stopped with a checkpoint because the apply run asked it to
    (``preempt-g<N>.json``); None otherwise (a stop from elsewhere is a failure: the sensor relaunches)."""
    request = preempt_request_file(launcher.ones_env.config().job_state_dir(allocation.job), allocation.generation)
    return _checkpointed_stop(launcher, allocation, since_s) if request.exists() else None


def _last_event(launcher: StepLauncher, allocation: RunAllocation, since_s: float, event: str) -> dict | None:
    """The newest ``event`` row of this generation since ``since_s`` in the job's progress file, or None."""
    path = launcher.ones_env.config().job_state_dir(allocation.job) / PROGRESS_FILE
    try:
        lines = path.read_text().splitlines()[-50:]
    except OSError:
        return None
    return newest_row(lines, lambda row: row.get("event") == event and row.get("generation") == allocation.generation
                      and float(row.get("time_s", 0)) >= since_s)


def _report_preempted(context: dg.AssetExecutionContext, allocation: RunAllocation, stopped: dict) -> None:
    """A planned preemption: say so in the run log and on the run (tag ``ones/outcome``). The reason is in
    the line the apply run logged on this run just before ("preempted by ones: <reason> ...")."""
    where = f"{allocation.job} generation {allocation.generation}"
    if stopped.get("before_training"):  # still starting up: the job's last checkpoint is unchanged
        message = (f"preempted by ones: {where} stopped while starting up, before it trained; it resumes from its "
                   "last checkpoint in a new generation when the scheduler gives it slots again")
    else:
        message = (f"preempted by ones: {where} checkpointed at {int(stopped.get('samples') or 0)} samples (epoch "
                   f"{float(stopped.get('epoch') or 0):.2f}); it resumes from the checkpoint in a new generation "
                   "when the scheduler gives it slots again")
    context.log.info(message)
    context.instance.add_run_tags(context.run.run_id, {TAG_OUTCOME: "preempted, checkpointed"})


def _materialization(context, allocation: RunAllocation, mlflow: MlflowResource, result: dg.MaterializeResult,
                     job_dir, final_batch: int | None = None, ledger: list | None = None) -> dg.MaterializeResult:
    """The partition's metadata: rounded, units in the names, slots named as the scheduler names them; the
    global batch the job ended with (``final_batch``, from its last epoch, when it re-tuned its own). ``job_dir``:
    a job's state directory (``EnvConfig.job_state_dir``: its runs' in-place changes)."""
    reported = {k: getattr(v, "value", v) for k, v in (result.metadata or {}).items()}
    if isinstance(reported.get("accuracy"), float):
        reported["accuracy"] = round(reported["accuracy"], 4)
    if isinstance(reported.get("epochs"), float):  # "1333.3413333333" on the partition page
        reported["epochs"] = round(reported["epochs"], 3)
    now = time.time()
    runs = job_run_infos(context.instance, job_dir, allocation.job)
    ledger = ledger or []  # the job's slot ledger (``defs.slot_owner``): slot-time across in-place changes
    this = next((r for r in runs if r.run_id == context.run.run_id), None)  # its slots now, not at its start
    mlflow_run = str(reported.pop("mlflow_run_id", "") or "")
    kind = "gpu" if allocation.device == "gpu" else "cpu"
    metadata = {
        **reported,
        "jct_s": round(now - allocation.submit_time_s, 1) if allocation.submit_time_s else None,
        "slot_hours": round(sum((e - s) * len(slots) for r in runs
                                for s, e, slots in held_periods(r, ledger, now)) / 3600.0, 4),
        "generations": len([r for r in runs if r.start_s is not None]),
        "slots": f"{kind} " + ",".join(str(s) for s in (this.slot_ids if this else allocation.slot_ids)),
        "global_batch": int(final_batch or reported.get("global_batch") or allocation.global_batch),
        "submit_time_s": dg.MetadataValue.timestamp(allocation.submit_time_s) if allocation.submit_time_s else None,
        "model": allocation.spec.model,
        "mlflow_run": mlflow.run_link(mlflow_run) if mlflow_run else "-",
        "mlflow_run_id": mlflow_run,
        **(_model_metadata(context, mlflow, mlflow_run) if mlflow_run else {}),
    }
    return dg.MaterializeResult(metadata={k: v for k, v in metadata.items() if v is not None})


def _model_metadata(context, mlflow: MlflowResource, run_id: str) -> dict:
    """The trained model's URI and the links to it and its run (``MlflowResource.model_metadata``); a store
    that cannot be read now costs the links, never the materialization."""
    try:
        return mlflow.model_metadata(run_id, context.run.run_id)
    except Exception as exc:  # noqa: BLE001
        context.log.warning(f"MLflow run {run_id}: model links unavailable ({exc})")
        return {}


@dg.asset(
    name=REPORT_ASSET,
    deps=[training_job],
    description="Finished jobs: JCT table, JCT CDF and allocation-over-time plots.",
    kinds={"pandas", "matplotlib"},
)
def cluster_report(context: dg.AssetExecutionContext, ones_env: OnesEnvResource,
                   inventory: InventoryResource) -> dg.MaterializeResult:
    from ones_pipeline.adapters.live_report import FinishedJob, RunSpan, build_report, png_markdown

    env = ones_env.config()
    instance = context.instance
    finished = []
    for job in sorted(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET))):
        event = _latest_partition_event(instance, job)
        if event is None:
            continue
        meta = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
        submit_s = float(meta.get("submit_time_s") or event.timestamp)
        jct_s = _float(meta.get("jct_s"))  # the partition's own figure, so both pages show one JCT
        finish_s = submit_s + jct_s if jct_s is not None else float(event.timestamp)
        finished.append(FinishedJob(
            job=job, submit_s=submit_s, finish_s=finish_s, accuracy=_float(meta.get("accuracy")),
            samples=_float(meta.get("samples")), restarts=int(_float(meta.get("restarts")) or 0),
            model=str(meta.get("model", ""))))
    spans = [RunSpan(r.job, r.generation, slots, start, end, r.status)
             for r in job_run_infos(instance, env.job_state_dir)
             for start, end, slots in held_periods(r, read_ledger(env.job_state_dir(r.job)), time.time())]
    out_dir = env.layout.report_dir
    slots = inventory.discover()
    report = build_report(finished, spans, slots.num_slots, out_dir, device=slots.kind)
    md = report.markdown + "\n\n" + png_markdown(report.files["jct_cdf"], "JCT CDF") + "\n\n" + \
        png_markdown(report.files["allocation"], "allocation over time")
    context.log.info(f"cluster report: {len(finished)} finished job(s), files in {out_dir}")
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(md),
        "job_table": dg.MetadataValue.table(*_job_table(report.table)),
        **_summary_metadata(report.summary),
        "directory": dg.MetadataValue.path(str(out_dir)),
    })


def _summary_metadata(summary: dict) -> dict:
    """Rounded, with the unit in the name; utilisation as a percentage."""
    out = {}
    for key, value in summary.items():
        if not isinstance(value, (int, float)) or value != value:  # NaN: nothing to show
            continue
        if key == "utilisation":
            out["utilisation_percent"] = dg.MetadataValue.float(round(100.0 * value, 1))
        elif key == "gpu_s":
            out["slot_hours"] = dg.MetadataValue.float(round(value / 3600.0, 3))
        elif isinstance(value, int) or key in ("jobs", "restarts"):
            out[key] = dg.MetadataValue.int(int(value))
        else:
            out[key] = dg.MetadataValue.float(round(float(value), 1))
    return out


def _job_table(table) -> tuple[list, dg.TableSchema]:
    """The per-job table as Dagster table metadata (seconds, one unit per column). Narrow enough for the
    asset page's metadata cell (about 560 px at a 1600 px window): accuracy to 4 digits, and the
    generations column only in the markdown report and jobs.csv."""
    columns = [("job", "string"), ("model", "string"), ("jct_s", "float"), ("wait_s", "float"), ("run_s", "float"),
               ("restarts", "int"), ("slot_hours", "float"), ("accuracy", "float")]
    records = []
    for row in table.itertuples(index=False):
        values = {"job": row.job, "model": row.model, "jct_s": round(row.jct_s, 1), "wait_s": round(row.wait_s, 1),
                  "run_s": round(row.run_s, 1), "restarts": int(row.restarts),
                  "slot_hours": round(row.gpu_s / 3600.0, 3), "accuracy": round(row.accuracy, 4)}
        records.append(dg.TableRecord({k: v for k, v in values.items() if v == v}))  # NaN accuracy left out
    return records, dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in columns])


def _float(value):
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _latest_partition_event(instance, job: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(TRAINING_ASSET), asset_partitions=[job]), limit=1).records
    return records[0].event_log_entry if records else None


# One step per run, so the step runs in the run worker (``in_process_executor``): the default multiprocess
# executor spawns a second process per run that imports Dagster and this code location again (3-4 s of
# CPU, on the path from a scheduling decision to training). A run's cancel reaches the step the same way
# (Dagster interrupts the run worker; Pipes forwards it to the training process).
train_job = dg.define_asset_job(TRAIN_JOB_NAME, selection=[TRAINING_ASSET], executor_def=dg.in_process_executor,
                                description="Train one job on one allocation (launched by the ONES sensor)")
report_job = dg.define_asset_job(REPORT_JOB_NAME, selection=[REPORT_ASSET])
