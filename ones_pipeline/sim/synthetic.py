"""A synthetic job type with closed-form behaviour, for hand-checkable tests and examples.

Each GPU processes ``samples_per_gpu_s`` samples per second whatever its batch (perfect linear
scaling when ``sync_s == 0``; ``sync_s`` seconds of all-reduce per step otherwise, plus
``cross_node_s`` when the job spans nodes); statistical efficiency is 1 for every batch, so a job
of ``total_samples`` on ``n`` GPUs runs ``total_samples / (n * samples_per_gpu_s)`` seconds
plus its restart cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    StopKind,
    StoppingRule,
    ThroughputObs,
)
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

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
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


def random_scheduler_state(rng: np.random.Generator, num_jobs: int, nodes: int, gpn: int):
    """A random (cluster, active jobs, current schedule) for property tests and latency benchmarks."""
    cluster = Cluster.uniform(nodes, gpn)
    jobs, allocs = [], {}
    free = list(rng.permutation(cluster.num_gpus))
    for i in range(num_jobs):
        requested = int(rng.choice([1, 2, 4, 8, 16]))
        stop = (StoppingRule(StopKind.EPOCHS, epochs=float(rng.integers(1, 20))) if rng.random() < 0.7 else
                StoppingRule(StopKind.ACCURACY, target_accuracy=0.8, patience=3))
        spec = JobSpec(name=f"job-{i}", model=str(rng.choice(["cifar10", "bert", "ncf"])),
                       dataset_size=int(rng.integers(100, 50_000)), per_gpu_batch=int(rng.choice([8, 32, 128])),
                       base_lr=0.1, max_lr=float(rng.choice([0.1, 0.4, 1.6])), requested_gpus=requested,
                       max_per_gpu_batch=int(rng.choice([16, 128, 512])), stopping=stop,
                       submit_time_s=float(rng.integers(0, 1000)))
        done = float(rng.random()) * spec.dataset_size * 5
        obs = ()
        if rng.random() < 0.6:
            step = float(rng.uniform(0.01, 1.0))
            obs = tuple(ThroughputObs(n, max(1, n // gpn), spec.per_gpu_batch, step * (1 + 0.1 * n),
                                      0.1 * n * step if n > 1 else 0.0)
                        for n in sorted({1, int(rng.integers(1, 9))}))
        hist = tuple((done * k / 4, 1.0 - 0.1 * k) for k in range(1, 4)) if done > 0 else ()
        acc = tuple((done * k / 4, 0.2 * k) for k in range(1, 4)) if done > 0 else ()
        running = rng.random() < 0.5 and free
        status = JobStatus.RUNNING if running else (JobStatus.PAUSED if obs else JobStatus.PENDING)
        if running:
            n = min(len(free), requested, spec.gpu_cap)
            gpus = tuple(int(free.pop()) for _ in range(n))
            allocs[spec.name] = Allocation.for_spec(spec, gpus)
        jobs.append(JobView(spec=spec, status=status, submit_time_s=spec.submit_time_s, samples_done=done,
                            progress_samples=done, throughput_obs=obs, grad_noise_scale=float(rng.uniform(10, 5000)),
                            loss_history=hist, accuracy_history=acc, initial_loss=1.2,
                            attained_gpu_s=float(rng.uniform(0, 1e5)), run_time_s=float(rng.uniform(0, 1e4)),
                            last_change_s=float(rng.uniform(0, 1000)) if running else None,
                            max_gpus_seen=int(rng.integers(0, 9)), restarts=int(rng.integers(0, 3))))
    return cluster, jobs, Schedule(allocs)
