"""Shared by the MLflow adapter tests: a real SQLite store in a temp dir (nothing mocked, no env vars set)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

from ones_pipeline.adapters.mlflow import default_tracking_uri, ensure_store
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule

EXP = "ones"


def make_template(base: Path) -> Path:
    """A store with the schema and experiment ``EXP`` created; tests copy it (schema creation takes seconds)."""
    ensure_store(default_tracking_uri(base), EXP)
    return base / "mlflow.db"


def copy_store(template: Path, directory: Path) -> str:
    """The tracking URI of a copy of ``template`` in ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, directory / "mlflow.db")
    return default_tracking_uri(directory)


def schema_revision(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def set_schema_revision(db: Path, revision: str) -> None:
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = ?", (revision,))


def same(a, b) -> bool:
    """Equality of JobProgress values (or dicts of them) treating NaN == NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return repr(a) == repr(b)


def job_spec(name: str = "job-a") -> JobSpec:
    return JobSpec(name=name, model="resnet18", dataset_size=1000, per_gpu_batch=32, requested_gpus=2,
                   stopping=StoppingRule(StopKind.ACCURACY, target_accuracy=0.9), command=("python", "t.py"))


def log_config(run, start_step, per_step, gpus, nodes, per_gpu_batch, step_times, sync=0.0):
    """One log_metrics per step, as the training step does; returns the next step."""
    step = start_step
    for k, st in enumerate(step_times):
        step += per_step
        run.log_metrics({
            "loss": 10.0 / step, "accuracy": step / 10_000, "samples": step, "epoch": step / 1000,
            "gpus": gpus, "num_nodes": nodes, "per_gpu_batch": per_gpu_batch,
            "global_batch": gpus * per_gpu_batch, "step_time_s": st, "sync_time_s": sync + k * 0.001,
            "samples_per_s": gpus * per_gpu_batch / st, "lr": 0.1, "grad_noise_scale": 123.0,
        }, step=step)
    return step
