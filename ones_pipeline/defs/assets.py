"""Assets: ``training_job`` (one dynamic partition per job spec) and ``cluster_report``.

A run of ``training_job`` trains one job on one allocation (run config: slots, global batch, LR,
generation) through the configured launcher until the job finishes (materialization) or the scheduler
cancels the run (the step checkpoints and the run ends CANCELED; the next generation resumes).

No ``from __future__ import annotations``: Dagster resolves Config and resource annotations at runtime.
"""

import json
import sys
import time

import dagster as dg

from ones_pipeline.core.types import spec_from_dict
from ones_pipeline.defs.resources import MlflowResource, OnesEnvResource
from ones_pipeline.live import TAG_JOB, TAG_MANAGED, RunInfo

JOBS_PARTITIONS = dg.DynamicPartitionsDefinition(name="training_jobs")
TRAINING_ASSET = "training_job"
REPORT_ASSET = "cluster_report"
TRAIN_JOB_NAME = "train_job"
REPORT_JOB_NAME = "report_job"


class TrainingRunConfig(dg.Config):
    """The allocation of one run (set by the scheduling sensor)."""

    spec_json: str = ""  # the job spec as JSON (core.types.spec_to_dict)
    slot_ids: list[int] = []
    slot_kind: str = "cpu"  # "gpu": slot ids are GPU ids; "cpu": CPU slots (one process each)
    global_batch: int = 0
    lr: float = 0.0
    generation: int = 0
    submit_time_s: float = 0.0


def job_run_infos(instance: dg.DagsterInstance, job: str | None = None) -> list[RunInfo]:
    """Every managed training run (of ``job``) the instance knows, with start/end times."""
    tags = {TAG_MANAGED: "true"}
    if job is not None:
        tags[TAG_JOB] = job
    out = []
    for rec in instance.get_run_records(dg.RunsFilter(tags=tags)):
        run = rec.dagster_run
        info = RunInfo.from_tags(run.run_id, run.status.value, run.tags, rec.create_timestamp.timestamp(),
                                 rec.start_time, rec.end_time)
        if info is not None:
            out.append(info)
    return out


def _run_subprocess(context, grace_period_s: float, extras: dict, env: dict):
    client = dg.PipesSubprocessClient(forward_termination=True, termination_timeout_seconds=grace_period_s + 10)
    return client.run(context=context, command=[sys.executable, "-m", "ones_pipeline.train"], extras=extras, env=env)


@dg.asset(
    name=TRAINING_ASSET,
    partitions_def=JOBS_PARTITIONS,
    description="One training job per partition (a spec file in assets/jobs). Materialized when the job "
                "has met its stopping rule; the ONES sensor starts, resizes and preempts its runs.",
    kinds={"pytorch", "mlflow"},
)
def training_job(context: dg.AssetExecutionContext, config: TrainingRunConfig, ones_env: OnesEnvResource,
                 mlflow: MlflowResource) -> dg.MaterializeResult:
    env = ones_env.config()
    job = context.partition_key
    if not config.spec_json:
        raise dg.Failure(f"{job}: no spec in the run config: runs of training_job are launched by the "
                         "ones_scheduler_sensor (or `ones submit`), not by hand")
    spec = spec_from_dict(json.loads(config.spec_json))
    if spec.name != job:
        raise dg.Failure(f"run config spec {spec.name!r} does not match partition {job!r}")
    if not config.slot_ids or config.global_batch < 1:
        raise dg.Failure(f"{job}: the run config holds no allocation (slot_ids {config.slot_ids}, "
                         f"global_batch {config.global_batch})")
    state_dir = env.job_state_dir(job)
    state_dir.mkdir(parents=True, exist_ok=True)
    mlflow.ensure()  # once, before the trainer's processes start (first-time schema creation races)
    on_gpus = config.slot_kind == "gpu"
    extras = {
        "spec": json.loads(config.spec_json), "gpus": list(config.slot_ids) if on_gpus else [],
        "slots": len(config.slot_ids), "global_batch": config.global_batch, "lr": config.lr,
        "generation": config.generation, "state_dir": str(state_dir), "tracking_uri": mlflow.tracking_uri,
        "experiment": mlflow.experiment, "grace_period_s": env.launcher.grace_period_s, "seed": env.policy.seed,
    }
    step_env = dict(mlflow.step_env())
    context.log.info(f"{job} generation {config.generation}: {len(config.slot_ids)} "
                     f"{'GPU' if on_gpus else 'CPU slot'}(s) "
                     f"{config.slot_ids}, global batch {config.global_batch}, lr {config.lr:.4g}, "
                     f"launcher {env.launcher.kind}")
    if env.launcher.kind == "docker":
        from ones_pipeline.defs.docker_launcher import run_docker_step

        mounts = [p for p in (mlflow.sqlite_dir(),) if p is not None]
        invocation = run_docker_step(context, env.launcher.docker, job, config.generation,
                                     list(config.slot_ids) if on_gpus else [], extras, step_env, state_dir, mounts)
    else:
        invocation = _run_subprocess(context, env.launcher.grace_period_s, extras, step_env)
    results = [r for r in invocation.get_results() if isinstance(r, dg.MaterializeResult)]
    if not results:
        raise dg.Failure(f"{job} generation {config.generation}: the training step ended without finishing "
                         "the job (stopped outside the scheduler?); its checkpoint is kept and the sensor "
                         "relaunches it")
    reported = dict(results[0].metadata or {})
    now = time.time()
    runs = job_run_infos(context.instance, job)
    gpu_s = sum(r.held_s(now) * len(r.slot_ids) for r in runs)
    run_id_file = state_dir / "mlflow_run_id"
    mlflow_run = run_id_file.read_text().strip() if run_id_file.exists() else ""
    metadata = {
        **reported,
        "jct_s": round(now - config.submit_time_s, 1) if config.submit_time_s else None,
        "gpu_seconds": round(gpu_s, 1),
        "generations": len([r for r in runs if r.start_s is not None]),
        "slots": ",".join(str(s) for s in config.slot_ids),
        "global_batch": config.global_batch,
        "submit_time_s": config.submit_time_s,
        "model": spec.model,
        "mlflow_run": mlflow.run_link(mlflow_run) if mlflow_run else "-",
        "mlflow_run_id": mlflow_run,
    }
    return dg.MaterializeResult(metadata={k: v for k, v in metadata.items() if v is not None})


