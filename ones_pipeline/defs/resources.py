"""Dagster resources: the environment (``resources/<env>.yaml``), the MLflow store, the slot inventory.

The step launchers are resources too (``defs/launchers.py``). ``definitions.py`` builds all of them
from the environment. No ``from __future__ import annotations`` here: Dagster resolves resource and
config annotations at runtime.
"""

from functools import lru_cache
from pathlib import Path

import dagster as dg

from ones_pipeline.adapters.inventory import Inventory, inventory_source
from ones_pipeline.config import EnvConfig, load_env


@lru_cache(maxsize=8)
def _load(project_dir: str, env: str, mtime: float) -> EnvConfig:
    return load_env(project_dir, env)


@lru_cache(maxsize=8)
def _parse(settings: str, path: str, project_dir: str, env: str) -> EnvConfig:
    import json

    from ones_pipeline.config import parse_env

    return parse_env(json.loads(settings), path, project_dir, env)


class OnesEnvResource(dg.ConfigurableResource):
    """Where the project lives and which environment file of it is in force (re-read when it changes); or,
    from a ``OnesComponent``, the environment its ``defs.yaml`` gives (``settings``: its sections as JSON,
    ``settings_path``: that file, named by errors)."""

    project_dir: str
    env: str = "local"
    settings: str = ""
    settings_path: str = ""

    def config(self) -> EnvConfig:
        if self.settings:
            return _parse(self.settings, self.settings_path, str(Path(self.project_dir).resolve()), self.env)
        path = Path(self.project_dir) / "resources" / f"{self.env}.yaml"
        mtime = path.stat().st_mtime if path.exists() else 0.0
        return _load(str(Path(self.project_dir).resolve()), self.env, mtime)


class MlflowResource(dg.ConfigurableResource):
    """The MLflow store the training steps log to and the scheduler reads progress from.

    ``tracking_uri`` comes from an environment variable (``dg.EnvVar``) when the environment names one
    (``mlflow.tracking_uri_env``: it carries credentials), else from ``EnvConfig.tracking_uri()``.
    """

    tracking_uri: str
    experiment: str = "ones"
    ui_url: str = ""  # the MLflow UI links point at ("": the http(s) store itself, else http://127.0.0.1:5000)
    dagster_ui_url: str = "http://127.0.0.1:3000"  # the Dagster UI each job's MLflow run links back to

    def step_env(self) -> dict:
        from ones_pipeline.adapters.mlflow.store import UI_URL_ENV

        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_EXPERIMENT_NAME": self.experiment,
                **({UI_URL_ENV: self.ui_url} if self.ui_url else {})}

    def model_metadata(self, run_id: str, dagster_run_id: str) -> dict:
        """A finished job's materialization metadata from its MLflow run: links (``MetadataValue.url``) to the
        run, its logged model and registry version in MLflow's model-training view, the model's URI (what
        ``mlflow.pytorch.load_model`` takes); and the run tagged with a link back to this Dagster run."""
        from ones_pipeline.adapters.mlflow.models import model_links

        return {k: dg.MetadataValue.url(v) if k.endswith("_url") else v for k, v in model_links(
            self.tracking_uri, run_id, self.ui_url or None, self.dagster_ui_url, dagster_run_id).items()}

    def progress(self, jobs):
        from ones_pipeline.adapters.mlflow import read_progress

        return read_progress(self.tracking_uri, self.experiment, jobs)

    def sqlite_dir(self):
        """Directory of a sqlite store (mounted into containers), else None."""
        if self.tracking_uri.startswith("sqlite:///"):
            return Path(self.tracking_uri[len("sqlite:///"):]).parent
        return None

    def run_link(self, run_id: str, experiment_id: str | None = None):
        """A URL into the MLflow UI: at ``ui_url`` when set (the user's UI on this store, sqlite included), for a
        server store on it; else for sqlite how to open it (the `mlflow ui` command: the run's address in that UI
        is in the run's log; in a metadata cell it would be clipped)."""
        from ones_pipeline.adapters.mlflow import run_link
        from ones_pipeline.adapters.mlflow.models import run_url

        if self.ui_url:  # a link a partition's progress row can be opened from, as its materialization's
            return dg.MetadataValue.url(run_url(self.ui_url.rstrip("/"), experiment_id or "0", run_id))
        link = run_link(self.tracking_uri, run_id, experiment_id, address=False, ui_url=self.ui_url or None)
        return dg.MetadataValue.url(link) if link.startswith(("http://", "https://")) else dg.MetadataValue.text(link)


class InventoryResource(dg.ConfigurableResource):
    """The slots (nodes and devices) the scheduler may use, from ``resources/<env>.yaml``'s ``cluster``
    section: NVML GPUs or configured CPU slots (``adapters.inventory``). Call ``discover`` once per tick."""

    ones_env: OnesEnvResource

    def discover(self) -> Inventory:
        return inventory_source(self.ones_env.config().cluster).discover()


def mlflow_resource_for(env: EnvConfig) -> MlflowResource:
    if env.mlflow.tracking_uri_env:
        return MlflowResource(tracking_uri=dg.EnvVar(env.mlflow.tracking_uri_env), experiment=env.mlflow.experiment,
                              ui_url=env.mlflow.ui_url or "", dagster_ui_url=env.mlflow.dagster_ui_url)
    return MlflowResource(tracking_uri=env.tracking_uri(), experiment=env.mlflow.experiment,
                          ui_url=env.mlflow.ui_url or "", dagster_ui_url=env.mlflow.dagster_ui_url)
