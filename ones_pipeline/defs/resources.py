"""Dagster resources: the environment (``resources/<env>.yaml``) and a small MLflow resource.

No ``from __future__ import annotations`` here: Dagster resolves resource and config annotations at
runtime.
"""

import os
from functools import lru_cache
from pathlib import Path

import dagster as dg

from ones_pipeline.config import EnvConfig, load_env


@lru_cache(maxsize=8)
def _load(project_dir: str, env: str, mtime: float) -> EnvConfig:
    return load_env(project_dir, env)


class OnesEnvResource(dg.ConfigurableResource):
    """Where the project lives and which environment file of it is in force."""

    project_dir: str
    env: str = "local"

    def config(self) -> EnvConfig:
        path = Path(self.project_dir) / "resources" / f"{self.env}.yaml"
        mtime = path.stat().st_mtime if path.exists() else 0.0
        return _load(str(Path(self.project_dir).resolve()), self.env, mtime)


class MlflowResource(dg.ConfigurableResource):
    """The MLflow store the training steps log to and the scheduler reads progress from.

    ``tracking_uri`` may come from an environment variable (``dg.EnvVar``) when it carries credentials.
    """

    tracking_uri: str
    experiment: str = "ones"

    def step_env(self) -> dict:
        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_EXPERIMENT_NAME": self.experiment}

    def ensure(self) -> str:
        from ones_pipeline.adapters.mlflow_tracker import ensure_store

        return ensure_store(self.tracking_uri, self.experiment)

    def progress(self, jobs):
        from ones_pipeline.adapters.mlflow_tracker import read_progress

        return read_progress(self.tracking_uri, self.experiment, jobs)

    def sqlite_dir(self):
        """Directory of a sqlite store (mounted into containers), else None."""
        if self.tracking_uri.startswith("sqlite:///"):
            return Path(self.tracking_uri[len("sqlite:///"):]).parent
        return None

    def run_link(self, run_id: str, experiment_id: str | None = None):
        """A URL into the MLflow UI for a server store; for sqlite, how to open it."""
        if self.tracking_uri.startswith(("http://", "https://")):
            base = self.tracking_uri.rstrip("/")
            return dg.MetadataValue.url(f"{base}/#/experiments/{experiment_id or '0'}/runs/{run_id}")
        return dg.MetadataValue.text(f"run {run_id} in {self.tracking_uri} "
                                     f"(mlflow ui --backend-store-uri {self.tracking_uri})")


def mlflow_resource_for(env: EnvConfig) -> MlflowResource:
    if env.mlflow.tracking_uri_env:
        return MlflowResource(tracking_uri=dg.EnvVar(env.mlflow.tracking_uri_env), experiment=env.mlflow.experiment)
    return MlflowResource(tracking_uri=env.tracking_uri(), experiment=env.mlflow.experiment)


def project_dir_from_env() -> str:
    return str(Path(os.environ.get("ONES_PROJECT_DIR") or os.getcwd()).resolve())
