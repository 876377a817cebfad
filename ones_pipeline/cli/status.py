"""``ones status``: one row per job (state, slots, batch, progress, ETA, restarts), from the Dagster
instance's runs, MLflow's progress and the scheduler's state files."""

from __future__ import annotations

import json
import sys
import time

from ones_pipeline.adapters.inventory import inventory_source
from ones_pipeline.config import EnvConfig, load_job_specs

STATE_OF_RUN = {"QUEUED": "queued", "NOT_STARTED": "queued", "STARTING": "starting", "STARTED": "running",
                "CANCELING": "preempting", "CANCELED": "paused", "FAILURE": "retrying",
                # A run that ended SUCCESS without materializing was preempted after its checkpoint (tag
                # ones/outcome); finished jobs are told by their materialization, not by this.
                "SUCCESS": "paused"}
STATUS_COLUMNS = ["job", "state", "slots", "batch", "progress", "eta", "restarts"]


def _progress_text(spec, p, total) -> str:
    epochs = p.epochs_done if p else 0.0
    if spec and total:
        return f"{epochs:.1f}/{total / spec.dataset_size:g} ep"
    if p and p.accuracy_history:
        return f"{epochs:.1f} ep, acc {p.accuracy_history[-1][1]:.3f}"
    return f"{epochs:.1f} ep"


def eta_text(remaining_samples: float, samples_done: float, held_s: float) -> str:
    """ETA from wall-clock progress: samples done per second the job's runs held their slots (start-up,
    evaluation, checkpoints and restarts included; a trainer's own samples/s leaves those out and was
    2-20x too optimistic); "-" before any progress."""
    if samples_done <= 0 or held_s <= 0:
        return "-"
    return f"{max(remaining_samples, 0.0) / (samples_done / held_s):.0f} s"


def slots_summary(env: EnvConfig):
    """(device kind, lines about the slots): the inventory's own line, one per node left out (down or
    drained, with Slurm's reason), or why the inventory could not be read now."""
    from ones_pipeline.adapters.inventory import InventoryUnavailable

    try:
        inventory = inventory_source(env.cluster).discover()
    except InventoryUnavailable as exc:
        return "gpu" if env.cluster.slurm is not None else "cpu", [f"slots unavailable: {exc}"], ()
    return (inventory.kind, [f"slots: {inventory.reason}"] + [f"node left out: {u}" for u in inventory.unavailable],
            inventory.slot_ids)


def waiting_lines(rows: list[dict], runs, slot_ids, device: str) -> list[str]:
    """For each job that waits (pending, paused, retrying): why, from the runs in flight and the slots."""
    from ones_pipeline.scheduler.rationale import waiting_reason

    holders: dict[str, tuple[int, ...]] = {}
    for r in runs:
        if r.in_flight:
            holders[r.job] = tuple(holders.get(r.job, ())) + tuple(r.slot_ids)
    free = [s for s in slot_ids if not any(s in held for held in holders.values())]
    return [f"{row['job']}: {waiting_reason(row['job'], holders, free, device)}" for row in rows
            if row["state"] in ("pending", "paused", "retrying")]


def slots_text(device: str, run) -> str:
    """The run's slots: its allocation, and a slot its tags still hold while an in-place shrink
    finishes ("cpu 0 (freeing 1)"; ``defs.slot_owner``)."""
    freeing = [s for s in run.held_ids if s not in run.slot_ids]
    return f"{device} " + ",".join(map(str, run.slot_ids)) + (f" (freeing {','.join(map(str, freeing))})"
                                                               if freeing else "")


def batch_text(run, progress) -> str:
    """The batch the job trains with now: its launch batch, or what the step re-tuned it to (MLflow's latest
    ``global_batch`` of this generation) with its measured noise scale."""
    now = progress.metrics.get("global_batch") if progress is not None and progress.generation == run.generation \
        else None
    if now is None or now != now or int(now) == run.global_batch:
        return str(run.global_batch)
    gns = progress.grad_noise_scale
    noise = f", noise scale {gns:.0f}" if gns is not None else ""
    return f"{int(now)} (re-tuned from {run.global_batch}{noise})"


