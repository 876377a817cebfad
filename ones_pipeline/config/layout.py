"""``StateLayout``: every file and folder of a project's state directory, named in one place.

    <state_dir>/
      dagster/            the Dagster instance (DAGSTER_HOME; dagster.yaml written by `ones init`)
      dagster.pid         the daemon / `dagster dev` process this project started
      daemon.log          the headless daemon's output (`ones run`)
      mlflow.db           the default MLflow store (sqlite), mlartifacts/ beside it
      jobs/<job>/         one job's checkpoints, MLflow run id, result.json, progress.jsonl (rank 0's events),
                          preempt-g<N>.json (the scheduler asks generation N to stop with a checkpoint)
      scheduler.paused    present while `ones up`/`ones run` drain the runs before Dagster stops
      failed_jobs.json    jobs the scheduler gave up on, with the reason
      spec_errors.json    job spec files skipped at the last tick, with the reason
      decisions.jsonl     one line per scheduling decision
      policy/<ref>.json   the policy's search state (population, RNG) as of a committed tick; the sensor
                          cursor names the current one (``policy_ref``); written by the apply run
      report/             the cluster report: jobs.csv, summary.json, jct_cdf.png, allocation.png
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ones_pipeline.core.types import JOB_NAME_RE

log = logging.getLogger("ones_pipeline")

PROGRESS_FILE = "progress.jsonl"  # in a job's directory: rank 0's events (epochs, MLflow run, stops)
PREEMPT_FILE = "preempt-g{generation}.json"  # in a job's directory: the scheduler's stop request to a generation


def preempt_request_file(job_dir: Path | str, generation: int) -> Path:
    """Where the apply run asks ``generation`` of the job in ``job_dir`` to stop with a checkpoint. Every
    launcher of the generation polls it (on one machine, in a container, on each Slurm node: the job's
    directory is mounted or shared at the same path), so a planned preemption ends the step normally."""
    return Path(job_dir) / PREEMPT_FILE.format(generation=int(generation))


# The PID of the Dagster step that starts a training launcher as its subprocess (``defs/launchers.py``): the
# launcher stops its ranks once its parent is no longer that process (the step's run worker died), also when that
# happened while the launcher was still starting up.
STEP_PID_ENV = "ONES_STEP_PID"


class ProgressTail:
    """New complete lines of a job's ``progress.jsonl`` since this object was made (earlier lines, e.g. of
    earlier generations, skipped; a half-written last line waits for the next call). Read by the launcher
    (relayed to the orchestrator) and by the asset body (observations of the partition)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def rows(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                log.warning("unreadable line in %s: %r", self.path, line[:200])
                continue
            if isinstance(row, dict):
                out.append(row)
        return out


@dataclass(frozen=True)
class StateLayout:
    root: Path

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    @property
    def instance_yaml(self) -> Path:
        return self.dagster_home / "dagster.yaml"

    @property
    def pidfile(self) -> Path:
        return self.root / "dagster.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def job_dir(self, job: str) -> Path:
        if not JOB_NAME_RE.fullmatch(job):  # never a path outside the state directory
            raise ValueError(f"bad job name {job!r}")
        return self.jobs_dir / job

    @property
    def paused(self) -> Path:
        return self.root / "scheduler.paused"

    @property
    def failed_jobs(self) -> Path:
        return self.root / "failed_jobs.json"

    @property
    def spec_errors(self) -> Path:
        return self.root / "spec_errors.json"

    @property
    def decisions(self) -> Path:
        return self.root / "decisions.jsonl"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    def known_entries(self) -> list[Path]:
        """Everything this product creates in the state directory (what ``ones run --fresh`` deletes)."""
        names = ("dagster", "dagster.pid", "daemon.log", "mlflow.db", "mlflow.db-journal", "mlflow.db-wal",
                 "mlflow.db-shm", "mlartifacts", "jobs", "scheduler.paused", "failed_jobs.json", "spec_errors.json",
                 "decisions.jsonl", "policy", "report")
        return [self.root / n for n in names] + sorted(self.root.glob("*.json.tmp"))

    # -- the small JSON files the scheduler writes and the CLI reads ---------------------------------
    @property
    def policy_dir(self) -> Path:
        """Saved policy search states, one file per state, named by the hash of its content."""
        return self.root / "policy"

    def policy_state(self, ref: str) -> Path:
        """The file of the saved state named ``ref`` (16 hex digits)."""
        if not ref or not all(c in "0123456789abcdef" for c in ref):
            raise ValueError(f"bad policy state reference {ref!r}")
        return self.policy_dir / f"{ref}.json"

    def read_json(self, path: Path, default: Any) -> Any:
        """``path`` parsed, or ``default`` when it is missing, empty or half-written."""
        try:
            text = path.read_text()
        except OSError:
            return default
        try:
            return json.loads(text) if text.strip() else default
        except ValueError:
            return default

    def write_json(self, path: Path, data: Any) -> None:
        """Atomically (a temporary file renamed over it); a state directory that cannot be written is
        not a reason to stop scheduling, so OSError is swallowed."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)
        except OSError:
            pass

    def append_jsonl(self, path: Path, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")

    def failed(self) -> dict[str, str]:
        return dict(self.read_json(self.failed_jobs, {}))


def newest_row(lines: Iterable[str | bytes], match: Callable[[dict], bool]) -> dict | None:
    """The last of ``lines`` (a JSON-lines file's, oldest first) that is a JSON object ``match`` accepts;
    lines that are not JSON (a row cut by a kill) are skipped. None: no such row."""
    for line in reversed(list(lines)):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and match(row):
            return row
    return None
