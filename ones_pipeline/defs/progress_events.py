"""Progress of a running generation on its partition: observations of ``training_job`` while it trains.

The step's rank 0 appends its events to ``jobs/<job>/progress.jsonl`` (``train.api``): ``training`` at its
first step, ``progress`` every ``records.PROGRESS_EVERY_S`` (5 s) while it trains, ``epoch`` at each evaluation;
the step relays the epochs as run-log lines; the run log is one click away from the partition, which itself
shows only "run has started" until the job finishes. So while the launcher runs the step, a thread of the
asset body reads the new lines of that file (from where the file ended when the generation started) and
records this generation's progress as an ``AssetObservation`` of the job's partition (at its first training
step, then one per ``OBSERVE_EVERY_S``, never more often): samples done of the stopping rule's total and the
percent, the ETA at this generation's rate and the scheduler's predicted finish (``decisions.jsonl``), epoch,
the last evaluation's accuracy and losses, samples/s, global batch, slots, and the MLflow run. A job that stops
on samples (or whose epochs are long) shows its progress from its first step, not at its first epoch's end
(20 minutes in, before). The file is on this machine for every launcher (the job's directory is mounted into a
container, shared with Slurm nodes), so the same code serves all three.

In-place changes (``train.resize_control``) show there too: on rank 0's ``resized`` event (or the launcher's
``resize_fallback``) the observer frees the slots the run gave up (``defs.slot_owner``), logs
"grew 1 -> 2 CPU slots in place in 1.8 s, 0.05 s without training" (from the apply run's request to the
re-formed group; the pause of training), records it as an observation of the partition and counts it on the
job's MLflow run (``ones.resizes_in_place``, beside ``ones.restarts``).

No ``from __future__ import annotations``: this module is loaded with the Dagster definitions.
"""

import threading
from pathlib import Path

import dagster as dg

from ones_pipeline.config.layout import ProgressTail, newest_row
from ones_pipeline.defs.slot_owner import allocation_now, free_given_back, record
from ones_pipeline.scheduler.allocation import RunAllocation

POLL_S = 2.0
# At most one observation per this many seconds (the first epoch of a generation always): one per epoch
# buried the decisions and materializations of a 250-epoch job under 250 rows of the asset's Events tab.
OBSERVE_EVERY_S = 30.0


