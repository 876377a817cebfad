"""A job command for tests: the built-in trainer (``train.builtin``) with one fault, from ``FAULT``:

* ``kill-at-checkpoint``: rank 0 kill -9s itself as it begins a checkpoint (before a byte is written), the first
  ``FAULT_TIMES`` (1) times over all generations: a kill in the window between an epoch's evaluation and its
  checkpoint, which chaos runs hit by chance;
* ``kill-after-checkpoint``: the same, just after the checkpoint was written (before whatever follows it);
* ``hang-after-result``: rank 0 sleeps after the job finished (its result written), until it is killed.

Counts live in ``<state_dir>/fault-count``, so a restarted generation goes on past the fault.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ones_pipeline.train import api, builtin

FAULT = os.environ.get("FAULT", "")
TIMES = int(os.environ.get("FAULT_TIMES", "1"))
COUNT = Path(os.environ["ONES_STATE_DIR"]) / "fault-count"
_save, _finish = api.save_checkpoint, api.TrainingSession._finish


def _due() -> bool:
    done = int(COUNT.read_text()) if COUNT.exists() else 0
    if done >= TIMES:
        return False
    COUNT.write_text(str(done + 1))
    return True


def _saving(state_dir, state):
    if FAULT == "kill-at-checkpoint" and _due():
        os.kill(os.getpid(), signal.SIGKILL)
    path = _save(state_dir, state)
    if FAULT == "kill-after-checkpoint" and _due():
        os.kill(os.getpid(), signal.SIGKILL)
    return path


def _finishing(self):
    _finish(self)
    if FAULT == "hang-after-result" and self.is_main:
        print("finished; hanging", file=sys.stderr, flush=True)
        time.sleep(600)


api.save_checkpoint, api.TrainingSession._finish = _saving, _finishing

if __name__ == "__main__":
    sys.exit(builtin.main())
