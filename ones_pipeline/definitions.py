"""The Dagster code location (``workspace.yaml``: python_module ``ones_pipeline.definitions``).

The one place the environment is chosen: ``$ONES_PROJECT_DIR`` (default: the working directory) and
``$ONES_ENV`` (default ``local``) select ``<project>/resources/<env>.yaml`` (read by ``config``); the
resources (environment, MLflow store, slot inventory, step launcher) are built from it here.
"""

from collections.abc import Callable

import dagster as dg

from ones_pipeline.config import load_env
from ones_pipeline.defs.apply import apply_job
from ones_pipeline.defs.assets import cluster_report, report_job, train_job, training_job
from ones_pipeline.defs.launchers import StepLauncher, launcher_for
from ones_pipeline.defs.resources import InventoryResource, OnesEnvResource, mlflow_resource_for
from ones_pipeline.defs.sensor import build_scheduler_sensor


def build_definitions(project_dir: str | None = None, env_name: str | None = None,
                      launcher: Callable[..., StepLauncher] | None = None) -> dg.Definitions:
    """``launcher``: a launcher class (or partial) used instead of the one the environment names, called
    with the ``ones_env`` and ``mlflow`` resources (tests pass ``InMemoryLauncher``)."""
    env = load_env(project_dir, env_name)
    ones_env = OnesEnvResource(project_dir=str(env.project_dir), env=env.name)
    mlflow = mlflow_resource_for(env)
    step_launcher = launcher_for(env, ones_env, mlflow) if launcher is None else launcher(ones_env=ones_env,
                                                                                         mlflow=mlflow)
    return dg.Definitions(
        assets=[training_job, cluster_report],
        jobs=[train_job, report_job, apply_job],
        sensors=[build_scheduler_sensor(env.scheduler.tick_interval_s)],
        resources={"ones_env": ones_env, "mlflow": mlflow, "inventory": InventoryResource(ones_env=ones_env),
                   "launcher": step_launcher},
    )


defs = build_definitions()
