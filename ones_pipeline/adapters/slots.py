"""What the scheduler may use: nodes and their slots (GPUs or CPU slots), as every inventory source reports
them (``adapters.inventory`` for one machine, ``adapters.slurm`` for a Slurm partition)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ones_pipeline.core.types import Cluster


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index = the id given to CUDA_VISIBLE_DEVICES / docker device_ids
    name: str
    uuid: str | None
    memory_total_mb: float  # 0.0 when NVML cannot report memory for this device
    memory_used_mb: float | None  # None when the counter is unsupported
    utilization_percent: float | None  # None when unsupported


@dataclass(frozen=True)
class Node:
    name: str  # host name (a cluster node) or node-<i> on one machine
    slot_ids: tuple[int, ...]  # the slot ids on this node, in inventory order


@dataclass(frozen=True)
class Inventory:
    kind: str  # "gpu" (NVML found devices) or "cpu" (configured CPU slots)
    slot_ids: tuple[int, ...]  # GPU indices or 0..cpu_slots-1; scheduler slots map 1:1 onto these in order
    gpus: tuple[GpuInfo, ...]  # empty for kind "cpu"
    reason: str  # one human line saying where the slots came from
    gpus_per_node: int
    nodes: tuple[Node, ...] = ()  # default: slot_ids split into nodes of gpus_per_node, named node-0, ...
    unavailable: tuple[str, ...] = ()  # nodes left out, one "name: state (reason)" line each (Slurm)

    def __post_init__(self) -> None:
        if self.kind not in ("gpu", "cpu"):
            raise ValueError(f"Inventory.kind must be 'gpu' or 'cpu', got {self.kind!r}")
        if self.kind == "gpu" and tuple(g.index for g in self.gpus) != self.slot_ids:
            raise ValueError(f"Inventory: slot_ids {self.slot_ids} do not match the GPU indices")
        if not self.nodes:
            per = max(int(self.gpus_per_node), 1)
            chunks = [self.slot_ids[i:i + per] for i in range(0, len(self.slot_ids), per)]
            object.__setattr__(self, "nodes", tuple(Node(f"node-{i}", c) for i, c in enumerate(chunks)))
        if tuple(s for n in self.nodes for s in n.slot_ids) != self.slot_ids:
            raise ValueError(f"Inventory: the nodes' slots {[n.slot_ids for n in self.nodes]} are not slot_ids "
                             f"{self.slot_ids} in order")

    @property
    def num_slots(self) -> int:
        return len(self.slot_ids)

    def cluster(self) -> Cluster:
        """The scheduler's view: one node per ``nodes`` entry with its number of slots."""
        return Cluster(tuple(len(n.slot_ids) for n in self.nodes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary for logs and run metadata."""
        return {
            "kind": self.kind,
            "slot_ids": list(self.slot_ids),
            "gpus": [dataclasses.asdict(g) for g in self.gpus],
            "reason": self.reason,
            "gpus_per_node": self.gpus_per_node,
            "nodes": [{"name": n.name, "slot_ids": list(n.slot_ids)} for n in self.nodes],
            "num_slots": self.num_slots,
            "unavailable": list(self.unavailable),
        }


class InventoryUnavailable(RuntimeError):
    """The slots cannot be read now (e.g. slurmctld does not answer); the scheduler skips the tick."""
