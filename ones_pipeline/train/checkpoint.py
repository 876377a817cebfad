"""Atomic, crash-safe checkpoints of a training job, one directory per job.

Layout of ``state_dir``:

* ``checkpoint-latest.pt``: the newest complete checkpoint;
* ``checkpoint-prev.pt``: the one before it (exactly one previous is kept);
* ``.checkpoint-*.pt.tmp``: a write in progress (or left by a killed writer; removed by the next save).

``save_checkpoint`` writes the new checkpoint to a temporary file in the same directory, flushes and
fsyncs it, moves the old latest to prev, renames the temporary file to latest (``os.replace``, atomic
on POSIX) and fsyncs the directory. Whenever the writer is killed, the directory holds a complete
latest, or (between the two renames) no latest and a complete prev; a partial file only ever lives
under a temporary name. ``load_checkpoint`` reads latest and falls back to prev when latest is missing
or unreadable (truncated or corrupted by a disk problem or a hand edit), with a warning.

One writer per directory (rank 0 of the job): concurrent writers would remove each other's temporary
files. Checkpoints load with ``torch.load(weights_only=True)``, so the state must be built from
dicts/lists/tuples, str/int/float/bool/None/bytes and tensors; numpy scalars are converted to Python
scalars on save, anything else (numpy arrays, dataclasses, enums, ...) is rejected with a TypeError
naming its key, rather than written into a file that could not be loaded back.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import random
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ones_pipeline.reporting import new_file_mode
from ones_pipeline.train.records import BadCheckpoint
from ones_pipeline.train.state_dir import check_state_dir

log = logging.getLogger(__name__)

LATEST_NAME = "checkpoint-latest.pt"
PREV_NAME = "checkpoint-prev.pt"
_TMP_PREFIX = ".checkpoint-"
_TMP_SUFFIX = ".pt.tmp"

_LEAF_TYPES = (str, int, float, bool, bytes, type(None), torch.Tensor, torch.Size, torch.dtype, torch.device)


class CheckpointError(RuntimeError):
    """No usable checkpoint although checkpoint files exist (every one is unreadable)."""


def _plain(value: Any, where: str) -> Any:
    """A copy of the container structure of ``value`` that ``torch.load(weights_only=True)`` can read."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, _LEAF_TYPES):
        return value
    if isinstance(value, collections.OrderedDict):
        out = collections.OrderedDict((k, _plain(v, f"{where}[{k!r}]")) for k, v in value.items())
        metadata = getattr(value, "_metadata", None)  # a module state_dict's per-module versions
        if metadata is not None:
            out._metadata = _plain(metadata, f"{where}._metadata")  # type: ignore[attr-defined]
        return out
    if isinstance(value, Mapping):
        return {_plain(k, f"{where} key"): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"checkpoint state {where} is a {type(value).__module__}.{type(value).__qualname__}, which a "
        "weights-only load cannot read; store dicts, lists, tuples, str/int/float/bool/None/bytes or tensors "
        "(e.g. dataclasses.asdict(...), array.tolist() or torch.from_numpy(array))"
    )


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(state_dir: Path) -> None:
    for stale in state_dir.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            stale.unlink()


