"""The Dagster code location (``workspace.yaml``: python_module ``ones_pipeline.definitions``).

The one place the environment is chosen: ``$ONES_PROJECT_DIR`` (default: the working directory) and
``$ONES_ENV`` (default ``local``) select ``<project>/resources/<env>.yaml``.
"""

import dagster as dg

from ones_pipeline.config import load_env
from ones_pipeline.defs.assets import cluster_report, report_job, train_job, training_job
from ones_pipeline.defs.resources import OnesEnvResource, mlflow_resource_for, project_dir_from_env
from ones_pipeline.defs.sensor import build_scheduler_sensor


def build_definitions(project_dir: str | None = None, env_name: str | None = None) -> dg.Definitions:
    project_dir = project_dir or project_dir_from_env()
    env = load_env(project_dir, env_name)
    return dg.Definitions(
        assets=[training_job, cluster_report],
        jobs=[train_job, report_job],
        sensors=[build_scheduler_sensor(env.scheduler.tick_interval_s)],
        resources={"ones_env": OnesEnvResource(project_dir=str(env.project_dir), env=env.name),
                   "mlflow": mlflow_resource_for(env)},
    )


defs = build_definitions()
