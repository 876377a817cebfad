"""The slot inventory: which nodes and devices the scheduler may use, behind one interface.

An inventory source has one method, ``discover() -> Inventory``; the sensor calls it once per tick.

* ``NvmlInventory`` asks NVML (the ``pynvml`` module of nvidia-ml-py, imported lazily) for this machine's
  GPUs (all of them, or a listed subset) and, for ``gpus: auto``, falls back to the configured CPU slots
  when there is no library, driver or device.
* ``StaticInventory`` is configured CPU slots, with no NVML call.
* ``adapters.slurm.SlurmInventory`` is a Slurm partition's nodes and GPUs (``cluster.slurm``).
* ``inventory_source(cluster_config)`` picks one from ``resources/<env>.yaml``'s ``cluster`` section.

An ``Inventory`` reports nodes and their devices; ``cluster()`` is the scheduler's view of it. Memory is
in MiB (2**20 bytes), as nvidia-smi reports it. Every NVML session is closed with ``nvmlShutdown``; each
metric is read on its own, since some GPUs lack some counters.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from ones_pipeline.adapters.slots import GpuInfo, Inventory, InventoryUnavailable, Node

if TYPE_CHECKING:
    from ones_pipeline.config import ClusterConfig

_LOG = logging.getLogger(__name__)
_MIB = 2**20
T = TypeVar("T")


class _NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why, for one log line."""


@contextlib.contextmanager
def _nvml() -> Iterator[ModuleType]:
    """An initialised ``pynvml`` module, shut down on exit; raises ``_NvmlUnavailable`` with the reason."""
    try:
        with warnings.catch_warnings():
            # The deprecated PyPI package "pynvml" warns on import; the module we want is nvidia-ml-py's.
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError as exc:
        raise _NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
            why = "no NVIDIA driver (NVML library not found)"
        elif isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
            why = "NVIDIA driver not loaded"
        else:
            why = f"NVML init failed ({type(exc).__name__}: {exc})"
        raise _NvmlUnavailable(why) from exc
    try:
        yield pynvml
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _metric(nv: ModuleType, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except nv.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # nvidia-ml-py < 11.515 gave bytes


def _read_gpu(nv: ModuleType, index: int) -> GpuInfo:
    handle = nv.nvmlDeviceGetHandleByIndex(index)  # the caller handles a device NVML cannot open
    mem = _metric(nv, lambda: nv.nvmlDeviceGetMemoryInfo(handle))
    util = _metric(nv, lambda: nv.nvmlDeviceGetUtilizationRates(handle))
    return GpuInfo(
        index=index,
        name=_metric(nv, lambda: _text(nv.nvmlDeviceGetName(handle))) or "unknown NVIDIA GPU",
        uuid=_metric(nv, lambda: _text(nv.nvmlDeviceGetUUID(handle))),
        memory_total_mb=float(mem.total) / _MIB if mem is not None else 0.0,
        memory_used_mb=float(mem.used) / _MIB if mem is not None else None,
        utilization_percent=float(util.gpu) if util is not None else None,
    )


def _read_all(nv: ModuleType) -> tuple[dict[int, GpuInfo], list[str]]:
    """GPUs NVML can open, by index, and a note per device it cannot (e.g. "GPU 2: GpuIsLost")."""
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        raise _NvmlUnavailable(f"NVML could not count GPUs ({type(exc).__name__}: {exc})") from exc
    found: dict[int, GpuInfo] = {}
    skipped: list[str] = []
    for index in range(count):
        try:
            found[index] = _read_gpu(nv, index)
        except nv.NVMLError as exc:
            skipped.append(f"GPU {index}: {type(exc).__name__}")
    return found, skipped


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _requested(gpus: str | Sequence[int]) -> str | tuple[int, ...]:
    if isinstance(gpus, str):
        if gpus not in ("auto", "none"):
            raise ValueError(f"gpus must be 'auto', 'none' or a list of GPU indices, got {gpus!r}")
        return gpus
    wanted = tuple(_check_int("every index in gpus", i, 0) for i in gpus)
    if not wanted:
        raise ValueError("gpus is an empty list: use gpus='none' for CPU slots")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"gpus lists an index twice: {list(wanted)}")
    return wanted


