"""A synthetic job type with closed-form behaviour, for hand-checkable tests and examples.

Each GPU processes ``samples_per_gpu_s`` samples per second whatever its batch (perfect linear
scaling when ``sync_s == 0``; ``sync_s`` seconds of all-reduce per step otherwise, plus
``cross_node_s`` when the job spans nodes); statistical efficiency is 1 for every batch, so a job
of ``total_samples`` on ``n`` GPUs runs ``total_samples / (n * samples_per_gpu_s)`` seconds
plus its restart cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
from ones_pipeline.sim.truth import SimJob


@dataclass(frozen=True)
class SyntheticTruth:
    model: str = "synthetic"
    base_batch: int = 32
    max_local_batch: int = 1024
    total_progress: float = 10_000.0
    restart_cost_s: float = 0.0
    samples_per_gpu_s: float = 100.0
    sync_s: float = 0.0
    cross_node_s: float = 0.0

    def step_time(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        n = sum(placement)
        sync = (self.sync_s if n > 1 else 0.0) + (self.cross_node_s if len(placement) > 1 else 0.0)
        return local_batch / self.samples_per_gpu_s + sync, sync

    def efficiency(self, progress: float, global_batch: float) -> float:
        return 1.0

    def grad_noise_scale(self, progress: float) -> float:
        return 1e9  # effectively no large-batch penalty

    def metrics(self, progress: float) -> tuple[float, float]:
        frac = min(progress / self.total_progress, 1.0)
        return 2.0 * (1.0 - frac) + 0.05, 0.1 + 0.8 * frac


def synthetic_job(name: str, submit_s: float, total_samples: float, requested_gpus: int,
                  per_gpu_batch: int = 32, max_gpus: int | None = None, **truth_kw) -> SimJob:
    """A job whose stopping rule is exactly ``total_samples`` base-equivalent samples."""
    spec = JobSpec(
        name=name, model=truth_kw.get("model", "synthetic"), dataset_size=max(int(total_samples // 4), 1),
        per_gpu_batch=per_gpu_batch, base_lr=0.1, max_global_batch=per_gpu_batch * 64,
        max_per_gpu_batch=truth_kw.get("max_local_batch", 1024), requested_gpus=requested_gpus, max_gpus=max_gpus,
        stopping=StoppingRule(StopKind.SAMPLES, samples=float(total_samples)), submit_time_s=float(submit_s),
    )
    truth = SyntheticTruth(base_batch=per_gpu_batch, total_progress=float(total_samples), **truth_kw)
    return SimJob(spec, truth)
