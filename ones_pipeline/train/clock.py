"""What a training session measures of its own wall-clock time (``SessionClock``): its steady-state optimizer
steps at the configuration it trains in now (and, accumulating, the micro-batches before the synchronising one),
the time its evaluation points take outside the steps, and when it last logged a point to MLflow.

A step is timed from the moment the session hands it out to ``step_done`` (forward, backward, all-reduce,
update). An evaluation point (an epoch's end, the budget's end) is timed from the step that ended the epoch to
the next step: the script's evaluation, ``end_epoch``'s record and checkpoint, which take as long on any number
of processes (the scheduler adds them to a job's time left: ``core.estimates.evaluation_time``). The last point,
which no step follows, is timed up to its record.
"""

from __future__ import annotations

import time

import numpy as np

THROUGHPUT_WINDOW = 20  # steady-state steps whose median is the step time
EPOCH_END_WINDOW = 5  # evaluation points whose median is ``epoch_end_s``
# A point is logged to MLflow at most this often, and at once when a configuration's steps are first timed. A point
# takes ~6 ms to write (sqlite, idle host): logged every 10 steps, as the built-in script did, a cnn-digits job (4 ms
# steps) trained at 4,530 samples/s alone, 5,040 with this; mlp-digits (0.4 ms) 17,200 -> 24,100.
LOG_EVERY_S = 5.0


class SessionClock:
    """One session's timings (one per process; every rank times its own steps)."""

    def __init__(self) -> None:
        self.step_times: list[float] = []  # steady-state optimizer steps at the current configuration, s
        self.micro_times: list[float] = []  # ... accumulating: their micro-batches before the last, s each
        self.epoch_ends: list[float] = []  # the recent evaluation points, s each
        self._t_step: float | None = None  # when the step handed out last began (None: it was accounted for)
        self._t_last: float | None = None  # when its last micro-batch began
        self._t_epoch_end: float | None = None  # when the last step, if it ended an epoch, was done
        self._logged_s = -float("inf")  # when a point was last logged, and the configuration it had timed
        self._logged_timed: tuple[int, int] | None = None

    @property
    def in_step(self) -> bool:
        """A step was handed out and ``step_taken`` has not accounted for it."""
        return self._t_step is not None

    def step_begins(self) -> None:
        """A step is handed out; an evaluation point before it ends here."""
        now = time.perf_counter()
        if self._t_epoch_end is not None:
            self.epoch_ends = [*self.epoch_ends[1 - EPOCH_END_WINDOW:], now - self._t_epoch_end]
            self._t_epoch_end = None
        self._t_last, self._t_step = None, now

    def last_micro_batch(self) -> None:
        self._t_last = time.perf_counter()

    def step_taken(self, micro: int) -> tuple[float, float | None]:
        """(the whole step's seconds, one micro-batch's before the last or None) of the step handed out last."""
        now = time.perf_counter()
        elapsed, before_last = now - self._t_step, None
        if micro > 1 and self._t_last is not None:
            before_last = (self._t_last - self._t_step) / (micro - 1)
        self._t_step = None
        return elapsed, before_last

    def steady(self, elapsed: float, before_last: float | None) -> None:
        """Keep a steady-state step's times (the windows' newest)."""
        self.step_times = [*self.step_times[1 - THROUGHPUT_WINDOW:], elapsed]
        if before_last is not None:
            self.micro_times = [*self.micro_times[1 - THROUGHPUT_WINDOW:], before_last]

    def new_configuration(self) -> None:
        """The batch or the processes changed: the step times so far measured another configuration."""
        self.step_times, self.micro_times = [], []

    def step_done(self, epoch_ended: bool) -> None:
        """After a step's bookkeeping: an evaluation point begins if it ended an epoch."""
        self._t_epoch_end = time.perf_counter() if epoch_ended else None

    def last_point(self) -> None:
        """The job is done at this evaluation point: no step follows to end it, so it is timed up to now."""
        if self._t_epoch_end is not None:
            self.epoch_ends = [*self.epoch_ends[1 - EPOCH_END_WINDOW:], time.perf_counter() - self._t_epoch_end]
            self._t_epoch_end = None

    def step_s(self) -> float | None:
        """The median steady-state step, None before two."""
        return float(np.median(self.step_times)) if len(self.step_times) >= 2 else None

    def micro_s(self) -> float | None:
        return float(np.median(self.micro_times)) if self.micro_times else None

    def epoch_end_s(self) -> float | None:
        """The median recent evaluation point, None before one has passed."""
        return float(np.median(self.epoch_ends)) if self.epoch_ends else None

    def log_due(self, timed: tuple[int, int] | None) -> bool:
        """Whether to log a point now: ``LOG_EVERY_S`` since the last, or ``timed`` (the configuration whose steps
        are timed, None: none yet) is timed for the first time. Counts it as logged."""
        now = time.monotonic()
        if now - self._logged_s < LOG_EVERY_S and (timed is None or timed == self._logged_timed):
            return False
        self._logged_s, self._logged_timed = now, timed or self._logged_timed
        return True
