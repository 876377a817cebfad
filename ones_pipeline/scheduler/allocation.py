"""``RunAllocation``: one run's allocation, the record that travels from the scheduler to the ranks.

Made (and validated, once) where the scheduler decides a launch; serialised once (``to_json``) into the
run config; handed unchanged to the training step through the Pipes extras; parsed back by the step
(``from_json``), which builds its processes from it. The LR always comes from the core rule
(``core.types.lr_for_batch``) unless the policy chose one; it is never 0 meaning "unknown".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ones_pipeline.core.types import JobSpec, lr_for_batch, spec_from_dict, spec_to_dict

DEVICES = ("gpu", "cpu")  # "gpu": slot ids are GPU ids; "cpu": CPU slots, one process each


@dataclass(frozen=True)
class RunAllocation:
    spec: JobSpec
    slot_ids: tuple[int, ...]
    device: str
    global_batch: int
    lr: float
    generation: int
    submit_time_s: float = 0.0
    tune_batch: bool = False  # the job re-tunes its batch in-process (``train.batch_tuning``); this is its start
    _json: str | None = field(default=None, init=False, compare=False, repr=False)  # the text it was read from

    def __post_init__(self) -> None:
        job = f"job {self.spec.name}"
        ids = self.slot_ids
        if not ids or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in ids) \
                or len(set(ids)) != len(ids):
            raise ValueError(f"{job}: slot_ids must be distinct integers >= 0, at least one; got {list(ids)}")
        if self.device not in DEVICES:
            raise ValueError(f"{job}: device {self.device!r}; allowed: {', '.join(DEVICES)}")
        cap = self.spec.global_batch_cap
        if not isinstance(self.global_batch, int) or not 1 <= self.global_batch <= cap:
            raise ValueError(f"{job}: global_batch {self.global_batch!r} outside 1..{cap} (the cap from max_lr / "
                             "base_lr or max_global_batch)")
        per_process = -(-self.global_batch // len(ids))
        if self.spec.max_per_gpu_batch is not None and per_process > self.spec.max_per_gpu_batch:
            raise ValueError(f"{job}: global_batch {self.global_batch} over {len(ids)} processes is {per_process} "
                             f"per process, above max_per_gpu_batch {self.spec.max_per_gpu_batch}")
        if not (isinstance(self.lr, float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"{job}: lr must be a finite number > 0, got {self.lr!r}")
        if not isinstance(self.generation, int) or self.generation < 0:
            raise ValueError(f"{job}: generation must be an integer >= 0, got {self.generation!r}")

    @classmethod
    def make(cls, spec: JobSpec, slot_ids: Sequence[int], device: str, global_batch: int, generation: int,
             submit_time_s: float = 0.0, lr: float | None = None, tune_batch: bool = False) -> RunAllocation:
        """The allocation with the LR of the core rule unless ``lr`` is given."""
        batch = int(global_batch)
        return cls(spec, tuple(int(s) for s in slot_ids), device, batch,
                   float(lr) if lr is not None else lr_for_batch(spec, batch), int(generation), float(submit_time_s),
                   bool(tune_batch))

    @property
    def job(self) -> str:
        return self.spec.name

    @property
    def world_size(self) -> int:
        return len(self.slot_ids)

    @property
    def gpus(self) -> tuple[int, ...]:
        """GPU ids (empty on CPU slots)."""
        return self.slot_ids if self.device == "gpu" else ()

    def describe(self) -> str:
        what = "GPU" if self.device == "gpu" else "CPU slot"
        tuned = " (the job re-tunes it)" if self.tune_batch else ""
        what += "" if self.world_size == 1 else "s"
        return (f"{self.job} generation {self.generation}: {self.world_size} {what} {list(self.slot_ids)}, "
                f"global batch {self.global_batch}{tuned}, lr {self.lr:.4g}")

    def to_dict(self) -> dict[str, Any]:
        return {"spec": spec_to_dict(self.spec), "slot_ids": list(self.slot_ids), "device": self.device,
                "global_batch": self.global_batch, "lr": self.lr, "generation": self.generation,
                "submit_time_s": self.submit_time_s, "tune_batch": self.tune_batch}

    def to_json(self) -> str:
        """The JSON text; for a record read with ``from_json``, that very text (it is not serialised again
        on its way from the run config through the Pipes extras to the step)."""
        return self._json if self._json is not None else json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunAllocation:
        """Raises ValueError naming the missing or bad field."""
        missing = sorted({"spec", "slot_ids", "device", "global_batch", "lr", "generation"} - set(data))
        if missing:
            raise ValueError(f"allocation: missing field(s) {', '.join(missing)}")
        try:
            spec = spec_from_dict(dict(data["spec"]))
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"allocation: field 'spec' is not a valid job spec: {exc}") from None
        try:
            return cls(spec, tuple(data["slot_ids"]), str(data["device"]), data["global_batch"], float(data["lr"]),
                       data["generation"], float(data.get("submit_time_s", 0.0)), bool(data.get("tune_batch", False)))
        except TypeError as exc:
            raise ValueError(f"allocation: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> RunAllocation:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"allocation: not JSON ({exc})") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"allocation: expected a JSON object, got {type(data).__name__}")
        allocation = cls.from_dict(data)
        object.__setattr__(allocation, "_json", text)
        return allocation
