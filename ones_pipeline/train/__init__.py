"""Training step: elastic, resumable data-parallel PyTorch training (models, data, sampler, checkpoints)."""

import gc
import sys
from typing import NoReturn


def exit_without_final_gc(code: int) -> NoReturn:
    """``sys.exit(code)`` for the training entry points (the launcher and the built-in ranks), without the
    interpreter's final garbage collections over everything torch and MLflow loaded: they took 1-2 s of CPU
    in every such process (py-spy: gc_collect_main at exit), all of it after the work was done and written.
    Frozen objects are never collected; the process is ending. Exit handlers still run."""
    gc.freeze()
    sys.exit(code)
