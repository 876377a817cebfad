"""The verdicts of ``benchmarks/chaos.py`` once its live run has ended, each read from where the product
keeps it: the Dagster instance (materializations, run records with their slot tags), the MLflow store
(every logged ``samples`` point), the job directories (``result.json``, rank 0's ``progress.jsonl``) and
the checkpoints the watcher saw completed (``chaos_procs.CheckpointWatcher``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SLOT_TAG_PREFIXES = ("ones/cpu-", "ones/gpu-")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Rewind:
    """One drop of a job's MLflow ``samples`` count (a restart after a crash)."""

    job: str
    time_s: float  # the first point logged after the drop
    before: int  # the point logged just before it (the highest of its generation)
    after: int  # the first point logged after it
    checkpoint: int  # samples of the last checkpoint completed before the resuming generation started
    restarted: bool  # a generation started between the two points (else two writers logged at once)

    @property
    def lost(self) -> int:
        return self.before - self.checkpoint


@dataclass(frozen=True)
class JobSamples:
    job: str
    required: int  # what the stopping rule fixes (epochs x dataset size, or samples)
    interval: int  # the checkpoint interval in samples: one epoch (every evaluation checkpoints)
    materialized: int | None  # the materialization's ``samples``
    result: int | None  # result.json
    mlflow_last: int | None  # the last ``samples`` point logged
    mlflow_max: int | None
    materializations: int = 1

    @property
    def exact(self) -> bool:
        return self.materializations == 1 and \
            self.materialized == self.result == self.mlflow_last == self.mlflow_max == self.required


def dagster_facts(env, jobs: Sequence[str]) -> tuple[set[str], dict[str, tuple[int, int | None]], list[tuple]]:
    """From the project's Dagster instance: the materialized jobs; per job, how many materializations and
    the newest one's ``samples``; every training run as (run id, tags, start, end, status)."""
    import dagster as dg

    from ones_pipeline.defs.instance import TRAINING_ASSET, finished_jobs, open_instance

    with open_instance(env) as instance:
        finished = finished_jobs(instance)
        mats = {}
        for job in jobs:
            records = instance.fetch_materializations(dg.AssetRecordsFilter(
                asset_key=dg.AssetKey(TRAINING_ASSET), asset_partitions=[job]), limit=20).records
            samples = None
            if records:  # newest first
                value = records[0].event_log_entry.asset_materialization.metadata.get("samples")
                samples = None if value is None else int(getattr(value, "value", value))
            mats[job] = (len(records), samples)
        runs = [(r.dagster_run.run_id, dict(r.dagster_run.tags), r.start_time, r.end_time, r.dagster_run.status.value)
                for r in instance.get_run_records(dg.RunsFilter(job_name="train_job"))]
    return finished, mats, runs


