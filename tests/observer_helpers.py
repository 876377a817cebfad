"""The stand-in for an asset context that ``defs.progress_events.ProgressObserver`` writes to, shared by the tests
that drive the observer directly: it keeps the events logged and fails the test on a warning."""

from __future__ import annotations

import dagster as dg


class Recorder:
    """The members of the asset context the observer uses (``log_event``, ``log``, ``run.run_id``)."""

    asset_key = dg.AssetKey("training_job")

    class run:  # noqa: N801 (``context.run.run_id``: the slot ledger's first row names the run)
        run_id = "r"

    def __init__(self):
        self.events = []
        self.log = self

    def log_event(self, event):
        self.events.append(event)

    def warning(self, msg):
        raise AssertionError(msg)
