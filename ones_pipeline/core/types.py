"""Value types shared by the policies, the simulator and the live pipeline.

Units are in the names: ``*_s`` seconds, ``*_samples`` training samples, ``*_batch`` samples per step.
A GPU is addressed by its flat slot index in the cluster (``0 .. cluster.num_gpus - 1``); ``Cluster``
converts between slots and (node, local index).
"""

from __future__ import annotations

import enum
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

JOB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")  # \Z: "$" would accept a trailing newline
# A registered model's name (``register_as``): what MLflow's registry and its UI routes take unescaped.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


class JobStatus(str, enum.Enum):
    """Lifecycle of a job as the scheduler sees it."""

    PENDING = "PENDING"  # submitted, never run
    RUNNING = "RUNNING"  # holds GPUs now
    PAUSED = "PAUSED"  # ran before, preempted, waiting for GPUs
    FINISHED = "FINISHED"
    FAILED = "FAILED"

    @property
    def is_finalized(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED)


class StopKind(str, enum.Enum):
    ACCURACY = "accuracy"  # target accuracy (or plateau) held for `patience` epochs, as ONES does
    EPOCHS = "epochs"
    SAMPLES = "samples"


@dataclass(frozen=True)
class StoppingRule:
    kind: StopKind = StopKind.EPOCHS
    epochs: float | None = None
    samples: float | None = None
    target_accuracy: float | None = None
    patience: int = 5
    min_delta: float = 0.01

    def __post_init__(self) -> None:
        kind = StopKind(self.kind)
        object.__setattr__(self, "kind", kind)
        if kind is StopKind.EPOCHS and not (self.epochs and self.epochs > 0):
            raise ValueError(f"stopping rule 'epochs' needs epochs > 0, got {self.epochs!r}")
        if kind is StopKind.SAMPLES and not (self.samples and self.samples > 0):
            raise ValueError(f"stopping rule 'samples' needs samples > 0, got {self.samples!r}")
        if kind is StopKind.ACCURACY:
            if self.target_accuracy is None or not 0 < self.target_accuracy <= 1:
                raise ValueError(
                    f"stopping rule 'accuracy' needs 0 < target_accuracy <= 1, got {self.target_accuracy!r}"
                )
            if self.patience < 1:
                raise ValueError(f"patience must be >= 1, got {self.patience!r}")

    def total_samples(self, dataset_size: int) -> float | None:
        """Samples to finish when the rule fixes them in advance, else None."""
        if self.kind is StopKind.EPOCHS:
            return float(self.epochs) * dataset_size
        if self.kind is StopKind.SAMPLES:
            return float(self.samples)
        return None