def save_checkpoint(state_dir: str | os.PathLike, state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically as ``state_dir/checkpoint-latest.pt`` (the old one becomes
    ``checkpoint-prev.pt``) and return the path written."""
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
    plain = _plain(dict(state), "state")
    state_dir = check_state_dir(state_dir)
    latest, prev = state_dir / LATEST_NAME, state_dir / PREV_NAME
    _remove_stale_temps(state_dir)
    fd, tmp_name = tempfile.mkstemp(dir=state_dir, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, new_file_mode())  # the user's umask, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            torch.save(plain, f)
            f.flush()
            os.fsync(f.fileno())
        if latest.exists():
            os.replace(latest, prev)
        os.replace(tmp, latest)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, Exception):
            e.add_note(f"while writing checkpoint {latest}")
        raise
    _fsync_dir(state_dir)
    return latest


def _load_one(path: Path, required_keys: Iterable[str]) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"holds a {type(state).__name__}, not a dict")
    missing = [k for k in required_keys if k not in state]
    if missing:
        raise CheckpointError(f"lacks keys {missing}")
    return state


def load_checkpoint(state_dir: str | os.PathLike, required_keys: Iterable[str] = ()) -> dict | None:
    """The newest readable checkpoint in ``state_dir`` (tensors on CPU), or None when there is none.

    Tries ``checkpoint-latest.pt`` then ``checkpoint-prev.pt``; an unreadable file (truncated, corrupt,
    not a dict or lacking one of ``required_keys``) is logged as a warning naming the file and skipped.
    Raises ``CheckpointError`` naming every file and its error when checkpoint files exist but none
    can be read, rather than silently restarting the job from scratch.
    """
    state_dir = Path(state_dir)
    if not state_dir.exists():
        return None
    if not state_dir.is_dir():
        raise ValueError(f"state directory {state_dir} exists and is not a directory")
    if not os.access(state_dir, os.R_OK | os.X_OK):
        raise PermissionError(f"state directory {state_dir} is not readable")
    required_keys = tuple(required_keys)
    latest, prev = state_dir / LATEST_NAME, state_dir / PREV_NAME
    errors: list[str] = []
    for path in (latest, prev):
        if not path.exists():
            if path is latest and prev.exists():
                log.info("no %s (a save was interrupted between its renames); using %s", path, prev.name)
            continue
        try:
            state = _load_one(path, required_keys)
        except Exception as e:  # any failure to read this file means: try the other one
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            msg = f"{path}: {type(e).__name__}: {first[:120]}{'...' if len(first) > 120 else ''}"
            errors.append(msg)
            if path is latest and prev.exists():  # else the CheckpointError below says it all
                log.warning("cannot load checkpoint %s; falling back to %s", msg, prev)
            continue
        if errors:
            log.warning("resuming from the previous checkpoint %s; the progress since it is lost", path)
        return state
    if errors:
        raise CheckpointError(
            f"no readable checkpoint in {state_dir}: " + "; ".join(errors)
            + ". Move the broken files away to restart the job from scratch."
        )
    return None


def load_checkpoint_of(state_dir: str | os.PathLike, spec) -> dict | None:
    """``load_checkpoint`` for the job ``spec`` (a ``JobSpec``): BadCheckpoint, one line, when there are checkpoint
    files but none is readable, or the newest is of another model (``model_name``, saved since issue 40)."""
    try:
        ckpt = load_checkpoint(state_dir)
    except (CheckpointError, OSError, ValueError) as exc:
        raise BadCheckpoint(f"job {spec.name}: {str(exc).splitlines()[0]}") from exc
    if ckpt is not None and ckpt.get("model_name") not in (None, spec.model):
        raise BadCheckpoint(f"job {spec.name}: the checkpoint in {state_dir} is of model {ckpt['model_name']}, this "
                            f"job trains {spec.model}: give the job its own state directory, or move the checkpoint "
                            "files away to start over")
    return ckpt


def restore_modules(ckpt: Mapping[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, spec,
                    state_dir: str | os.PathLike) -> dict:
    """Load ``ckpt``'s model and optimizer state; return its progress. BadCheckpoint (one line) when they do not
    fit (a checkpoint without ``model_name`` of another model, or of a job whose own command changed its model)."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        return dict(ckpt["progress"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise BadCheckpoint(f"job {spec.name}: the checkpoint in {state_dir} does not fit this job's model "
                            f"{spec.model} ({first[:160]}): give the job its own state directory, or move the "
                            "checkpoint files away to start over") from exc


def capture_rng_state() -> dict:
    """The global RNG states of torch (CPU, and CUDA when it is in use), numpy and Python's ``random``,
    as plain values that a weights-only checkpoint can hold."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": str(np_state["bit_generator"]),
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"], dtype=np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": _plain(random.getstate(), "python"),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what ``capture_rng_state`` captured (keys that are absent are left alone)."""
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    if "numpy" in state:
        s = state["numpy"]
        np.random.set_state({
            "bit_generator": s["bit_generator"],
            "state": {"key": np.asarray(torch.as_tensor(s["key"]).numpy(), dtype=np.uint32), "pos": int(s["pos"])},
            "has_gauss": int(s["has_gauss"]),
            "gauss": float(s["gauss"]),
        })
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = list(state["cuda"])
        for i in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(torch.as_tensor(cuda_states[i], dtype=torch.uint8).cpu(), i)