def result_samples(job_dir: Path) -> int | None:
    try:
        return int(json.loads((job_dir / "result.json").read_text())["samples"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def samples_history(tracking_uri: str, job_dir: Path) -> list[tuple[float, int]]:
    """Every ``samples`` point of the job's MLflow run as (time s, samples), in logging order."""
    from mlflow import MlflowClient

    try:
        run_id = (job_dir / "mlflow_run_id").read_text().strip()
    except OSError:
        return []
    points = MlflowClient(tracking_uri).get_metric_history(run_id, "samples")
    return [(m.timestamp / 1000.0, int(m.value)) for m in sorted(points, key=lambda m: (m.timestamp, m.step))]


def generation_starts(job_dir: Path) -> list[float]:
    """When each generation's rank 0 opened the MLflow run (just after it loaded the checkpoint)."""
    out = []
    try:
        lines = (job_dir / "progress.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "mlflow_run":
            out.append(float(row["time_s"]))
    return sorted(out)


def _last_before(records: Sequence[tuple[float, int]], t: float) -> int:
    done = [s for ts, s in records if ts < t]
    return done[-1] if done else 0


def rewinds(job: str, history: Sequence[tuple[float, int]], checkpoints: Sequence[tuple[float, int]],
            starts: Sequence[float]) -> list[Rewind]:
    """Every drop of the logged sample count, with the checkpoint the next generation resumed from: the
    last one completed before the first generation that started after the last point before the drop."""
    out = []
    for (t0, v0), (t1, v1) in zip(history, history[1:], strict=False):
        if v1 >= v0:
            continue
        between = [s for s in starts if t0 < s <= t1]
        resumed_at = between[0] if between else t1
        out.append(Rewind(job, t1, v0, v1, _last_before(checkpoints, resumed_at), bool(between)))
    return out


def check_rewinds(all_rewinds: Sequence[Rewind], intervals: Mapping[str, int]) -> tuple[Check, Rewind | None]:
    """Samples only drop back to the last checkpoint: after each drop the count resumes at or above it, a
    generation started in between, and what was lost is at most one checkpoint interval."""
    bad = [r for r in all_rewinds if r.after < r.checkpoint or not r.restarted or r.lost > intervals[r.job]]
    worst = max(all_rewinds, key=lambda r: (r.lost / intervals[r.job], r.lost), default=None)
    if worst is None:
        return Check("samples drop only back to the last checkpoint", True, "no drop in any MLflow run"), None
    detail = (f"{len(all_rewinds)} drop(s); worst {worst.lost} samples ({worst.job}: {worst.before} -> checkpoint "
              f"{worst.checkpoint}), {worst.lost / intervals[worst.job]:.2f} of the {intervals[worst.job]}-sample "
              "checkpoint interval")
    if bad:
        b = bad[0]
        detail += (f"; {len(bad)} bad, e.g. {b.job} at {b.time_s:.1f}: {b.before} -> {b.after} "
                   f"(last checkpoint {b.checkpoint}, restart in between: {b.restarted})")
    return Check("samples drop only back to the last checkpoint", not bad, detail), worst


def check_finished(jobs: Sequence[str], finished: set[str], failed: Mapping[str, str]) -> Check:
    missing = [j for j in jobs if j not in finished]
    detail = f"{len(jobs) - len(missing)}/{len(jobs)} materialized"
    if missing:
        detail += f"; not: {', '.join(missing)}"
    if failed:
        detail += f"; marked failed: {dict(failed)}"
    return Check("every job finished", not missing and not failed, detail)


def check_exact(rows: Sequence[JobSamples]) -> Check:
    bad = [r for r in rows if not r.exact]
    detail = f"{len(rows) - len(bad)}/{len(rows)} exact (materialization = result.json = last and highest MLflow " \
             "point = stopping rule)"
    if bad:
        detail += "; " + ", ".join(f"{r.job}: required {r.required}, materialized {r.materialized} "
                                   f"({r.materializations} materialization(s)), result {r.result}, MLflow last "
                                   f"{r.mlflow_last} max {r.mlflow_max}" for r in bad)
    return Check("final samples exactly as the stopping rule requires", not bad, detail)


def slot_overlaps(runs: Sequence[tuple[str, Mapping[str, str], float | None, float | None]], now: float
                  ) -> tuple[list[tuple[str, str, str, float]], int]:
    """(slot tag, run, run, seconds) for every two runs that held one slot tag at once, from the run
    records (run id, tags, start, end; a run still in flight ends ``now``); and the number of spans."""
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for run_id, tags, start, end in runs:
        if start is None:
            continue
        for key in tags:
            if key.startswith(SLOT_TAG_PREFIXES):
                spans.setdefault(key, []).append((start, end if end is not None else now, run_id))
    out = []
    for slot, intervals in spans.items():
        intervals.sort()
        for i, (_s1, e1, r1) in enumerate(intervals):
            for s2, _e2, r2 in intervals[i + 1:]:
                if s2 >= e1:
                    break
                out.append((slot, r1, r2, e1 - s2))
    return out, sum(len(v) for v in spans.values())


def check_overlaps(overlaps: Sequence[tuple[str, str, str, float]], spans: int, slots: int) -> Check:
    detail = f"{len(overlaps)} overlap(s) among {spans} run spans on {slots} slot tags"
    if overlaps:
        slot, r1, r2, secs = max(overlaps, key=lambda o: o[3])
        detail += f"; worst {slot}: runs {r1[:8]} and {r2[:8]} for {secs:.1f} s"
    return Check("no slot held by two runs at once (run records)", not overlaps, detail)


def check_orphans(procs: Sequence, containers: list[str] | None) -> Check:
    detail = f"{len(procs)} process(es)"
    if procs:
        detail += ": " + "; ".join(f"{p.pid} {p.role} {p.describe()}" for p in procs[:6])
    detail += ", containers: " + ("n/a (no Docker engine reachable)" if containers is None else str(len(containers)))
    return Check("no orphan process or container left", not procs and not containers, detail)


def check_double_training(events: Sequence[str], samples: int) -> Check:
    detail = f"{samples} process samples"
    if events:
        detail += f"; {len(events)} with two generations of a job or more ranks than slots, first: {events[0]}"
    return Check("no job trained twice at once, ranks <= slots (process samples)", not events, detail)


def live_containers(jobs: Sequence[str]) -> list[str] | None:
    """Names of our containers of these jobs (any state), or None when no Docker engine answers."""
    try:
        import docker

        from ones_pipeline.adapters.docker_containers import LABEL_JOB, label_filters

        client = docker.from_env(timeout=5)
        found = client.containers.list(all=True, filters={"label": label_filters()})
    except Exception:  # no SDK, no engine: nothing the subprocess launcher could have left
        return None
    return [c.name for c in found if (c.labels or {}).get(LABEL_JOB) in set(jobs)]


TRACEBACK = "Traceback (most recent call last)"
LOG_SUFFIXES = (".log", ".err", ".out")


def tracebacks(root: Path) -> list[tuple[str, str]]:
    """(file, exception line) of every Python traceback in the project's logs: ``ones run``'s output, Dagster's
    (the daemon's, and every run's compute logs: the launchers' and ranks' stderr)."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in LOG_SUFFIXES or not path.is_file():
            continue
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if TRACEBACK not in line:
                continue
            rest = (re.sub(r"^\[rank\d+\]:\s?", "", x) for x in lines[i + 1:])
            last = next((x for x in rest if x and not x[0].isspace() and not x.startswith(("Traceback", "During"))),
                        "?")
            found.append((str(path.relative_to(root)), last[:160]))
    return found


def check_tracebacks(found: Sequence[tuple[str, str]]) -> Check:
    detail = f"{len(found)} traceback(s)"
    if found:
        where = Counter(Path(f).name if Path(f).name == "daemon.log" else Path(f).suffix for f, _ in found)
        kinds = Counter(last.split(":")[0] for _, last in found)
        detail += f" by file {dict(where)}, by exception {dict(kinds)}; first: {found[0][0]}: {found[0][1]}"
    return Check("no traceback in any log (ones run, daemon, compute logs of launchers and ranks)", not found, detail)


def recoveries(root: Path, jobs_dir: Path, jobs: Sequence[str]) -> dict[str, int]:
    """How often the product's own time limits fired (recoveries, not failures; a hang would show as a run that
    never finishes): in-place resizes that fell back, by reason, and stops that outlasted the grace period."""
    out: Counter[str] = Counter()
    for job in jobs:
        path = jobs_dir / job / "progress.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if row.get("event") == "resize_fallback":
                    out[f"resize fallback: {re.sub(r'[0-9-]+', 'N', str(row.get('reason')))}"] += 1
                elif row.get("event") == "resized":
                    out["resized in place"] += 1
    for path in root.rglob("*"):
        if path.suffix in LOG_SUFFIXES and path.is_file():
            out["stop outlasted the grace period"] += path.read_text(errors="replace").count(
                "after the stop request: killing them")
    return dict(out)