@dataclass(frozen=True)
class JobSpec:
    """What a user submits. ``per_gpu_batch`` and ``base_lr`` are the 1-GPU recipe.

    The LR scales linearly with the global batch until ``max_lr``; that cap fixes the largest global
    batch (``per_gpu_batch * max_lr / base_lr``) as in ONES. ``max_global_batch`` caps it directly
    when given (the smaller cap wins).
    """

    name: str
    model: str
    dataset_size: int  # samples per epoch
    per_gpu_batch: int
    base_lr: float = 0.1
    max_lr: float | None = None
    max_global_batch: int | None = None
    max_per_gpu_batch: int | None = None  # memory limit; larger batches use gradient accumulation
    # Smallest total batch the job may train with, and the batch its gradient statistics (and so its
    # statistical efficiency) are relative to (Pollux's M0); None: per_gpu_batch.
    min_global_batch: int | None = None
    min_per_gpu_batch: int | None = None  # smallest useful per-GPU micro-batch; None: 1
    requested_gpus: int = 1
    max_gpus: int | None = None  # None: 4x requested (ONES's growth cap)
    stopping: StoppingRule = field(default_factory=lambda: StoppingRule(StopKind.EPOCHS, epochs=1))
    priority: int = 0
    submit_time_s: float = 0.0
    command: tuple[str, ...] | None = None
    image: str | None = None
    register_as: str | None = None  # when it finishes, its model also becomes a version of this registered model

    def __post_init__(self) -> None:
        if not JOB_NAME_RE.match(self.name):
            raise ValueError(f"job name {self.name!r} must match {JOB_NAME_RE.pattern}")
        if self.register_as is not None and not MODEL_NAME_RE.match(str(self.register_as)):
            raise ValueError(f"job {self.name}: register_as {self.register_as!r} is not a model name: letters, "
                             "digits, '_', '.', '-', starting with a letter or digit, at most 128 characters")
        for fname in ("dataset_size", "per_gpu_batch", "requested_gpus"):
            value = getattr(self, fname)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"job {self.name}: {fname} must be an integer >= 1, got {value!r}")
        if not self.base_lr > 0:
            raise ValueError(f"job {self.name}: base_lr must be > 0, got {self.base_lr!r}")
        if self.max_lr is not None and self.max_lr < self.base_lr:
            raise ValueError(f"job {self.name}: max_lr {self.max_lr} must be >= base_lr {self.base_lr}")
        if self.max_global_batch is not None and self.max_global_batch < self.per_gpu_batch:
            raise ValueError(
                f"job {self.name}: max_global_batch {self.max_global_batch} must be >= per_gpu_batch "
                f"{self.per_gpu_batch}"
            )
        if self.min_global_batch is not None and not 1 <= self.min_global_batch <= self.global_batch_cap:
            raise ValueError(
                f"job {self.name}: min_global_batch must be between 1 and the largest global batch "
                f"{self.global_batch_cap}, got {self.min_global_batch!r}"
            )
        if self.min_per_gpu_batch is not None and not (
                1 <= self.min_per_gpu_batch <= (self.max_per_gpu_batch or self.min_per_gpu_batch)):
            raise ValueError(
                f"job {self.name}: min_per_gpu_batch must be between 1 and max_per_gpu_batch "
                f"{self.max_per_gpu_batch}, got {self.min_per_gpu_batch!r}"
            )
        if self.max_gpus is not None and self.max_gpus < 1:
            raise ValueError(f"job {self.name}: max_gpus must be >= 1, got {self.max_gpus!r}")
        if self.command is not None:
            object.__setattr__(self, "command", tuple(str(a) for a in self.command))

    @property
    def global_batch_cap(self) -> int:
        """Largest global batch this job may train with."""
        caps = []
        if self.max_lr is not None:
            caps.append(int(round(self.per_gpu_batch * self.max_lr / self.base_lr)))
        if self.max_global_batch is not None:
            caps.append(int(self.max_global_batch))
        return min(max(self.per_gpu_batch, min(caps)), 2**62) if caps else 2**62

    @property
    def gpu_cap(self) -> int:
        return int(self.max_gpus) if self.max_gpus is not None else 4 * self.requested_gpus


