"""The small API every training process uses: built-in workloads and users' own scripts alike.

A launcher (``ones_pipeline.train.launcher``) starts one process per assigned slot with its placement in
environment variables (``ONES_*``: ``Placement.to_env`` writes them, ``Placement.from_env`` reads them).
In each process::

    with TrainingSession.from_env(dataset_size=len(train_x)) as session:
        model = session.prepare(model, optimizer)          # restores the checkpoint, opens the MLflow run, wraps DDP
        for batch_idx in session.batches():                 # elastic, resumable data order
            x, y = train_x[batch_idx], train_y[batch_idx]   # this rank's share; may be empty
            loss = loss_fn(model(x), y, reduction="sum") * session.loss_scale()
            ...backward, optimizer.step()...
            session.step_done(loss=...)                     # throughput, LR warm-up, stop requests
            if session.epoch_ended:
                session.end_epoch(accuracy=..., loss=...)   # the script's evaluation: stopping rule, checkpoint

The loss is summed over the rank's samples and ``loss_scale()`` weights it so that DDP's gradient average is the
gradient of the mean loss over the step's global batch, also for the short last batch of an epoch. A rank with an
empty share still calls the model, on zero samples: DDP all-reduces in ``backward`` only after a forward through its
wrapper (``step_done`` raises where a rank skipped it: its peers would wait in an all-reduce it never joins). A
script that takes its steps from ``steps()`` instead (``for step in session.steps(): zero_grad; for batch_idx in
step: ...backward; step(); step_done``) trains a per-GPU batch above ``max_per_gpu_batch`` by gradient accumulation
(``micro_batches``); on ``batches()`` it never accumulates, and the batch tuner keeps the per-GPU batch within
``max_per_gpu_batch``.
The session counts progress in samples, so a restart or an in-place resize (``membership``: the same script, the
same model object) with another number of processes or global batch continues the same epoch. A stop request
(SIGTERM/SIGINT/SIGUSR1 to the process, the launcher's stop file, or the launcher's disappearance) is agreed on by
all ranks at the next step boundary (at an epoch's end, after ``end_epoch`` has recorded its evaluation): rank 0
writes a checkpoint and ends the MLflow run as KILLED; ``batches()`` then ends and ``stopped`` is True.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ones_pipeline.core.progress import convergence_counters
from ones_pipeline.core.types import StopKind, lr_for_batch
from ones_pipeline.train import membership, records
from ones_pipeline.train.batch_tuning import BatchChange, BatchTuner, as_observation
from ones_pipeline.train.checkpoint import (
    capture_rng_state,
    load_checkpoint_of,
    restore_modules,
    restore_rng_state,
    save_checkpoint,
)
from ones_pipeline.train.clock import SessionClock
from ones_pipeline.train.micro_batches import Step
from ones_pipeline.train.noise_probe import NoiseScaleProbe
from ones_pipeline.train.placement import Placement, spec_from_json, spec_to_json, system_metrics
from ones_pipeline.train.sampler import EpochOrder

__all__ = ["Placement", "Progress", "Step", "TrainingSession", "spec_from_json", "spec_to_json", "system_metrics"]

log = logging.getLogger("ones_pipeline.train")

# Throughput is reported only from steady state: the first steps after a (re)start include
# compilation/allocation warm-up and would bias the scheduler's speed model.
WARMUP_STEPS = 3


@dataclass
class Progress:
    """Everything a checkpoint must carry besides model and optimizer state."""

    epoch: int = 0
    position: int = 0  # samples consumed in the current epoch
    samples_done: int = 0
    steps_done: int = 0
    accuracies: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lr_from: float | None = None  # warm-up start (LR before the last change)
    lr_to: float | None = None
    warmup_start_samples: int = 0
    global_batch: int | None = None
    restarts: int = 0  # starts of training after the first (``records.starts``)
    finished: bool = False
    record: dict | None = None  # the last epoch's MLflow point and event (``records``: written after the checkpoint)


class TrainingSession:
    """One rank's view of an elastic, resumable data-parallel training run."""

    def __init__(self, placement: Placement, dataset_size: int, checkpoint_interval_s: float = 30.0):
        self.p = placement
        self.spec = placement.spec
        self.dataset_size = int(dataset_size)
        self.checkpoint_interval_s = checkpoint_interval_s
        self.order = EpochOrder(self.dataset_size, seed=placement.seed)
        self.progress = Progress()
        self.stopped = self.left = False  # left: this process left the group in an in-place shrink
        self.finished = False
        self.epoch_ended = False
        self._stop_requested = False
        self._pending_stop = False
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._run = None
        self.clock = SessionClock()  # its steps' and evaluation points' times; when it last logged to MLflow
        self._step: Step | None = None  # the step handed out last
        self._retune_to = 0  # the batch rank 0 chose at this evaluation point (0: none), from ``_agree``
        self._change: BatchChange | None = None  # rank 0: that choice, for the report
        self._steps_since_start = self._steps_here = 0  # since the last batch change / in this process
        self._last_ckpt = self._beat_s = time.monotonic()  # the last checkpoint; the last progress event
        self._prev_handlers: dict[int, Any] = {}
        self._stop_file = placement.stop_file
        self._launcher_pid = placement.launcher_pid
        self._gns = NoiseScaleProbe.for_placement(placement, self.dataset_size)  # gradient noise scale
        self.global_batch = placement.global_batch  # the step's batch now (``batch_tuning`` may change it)
        self._tuner = BatchTuner(placement.spec, placement.world_size, placement.num_nodes, placement.tune_batch)

    @classmethod
    def from_env(cls, dataset_size: int, **kw) -> TrainingSession:
        return cls(Placement.from_env(), dataset_size, **kw)

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.p.rank == 0

    @property
    def device(self) -> torch.device:
        if self.p.device == "cuda":
            return torch.device("cuda", 0 if not self.p.gpus else self.p.rank % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")

    def __enter__(self) -> TrainingSession:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
        if membership.wants_group(self.p):
            membership.init_group(self.p)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self._run is not None:
            self._run.finish("FAILED")
        code = records.quiet_exit(exc, self.spec.name, self.p.rank)  # one line, not a traceback per rank
        self._teardown(exc)
        if code is not None:
            raise SystemExit(code) from None

    def _teardown(self, exc: BaseException | None) -> None:
        if dist.is_initialized():
            if exc is None:
                # Leave together: rank 0 hosts the rendezvous store, and a peer still tearing down
                # its process group after rank 0 has gone can wait on it until the timeout.
                try:
                    dist.barrier()
                except RuntimeError as err:  # a peer already gone: nothing left to wait for
                    log.warning("final barrier failed: %s", err)
            dist.destroy_process_group()
        for sig, handler in self._prev_handlers.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self._stop_requested = True

    # -- setup --------------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: Mapping[str, Any] | None = None
                ) -> torch.nn.Module:
        """Restore the latest checkpoint (if any), open the job's MLflow run (rank 0), wrap for DDP. A process
        that joins a running group in place (``membership.join``) gets the state from rank 0 instead."""
        self._optimizer = optimizer
        ckpt = None if self.p.joining else load_checkpoint_of(self.p.state_dir, self.spec)
        if self.p.joining and not membership.join(self):
            return model  # stopped before it joined
        if ckpt is not None:
            self.progress = Progress(**restore_modules(ckpt, model, optimizer, self.spec, self.p.state_dir))
            restore_rng_state(ckpt["rng"])
            self._gns.load_state_dict(ckpt.get("noise_scale"))  # absent in checkpoints from before GNS
            self._tuner.load_state_dict(ckpt.get("batch_tuning"))
            # Stopped after its last epoch's evaluation: nothing left to train.
            self.finished = self.progress.finished
        if not self.p.joining:
            self._use_batch(self.p.global_batch, self.p.lr)
        self._set_lr()
        self._model = model = membership.wrap(self, model.to(self.device))
        self._gns.attach(model)
        # A generation that finds the job finished trains nothing: its MLflow run is left as it ended, unless the
        # process that finished it was killed before it wrote the last epoch's record or the result.
        ended = self.finished and records.recorded(self.p.state_dir, self.progress.record) and self._result_written
        if self.is_main and self.p.tracking_uri and not ended:
            self._run = records.open_run(self.p, params)
        if self.is_main and ckpt is not None:
            records.replay(self.p.state_dir, self._run, self.progress.record)
            if self.finished and not self._result_written:
                self._finish()
        return model

    @property
    def _result_written(self) -> bool:
        return records.result_path(self.p.state_dir).exists()

    def current_lr(self) -> float:
        pr = self.progress
        start, end = (pr.lr_from if pr.lr_from is not None else self.p.lr,
                      pr.lr_to if pr.lr_to is not None else self.p.lr)
        span = max(self.dataset_size, 1)
        frac = min(max((pr.samples_done - pr.warmup_start_samples) / span, 0.0), 1.0)
        return float(start + (end - start) * frac)

    def _use_batch(self, batch: int, lr: float) -> None:
        """Train on with global batch ``batch`` and target LR ``lr`` (after a restart and after an in-process
        re-tune). A larger LR is reached by a linear warm-up over one epoch from the LR before the change; a
        smaller one applies at once (ramping down from a large-batch LR at a small batch can diverge)."""
        pr = self.progress
        if pr.global_batch is not None and pr.global_batch != batch:
            pr.lr_from = min(self.current_lr(), lr)
            pr.warmup_start_samples = pr.samples_done
        elif pr.lr_from is None:
            pr.lr_from = lr
        pr.lr_to, pr.global_batch, self.global_batch = lr, batch, batch

    def _retune_choice(self) -> float:
        """At an evaluation point, before the step's ``_agree``: rank 0's goodput-optimal batch for this
        allocation (``batch_tuning``), 0 for none. It reaches the other ranks as a term of that all-reduce
        (the others add 0), so choosing costs no collective of its own that a rank could be out of step with."""
        if not self._tuner.enabled:
            return 0.0
        self._tuner.record(self.global_batch, self.clock.step_times, self.clock.micro_times)  # every rank: same record
        self._change = self._tuner.choose(self.global_batch, self._gns.smoother.noise_scale()) \
            if self.is_main else None
        return float(self._change.new) if self._change is not None else 0.0

    def _retune(self) -> None:
        """Every rank: switch to the batch agreed at this evaluation point (``_retune_choice``), if any."""
        new, change = self._retune_to, self._change
        self._retune_to, self._change = 0, None
        if not new or new == self.global_batch:
            return
        self._use_batch(new, lr_for_batch(self.spec, new))
        self._set_lr()
        self.clock.new_configuration()  # steady state again
        self._steps_since_start = 0
        if change is not None:  # rank 0
            n, word = self.p.world_size, "GPU" if self.p.device == "cuda" else "CPU slot"
            text = change.text(f"{n} {word}{'' if n == 1 else 's'}", per="GPU" if word == "GPU" else "slot")
            log.info("%s: %s", self.spec.name, text)
            self._report({**change.to_dict(), "processes": self.p.world_size, "generation": self.p.generation,
                          "samples": self.progress.samples_done})
            if self._run is not None:
                self._run.set_tags({"ones.batch": text[:250]})

    def _set_lr(self) -> None:
        lr = self.current_lr()
        for group in self._optimizer.param_groups:
            group["lr"] = lr

    def loss_scale(self) -> float:
        """Factor for this step's loss summed over this rank's samples, so that DDP's gradient average
        (over ``world_size`` ranks) equals the gradient of the mean loss over the step's global batch.

        That is ``world_size / B``, ``B`` being the samples the step takes across all ranks: the global
        batch, or fewer at the end of an epoch. It is the same on every rank whatever its share (the sum
        already counts a rank's samples; an empty share contributes a zero loss), and the same for every
        micro-batch of a step (``steps()``): their gradients add up to the step's.
        """
        return self.p.world_size / max(self._batch_now, 1)

    def batches(self) -> Iterator[np.ndarray]:
        """Yield this rank's sample indices for each step until the job finishes or is stopped (one
        micro-batch per step: a script on this loop never accumulates gradients)."""
        for step in self._take_steps():
            step.taken = 1
            yield step.indices

    def steps(self) -> Iterator[Step]:
        """Yield each optimizer step until the job finishes or is stopped: iterate it for its micro-batches
        (``micro_batches.Step``). Using this loop tells the session that the script accumulates gradients."""
        self._tuner.accumulates = True
        yield from self._take_steps()

    def _take_steps(self) -> Iterator[Step]:
        while not self.finished and not self.stopped:
            if self._pending_stop:  # the script did not call end_epoch: stop now
                self._stop("KILLED")
                break
            pr = self.progress
            if pr.position >= self.dataset_size:
                pr.epoch, pr.position = pr.epoch + 1, 0
            self.epoch_ended = False
            self._batch_now = min(self.global_batch, self.dataset_size - pr.position)
            idx = self.order.batch_indices(pr.epoch, pr.position, self.global_batch, self.p.rank, self.p.world_size)
            # The step's micro-batches from its own sample count: a short last step needs fewer.
            self._step = Step(idx, self._tuner.split(self._batch_now)[1] + 1, self._model, self._last_micro_batch)
            self.clock.step_begins()
            yield self._step
            if self.clock.in_step:  # step_done was not called: do its bookkeeping anyway
                self.step_done()

    def _last_micro_batch(self) -> None:
        self.clock.last_micro_batch()

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        """DDP wrapper's forward pre-hook: count the forwards whose backward will all-reduce."""
        if self._step is not None and torch.is_grad_enabled() and getattr(module, "require_backward_grad_sync", True):
            self._step.synced_forwards += 1

    def step_done(self, loss: float | None = None) -> None:
        """Account for the step just taken; decide (all ranks together) whether to stop."""
        if not self.clock.in_step:
            return
        elapsed, before_last = self.clock.step_taken(len(self._step))
        self._step.check_taken(self.p.rank, self.p.world_size)
        pr = self.progress
        pr.position += self._batch_now
        pr.samples_done += self._batch_now
        pr.steps_done += 1
        if self.is_main and (not self._steps_here or time.monotonic() - self._beat_s >= records.PROGRESS_EVERY_S):
            self._beat_s = time.monotonic()
            self._report({"event": "progress" if self._steps_here else "training", "samples": pr.samples_done,
                          "generation": self.p.generation, "samples_per_s": self.throughput(),
                          "global_batch": self._batch_now, "processes": self.p.world_size})
            pr.restarts = records.starts(self.p.state_dir) - 1 if not self._steps_here else pr.restarts
        self._steps_since_start += 1
        self._steps_here += 1
        if self._steps_since_start > WARMUP_STEPS and self._batch_now == self.global_batch:
            self.clock.steady(elapsed, before_last)
        self._set_lr()
        # An evaluation point: the end of an epoch, or the sample budget of an epochs/samples rule
        # reached mid-epoch (e.g. 0.5 epochs).
        self.epoch_ended = pr.position >= self.dataset_size or self._budget_reached()
        if loss is not None:
            self._last_loss = float(loss)
        ckpt_due = time.monotonic() - self._last_ckpt > self.checkpoint_interval_s and not self.epoch_ended
        local_gns = self._gns.local_statistic(self._batch_now)  # summed over ranks in the same all-reduce
        retune = self._retune_choice() if self.epoch_ended else 0.0  # rank 0's; the others add 0
        plan = membership.next_plan(self.p) if self.is_main and not self.epoch_ended else 0.0  # in-place resize
        stop, ckpt_due, sums = self._agree(self._stop_wanted(), ckpt_due, totals=[*local_gns, retune, plan])
        self._gns.observe(sums[:-2], self._batch_now)
        self._retune_to, plan = int(round(sums[-2])), int(round(sums[-1]))
        if stop and self.epoch_ended:
            # Evaluate the finished epoch first (end_epoch), then stop: a resume must not skip it.
            self._pending_stop = True
        elif stop:
            self._stop("KILLED")
        elif plan:
            membership.change(self, plan)
        elif ckpt_due:
            self.checkpoint()
        self.clock.step_done(self.epoch_ended)

    def _stop_wanted(self) -> bool:
        if self._stop_requested:
            return True
        if self._stop_file is not None and self._stop_file.exists():
            return True
        # Orphaned (launcher killed): stop cleanly rather than train unsupervised.
        return self._launcher_pid is not None and os.getppid() != self._launcher_pid

    def _agree(self, *flags: bool, totals: Sequence[float] = ()) -> tuple:
        """One all-reduce per step: any rank's True wins (so all ranks or none enter a collective), totals sum."""
        if self.p.world_size == 1:
            return (*flags, list(totals))
        # On the process's device: NCCL reduces GPU tensors only.
        t = torch.tensor([1.0 if f else 0.0 for f in flags] + list(totals), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)  # a sum: a flag is set when any rank's is
        values = t.tolist()
        return (*(v > 0 for v in values[:len(flags)]), values[len(flags):])

    def throughput(self) -> float | None:
        """Steady-state samples/s (median optimizer-step time of the recent window), None before steady state."""
        step = self.clock.step_s()
        return None if step is None else self.global_batch / step

    def metrics(self) -> dict[str, float]:
        """The logged metrics. ``per_gpu_batch``, ``step_time_s`` and ``sync_time_s`` are the throughput
        model's terms (``batch_tuning.as_observation``): the micro-batch per GPU, and for an accumulating step
        the synchronising micro-batch and update, not the whole optimizer step (``samples_per_s`` is real).
        ``epoch_end_s``: the median wall time of the recent evaluation points (from the step that ended an
        epoch to the next step), once one has passed."""
        pr = self.progress
        micro, accum = self._tuner.split(self.global_batch)
        out = {"samples": float(pr.samples_done), "epoch": pr.samples_done / self.dataset_size,
               "global_batch": float(self.global_batch), "gpus": float(self.p.world_size),
               "lr": self.current_lr(), "per_gpu_batch": float(micro), "num_nodes": float(self.p.num_nodes),
               **({"accum_steps": float(accum)} if accum else {}), **self._gns.metrics()}  # (a constant 0 led charts)
        tp = self.throughput()
        if tp is not None:
            out["samples_per_s"] = tp
            obs = as_observation((self.p.world_size, self.p.num_nodes, micro, accum), self.clock.step_s(),
                                 self.clock.micro_s() if accum else None)
            out["step_time_s"] = obs.step_time_s
            if accum:
                out["sync_time_s"] = obs.sync_time_s
        if (epoch_end := self.clock.epoch_end_s()) is not None:
            out["epoch_end_s"] = epoch_end
        if getattr(self, "_last_loss", None) is not None:
            out["loss"] = self._last_loss
        out.update(system_metrics(self.p.device == "cuda"))
        return out

    def end_epoch(self, accuracy: float, loss: float | None = None) -> bool:
        """Record an evaluation; apply the stopping rule; checkpoint. Returns True when the job is done."""
        pr = self.progress
        pr.accuracies.append(float(accuracy))
        if loss is not None:
            pr.losses.append(float(loss))
        self.finished = self._stopping_rule_met()
        if self.finished:  # in the final record, for the model's next jobs (one shorter than an epoch has only this)
            self.clock.last_point()
        pr.record = None
        if self.is_main:  # the epoch's record: written after the checkpoint that holds it (``records``)
            m = {**self.metrics(), "accuracy": float(accuracy), "test_loss": loss}
            pr.record = records.epoch_record(m if self._run is not None else {}, {
                "event": "epoch", "epoch": round(pr.samples_done / self.dataset_size, 3), "samples": pr.samples_done,
                "accuracy": float(accuracy), "loss": None if loss is None else float(loss),
                "train_loss": m.get("loss"), "samples_per_s": m.get("samples_per_s"),
                "global_batch": self.global_batch, "processes": self.p.world_size, "generation": self.p.generation})
        pr.finished = self.finished
        if not self.finished and not self._pending_stop:
            self._retune()
        self.checkpoint()
        if self.is_main:
            if self.finished and self._run is not None:  # its model, then the last metrics linked to it
                self._run.log_model(self._model, pr.samples_done, register_as=self.spec.register_as)
            records.write(self.p.state_dir, self._run, pr.record)
        if self.finished:
            self._finish()
        elif self._pending_stop:
            self._stop("KILLED")
        return self.finished

    def _report(self, row: Mapping[str, Any]) -> None:
        """Rank 0: one line of ``<state_dir>/progress.jsonl``, which the launcher relays to the orchestrator
        (Dagster Pipes log lines) while the job trains."""
        records.report(self.p.state_dir, row)

    def _budget_reached(self) -> bool:
        rule = self.spec.stopping
        total = rule.total_samples(self.dataset_size)
        return total is not None and self.progress.samples_done >= total - 1e-9

    def _stopping_rule_met(self) -> bool:
        rule, pr = self.spec.stopping, self.progress
        if rule.kind is not StopKind.ACCURACY:
            return self._budget_reached()
        counters, _ = convergence_counters(pr.accuracies, rule.target_accuracy, rule.min_delta)
        return bool(counters[-1] >= rule.patience)

    # -- checkpoint / end ---------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Rank 0 writes model, optimizer, progress and RNG state atomically; all ranks wait for it."""
        if self.is_main:
            self.save()
        if dist.is_initialized():
            dist.barrier()
        self._last_ckpt = time.monotonic()

    def save(self) -> None:
        """Rank 0: write the checkpoint now (``checkpoint`` is the ranks' agreed one)."""
        model = self._model.module if hasattr(self._model, "module") else self._model
        save_checkpoint(self.p.state_dir, {
            "model_name": self.spec.model, "model": model.state_dict(), "optimizer": self._optimizer.state_dict(),
            "progress": asdict(self.progress), "rng": capture_rng_state(),
            "noise_scale": self._gns.state_dict(), "batch_tuning": self._tuner.state_dict()})

    def _stop(self, status: str) -> None:
        self._pending_stop = False
        self.checkpoint()
        if self._run is not None:
            self._run.log_metrics(self.metrics(), step=self.progress.samples_done)
            self._run.finish(status)
        self.stopped = True
        if self.is_main:  # the orchestrator reads this to tell a planned preemption from a crash
            self._report({"event": "stopped", "samples": self.progress.samples_done,
                          "epoch": round(self.progress.samples_done / self.dataset_size, 3),
                          "generation": self.p.generation})
        log.info("stopped at %d samples (epoch %.2f): checkpoint written", self.progress.samples_done,
                 self.progress.samples_done / self.dataset_size)

    def _finish(self) -> None:
        if self._run is not None:
            self._run.finish("FINISHED")
        if self.is_main:
            result = {"job": self.spec.name, "samples": self.progress.samples_done,
                      "epochs": self.progress.samples_done / self.dataset_size,
                      "accuracy": self.progress.accuracies[-1] if self.progress.accuracies else None,
                      "restarts": self.progress.restarts, "global_batch": self.global_batch,
                      "mlflow_run_id": self._run.run_id if self._run is not None else None}
            records.write_result(self.p.state_dir, result)

    def log_step_metrics(self) -> None:
        """Log the current step metrics (rank 0) for a live progress curve: call it after every step. It logs a
        point every ``clock.LOG_EVERY_S`` seconds, and at once once the steps at a new configuration (processes,
        global batch) are timed, so the scheduler values a job by its own steps as soon as they are."""
        timed = (self.p.world_size, self.global_batch) if self.throughput() is not None else None
        if self._run is not None and self.clock.log_due(timed):
            self._run.log_metrics(self.metrics(), step=self.progress.samples_done)
