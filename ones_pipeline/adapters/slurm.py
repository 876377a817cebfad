"""Slurm through its command line (``sinfo --json``, ``sbatch --parsable``, ``scontrol``, ``scancel``).

No Python binding: ``pyslurm`` needs a newer Slurm than the 22.05 of Debian 12, and ``dagster-slurm`` reaches
Slurm only over SSH (ECOSYSTEM.md section 8). This module is the one place that runs Slurm commands:

* ``SlurmInventory``: the partition's nodes and their GPUs (from each node's ``gres``), as the scheduler's
  slots. Slot ids are numbered over every node of the partition in name order (n1's GPUs first), so a node
  that goes down leaves the other nodes' ids unchanged; nodes that are down, drained or not responding
  are left out, with the reason, in ``Inventory.unavailable``.
* ``submit``, ``job_state``, ``signal_job``, ``cancel_job``: one Slurm job per allocation.
* ``rendezvous_port``: where the ranks of a generation meet.

An unreachable controller raises ``SlurmUnreachable`` (every command has a timeout); other refusals raise
``SlurmError`` with Slurm's own message.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ones_pipeline.adapters.slots import GpuInfo, Inventory, InventoryUnavailable, Node

CLI_TIMEOUT_S = 20.0
UNUSABLE_FLAGS = {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "MAINTENANCE", "POWERED_DOWN",
                  "POWER_DOWN", "REBOOT_REQUESTED"}
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "SUSPENDED"}
ACTIVE_STATES = PENDING_STATES | {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
_UNREACHABLE = ("Unable to contact slurm controller", "is DOWN", "Unable to establish controller", "Socket timed out",
                "Zero Bytes were transmitted", "Connection refused", "Unable to process configuration")


class SlurmError(RuntimeError):
    """A Slurm command refused or failed; the message carries Slurm's own words."""


class SlurmUnreachable(SlurmError):
    """slurmctld does not answer (or no Slurm command line is installed)."""