def batch_and_lr(spec: JobSpec, n_gpus: int) -> tuple[int, float]:
    """ONES's batch/LR rule: global batch grows linearly with GPUs up to the cap, LR follows it.

    Returns ``(global_batch, lr)``. Past the cap the global batch stays fixed and the extra GPUs split it.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    global_batch = min(spec.per_gpu_batch * n_gpus, spec.global_batch_cap)
    return int(global_batch), lr_for_batch(spec, global_batch)


def lr_for_batch(spec: JobSpec, global_batch: int) -> float:
    """Linear LR scaling from the 1-GPU recipe, capped at ``max_lr``."""
    lr = spec.base_lr * global_batch / spec.per_gpu_batch
    return float(min(lr, spec.max_lr) if spec.max_lr is not None else lr)


@dataclass(frozen=True)
class Cluster:
    """GPUs per node. Slot ``s`` lives on ``node_of[s]``."""

    gpus_per_node: tuple[int, ...]

    def __post_init__(self) -> None:
        gpn = tuple(int(g) for g in self.gpus_per_node)
        if not gpn or min(gpn) < 1:
            raise ValueError(f"every node needs >= 1 GPU, got {self.gpus_per_node!r}")
        object.__setattr__(self, "gpus_per_node", gpn)

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int) -> Cluster:
        return cls((gpus_per_node,) * num_nodes)

    @classmethod
    def from_total(cls, num_gpus: int, gpus_per_node: int) -> Cluster:
        if num_gpus < 1 or gpus_per_node < 1:
            raise ValueError(f"need num_gpus >= 1 and gpus_per_node >= 1, got {num_gpus}, {gpus_per_node}")
        full, rest = divmod(num_gpus, gpus_per_node)
        return cls((gpus_per_node,) * full + ((rest,) if rest else ()))

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus_per_node)

    @property
    def num_nodes(self) -> int:
        return len(self.gpus_per_node)

    @functools.cached_property
    def node_of(self) -> np.ndarray:
        """(num_gpus,) int, read-only: node index of every slot (built once per cluster: policies look
        slots up GPU by GPU)."""
        out = np.repeat(np.arange(self.num_nodes), self.gpus_per_node)
        out.setflags(write=False)
        return out

    def placement(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """GPUs per node of an allocation, largest first (e.g. ``(4, 2)``)."""
        if len(gpus) == 0:
            return ()
        counts = np.bincount(self.node_of[np.asarray(gpus, dtype=int)], minlength=self.num_nodes)
        return tuple(sorted((int(c) for c in counts if c), reverse=True))

    def slot_to_gpu(self, slot: int) -> tuple[int, int]:
        node = int(self.node_of[slot])
        return node, slot - int(sum(self.gpus_per_node[:node]))


@dataclass(frozen=True)
class Allocation:
    """GPUs a job holds, the global batch it trains with on them and that batch's LR.

    ``lr`` is required and must be finite and > 0: build it with the batch/LR rule (``lr_for_batch``,
    or ``Allocation.for_spec`` for the spec's own batch), so the LR a run is launched with always follows
    its batch.
    """

    job: str
    gpus: tuple[int, ...]
    global_batch: int
    lr: float
    # The job re-tunes its own batch in-process (AdaptDL's trainer: goodput-optimal batch for these GPUs,
    # at every epoch end, no restart); ``global_batch`` is then the batch it trains with now.
    batch_tuned_by_job: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        gpus = tuple(int(g) for g in self.gpus)
        if not gpus:
            raise ValueError(f"allocation of {self.job} holds no GPU")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"allocation of {self.job} repeats a GPU: {gpus}")
        if self.global_batch < 1:
            raise ValueError(f"allocation of {self.job}: global_batch must be >= 1, got {self.global_batch}")
        is_number = isinstance(self.lr, (int, float, np.integer, np.floating)) and not isinstance(self.lr, bool)
        if not (is_number and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"allocation of {self.job}: lr must be a finite number > 0, got {self.lr!r}")
        object.__setattr__(self, "gpus", tuple(sorted(gpus)))
        object.__setattr__(self, "lr", float(self.lr))

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def per_gpu_batch(self) -> int:
        return int(math.ceil(self.global_batch / len(self.gpus)))

    @classmethod
    def for_spec(cls, spec: JobSpec, gpus: Sequence[int]) -> Allocation:
        """Allocation following the spec's batch/LR rule (``batch_and_lr``)."""
        global_batch, lr = batch_and_lr(spec, len(gpus))
        return cls(spec.name, tuple(gpus), global_batch, lr)


@dataclass(frozen=True)
class Schedule:
    """Which jobs hold which GPUs. A job absent from ``allocations`` holds nothing (queued or paused)."""

    allocations: Mapping[str, Allocation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocations", dict(self.allocations))

    def gpus_of(self, job: str) -> tuple[int, ...]:
        alloc = self.allocations.get(job)
        return alloc.gpus if alloc else ()

    def validate(self, cluster: Cluster, specs: Mapping[str, JobSpec] | None = None) -> None:
        """Raise ValueError if a GPU is double-booked, out of range, or a job exceeds its GPU cap."""
        seen: dict[int, str] = {}
        for name, alloc in self.allocations.items():
            if alloc.job != name:
                raise ValueError(f"allocation keyed {name!r} belongs to {alloc.job!r}")
            for g in alloc.gpus:
                if not 0 <= g < cluster.num_gpus:
                    raise ValueError(f"{name}: GPU {g} outside cluster of {cluster.num_gpus}")
                if g in seen:
                    raise ValueError(f"GPU {g} double-booked by {seen[g]} and {name}")
                seen[g] = name
            if specs is not None and name in specs and alloc.num_gpus > specs[name].gpu_cap:
                raise ValueError(f"{name}: {alloc.num_gpus} GPUs exceeds cap {specs[name].gpu_cap}")

    def slot_array(self, cluster: Cluster, job_index: Mapping[str, int]) -> np.ndarray:
        """(num_gpus,) int: index of the job on each slot, -1 when free."""
        out = np.full(cluster.num_gpus, -1, dtype=np.int64)
        for name, alloc in self.allocations.items():
            if name in job_index:
                out[list(alloc.gpus)] = job_index[name]
        return out

    def to_dict(self) -> dict:
        out = {}
        for name, a in self.allocations.items():
            out[name] = {"gpus": list(a.gpus), "global_batch": a.global_batch, "lr": a.lr}
            if a.batch_tuned_by_job:
                out[name]["batch_tuned_by_job"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping]) -> Schedule:
        """Inverse of ``to_dict``; every allocation must carry its ``gpus``, ``global_batch`` and ``lr``."""
        allocations = {}
        for name, d in data.items():
            missing = [k for k in ("gpus", "global_batch", "lr") if k not in d]
            if missing:
                raise ValueError(f"allocation of {name}: missing {', '.join(missing)}")
            allocations[name] = Allocation(name, tuple(d["gpus"]), int(d["global_batch"]), d["lr"],
                                           batch_tuned_by_job=bool(d.get("batch_tuned_by_job", False)))
        return cls(allocations)


@dataclass(frozen=True)
class ThroughputObs:
    """One measured step time: the fitting data of the throughput model."""

    num_gpus: int
    num_nodes: int
    per_gpu_batch: int
    step_time_s: float
    sync_time_s: float = 0.0


class SharedObs(tuple):
    """A tuple of observations that many jobs share (``ones``'s pooled observations of a model): equal to,
    and hashed as, the plain tuple, but its hash is computed once instead of at every lookup (a plain tuple
    hashes each of its observations every time, and a pooled tuple of thousands of jobs is looked up for
    each of them)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


def obs_key(observations) -> tuple:
    """``observations`` as a memo key: a tuple (``SharedObs`` kept as it is), else a tuple of them."""
    return observations if isinstance(observations, tuple) else tuple(observations)


@dataclass(frozen=True)
class JobView:
    """What the scheduler knows of one active job at decision time (simulated or live)."""

    spec: JobSpec
    status: JobStatus
    submit_time_s: float
    samples_done: float = 0.0  # raw samples processed
    # Base-batch-equivalent samples: samples weighted by statistical efficiency (equal to samples_done
    # when every step ran at the base batch). Stopping rules in epochs/samples count these.
    progress_samples: float = 0.0
    throughput_obs: tuple[ThroughputObs, ...] = ()
    # Gradient noise scale (samples) measured by the job, None until it has run.
    grad_noise_scale: float | None = None
    # (samples_done, value) pairs, one per evaluated epoch.
    loss_history: tuple[tuple[float, float], ...] = ()
    accuracy_history: tuple[tuple[float, float], ...] = ()
    initial_loss: float | None = None
    restarts: int = 0
    attained_gpu_s: float = 0.0  # GPU-seconds of service so far (Tiresias's 2D attained service)
    run_time_s: float = 0.0  # wall seconds it has held GPUs
    last_change_s: float | None = None  # when its allocation last changed
    epochs_at_last_change: float = 0.0
    max_gpus_seen: int = 0
    # Step times earlier jobs of the same model measured (the live scheduler remembers them): the estimates
    # of a job that has measured nothing of its own, when no active job of its model has either; ``ones``
    # also values a measured job by them where it has not run itself (``ones_goodput.memory_filled_views``).
    model_obs: tuple[ThroughputObs, ...] = ()
    # ... and the noise scale they measured earliest in their training (``core.model_memory.remember_noise``);
    # None: none remembered, or the job has measured its own steps.
    model_gns: float | None = None
    # Seconds without training that each kind of change costs this job where it runs, as the environment
    # measured them: "start", "grow" and "shrink" (in place), "restart" (through a checkpoint; where the
    # environment cannot resize in place, grow and shrink cost a restart). Empty: not known.
    change_costs: Mapping[str, float] = field(default_factory=dict, hash=False)
    # Seconds each evaluation point (an epoch's end, the budget's end) takes outside the steps, as the job
    # measured it (its evaluation, checkpoint): time no added GPU shortens (``estimates.evaluation_time``).
    # 0: not measured (every simulated job).
    epoch_end_s: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def epochs_done(self) -> float:
        return self.samples_done / self.spec.dataset_size

    def known_total_samples(self) -> float | None:
        """Base-equivalent samples needed in total, when the stopping rule fixes them."""
        return self.spec.stopping.total_samples(self.spec.dataset_size)


def spec_to_dict(spec: JobSpec) -> dict:
    """JSON-able form of a spec (enums as their values, command as a list)."""
    from dataclasses import asdict

    data = asdict(spec)
    data["stopping"] = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(spec.stopping).items()}
    if data.get("command") is not None:
        data["command"] = list(data["command"])
    if data.get("register_as") is None:  # absent, as before the field existed: spec hashes stay the same
        data.pop("register_as", None)
    return data


def spec_from_dict(data: Mapping) -> JobSpec:
    """Inverse of ``spec_to_dict``."""
    data = dict(data)
    stopping = StoppingRule(**data.pop("stopping"))
    if data.get("command") is not None:
        data["command"] = tuple(data["command"])
    return JobSpec(stopping=stopping, **data)