def discover(
    cpu_slots: int = 2,
    gpus: str | Sequence[int] = "auto",
    gpus_per_node: int | None = None,
    log: logging.Logger | None = None,
) -> Inventory:
    """Slots for this machine.

    ``gpus="auto"``: every GPU NVML reports, else ``cpu_slots`` CPU slots and one info log line saying
    why. ``gpus="none"``: CPU slots without calling NVML. A list of NVML indices: exactly those, in that
    order (ValueError if NVML is unavailable or an index is absent). ``gpus_per_node`` defaults to the
    number of slots (one node).
    """
    cpu_slots = _check_int("cpu_slots", cpu_slots, 1)
    per_node = None if gpus_per_node is None else _check_int("gpus_per_node", gpus_per_node, 1)
    wanted = _requested(gpus)
    log = log or _LOG

    def cpu(why: str) -> Inventory:
        plural = "s" if cpu_slots != 1 else ""
        reason = f"{why}: using {cpu_slots} configured CPU slot{plural}"
        return Inventory("cpu", tuple(range(cpu_slots)), (), reason, per_node or cpu_slots)

    if wanted == "none":
        return cpu("GPUs disabled (gpus='none')")
    try:
        with _nvml() as nv:
            found, skipped = _read_all(nv)
    except _NvmlUnavailable as exc:
        if wanted == "auto":
            inventory = cpu(str(exc))
            log.info("GPU inventory: %s", inventory.reason)
            return inventory
        raise ValueError(f"gpus={list(wanted)} needs NVML, which is unavailable: {exc}") from exc

    note = f" (skipped {', '.join(skipped)})" if skipped else ""
    if wanted == "auto":
        if not found:
            inventory = cpu(f"NVML found no usable GPU{note}")
            log.info("GPU inventory: %s", inventory.reason)
            return inventory
        chosen = tuple(found.values())
    else:
        missing = [i for i in wanted if i not in found]
        if missing:
            raise ValueError(
                f"gpus={list(wanted)}: GPU index {missing[0]} not found; NVML indices present: {sorted(found)}{note}"
            )
        chosen = tuple(found[i] for i in wanted)
        note = f" (indices {', '.join(map(str, wanted))} of {len(found) + len(skipped)}){note}"
    names = ", ".join(f"{n} x {name}" for name, n in Counter(g.name for g in chosen).items())
    slot_ids = tuple(g.index for g in chosen)
    return Inventory("gpu", slot_ids, chosen, f"NVML: {names}{note}", per_node or len(slot_ids))


class InventorySource(Protocol):
    """Where the slots come from. ``discover`` is called once per scheduler tick."""

    def discover(self) -> Inventory: ...


@dataclass(frozen=True)
class NvmlInventory:
    """This machine's GPUs through NVML: every one (``gpus="auto"``, falling back to ``cpu_slots`` CPU slots
    when NVML has none) or exactly the listed indices."""

    gpus: str | tuple[int, ...] = "auto"
    cpu_slots: int = 2
    gpus_per_node: int | None = None

    def discover(self) -> Inventory:
        return discover(cpu_slots=self.cpu_slots, gpus=self.gpus, gpus_per_node=self.gpus_per_node)


@dataclass(frozen=True)
class StaticInventory:
    """``cpu_slots`` configured CPU slots (one training process each); NVML is never called."""

    cpu_slots: int = 2
    gpus_per_node: int | None = None

    def discover(self) -> Inventory:
        return discover(cpu_slots=self.cpu_slots, gpus="none", gpus_per_node=self.gpus_per_node)


def inventory_source(cluster: ClusterConfig) -> InventorySource:
    """The source ``resources/<env>.yaml``'s ``cluster`` section asks for."""
    if cluster.slurm is not None:
        from ones_pipeline.adapters.slurm import SlurmInventory

        return SlurmInventory(cluster.slurm.partition, cluster.slurm.nodes, cluster.slurm.slurm_conf)
    if cluster.gpus == "none":
        return StaticInventory(cluster.cpu_slots, cluster.gpus_per_node)
    return NvmlInventory(cluster.gpus, cluster.cpu_slots, cluster.gpus_per_node)


__all__ = ["GpuInfo", "Inventory", "InventorySource", "InventoryUnavailable", "Node", "NvmlInventory",
           "StaticInventory", "discover", "inventory_source"]
