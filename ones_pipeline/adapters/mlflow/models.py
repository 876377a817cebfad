"""A finished job's model in MLflow: an MLflow 3 logged model of the job's run, optionally a registry version.

``log_trained_model`` is called by the training session's rank 0 when the job meets its stopping rule
(``train.api``): every script on the session API gets it without a call of its own. The model is logged
with ``mlflow.pytorch.log_model`` under the job's run (the one the writer resumes across restarts), so the
run's page lists it and the logged model's page names the run; the caller then logs the final evaluation's
metrics with the model's id (``JobRun.log_metrics(..., model_id=)``), which links them to the model too.
A spec's ``register_as`` also makes it a new version of that registered model.

The writer's rule "an explicit ``MlflowClient``, never the fluent API" has one exception here:
``log_model`` logs into the active run, so this opens the job's run as the active run for the call and
ends it FINISHED (the job is done). Training processes are ours, one job each, so the fluent API's
process-wide state harms no one.

``model_links`` builds the UI addresses (run, logged model, registry version) that Dagster's metadata
shows: each opens MLflow's model-training view (``?workflowType=machine_learning``, mlflow/mlflow#24498).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ones_pipeline.adapters.mlflow.store import ui_base

log = logging.getLogger(__name__)

MODEL_NAME = "model"  # the logged model's name in its run
TAG_MODEL_ID = "ones.model_id"  # on the job's run: the id of the model it finished with
TAG_MODEL_VERSION = "ones.model_version"  # on the job's run: "<registered name>/<version>" when registered
# Every route of MLflow's UI links with this query, so a fresh browser opens the model-training view.
VIEW = "?workflowType=machine_learning"


@dataclass(frozen=True)
class TrainedModel:
    """What ``log_trained_model`` made: ``model_uri`` loads it (``mlflow.pytorch.load_model``)."""

    model_id: str
    model_uri: str  # models:/<model_id>
    registered_name: str | None = None
    version: int | None = None

    def to_dict(self) -> dict:
        return {"model_id": self.model_id, "model_uri": self.model_uri, "registered_name": self.registered_name,
                "version": self.version}


def log_trained_model(tracking_uri: str, run_id: str, model, *, step: int, register_as: str | None = None,
                      tags: dict[str, str] | None = None) -> TrainedModel:
    """Log ``model`` (a ``torch.nn.Module``; a DDP wrapper is unwrapped) as the logged model ``model`` of run
    ``run_id``; with ``register_as``, also a new version of that registered model. ``step``: samples done."""
    from importlib.metadata import version as installed

    import mlflow
    import mlflow.pytorch

    model = getattr(model, "module", model)  # DDP: the module the user built
    mlflow.set_tracking_uri(tracking_uri)
    active = mlflow.active_run()
    started = active is None or active.info.run_id != run_id
    if started:
        mlflow.start_run(run_id=run_id)
    try:
        # Pickled (MLflow 3.17's default "pt2" traces the model and needs an example input the session does not
        # keep); so the loader needs the model's class importable: a class defined in the script run as
        # ``__main__`` loads only where that script is ``__main__`` too (docs/extension.md). Pinned requirements:
        # MLflow's inference would load the model in a subprocess (seconds of CPU per job).
        info = mlflow.pytorch.log_model(model, name=MODEL_NAME, step=int(step), tags=dict(tags or {}),
                                        registered_model_name=register_as, serialization_format="pickle",
                                        pip_requirements=[f"torch=={installed('torch').split('+')[0]}"])
    finally:
        if started:  # FINISHED: the job is done (the session logs its final metrics, then ends it FINISHED too)
            mlflow.end_run()
    version = getattr(info, "registered_model_version", None)
    trained = TrainedModel(info.model_id, f"models:/{info.model_id}", register_as if version else None,
                           int(version) if version else None)
    client_tags = {TAG_MODEL_ID: trained.model_id}
    if trained.version is not None:
        client_tags[TAG_MODEL_VERSION] = f"{trained.registered_name}/{trained.version}"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    for key, value in client_tags.items():
        client.set_tag(run_id, key, value)
    log.info("logged model %s of run %s%s", trained.model_uri, run_id,
             f" (registered {trained.registered_name} version {trained.version})" if trained.version else "")
    return trained


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{VIEW}"


def model_url(base: str, experiment_id: str, model_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/models/{model_id}{VIEW}"


def version_url(base: str, name: str, version: int) -> str:
    return f"{base}/#/models/{name}/versions/{int(version)}{VIEW}"


TAG_DAGSTER_RUN_URL = "dagster.run_url"  # on the job's run: the Dagster run that materialized the job


def model_links(tracking_uri: str, run_id: str, ui_url: str | None, dagster_ui_url: str | None,
                dagster_run_id: str | None) -> dict[str, str]:
    """What Dagster shows of a finished job's MLflow run: ``mlflow_run_url``, ``model_uri``, ``mlflow_model_url``
    and, when registered, ``registered_model`` and ``registered_model_url`` (the ``*_url`` keys are UI
    addresses). Tags the run with ``dagster.run_url`` (a link back to ``dagster_run_id``) when given."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    base, experiment = ui_base(tracking_uri, ui_url), run.info.experiment_id
    out = {"mlflow_run_url": run_url(base, experiment, run_id)}
    model_id = run.data.tags.get(TAG_MODEL_ID)
    if model_id:
        out.update(model_uri=f"models:/{model_id}", mlflow_model_url=model_url(base, experiment, model_id))
    if registered := run.data.tags.get(TAG_MODEL_VERSION):
        name, _, version = registered.rpartition("/")
        out.update(registered_model=registered, registered_model_url=version_url(base, name, int(version)))
    if dagster_ui_url and dagster_run_id:
        client.set_tag(run_id, TAG_DAGSTER_RUN_URL, f"{dagster_ui_url.rstrip('/')}/runs/{dagster_run_id}")
    return out
