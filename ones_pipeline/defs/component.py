"""``OnesComponent``: ONES in the user's own Dagster project (a Dagster Component, YAML or Python).

In a ``dg`` project's ``defs/`` folder, ``ones/defs.yaml``::

    type: ones_pipeline.defs.component.OnesComponent
    attributes:
      cluster: {gpus: none, cpu_slots: 2}      # the sections of resources/<env>.yaml, same fields
      scheduler: {tick_interval_s: 5}
      mlflow: {experiment: ones, ui_url: "http://127.0.0.1:5000"}
      jobs:                                    # besides the spec files of jobs_dir (assets/jobs)
        - {name: mlp-a, model: mlp-digits, per_gpu_batch: 32, stopping: {epochs: 3}, deps: [digits_dataset]}

It builds what ``ones up`` serves: the ``training_job`` asset (one partition per job; depends on every
upstream asset a job names), ``cluster_report``, the ``ones_scheduler_sensor``, the jobs (train, report,
apply) and the resources (environment, MLflow, slot inventory, step launcher). ``ones_pipeline.definitions``
(the standalone code location of ``ones up`` / ``ones run``) is this component built from the project's
``resources/<env>.yaml`` (``OnesComponent.from_env``). In Python: ``OnesComponent(cluster=..., jobs=[
ones_job("mlp-a", model="mlp-digits", ..., deps=["digits_dataset"])])`` (``defs.declared.ones_job``).

A finished job's materialization carries ``model_uri`` (``models:/<id>``) and links to MLflow; a downstream
asset names ``deps=[AssetKey("training_job")]`` and loads the models with ``trained_models`` (below).

No ``from __future__ import annotations``: Dagster resolves the model's annotations at runtime.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from ones_pipeline.config.env import ENV_FIELDS, load_env
from ones_pipeline.defs.declared import DeclaredJob, declared_jobs, ones_job, upstream_keys

__all__ = ["OnesComponent", "ones_job", "trained_models"]


class OnesComponent(dg.Component, dg.Model, dg.Resolvable):
    """ONES elastic training jobs in a Dagster project: assets, scheduling sensor and resources."""

    project_dir: str | None = None  # checkpoints, MLflow store and jobs_dir live here; default: the project root
    env: str | None = None  # start from <project_dir>/resources/<env>.yaml; the sections below replace its own
    cluster: dict[str, Any] | None = None
    launcher: dict[str, Any] | None = None
    mlflow: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    state_dir: str | None = None
    jobs_dir: str | None = None
    jobs: list[dict[str, Any]] = []  # specs (the fields of a spec file) with optional deps: [asset keys]

    @classmethod
    def from_env(cls, project_dir: str | None = None, env: str | None = None) -> "OnesComponent":
        """The component ``ones up`` serves: the project's ``resources/<env>.yaml`` as it is."""
        config = load_env(project_dir, env)
        return cls(project_dir=str(config.project_dir), env=config.name)

    def _sections(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in sorted(ENV_FIELDS) if getattr(self, k) is not None}

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = Path(context.path)
        project_dir = Path(self.project_dir) if self.project_dir else Path(context.project_root)
        if not project_dir.is_absolute():
            project_dir = Path(context.project_root) / project_dir
        return self.definitions(project_dir, where / "defs.yaml" if where.is_dir() else where)

    def definitions(self, project_dir: Path | str | None = None, source: Path | str | None = None,
                    launcher: Callable[..., Any] | None = None) -> dg.Definitions:
        """The definitions for ``project_dir`` (default: this component's, else the working directory);
        ``source``: the file errors name; ``launcher``: a step launcher class used instead of the
        environment's (tests pass ``InMemoryLauncher``)."""
        from ones_pipeline.defs.resources import OnesEnvResource

        project_dir = Path(project_dir or self.project_dir or ".").resolve()
        sections, env_name = self._sections(), self.env or "local"
        if sections:  # the file's sections, then the component's (whole sections replaced)
            base = load_env(project_dir, self.env) if self.env else None
            source = Path(source or project_dir / "defs.yaml")
            data = {**(_env_mapping(base) if base else {}), **sections}
            ones_env = OnesEnvResource(project_dir=str(project_dir), env=env_name, settings=json.dumps(data),
                                       settings_path=str(source))
        else:
            ones_env = OnesEnvResource(project_dir=str(project_dir), env=env_name)
        declared = declared_jobs(self.jobs, Path(source or project_dir / "defs.yaml"))
        return build(ones_env, declared, launcher)


def _env_mapping(env) -> dict[str, Any]:
    """The environment file's own sections (re-read as written, so the component's parser sees them)."""
    from ones_pipeline.config import read_yaml

    return dict(read_yaml(env.path) or {}) if env.path.exists() else {}


def build(ones_env, declared: dict[str, DeclaredJob], launcher=None) -> dg.Definitions:
    """The definitions of one ONES environment (``ones_env``: an ``OnesEnvResource``) and its declared jobs."""
    from ones_pipeline.defs.apply import apply_job
    from ones_pipeline.defs.assets import cluster_report, report_job, train_job, training_job
    from ones_pipeline.defs.launchers import launcher_for
    from ones_pipeline.defs.resources import InventoryResource, mlflow_resource_for
    from ones_pipeline.defs.sensor import build_scheduler_sensor

    env = ones_env.config()
    mlflow = mlflow_resource_for(env)
    step_launcher = launcher_for(env, ones_env, mlflow) if launcher is None else launcher(ones_env=ones_env,
                                                                                         mlflow=mlflow)
    training = training_job
    if upstream := upstream_keys(declared):  # the asset graph's edges: dataset -> training_job
        training = training_job.map_asset_specs(lambda spec: spec.merge_attributes(deps=upstream))
    return dg.Definitions(
        assets=[training, cluster_report],
        jobs=[train_job, report_job, apply_job],
        sensors=[build_scheduler_sensor(declared)],
        resources={"ones_env": ones_env, "mlflow": mlflow, "inventory": InventoryResource(ones_env=ones_env),
                   "launcher": step_launcher},
    )


def trained_models(context: dg.AssetExecutionContext, jobs: list[str] | None = None) -> dict[str, dict]:
    """For a downstream asset (``deps=[AssetKey("training_job")]``): each finished job's (``jobs``: these
    only) materialization metadata, ``model_uri`` first: ``mlflow.pytorch.load_model(m["model_uri"])``."""
    from ones_pipeline.defs.instance import TRAINING_ASSET

    instance = context.instance
    key = dg.AssetKey(TRAINING_ASSET)
    out = {}
    for job in sorted(jobs if jobs is not None else instance.get_materialized_partitions(key)):
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[job]),
                                                  limit=1).records
        if records:
            meta = records[0].event_log_entry.asset_materialization.metadata
            out[job] = {k: getattr(v, "value", v) for k, v in meta.items()}
    return out
