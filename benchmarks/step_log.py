"""A job command for measurements of the training step: the built-in workload (``train.builtin``), logging every
optimizer step of every rank to ``<state_dir>/steps-<pid>.jsonl``: wall-clock start and end, rank, world size,
generation, epoch and position of the step (before it); with ``STEP_LOG_INDICES=1`` also the sample indices the
rank trained and a checksum of the model's parameters after the step (replicas in step have the same).
``benchmarks/resize_cost.py`` reads when training paused; ``tests/test_resize_in_place.py`` checks the data order,
the sample count and the replicas from the same lines.

Use it as a job spec's ``command``: ``["python", "benchmarks/step_log.py"]`` (the launcher starts it once per
rank, with the ``ONES_*`` environment).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ones_pipeline.train import api, builtin, micro_batches

_LOG = open(Path(os.environ["ONES_STATE_DIR"]) / f"steps-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
_INDICES = os.environ.get("STEP_LOG_INDICES") == "1"
_iterate, _step_done, _prepare = micro_batches.Step.__iter__, api.TrainingSession.step_done, api.TrainingSession.prepare
_started: dict[str, float] = {}
_models: list = []


def _prep(self, model, optimizer, params=None):
    _models.append(model)
    return _prepare(self, model, optimizer, params)


def _iter(self):
    _started["t0"] = time.time()  # the step's first micro-batch is handed out
    parts = []
    for idx in _iterate(self):
        if _INDICES:
            parts.extend(int(i) for i in idx)
        yield idx
    _started["idx"] = parts


def _done(self, *args, **kwargs):
    pr, t1 = self.progress, time.time()
    row = {"t0": _started.get("t0", t1), "t1": t1, "rank": self.p.rank, "world": self.p.world_size,
           "gen": self.p.generation, "epoch": pr.epoch, "pos": pr.position, "batch": self.global_batch}
    if _INDICES:
        row["idx"] = _started.get("idx", [])
        row["params"] = sum(float(p.detach().double().sum()) for p in _models[-1].parameters())
    _LOG.write(json.dumps(row) + "\n")
    return _step_done(self, *args, **kwargs)


micro_batches.Step.__iter__ = _iter
api.TrainingSession.step_done = _done
api.TrainingSession.prepare = _prep

if __name__ == "__main__":
    sys.exit(builtin.main())