def slurm_environ(slurm_conf: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = str(slurm_conf)
    env.update(extra or {})
    return env


def run_cli(args: Sequence[str], slurm_conf: str | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float = CLI_TIMEOUT_S) -> str:
    """Run one Slurm command; its stdout. Raises ``SlurmUnreachable`` or ``SlurmError``."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s,
                              env=slurm_environ(slurm_conf, env))
    except FileNotFoundError as exc:
        raise SlurmUnreachable(f"{args[0]} is not installed (install slurm-wlm, or run on a Slurm login node)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnreachable(f"`{' '.join(args[:2])}` got no answer from slurmctld within {timeout_s:g} s") from exc
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip().splitlines()
        message = text[-1] if text else f"exit code {done.returncode}"
        if any(marker in (done.stderr or "") for marker in _UNREACHABLE):
            raise SlurmUnreachable(f"slurmctld unreachable ({' '.join(args[:2])}): {message}")
        raise SlurmError(f"{' '.join(args[:2])}: {message}")
    return done.stdout


def json_cli(args: Sequence[str], slurm_conf: str | None = None) -> dict:
    """A ``--json`` command's document. Slurm 22.05 exits 0 with an ``errors`` list when slurmctld does
    not answer; then ``scontrol ping`` says whether the controller is down (``SlurmUnreachable``)."""
    data = json.loads(run_cli(args, slurm_conf))
    errors = [e.get("description") or e.get("error") or str(e) for e in data.get("errors") or []]
    if errors:
        try:
            ping = run_cli(["scontrol", "ping"], slurm_conf)
        except SlurmError as exc:
            raise SlurmUnreachable(f"slurmctld unreachable ({args[0]}: {'; '.join(errors)}): {exc}") from exc
        if "DOWN" in ping:
            raise SlurmUnreachable(f"slurmctld unreachable: {ping.strip().splitlines()[0]}")
        raise SlurmError(f"{args[0]}: {'; '.join(errors)}")
    return data


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str  # NodeAddr: node names need not resolve as host names
    state: str  # e.g. idle, mixed, allocated, down
    flags: tuple[str, ...]  # e.g. DRAIN, NOT_RESPONDING
    gpus: int  # from the node's gres
    reason: str

    @property
    def usable(self) -> bool:
        return self.state.lower() in USABLE_STATES and not (set(self.flags) & UNUSABLE_FLAGS)

    def why_unusable(self) -> str:
        what = "+".join([self.state.lower(), *(f.lower() for f in self.flags)])
        return f"{self.name}: {what}" + (f" ({self.reason})" if self.reason else "")


def gres_gpus(gres: str) -> int:
    """GPUs in a node's gres string: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:2,shard:8`` -> 4, 4, 2."""
    total = 0
    for part in (gres or "").split(","):
        fields = re.sub(r"\(.*?\)", "", part).split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def list_nodes(partition: str, names: Sequence[str] = (), slurm_conf: str | None = None) -> list[SlurmNode]:
    """The partition's nodes (only ``names`` when given), sorted by name. Raises SlurmError when the
    partition has none of them."""
    data = json_cli(["sinfo", "--json"], slurm_conf)
    nodes = {}
    for raw in data.get("nodes", []):
        if partition not in (raw.get("partitions") or []) or (names and raw["name"] not in names):
            continue
        state = raw.get("state", "unknown")
        nodes[raw["name"]] = SlurmNode(name=raw["name"], address=raw.get("address") or raw["name"],
                                       state=state if isinstance(state, str) else "+".join(state),
                                       flags=tuple(raw.get("state_flags") or ()), gpus=gres_gpus(raw.get("gres", "")),
                                       reason=raw.get("reason") or "")
    missing = [n for n in names if n not in nodes]
    if missing or not nodes:
        raise SlurmError(f"partition {partition!r}: no node{' ' + ', '.join(missing) if missing else 's'} "
                         f"(sinfo lists {', '.join(sorted(nodes)) or 'none'})")
    return [nodes[n] for n in sorted(nodes)]


@dataclass(frozen=True)
class SlurmInventory:
    """The GPUs of a Slurm partition (optionally only the listed nodes) as the scheduler's slots."""

    partition: str
    nodes: tuple[str, ...] = ()
    slurm_conf: str | None = None

    def numbering(self) -> list[tuple[SlurmNode, tuple[int, ...]]]:
        """Every node of the partition with its slot ids, usable or not (ids never shift)."""
        out, next_id = [], 0
        for node in list_nodes(self.partition, self.nodes, self.slurm_conf):
            out.append((node, tuple(range(next_id, next_id + node.gpus))))
            next_id += node.gpus
        return out

    def discover(self) -> Inventory:
        """Raises ``InventoryUnavailable`` when Slurm cannot be asked (the scheduler skips the tick)."""
        try:
            numbered = self.numbering()
        except SlurmError as exc:
            raise InventoryUnavailable(f"Slurm partition {self.partition}: {exc}") from exc
        usable = [(n, ids) for n, ids in numbered if n.usable and ids]
        down = tuple(n.why_unusable() for n, ids in numbered if not n.usable)
        gpus = tuple(GpuInfo(index=i, name=f"gres gpu on {n.name}", uuid=None, memory_total_mb=0.0,
                             memory_used_mb=None, utilization_percent=None) for n, ids in usable for i in ids)
        slot_ids = tuple(g.index for g in gpus)
        reason = (f"Slurm partition {self.partition}: {len(usable)} node(s), {len(slot_ids)} GPU(s)"
                  + (f"; left out: {'; '.join(down)}" if down else ""))
        if not usable:  # e.g. every node "unknown" while a restarted slurmctld waits for them to register
            raise InventoryUnavailable(f"Slurm partition {self.partition}: no usable node ({'; '.join(down)})")
        return Inventory("gpu", slot_ids, gpus, reason, max(len(ids) for _, ids in usable),
                         nodes=tuple(Node(n.name, ids) for n, ids in usable), unavailable=down)

    def place(self, slot_ids: Sequence[int]) -> list[tuple[SlurmNode, int]]:
        """The nodes holding ``slot_ids`` and how many of them each, in node order."""
        wanted = set(slot_ids)
        out = [(node, len(wanted & set(ids))) for node, ids in self.numbering() if wanted & set(ids)]
        known = {i for _, ids in self.numbering() for i in ids}
        if wanted - known:
            raise SlurmError(f"slot ids {sorted(wanted - known)} are on no node of partition {self.partition!r}")
        return out


def rendezvous_port(job: str, generation: int, run_id: str = "", low: int = 20000, span: int = 20000) -> int:
    """A TCP port for the ranks' rendezvous, derived from the job, generation and Dagster run: nodes may
    share an address (and a free port cannot be probed on another node), so every run gets its own (two
    runs of one generation, e.g. in two projects, must not meet each other's ranks)."""
    digest = hashlib.sha256(f"{job}/{generation}/{run_id}".encode()).digest()
    return low + int.from_bytes(digest[:4], "big") % span


def submit(script: str, args: Sequence[str], env: Mapping[str, str], slurm_conf: str | None = None) -> str:
    """``sbatch --parsable ARGS SCRIPT`` with ``env`` exported to the job; the job id."""
    out = run_cli(["sbatch", "--parsable", *args, script], slurm_conf, env=env).strip()
    job_id = out.split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed {out!r}, not a job id")
    return job_id


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, TIMEOUT, ...
    reason: str  # Slurm's reason (why pending, or why it ended)
    nodes: str  # the node list it runs on ("" while pending)
    exit_code: str  # "0:0" (code:signal)

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def _fields(line: str) -> dict[str, str]:
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def job_state(job_id: str, slurm_conf: str | None = None) -> JobState | None:
    """The job's state from ``scontrol -o show job`` (kept MinJobAge seconds after it ends; no slurmdbd
    needed); None when Slurm no longer knows the job."""
    try:
        out = run_cli(["scontrol", "-o", "show", "job", str(job_id)], slurm_conf)
    except SlurmUnreachable:
        raise
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    f = _fields(out.splitlines()[0] if out.strip() else "")
    return JobState(job_id=str(job_id), state=f.get("JobState", "UNKNOWN"), reason=f.get("Reason", ""),
                    nodes=f.get("NodeList", "") if f.get("NodeList") != "(null)" else "",
                    exit_code=f.get("ExitCode", ""))


def signal_job(job_id: str, signal_name: str = "TERM", slurm_conf: str | None = None) -> None:
    """Signal every task of the job's steps (not ``--full``: srun itself would then kill the ranks before
    they checkpoint). A pending job refuses signals; that is not an error here."""
    try:
        run_cli(["scancel", f"--signal={signal_name}", str(job_id)], slurm_conf)
    except SlurmUnreachable:
        raise
    except SlurmError as exc:
        if "pending" not in str(exc).lower() and "already completing" not in str(exc).lower() \
                and "Invalid job id" not in str(exc):
            raise


def cancel_job(job_id: str, slurm_conf: str | None = None) -> None:
    """Cancel the job outright (SIGCONT+SIGTERM, then SIGKILL after KillWait)."""
    try:
        run_cli(["scancel", str(job_id)], slurm_conf)
    except SlurmUnreachable:
        raise
    except SlurmError as exc:
        if "Invalid job id" not in str(exc) and "already completing" not in str(exc).lower():
            raise


def jobs_named(prefix: str, slurm_conf: str | None = None) -> list[dict]:
    """Active jobs whose name starts with ``prefix`` (``squeue --json``): id, name, state, nodes."""
    data = json_cli(["squeue", "--json"], slurm_conf)
    return [{"job_id": str(j["job_id"]), "name": j.get("name", ""), "state": j.get("job_state", ""),
             "nodes": j.get("nodes", "")} for j in data.get("jobs", [])
            if str(j.get("name", "")).startswith(prefix) and j.get("job_state") in ACTIVE_STATES]
