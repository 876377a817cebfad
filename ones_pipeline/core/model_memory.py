"""What earlier jobs of a model measured, remembered for the model's next jobs (``JobView.model_obs``).

A job that has not measured anything yet is valued by the step times its model's earlier jobs measured
(``core.goodput.GoodputModel.prior``), not by the generic prior. The memory keeps one row per configuration
(GPUs, nodes, per-GPU batch), the newest measurement of each, and at most ``MODEL_OBS_KEPT`` rows per model
(the oldest configuration goes first). With them, the gradient noise scale the model's jobs measured earliest
in their training (``remember_noise``: the one at the fewest samples; the noise scale grows as training goes
on, so that is what a new job will measure first), so a new job can start at the batch its model's step times
and that noise scale make goodput-optimal (``JobView.model_gns``, ``ones_goodput.memory_views``). The live
scheduler (``scheduler.tick``, rows stored in its sensor
cursor) and the simulator (``sim.engine``) keep it by these same functions, so a simulated policy sees what a
live one would.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from ones_pipeline.core.types import ThroughputObs

MODEL_OBS_KEPT = 16  # step times remembered per model (one per GPU count, nodes and per-GPU batch)

Row = list  # [GPUs, nodes, per-GPU batch, step s, sync s]


def remember(memory: MutableMapping[str, list[Row]], model: str, obs: Iterable[ThroughputObs],
             kept: int = MODEL_OBS_KEPT) -> None:
    """Keep ``obs`` as the newest step times of ``model`` in ``memory`` (model -> rows, newest last)."""
    rows = {tuple(r[:3]): r for r in memory.get(model, [])}
    for o in obs:
        key = (o.num_gpus, o.num_nodes, o.per_gpu_batch)
        rows.pop(key, None)
        rows[key] = [o.num_gpus, o.num_nodes, o.per_gpu_batch, o.step_time_s, o.sync_time_s]
    memory[model] = list(rows.values())[-kept:]


def recalled(memory: MutableMapping[str, list[Row]], model: str) -> tuple[ThroughputObs, ...]:
    """The remembered step times of ``model`` (oldest first), as observations."""
    return tuple(ThroughputObs(int(g), int(n), int(b), float(t), float(s))
                 for g, n, b, t, s in memory.get(model, []))


def remember_noise(noise: MutableMapping[str, list[float]], model: str, samples_done: float,
                   grad_noise_scale: float | None) -> None:
    """Keep ``grad_noise_scale``, measured after ``samples_done`` samples, as ``model``'s noise scale when it
    was measured earlier in training than the one kept (``noise``: model -> [samples, noise scale])."""
    if grad_noise_scale is None or not grad_noise_scale > 0:
        return
    kept = noise.get(model)
    if kept is None or float(samples_done) < kept[0]:
        noise[model] = [float(samples_done), float(grad_noise_scale)]


def recalled_noise(noise: MutableMapping[str, list[float]], model: str) -> float | None:
    """The noise scale ``remember_noise`` kept for ``model`` (None: none measured)."""
    kept = noise.get(model)
    return None if kept is None else float(kept[1])
