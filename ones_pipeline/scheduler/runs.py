"""What the scheduler knows of Dagster runs and what it tells them: run tags, run records, the plan's parts.

No Dagster here: ``defs`` turns Dagster run records into ``RunInfo`` (through the tags below) and the
plan's ``Launch``/``Cancel`` back into run requests and cancellations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ones_pipeline.core.types import JobSpec, ThroughputObs, spec_to_dict
from ones_pipeline.scheduler.allocation import RunAllocation

# Run tags (Dagster tag keys: letters, digits, '-', '_', '.', '/'): only what a user filters the runs list by and
# what Dagster's tag concurrency limits count. The rest of a run's bookkeeping is in its run config (the allocation
# it was launched with: generation, slots, batch; ``Launch.run_config``) and, for what changes while it runs, in
# its generation's in-place change request (``train.resize_control``: slots, batch, when), read with
# ``RunInfo.from_run``: each tag is a line of every row of Dagster's runs list.
TAG_JOB = "ones/job"
TAG_OUTCOME = "ones/outcome"  # set when a run ends without training on: "preempted, checkpointed" or:
OUTCOME_NOT_TRAINED = "not trained: not a run the scheduler wants"  # it ended at once (``defs.run_guard``)
# Slot ownership: one tag per slot a run has held, ``ones/gpu-<id>`` or ``ones/cpu-<id>``, valued ``held`` while
# the run holds the slot and ``free`` once it gave it back in place. dagster.yaml limits each (key, ``held``) pair
# to one in-flight run (``defs.instance.instance_yaml``). A tag cannot be removed from a run but its value can
# change (``add_run_tags``), so an in-place grow claims a slot (adds ``held``) and a shrink frees one (``free``).
# The run's allocation (``RunInfo.slot_ids``) is the slots it trains on, or will once its in-place change is done.
SLOT_HELD = "held"
SLOT_FREE = "free"

IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")
ENDED_BAD = ("FAILURE",)
TAG_FAILURE_REASON = "dagster/failure_reason"  # Dagster's own, on a failed run
# Failures of the machinery around the training, not of the job: its run worker died or was restarted
# (e.g. kill -9, a daemon restart) or never started in time. They do not use up the job's retries.
INFRA_FAILURES = frozenset({"UNEXPECTED_TERMINATION", "RUN_WORKER_RESTART", "START_TIMEOUT"})


def slot_tag(slot_id: int, device: str) -> str:
    """The tag key of one slot: ``ones/gpu-3`` for a GPU, ``ones/cpu-0`` for a CPU slot."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device {device!r}; allowed: gpu, cpu")
    return f"ones/{device}-{int(slot_id)}"