def job_rows(env: EnvConfig, instance, device: str | None = None) -> list[dict]:
    """One row per job in assets/jobs (and finished ones): state, slots, batch, progress, ETA, restarts."""
    from ones_pipeline.adapters.mlflow import read_progress
    from ones_pipeline.defs.instance import finished_jobs, job_run_infos

    specs, _ = load_job_specs(env.jobs_dir)
    finished = finished_jobs(instance)
    runs = job_run_infos(instance, env.job_state_dir)
    try:
        progress = read_progress(env.tracking_uri(), env.mlflow.experiment, sorted(set(specs) | finished))
    except Exception as exc:  # status must work without MLflow (a dead server: TrackerError within 5 s)
        print(f"MLflow progress unavailable: {str(exc).splitlines()[0][:300] if str(exc) else exc!r}",
              file=sys.stderr)
        progress = {}
    failed = env.layout.failed()
    device = device or slots_summary(env)[0]  # "gpu 0,1" or "cpu 0": CPU slots are not GPUs
    rows = []
    for job in sorted(set(specs) | finished):
        rs = sorted((r for r in runs if r.job == job), key=lambda r: (r.generation, r.created_s))
        latest = rs[-1] if rs else None
        state = "finished" if job in finished else STATE_OF_RUN.get(latest.status, latest.status.lower()) \
            if latest else "pending"
        if job in failed:
            state = "failed"
        p = progress.get(job)
        spec = specs.get(job)
        total = spec.stopping.total_samples(spec.dataset_size) if spec else None
        eta = "-"
        if state == "running" and total and p:
            now = time.time()
            eta = eta_text(total - p.samples_done, p.samples_done, sum(r.held_s(now) for r in rs))
        in_flight = latest is not None and latest.in_flight
        rows.append({"job": job, "state": state,
                     "slots": slots_text(device, latest) if in_flight else "-",
                     "batch": batch_text(latest, p) if in_flight else "-",
                     "progress": _progress_text(spec, p, total), "eta": eta,
                     "restarts": max((p.restarts if p else 0), len([r for r in rs if r.start_s is not None]) - 1, 0),
                     "generations": len(rs)})
    return rows


def decision_lines(env: EnvConfig, limit: int = 40) -> list[str]:
    """The decision log (``decisions.jsonl``) as text, one line per decision with its time since the first:
    ``+ 62 s  long: [0] -> [0,1] batch 64 (grow 1 -> 2 in place: ...)``, then how many changes of running
    jobs were made in place and how many through a checkpoint; a log longer than ``limit`` shows its first
    ``limit // 2`` and last ``limit // 2`` lines around a count of those left out. Unreadable lines are
    skipped."""
    from ones_pipeline.scheduler.runs import Decision

    decisions = []
    try:
        lines = env.layout.decisions.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            d = json.loads(line)
            decisions.append(Decision(float(d["time_s"]), d["job"], tuple(d.get("before", ())),
                                      tuple(d.get("after", ())), int(d.get("global_batch", 0)), d.get("reason", ""),
                                      path=str(d.get("path", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    if not decisions:
        return []
    t0 = decisions[0].time_s
    out = [f"+{d.time_s - t0:4.0f} s  {d.line()}" for d in decisions]
    if len(out) > limit:
        half = max(limit // 2, 1)
        out = out[:half] + [f"... {len(out) - 2 * half} more ..."] + out[-half:]
    paths = [d.path for d in decisions]
    if "in place" in paths or "checkpoint" in paths:  # how the changes of running jobs were made
        out.append(f"changes of running jobs: {paths.count('in place')} in place (same run), "
                   f"{paths.count('checkpoint')} through a checkpoint (a new generation)")
    return out


def format_table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(no jobs)"
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def cmd_status(env: EnvConfig) -> int:
    from ones_pipeline.defs.instance import job_run_infos, open_instance

    device, slot_lines, slot_ids = slots_summary(env)
    from ones_pipeline.defs.liveness import no_scheduler_line

    with open_instance(env) as instance:
        rows = job_rows(env, instance, device)
        waits = waiting_lines(rows, job_run_infos(instance, env.job_state_dir), slot_ids, device)
        if stopped := no_scheduler_line(instance):  # then no job waits for the policy: none decides
            waits = [f"{line.partition(' but the policy')[0]}, but {stopped}" for line in waits] or [stopped]
    print(format_table(rows, STATUS_COLUMNS))
    print()  # then the slots, nodes left out and why jobs wait
    for line in slot_lines + waits:
        print(line)
    for err in env.layout.read_json(env.layout.spec_errors, []):
        print(f"skipped spec: {err['message']}")
    return 0
