"""What rank 0 of a job records besides its checkpoints, and how each record survives a kill -9 (torch-free).

* **Progress events**: one JSON line each in ``<state_dir>/progress.jsonl`` (``report``), which the launcher relays
  to the orchestrator and ``ones status`` reads.
* **An epoch's record**: its MLflow point (``step`` = samples done: accuracy, losses, throughput...) and its
  ``epoch`` progress event. The session writes the checkpoint *first*, holding the record (``Progress.record``),
  and the record after it: a kill before the checkpoint has completed leaves no record (the epoch is trained
  again from the previous checkpoint and recorded once then); a kill after it leaves a record that the next start
  finds in the checkpoint and writes where it is missing (``replay``), keyed by its sample count, so it is
  written exactly once either way. (Written before the checkpoint, as until issue 40, a kill between the two
  wrote the epoch's point and event twice: once before the kill, once when the epoch was trained again.)
* **Restarts**: the number of times training started again after its first start, counted from the ``training``
  events rank 0 writes at its first step in each process (``starts``): exact also for processes killed before
  their first checkpoint, whose own count (in the checkpoint) was lost with them. A generation stopped before it
  trained, or started after the job had finished, trains nothing and is not a restart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ones_pipeline.config.layout import PROGRESS_FILE

# Rank 0 writes a ``training`` event at its first step in a process (from then on a kill would lose work), then a
# ``progress`` event (samples, samples/s) this often while it trains, besides its epochs: a job whose
# epochs are long (or that stops on samples, mid-epoch) shows its progress on its partition within seconds of its start
# (``defs.progress_events``, which records one observation per 30 s), not at its first epoch's end. A line appended
# to a local file every 5 s costs nothing next to a training step.
PROGRESS_EVERY_S = 5.0

# The exit code of a rank that stopped on bad input it has explained in one line on stderr (e.g. a checkpoint of
# another model): its launcher adds no line of its own and exits with it too.
BAD_INPUT_EXIT = 2


class BadCheckpoint(ValueError):
    """The job's checkpoint cannot be used for this job (unreadable, of another model); the message is one line."""