def spec_hash(spec: JobSpec) -> str:
    return hashlib.sha256(json.dumps(spec_to_dict(spec), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunInfo:
    """What the sensor needs of one Dagster run of a training job."""

    run_id: str
    job: str
    generation: int
    slot_ids: tuple[int, ...]
    status: str  # DagsterRunStatus value
    global_batch: int = 0
    created_s: float = 0.0
    start_s: float | None = None
    end_s: float | None = None
    failure_reason: str = ""  # Dagster's ``dagster/failure_reason`` of a failed run
    held: tuple[int, ...] | None = None  # slots whose tag says ``held`` (None: as ``slot_ids``)
    resized_s: float | None = None  # when its slots were last asked to change in place (the tick's decision)

    @property
    def held_ids(self) -> tuple[int, ...]:
        """The slots this run owns now (while an in-place shrink finishes, also the slot it gives up)."""
        return self.slot_ids if self.held is None else self.held

    @property
    def changed_s(self) -> float:
        """When its allocation last changed: its creation, or its last in-place change."""
        return max(self.created_s, self.resized_s or 0.0)

    @property
    def infra_failure(self) -> bool:
        """A failed run whose run worker died or never started: not the job's fault (``INFRA_FAILURES``)."""
        return self.status in ENDED_BAD and self.failure_reason in INFRA_FAILURES

    @classmethod
    def from_run(cls, run_id: str, status: str, tags: Mapping[str, str], config: Mapping[str, Any],
                 change: Mapping[str, Any] | None = None, created_s: float = 0.0, start_s: float | None = None,
                 end_s: float | None = None) -> RunInfo | None:
        """One run of a training job as the scheduler sees it, or None when it is not one (no ``ones/job`` tag,
        no allocation in its config, or it ended without training: ``defs.run_guard``). ``config``: the training
        asset's run config (``Launch.run_config``: the allocation it was launched with); ``change``: its
        generation's newest in-place change request (``train.resize_control.read_resize_request``: ``slots``,
        ``global_batch``, ``time_s``, ``run_id``): made for this run (the apply run's, ``defs.slot_owner.claim``),
        it is the run's allocation since; one without the run's id (a shell's, a benchmark's) is not."""
        if TAG_JOB not in tags or tags.get(TAG_OUTCOME) == OUTCOME_NOT_TRAINED:
            return None
        try:
            alloc = json.loads(config["allocation"])
            generation, slots, batch = int(alloc["generation"]), tuple(int(s) for s in alloc["slot_ids"]), \
                int(alloc["global_batch"])
        except (KeyError, TypeError, ValueError):
            return None
        resized = None
        if change and change.get("run_id") == run_id:
            try:
                slots = tuple(int(s) for s in change["slots"])
                batch = int(change.get("global_batch") or batch)
                resized = float(change.get("decided_s") or change["time_s"])
            except (KeyError, TypeError, ValueError):
                pass
        held = tuple(sorted(int(k.rsplit("-", 1)[1]) for k, v in tags.items()
                            if k.startswith(("ones/cpu-", "ones/gpu-")) and v != SLOT_FREE))
        return cls(run_id, tags[TAG_JOB], generation, slots, status, batch, created_s, start_s, end_s,
                   tags.get(TAG_FAILURE_REASON, ""), held, resized)

    @property
    def in_flight(self) -> bool:
        return self.status in IN_FLIGHT

    def held_s(self, now: float) -> float:
        """Seconds it held its slots (so far)."""
        if self.start_s is None:
            return 0.0
        return max((self.end_s if self.end_s is not None else now) - self.start_s, 0.0)


def held_periods(run: RunInfo, ledger: Sequence[Mapping[str, Any]],
                 now: float) -> list[tuple[float, float, tuple[int, ...]]]:
    """(start, end, slots) of each stretch of ``run`` with one slot set: from its start to its end (or ``now``),
    split at every in-place claim and free of its job's slot ledger rows (``defs.slot_owner``: ``time_s``,
    ``run_id``, ``claimed``, ``freed``, ``first``). Slot-time, the tick's attained service and the allocation
    plot read these: a run changed in place does not hold its last slot set for its whole life."""
    if run.start_s is None:
        return []
    end = run.end_s if run.end_s is not None else now
    mine = [r for r in ledger if r.get("run_id") == run.run_id]
    changes = [r for r in mine if not r.get("first")]
    first = next((r for r in mine if r.get("first")), None)
    if first is not None:
        held = set(first["claimed"])
    else:  # its step did not record its start: its slots now, with every change since undone, newest first
        held = set(run.held_ids)
        for r in reversed(changes):
            held = (held - set(r["claimed"])) | set(r["freed"])
    out, t = [], run.start_s
    for r in changes:
        at = min(max(float(r["time_s"]), run.start_s), end)
        if at > t and held:
            out.append((t, at, tuple(sorted(held))))
        t = max(t, at)
        held = (held | set(r["claimed"])) - set(r["freed"])
    if end > t and held:
        out.append((t, end, tuple(sorted(held))))
    return out


def slot_seconds(run: RunInfo, ledger: Sequence[Mapping[str, Any]], now: float) -> float:
    """Slot-seconds ``run`` held so far: each stretch of ``held_periods`` times its slot count."""
    return sum((end - start) * len(slots) for start, end, slots in held_periods(run, ledger, now))


@dataclass(frozen=True)
class ProgressInfo:
    """A job's progress as read from MLflow (``adapters.mlflow.JobProgress`` fits)."""

    samples_done: float = 0.0
    throughput_obs: tuple[ThroughputObs, ...] = ()
    loss_history: tuple[tuple[float, float], ...] = ()
    accuracy_history: tuple[tuple[float, float], ...] = ()
    restarts: int = 0
    grad_noise_scale: float | None = None  # measured by the step (samples); None before it has one
    epoch_end_s: float | None = None  # s one evaluation point takes outside the steps; None before one passed


@dataclass(frozen=True)
class Launch:
    """Start ``allocation`` (a new generation of its job) because of ``reason``."""

    allocation: RunAllocation
    reason: str
    previous_slot_ids: tuple[int, ...] = ()

    @property
    def job(self) -> str:
        return self.allocation.job

    @property
    def generation(self) -> int:
        return self.allocation.generation

    @property
    def slot_ids(self) -> tuple[int, ...]:
        return self.allocation.slot_ids

    @property
    def global_batch(self) -> int:
        return self.allocation.global_batch

    @property
    def lr(self) -> float:
        return self.allocation.lr

    @property
    def run_key(self) -> str:
        return f"{self.job}-g{self.generation}"

    def tags(self) -> dict[str, str]:
        """The run's tags: the job (what the runs list is filtered by) and one tag per slot for the concurrency
        limits. Everything else the scheduler reads back is in the run config (``run_config``): each tag is a line
        of the run's row in Dagster's runs list (ten tags made each row 200 px tall, the reason cut off)."""
        return {TAG_JOB: self.job, **{slot_tag(s, self.allocation.device): SLOT_HELD for s in self.slot_ids}}

    def run_config(self) -> dict[str, str]:
        """The training asset's config of the run: the allocation (JSON: generation, slots, batch, LR, the spec),
        why, and the slots before ("-": none). ``RunInfo.from_run`` reads it back."""
        return {"allocation": self.allocation.to_json(), "reason": self.reason,
                "previous_slots": ",".join(str(s) for s in self.previous_slot_ids) or "-"}


@dataclass(frozen=True)
class Cancel:
    run_id: str
    job: str
    generation: int
    reason: str


@dataclass(frozen=True)
class Resize:
    """Change the slots of a running generation in place (``train.resize_control.request_resize``): carried
    out by the tick's apply run, which claims the slots it adds before asking; the step frees those it gives
    up once the change is done. Same run, same generation."""

    run_id: str
    job: str
    generation: int
    before: tuple[int, ...]
    after: tuple[int, ...]
    global_batch: int
    lr: float
    device: str
    reason: str
    decided_s: float = 0.0  # the tick's time (the change's delay to its effect is measured from it)

    @property
    def kind(self) -> str:
        return "grow" if len(self.after) > len(self.before) else "shrink" if len(self.after) < len(self.before) \
            else "move"

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "job": self.job, "generation": self.generation, "before": list(self.before),
                "after": list(self.after), "global_batch": self.global_batch, "lr": self.lr, "device": self.device,
                "reason": self.reason, "decided_s": self.decided_s}


@dataclass(frozen=True)
class Decision:
    """One line of the decision log: job, slots before -> after, batch, why."""

    time_s: float
    job: str
    before: tuple[int, ...]
    after: tuple[int, ...]
    global_batch: int
    reason: str  # in words, with the predictions behind it (``scheduler.rationale``)
    why: Mapping[str, Any] | None = None  # those numbers: remaining_before_s, remaining_after_s, restart_cost_s, ...
    # The job re-tunes its batch itself (``train.batch_tuning``): ``global_batch`` is the batch it starts with,
    # the one it would pick on these slots at the noise scale it measured (``grad_noise_scale``; None: prior).
    batch_tuned: bool = False
    grad_noise_scale: float | None = None
    # How the change is made: "in place" (same run, ``Resize``), "checkpoint" (stop, new generation), "" (a start)
    path: str = ""

    def line(self) -> str:
        def fmt(slots: tuple[int, ...]) -> str:
            return "[" + ",".join(map(str, slots)) + "]" if slots else "-"

        batch = f" batch {self.global_batch}" if self.after else ""
        if self.after and self.batch_tuned:
            noise = f"noise scale {self.grad_noise_scale:.0f}" if self.grad_noise_scale else "no noise scale yet"
            batch += f" (goodput-optimal at {noise}; the job re-tunes it)"
        return f"{self.job}: {fmt(self.before)} -> {fmt(self.after)}{batch} ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "job": self.job, "before": list(self.before), "after": list(self.after),
                "global_batch": self.global_batch, "reason": self.reason,
                **({"why": dict(self.why)} if self.why else {}), **({"path": self.path} if self.path else {}),
                **({"batch_tuned_by_job": True, "grad_noise_scale": self.grad_noise_scale} if self.batch_tuned else {})}


@dataclass
class TickPlan:
    cancels: list[Cancel] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)  # in-place changes of running generations
    decisions: list[Decision] = field(default_factory=list)
    cursor: dict[str, Any] = field(default_factory=dict)
    newly_failed: dict[str, str] = field(default_factory=dict)  # job -> reason
    quarantined: dict[str, str] = field(default_factory=dict)  # job whose spec the tick refused -> reason
    waiting: dict[str, str] = field(default_factory=dict)  # job without slots -> why it waits
    idle: dict[str, str] = field(default_factory=dict)  # running job beside idle slots it could use -> why
    policy_state: dict[str, Any] = field(default_factory=dict)  # the search state after this tick
    policy_ref: str = ""  # its name (a hash of it): the file the apply run writes it to
    decide_s: float = 0.0  # wall time of the policy


