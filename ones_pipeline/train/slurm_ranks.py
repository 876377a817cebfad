"""The ranks of a multi-node step on Slurm, and where each one ran.

The Slurm launcher (``defs/slurm_step.py``) writes a request file on the shared filesystem (the Pipes
extras, the rendezvous address and port, the device) and submits one job whose batch script ``exec srun``s
``python -m ones_pipeline.train --slurm-request FILE`` once per rank. Each task takes its rank from
``SLURM_PROCID`` (``SLURM_NTASKS`` must equal the allocation's world size), writes ``rank-<r>.json`` beside
the request (node, the GPUs Slurm gave it, pid) and runs that one rank under the launcher used on one
machine: ``scancel --signal=TERM`` reaches every task, each sets its rank's stop file, the ranks agree and
rank 0 checkpoints; Slurm has set ``CUDA_VISIBLE_DEVICES``. Rank 0's task is the Pipes process. Rank 0
reads the records for its MLflow tags, the Dagster side for the run's tags."""

from __future__ import annotations

import json
import os
from pathlib import Path

RANK_FILE = "rank-{rank}.json"
LEADER_EXIT_FILE = "rank-0.exit"  # rank 0's task's exit code, for the other tasks (a peer stuck in teardown)
STEP_DIR_ENV = "ONES_SLURM_STEP_DIR"  # the directory of the request and rank files, for rank 0's MLflow tags


def env_int(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise ValueError(f"{name} is {value!r}: run this under srun (the Slurm launcher's batch script does)")
    return int(value)


def rank_record() -> dict:
    """Where Slurm put this task: its rank, node, GPUs (``SLURM_STEP_GPUS``, else CUDA_VISIBLE_DEVICES)."""
    gpus = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return {"rank": env_int("SLURM_PROCID"), "node": os.environ.get("SLURMD_NODENAME", ""),
            "gpus": [g for g in gpus.split(",") if g], "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "slurm_step_id": os.environ.get("SLURM_STEP_ID", "")}


def read_leader_exit(path: Path) -> str:
    """What rank 0's task wrote in ``LEADER_EXIT_FILE`` (its exit code), or "" while it has not."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def read_rank_records(step_dir: Path) -> list[dict]:
    """The ``rank-<r>.json`` files the tasks of one generation wrote, by rank."""
    out = []
    for path in sorted(Path(step_dir).glob("rank-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # being written
    return sorted(out, key=lambda r: r.get("rank", 0))


def devices_text(records: list[dict]) -> str:
    """``0:n1/gpu0 1:n1/gpu1 2:n2/gpu0``: which node and GPU each rank got."""
    return " ".join(f"{r['rank']}:{r.get('node') or '?'}/gpu{'+'.join(r.get('gpus') or ['-'])}" for r in records)


def mlflow_device_tags(generation: int) -> dict:
    """For rank 0's MLflow run: the Slurm job and each rank's node and GPUs of this generation."""
    step_dir = os.environ.get(STEP_DIR_ENV)
    if not step_dir:
        return {}
    records = read_rank_records(Path(step_dir))
    return {f"slurm.job_id.g{generation}": os.environ.get("SLURM_JOB_ID", ""),
            f"slurm.devices.g{generation}": devices_text(records)}
