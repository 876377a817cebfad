"""The stated range of every number a user's file gives: job specs and environments (YAML) and traces (CSV).

One layer: ``config.fields.get_field`` and ``sim.csv_fields.Field`` both check a value against a
:class:`Range`, so every number read is finite, within its field's range, and an integer is within
bounds (a default bound when a field states none). The scheduler checks a job's spec once more at the
tick's boundary (:func:`spec_problem`), so a spec from any source that breaks these ranges stops that
job, never the tick.

The ranges are wide enough for any real workload and narrow enough that nothing downstream overflows
or runs for hours: a float a C ``int`` or an ``int(round(...))`` cannot hold, a job the simulator needs
1e15 steps for (issue 40).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_INT = 2**53  # any integer field without a bound of its own: exact as a float, fits a C int64
MAX_GPUS = 4096  # GPUs (replicas, slots) of one job or one node
MAX_BATCH = 2**20  # samples per step (per GPU or global) a trace or spec may give
MAX_DATASET_SIZE = 10**10  # samples per epoch of a job spec
MAX_EPOCH_SIZE = 10**7  # samples per epoch of an ONES trace row: 1e7 already simulates ~20 h of one job
MAX_EPOCHS = 10**6
MAX_SAMPLES = 1e15
MIN_LR, MAX_LR = 1e-12, 1e3  # learning rates; max_lr / base_lr at most 1e15 keeps the batch cap an int64
MAX_PRIORITY = 10**6
MAX_PATIENCE = 10**4
MAX_SECONDS = 366 * 86400.0  # any duration setting (tick interval, timeouts, backoff)
MAX_CPU_SLOTS = 1024
SHOW_CHARS = 40  # an error quotes at most this many characters of a bad value


@dataclass(frozen=True)
class Range:
    """What a number field allows: an integer or a finite float, optionally within ``[low, high]`` (a bound
    excluded when ``*_open``). An integer field without ``high`` is bounded by ``MAX_INT`` (and ``low`` by
    ``-MAX_INT``)."""

    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def _bounds(self) -> tuple[float | None, float | None]:
        if not self.integer:
            return self.low, self.high
        return (self.low if self.low is not None else -MAX_INT), (self.high if self.high is not None else MAX_INT)

    def allowed(self) -> str:
        """In words: ``an integer in [1, 4096]``, ``a number > 0``, ``a finite number``."""
        noun = "an integer" if self.integer else "a number"
        low, high = self._bounds()
        if low is not None and high is not None:
            return (f"{noun} in {'(' if self.low_open else '['}{_num(low)}, {_num(high)}"
                    f"{')' if self.high_open else ']'}")
        if low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {_num(low)}"
        if high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {_num(high)}"
        return "a finite number"

    def problem(self, value: int | float) -> str | None:
        """None when ``value`` is allowed, else what is wrong with it (``non-finite value``, ...)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "non-numeric value"
        if isinstance(value, float) and not math.isfinite(value):
            return "non-finite value"
        if self.integer and isinstance(value, float) and value != int(value):
            return "non-integer value"
        low, high = self._bounds()
        if low is not None and (value <= low if self.low_open else value < low):
            return "out-of-range value"
        if high is not None and (value >= high if self.high_open else value > high):
            return "out-of-range value"
        return None


def _num(x: float) -> str:
    """A bound in words: integral ones in full (1048576), others as ``%g`` (1e-12)."""
    return str(int(x)) if float(x).is_integer() and abs(x) <= 2**53 else f"{x:g}"


def shown(value: object) -> str:
    """``repr(value)`` cut to ``SHOW_CHARS`` characters (computed without expanding a large structure)."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = SHOW_CHARS
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = 4
    r.maxlevel = 2
    text = r.repr(value)
    return text if len(text) <= SHOW_CHARS + 10 else text[:SHOW_CHARS] + "..."


# The ranges of a JobSpec's numbers, by field (None: the field may be absent).
SPEC_RANGES: dict[str, Range] = {
    "dataset_size": Range(True, 1, MAX_DATASET_SIZE),
    "per_gpu_batch": Range(True, 1, MAX_BATCH),
    "max_global_batch": Range(True, 1, MAX_BATCH * MAX_GPUS),
    "max_per_gpu_batch": Range(True, 1, MAX_BATCH),
    "min_global_batch": Range(True, 1, MAX_BATCH * MAX_GPUS),
    "min_per_gpu_batch": Range(True, 1, MAX_BATCH),
    "requested_gpus": Range(True, 1, MAX_GPUS),
    "max_gpus": Range(True, 1, MAX_GPUS),
    "base_lr": Range(False, MIN_LR, MAX_LR),
    "max_lr": Range(False, MIN_LR, MAX_LR),
    "priority": Range(True, -MAX_PRIORITY, MAX_PRIORITY),
    "submit_time_s": Range(False, 0),
}
STOPPING_RANGES: dict[str, Range] = {
    "epochs": Range(False, 0, MAX_EPOCHS, low_open=True),
    "samples": Range(False, 0, MAX_SAMPLES, low_open=True),
    "target_accuracy": Range(False, 0, 1, low_open=True),
    "patience": Range(True, 1, MAX_PATIENCE),
    "min_delta": Range(False, 0, 1),
}


def spec_problem(spec) -> str | None:
    """None when every number of ``spec`` (a ``core.types.JobSpec``) is within its range, else one line
    naming the first field that is not (the scheduler's check at the tick's boundary)."""
    for prefix, obj, ranges in (("", spec, SPEC_RANGES), ("stopping.", spec.stopping, STOPPING_RANGES)):
        for name, rng in ranges.items():
            value = getattr(obj, name)
            if value is None:
                continue
            problem = rng.problem(value.item() if hasattr(value, "item") else value)
            if problem is not None:
                return f"field '{prefix}{name}': {problem} {shown(value)}; allowed: {rng.allowed()}"
    return None