class ProgressObserver:
    """Use as a context manager around the step: observations while it trains, the last lines at exit."""

    def __init__(self, context: dg.AssetExecutionContext, path: Path, allocation: RunAllocation, run_link=None,
                 poll_s: float = POLL_S, tracking_uri: str | None = None, decisions: Path | None = None):
        self.context, self.path, self.allocation = context, Path(path), allocation
        self.run_link = run_link  # run id -> metadata value (``MlflowResource.run_link``), or None
        self.poll_s = poll_s
        self.tracking_uri = tracking_uri  # the MLflow store: in-place changes are counted on the job's run
        self.decisions = decisions  # the decision log (``decisions.jsonl``): the scheduler's predicted finish
        self.changes: list[str] = []  # this run's in-place changes, as logged
        self.mlflow_run: str | None = None
        self.mlflow_experiment: str | None = None
        self.observed = 0
        self._last_observed_s: float | None = None
        self._first: tuple[float, float] | None = None  # (time, samples) of this generation's first training row
        self._epoch: dict | None = None  # its last epoch row: the accuracy and losses shown until the next
        self._tail = ProgressTail(self.path)  # from where the file ends now: this generation's lines
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ones-progress-observer", daemon=True)

    def __enter__(self) -> "ProgressObserver":
        # the slot ledger's first row of this run: the slots its tags held when Dagster started it
        record(self.path.parent, self.context.run.run_id, self.allocation.generation,
               claimed=self.allocation.slot_ids, first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10.0)
        self._poll()  # the epochs of the last seconds

    def _loop(self) -> None:
        while not self._done.wait(self.poll_s):
            self._poll()

    def _poll(self) -> None:
        for row in self._tail.rows():
            if row.get("generation") != self.allocation.generation:
                continue
            if row.get("event") == "mlflow_run":
                self.mlflow_run = str(row.get("run_id") or "") or None
                self.mlflow_experiment = str(row.get("experiment_id") or "") or None
            elif row.get("event") in ("resized", "resize_fallback"):
                try:
                    self.changed(row)
                except Exception as exc:  # never fail the training step; the next event retries the free
                    self.context.log.warning(f"in-place change not recorded: {exc}")
            elif row.get("event") in ("training", "progress", "epoch"):
                now = float(row.get("time_s") or 0.0)
                if self._first is None and row.get("event") != "epoch":  # the rate since training began: the ETA
                    self._first = (now, float(row.get("samples") or 0.0))
                if row.get("event") == "epoch":
                    self._epoch = row
                if self._last_observed_s is not None and now - self._last_observed_s < OBSERVE_EVERY_S:
                    continue
                self._last_observed_s = now
                try:
                    self.context.log_event(dg.AssetObservation(asset_key=self.context.asset_key,
                                                               partition=self.allocation.job,
                                                               metadata=self.metadata(row)))
                    self.observed += 1
                except Exception as exc:  # progress display must never fail the training step
                    self.context.log.warning(f"progress observation not recorded: {exc}")

    def changed(self, row: dict) -> None:
        """An in-place change is done (or fell back to a checkpoint, in the same run): free the slots given
        up, say it in the run log, on the partition and on the MLflow run."""
        instance, run_id = self.context.instance, self.context.run.run_id
        now = allocation_now(instance, run_id, self.path.parent)
        slots = [str(s) for s in (now.slot_ids if now else ())]
        if int(row.get("to") or 0) != len(slots):
            return  # an earlier change's event: the run has been asked for another since
        freed = free_given_back(instance, run_id, self.allocation.device, self.path.parent,
                                self.allocation.generation)
        old, new = int(row.get("from") or 0), int(row.get("to") or 0)
        word = "GPU" if self.allocation.device == "gpu" else "CPU slot"
        verb = "grew" if new > old else "shrank" if new < old else "moved"
        took = float(row.get("time_s") or 0.0) - (now.resized_s or 0.0)
        took_text = f" in {took:.1f} s" if 0 < took < 3600 else ""
        if row.get("event") == "resized":
            paused = f", {float(row['paused_s']):.2f} s without training" if row.get("paused_s") is not None else ""
            text = f"{verb} {old} -> {new} {word}s in place{took_text}{paused}"
        else:
            text = (f"{verb} {old} -> {new} {word}s through a checkpoint in the same run{took_text} "
                    f"(in place failed: {row.get('reason')})")
        self.changes.append(text)
        self.context.log.info(f"{self.allocation.job} generation {self.allocation.generation}: {text}; "
                              f"slots {','.join(slots)}" + (f", freed {freed}" if freed else ""))
        self.context.log_event(dg.AssetObservation(asset_key=self.context.asset_key, partition=self.allocation.job,
                                                   metadata={"change": text, "slots": ",".join(slots),
                                                             "generation": self.allocation.generation,
                                                             "samples": int(row.get("samples") or 0),
                                                             "paused_s": _rounded(row.get("paused_s"), 3)}))
        if self.tracking_uri and self.mlflow_run:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self.tracking_uri)
            done = int(client.get_run(self.mlflow_run).data.tags.get("ones.resizes_in_place", 0))
            client.set_tag(self.mlflow_run, "ones.resizes_in_place", str(done + (row.get("event") == "resized")))
            client.set_tag(self.mlflow_run, "ones.last_change", f"generation {self.allocation.generation}: {text}")

    def predicted_finish(self):
        """When the scheduler's last decision for this job (its start or its last change) predicted it to finish:
        the decision's time plus its ``remaining_after_s`` (the policy's model, restart included), beside the
        ``eta_s`` this generation's rate gives; None without one."""
        row = _last_decision(self.decisions, self.allocation.job)
        after = ((row or {}).get("why") or {}).get("remaining_after_s")
        if after is None:
            return None
        return dg.MetadataValue.timestamp(float(row.get("time_s") or 0.0) + float(after))

    def metadata(self, row: dict) -> dict:
        """What the partition shows for one progress row (``training``/``progress``/``epoch``): samples done of
        the stopping rule's total, percent, ETA, epoch, the last evaluation; rounded, units in the names."""
        spec = self.allocation.spec
        samples = int(row.get("samples") or 0)
        epoch = float(row.get("epoch") or samples / max(spec.dataset_size, 1))
        total = spec.stopping.total_samples(spec.dataset_size)  # None: it stops on accuracy
        n = int(row.get("processes") or self.allocation.world_size)
        word = "GPU" if self.allocation.device == "gpu" else "CPU slot"
        last = self._epoch or {}
        out = {
            "progress": f"{samples:,}/{int(total):,} samples ({100.0 * min(samples / total, 1.0):.1f} %)" if total
            else f"epoch {epoch:.2f} (until accuracy {spec.stopping.target_accuracy:g})",
            "epoch": f"{epoch:.2f}/{total / spec.dataset_size:g}" if total else None,
            "samples": samples, "samples_total": int(total) if total else None,
            "progress_percent": dg.MetadataValue.float(round(100.0 * min(samples / total, 1.0), 1)) if total else None,
            "eta_s": _eta_s(self._first, float(row.get("time_s") or 0.0), samples, total),
            "predicted_finish": self.predicted_finish(),
            "accuracy": _rounded(last.get("accuracy"), 4), "test_loss": _rounded(last.get("loss"), 4),
            "train_loss": _rounded(last.get("train_loss"), 4),
            "samples_per_s": _rounded(row.get("samples_per_s"), 1),
            "global_batch": row.get("global_batch"),
            "slots": f"{n} {word}{'' if n == 1 else 's'}",
            "generation": self.allocation.generation,
        }
        if self.mlflow_run and self.run_link is not None:
            out["mlflow_run"] = self.run_link(self.mlflow_run, self.mlflow_experiment)
        return {k: v for k, v in out.items() if v is not None}


def _last_decision(path: Path | None, job: str) -> dict | None:
    """The newest decision in the log that gave ``job`` slots (the last 64 KB of the file: a job's last decision is
    recent while it trains)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(fh.seek(0, 2) - 65536, 0))
            lines = fh.read().splitlines()
    except (OSError, TypeError):
        return None
    return newest_row(lines, lambda row: row.get("job") == job and bool(row.get("after")))


def _eta_s(first: tuple[float, float] | None, now: float, samples: float, total: float | None):
    """Seconds to the stopping rule's total at this generation's wall-clock rate since its first training step
    (evaluations and checkpoints included, as ``ones status`` measures its ETA; a trainer's samples/s leaves
    them out); None without a total or before a second row."""
    if total is None or first is None or now - first[0] <= 0 or samples - first[1] <= 0:
        return None
    return dg.MetadataValue.float(round(max(total - samples, 0.0) / ((samples - first[1]) / (now - first[0])), 0))


def _rounded(value, digits: int):
    try:
        return None if value is None else round(float(value), digits)
    except (TypeError, ValueError):
        return None