def quiet_exit(exc: BaseException | None, job: str, rank: int) -> int | None:
    """For a rank ending on ``exc``: the exit code to end with after one line on stderr instead of a traceback, or
    None (let it propagate). A checkpoint the job cannot use: rank 0's line, exit 2 (``BAD_INPUT_EXIT``). A collective
    that failed because a peer left the group (killed: gloo's ``Connection reset by peer`` / ``closed by peer``, or
    torch's ``DistError``): this rank's line, exit 1 (the launcher decides from rank 0, as before)."""
    if isinstance(exc, BadCheckpoint):
        if rank == 0:
            print(f"ones train: {exc}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT
    if _peer_gone(exc):
        first = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
        print(f"ones train: job {job} rank {rank}: a peer left the group (killed or failed), so this rank stops: "
              f"{first[:200]}", file=sys.stderr, flush=True)
        return 1
    return None


def _peer_gone(exc: BaseException | None) -> bool:
    if not isinstance(exc, RuntimeError):
        return False
    if any(c.__name__ == "DistError" for c in type(exc).__mro__):  # torch.distributed's (no torch import here)
        return True
    text = str(exc)
    return "gloo" in text and any(m in text for m in ("by peer", "Broken pipe", "Connection refused"))


def report(state_dir: Path, row: Mapping[str, Any]) -> None:
    """Append one progress event (rank 0 only: one writer per file; one ``write`` per line)."""
    with open(Path(state_dir) / PROGRESS_FILE, "a") as fh:
        fh.write(json.dumps({**row, "time_s": time.time()}) + "\n")


def events(state_dir: Path, kinds: Iterable[str] | None = None) -> Iterator[dict]:
    """Every complete, readable progress event so far (a half-written last line is skipped); with ``kinds``, only
    the rows whose ``event`` is one of them (other lines are not parsed: a long job's file holds a progress row
    every few seconds)."""
    try:
        data = (Path(state_dir) / PROGRESS_FILE).read_bytes()
    except FileNotFoundError:
        return
    wanted = None if kinds is None else [json.dumps(k).encode() for k in kinds]
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        if wanted is not None and not any(w in line for w in wanted):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def starts(state_dir: Path) -> int:
    """How many times rank 0 started training (its ``training`` events), this process's included."""
    return sum(row.get("event") == "training" for row in events(state_dir))


def recorded(state_dir: Path, record: Mapping[str, Any] | None) -> bool:
    """Whether ``record``'s event is in the progress file (then its MLflow point is in the run: written first)."""
    if not record:
        return True
    samples = int(record["event"]["samples"])
    return any(row.get("event") == "epoch" and row.get("samples") == samples for row in events(state_dir))


def result_path(state_dir: Path) -> Path:
    return Path(state_dir) / "result.json"


def write_result(state_dir: Path, result: Mapping[str, Any]) -> None:
    """``result.json`` (the job finished), atomically."""
    tmp = Path(state_dir) / "result.json.tmp"
    tmp.write_text(json.dumps(dict(result)))
    os.replace(tmp, result_path(state_dir))


def open_run(p, params: Mapping[str, Any] | None):
    """Rank 0 of placement ``p``: open the job's MLflow run (``JobRun``: created, or resumed after a restart) with the
    spec's fields and ``params`` as its params, tagged with the Dagster run and the Slurm devices where there are."""
    from ones_pipeline.adapters.mlflow import JobRun
    from ones_pipeline.config import job_spec_to_yaml_dict
    from ones_pipeline.train.slurm_ranks import mlflow_device_tags

    run_params = job_spec_to_yaml_dict(p.spec)  # the fields that apply (no patience on an epochs job)
    run_params.update(params or {})
    run = JobRun.open(p.tracking_uri, p.experiment, p.spec.name, p.state_dir, params=run_params,
                      generation=p.generation)
    report(p.state_dir, {"event": "mlflow_run", "run_id": run.run_id, "experiment_id": run.experiment_id,
                         "generation": p.generation})
    if p.dagster_run_id:  # from the MLflow run back to the Dagster run of each generation
        run.set_tags({"dagster.run_id": p.dagster_run_id, f"dagster.run_id.g{p.generation}": p.dagster_run_id})
    if slurm_tags := mlflow_device_tags(p.generation):  # {} off Slurm
        run.set_tags(slurm_tags)
    return run


def epoch_record(metrics: Mapping[str, float], event: Mapping[str, Any]) -> dict:
    """What ``Progress.record`` holds between the checkpoint and the writes: the MLflow point and the event."""
    return {"metrics": {k: float(v) for k, v in metrics.items() if v is not None}, "event": dict(event)}


def write(state_dir: Path, run, record: Mapping[str, Any] | None) -> None:
    """Write an epoch's record: its MLflow point (``run``: a ``JobRun``, or None without MLflow), then its event."""
    if not record:
        return
    event = record["event"]
    if run is not None and record["metrics"]:
        run.log_metrics(record["metrics"], step=int(event["samples"]), model_id=run.model_id)
    report(state_dir, event)


def replay(state_dir: Path, run, record: Mapping[str, Any] | None) -> bool:
    """At a start from a checkpoint holding ``record``: write what of it the process that wrote the checkpoint did
    not (killed in between); True if anything was missing. The event is written after the MLflow point, so a
    present event means both are; else MLflow's history says whether the point is."""
    if recorded(state_dir, record):
        return False
    samples = int(record["event"]["samples"])
    if run is not None and record["metrics"] and _has_point(run, record["metrics"], samples):
        report(state_dir, record["event"])
    else:
        write(state_dir, run, record)
    return True


def _has_point(run, metrics: Mapping[str, float], samples: int) -> bool:
    """Whether the run has the record's point: its ``accuracy`` (logged at evaluations only) at ``samples``."""
    key = "accuracy" if "accuracy" in metrics else next(iter(metrics))
    return any(m.step == samples for m in run.client.get_metric_history(run.run_id, key))