def _meta_value(entry):
    value = getattr(entry, "value", entry)
    return value


@dg.asset(
    name=REPORT_ASSET,
    deps=[training_job],
    description="Finished jobs: JCT table, JCT CDF and allocation-over-time plots.",
    kinds={"pandas", "matplotlib"},
)
def cluster_report(context: dg.AssetExecutionContext, ones_env: OnesEnvResource) -> dg.MaterializeResult:
    from ones_pipeline.adapters.gpus import discover
    from ones_pipeline.adapters.live_report import FinishedJob, RunSpan, build_report, png_markdown

    env = ones_env.config()
    instance = context.instance
    finished = []
    for job in sorted(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET))):
        event = _latest_partition_event(instance, job)
        if event is None:
            continue
        meta = {k: _meta_value(v) for k, v in event.asset_materialization.metadata.items()}
        finished.append(FinishedJob(
            job=job, submit_s=float(meta.get("submit_time_s") or event.timestamp),
            finish_s=float(event.timestamp), accuracy=_float(meta.get("accuracy")),
            samples=_float(meta.get("samples")), restarts=int(_float(meta.get("restarts")) or 0),
            model=str(meta.get("model", ""))))
    spans = [RunSpan(r.job, r.generation, r.slot_ids, r.start_s, r.end_s, r.status) for r in job_run_infos(instance)]
    inventory = discover(cpu_slots=env.cluster.cpu_slots, gpus=env.cluster.gpus,
                         gpus_per_node=env.cluster.gpus_per_node)
    report = build_report(finished, spans, inventory.num_slots, env.state_dir / "report")
    md = report.markdown + "\n\n" + png_markdown(report.files["jct_cdf"], "JCT CDF") + "\n\n" + \
        png_markdown(report.files["allocation"], "allocation over time")
    context.log.info(f"cluster report: {len(finished)} finished job(s), files in {env.state_dir / 'report'}")
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(md),
        "jobs": len(finished),
        **{k: float(v) for k, v in report.summary.items() if isinstance(v, (int, float))},
        "directory": dg.MetadataValue.path(str(env.state_dir / "report")),
    })


def _float(value):
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _latest_partition_event(instance, job: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(TRAINING_ASSET), asset_partitions=[job]), limit=1).records
    return records[0].event_log_entry if records else None


train_job = dg.define_asset_job(TRAIN_JOB_NAME, selection=[TRAINING_ASSET],
                                description="Train one job on one allocation (launched by the ONES sensor)")
report_job = dg.define_asset_job(REPORT_JOB_NAME, selection=[REPORT_ASSET])
