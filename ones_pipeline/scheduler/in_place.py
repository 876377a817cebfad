"""Which changes of a running generation its launcher makes in place, and which take the checkpoint path.

In place (``train.resize_control``): the same launcher, Dagster run and generation change their ranks at a
step boundary; nothing is written or read beyond one checkpoint, new ranks warm up while the old ones train.
The checkpoint path: the generation stops with a checkpoint, its run ends, and the next generation is a new
run started from that checkpoint (15-35 s of start-up on 2 CPU slots, docs/live.md). Per launcher:

* ``subprocess``: grow and shrink (and move) in place. On GPUs, a change that drops rank 0's GPU is not
  (the rank that holds the MLflow run and the checkpoint is bound to it).
* ``docker``: on CPU slots as ``subprocess`` (the same launcher runs in the container and starts a grow's new
  ranks there, the job's directory, with the resize request and the progress file, is mounted at the same path,
  and CPU slots are processes, not devices or cores the container was given: it is created without a CPU set
  or limit, so nothing of the container changes with the slot set). Run under a real engine by
  ``tests/test_docker_launcher.py`` (shrink and grow; tags, ``ones status`` and the slot ledger agree). On GPUs
  neither: the container was created with exactly its GPUs, renumbered from 0 inside it, so it cannot add
  one, and a rank's GPU follows its rank there, so the launcher does not re-rank in place either.
* ``slurm``: neither: the generation is one Slurm job whose nodes and tasks are fixed when it starts, and each
  task's launcher holds only its own ranks.

A change of batch alone (same slots) takes the checkpoint path unless the job re-tunes its batch itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from ones_pipeline.train.resize_control import in_place_reason

IN_PLACE = "in place"
CHECKPOINT = "checkpoint"
LAUNCHERS = ("subprocess", "docker", "slurm")


def resizes_in_place(launcher: str, device: str) -> bool:
    """Whether ``launcher`` changes a running generation's slots in place on ``device`` slots at all (module
    docstring): subprocess always, Docker on CPU slots, Slurm never."""
    return launcher == "subprocess" or (launcher == "docker" and device != "gpu")


def not_in_place(launcher: str, device: str, before: Sequence[int], after: Sequence[int], status: str) -> str | None:
    """Why the change of a running generation from slots ``before`` to ``after`` (ids, rank order) cannot be
    made in place by ``launcher``; None: it can. ``status``: its run's Dagster status."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher kind {launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    if not before or not after:
        return "not a change of a running generation"
    if tuple(before) == tuple(after):
        return "same slots (a change of batch alone)"
    if status != "STARTED":
        return f"its run is {status.lower()}, not started"
    if not resizes_in_place(launcher, device):
        return ("a Slurm job's nodes and tasks are fixed when it starts" if launcher == "slurm" else
                "a container holds exactly the GPUs it was created with")
    return in_place_reason(device, list(before), list(after))


def rank_order(device: str, before: Sequence[int], after: Sequence[int]) -> tuple[int, ...]:
    """``after`` in the launcher's rank order after the change: on GPUs the members that stay keep their order
    (rank 0 first) and the new GPUs follow; CPU slots are interchangeable, the first ranks take them in order."""
    if device != "gpu":
        return tuple(after)
    return tuple([s for s in before if s in after] + [s for s in after if s not in before])
