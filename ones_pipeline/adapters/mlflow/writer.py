"""The training step's side: one MLflow run per job, created on the first start and resumed on every restart.

The run id lives in ``<state_dir>/mlflow_run_id``. Metrics are logged with ``step`` = samples done. Only an
explicit ``MlflowClient`` is used, never the fluent ``mlflow.*`` API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from ones_pipeline.adapters.mlflow.schema import (
    TAG_CHANGED_PARAMS,
    TAG_CURRENT_PREFIX,
    TAG_GENERATION,
    TAG_JOB,
    TAG_RESTARTS,
    chunks,
)
from ones_pipeline.adapters.mlflow.store import TrackerError, ensure_store
from ones_pipeline.core.types import JOB_NAME_RE

log = logging.getLogger(__name__)

RUN_ID_FILE = "mlflow_run_id"
END_STATUSES = ("FINISHED", "KILLED", "FAILED")

# MLflow's limits (mlflow.utils.validation, 3.17).
MAX_KEY_LENGTH = 250
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000


class JobRun:
    """One MLflow run per job, resumed across restarts. Build it with ``JobRun.open``."""

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, job: str, generation: int,
                 restarts: int, resumed: bool) -> None:
        self.client = client
        self._run_id = run_id
        self.experiment_id = experiment_id
        self.job = job
        self.generation = generation
        self.restarts = restarts
        self.resumed = resumed
        self.model_id: str | None = None  # the logged model of the finished job (``log_model``)

    @property
    def run_id(self) -> str:
        return self._run_id

    def __repr__(self) -> str:
        return (f"JobRun(job={self.job!r}, run_id={self._run_id!r}, generation={self.generation}, "
                f"restarts={self.restarts})")

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, job_name: str, state_dir: str | os.PathLike,
             params: Mapping[str, Any] | Any, generation: int) -> JobRun:
        """Resume the job's run (id in ``<state_dir>/mlflow_run_id``) or create it.

        A new run gets ``params`` (a mapping or a dataclass such as a ``JobSpec``; nested values are
        flattened to dotted keys, values stringified and truncated to MLflow's limits) and the tag
        ``ones.job``. A resumed run is set back to RUNNING; params it lacks are added, and keys whose
        value changed are listed in the tag ``ones.changed_params`` and their value now is the tag
        ``current.<key>``, set again at each generation (MLflow params are immutable: the param keeps the
        first value, so after a spec change the run page showed the old one only).
        Every open sets ``ones.generation`` and ``ones.restarts`` (opens - 1).
        """
        if not isinstance(job_name, str) or not JOB_NAME_RE.match(job_name):
            raise ValueError(f"job name {job_name!r} must match {JOB_NAME_RE.pattern}")
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"job {job_name}: generation must be an integer >= 0, got {generation!r}")
        exp_id = ensure_store(tracking_uri, experiment)
        client = MlflowClient(tracking_uri=tracking_uri)
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        id_file = state / RUN_ID_FILE
        wanted = _flatten_params(params)

        run = _resumable_run(client, id_file, exp_id, job_name)
        if run is None:
            run = client.create_run(exp_id, tags={TAG_JOB: job_name}, run_name=job_name)
            run_id = run.info.run_id
            _log_params(client, run_id, wanted)
            _write_atomic(id_file, run_id + "\n")
            restarts, resumed, extra_tags = 0, False, {}
        else:
            run_id = run.info.run_id
            restarts, extra_tags = _resume(client, run, wanted, job_name)
            resumed = True
        job_run = cls(client, run_id, exp_id, job_name, generation, restarts, resumed)
        job_run.set_tags({TAG_JOB: job_name, TAG_GENERATION: generation, TAG_RESTARTS: restarts, **extra_tags})
        return job_run

    def log_metrics(self, metrics: Mapping[str, float], step: int, model_id: str | None = None) -> None:
        """Log ``metrics`` at ``step`` (= samples done) in one ``log_batch``; None values are skipped. With
        ``model_id`` (a logged model of this run) they are that model's metrics too."""
        if isinstance(step, bool) or int(step) != step or step < 0:
            raise ValueError(f"job {self.job}: step must be an integer >= 0 (samples done), got {step!r}")
        ts = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), ts, int(step), model_id=model_id) for k, v in metrics.items()
                 if v is not None]
        for chunk in chunks(batch, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._run_id, metrics=chunk, synchronous=True)

    def log_model(self, model, step: int, register_as: str | None = None):
        """The finished job's model as this run's logged model (and a version of ``register_as``):
        ``adapters.mlflow.models.log_trained_model``; sets ``model_id``. A model MLflow cannot save is said in
        the log and leaves ``model_id`` None: the finished job stands all the same. Returns the
        ``TrainedModel`` or None."""
        from ones_pipeline.adapters.mlflow.models import log_trained_model

        try:
            trained = log_trained_model(self.client.tracking_uri, self._run_id, model, step=step,
                                        register_as=register_as, tags={TAG_JOB: self.job})
        except Exception as exc:  # noqa: BLE001 - e.g. a model class pickle cannot reach
            log.warning("job %s: its model was not logged to MLflow run %s: %s", self.job, self._run_id, exc)
            self.set_tags({"ones.model_error": str(exc)[:500]})
            return None
        self.model_id = trained.model_id
        return trained

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(_key(k), _truncate(_stringify(v), MAX_TAG_VAL_LENGTH)) for k, v in tags.items()]
        for chunk in chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self._run_id, tags=chunk, synchronous=True)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED (job done), KILLED (preempted; it will be resumed) or FAILED."""
        if status not in END_STATUSES:
            raise ValueError(f"job {self.job}: finish status must be one of {END_STATUSES}, got {status!r}")
        self.client.set_terminated(self._run_id, status=status)


def _resume(client: MlflowClient, run, wanted: Mapping[str, str], job_name: str) -> tuple[int, dict[str, str]]:
    """Set a resumed run back to RUNNING and add the params it lacks; return its restart count and the
    tags recording params whose value changed since it started."""
    run_id = run.info.run_id
    client.update_run(run_id, status="RUNNING")
    try:
        restarts = int(run.data.tags.get(TAG_RESTARTS, "-1")) + 1
    except ValueError:
        restarts = 0
    have = run.data.params
    _log_params(client, run_id, {k: v for k, v in wanted.items() if k not in have})
    changed = sorted(k for k, v in wanted.items() if k in have and have[k] != v)
    try:  # the keys an earlier generation changed: their ``current.`` tag follows the spec back, too
        before = set(json.loads(run.data.tags.get(TAG_CHANGED_PARAMS, "[]")))
    except ValueError:
        before = set()
    if not changed and not before:
        return restarts, {}
    if changed:
        log.warning("job %s: params %s changed since run %s started; kept the first values, the values now in "
                    "tags %s", job_name, changed, run_id, ", ".join(f"{TAG_CURRENT_PREFIX}{k}" for k in changed))
    current = {f"{TAG_CURRENT_PREFIX}{k}": wanted[k] for k in sorted(before | set(changed)) if k in wanted}
    return restarts, {TAG_CHANGED_PARAMS: json.dumps(changed), **current}


def _resumable_run(client: MlflowClient, id_file: Path, exp_id: str, job_name: str):
    """The run recorded in ``id_file`` when it still exists in this experiment, else None."""
    try:
        run_id = id_file.read_text().strip()
    except FileNotFoundError:
        return None
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        log.warning("%s names MLflow run %s, which no longer exists; starting a new run", id_file, run_id)
        return None
    owner = run.data.tags.get(TAG_JOB)
    if owner not in (None, job_name):
        raise TrackerError(
            f"{id_file} names MLflow run {run_id} of job {owner!r}, not {job_name!r}; give each job its "
            f"own state directory"
        )
    if run.info.lifecycle_stage != "active" or run.info.experiment_id != exp_id:
        log.warning("%s names MLflow run %s, which is deleted or in another experiment (%s); starting a "
                    "new run", id_file, run_id, run.info.experiment_id)
        return None
    return run


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename durable where directories can be fsynced
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


_BAD_KEY_CHARS = re.compile(r"[^\w\-. /]")


def _key(key: str) -> str:
    """An MLflow-valid key: letters, digits, ``_ - . / space``, at most 250 characters."""
    return _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY_LENGTH]


def _stringify(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return json.dumps(list(value) if isinstance(value, (set, frozenset)) else value, default=str)
    return str(value)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten_params(params: Mapping[str, Any] | Any, prefix: str = "") -> dict[str, str]:
    """``{"stopping": {"kind": "epochs"}}`` -> ``{"stopping.kind": "epochs"}``, values stringified."""
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        params = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping or a dataclass, got {type(params).__name__}")
    out: dict[str, str] = {}
    for name, value in params.items():
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping) and value:
            out.update(_flatten_params(value, key + "."))
        else:
            out[_key(key)] = _truncate(_stringify(value), MAX_PARAM_VAL_LENGTH)
    return out


def _log_params(client: MlflowClient, run_id: str, params: Mapping[str, str]) -> None:
    items = [Param(k, v) for k, v in params.items()]
    for chunk in chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=chunk, synchronous=True)
