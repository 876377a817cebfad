"""Hand-built job specs and step-time observations shared by the policy tests."""

from __future__ import annotations

from ones_pipeline.core.types import JobSpec, StoppingRule, ThroughputObs


def spec(name, requested=1, per_gpu_batch=32, submit=0.0, model="cifar10", epochs=10.0, **kw) -> JobSpec:
    return JobSpec(name=name, model=model, dataset_size=10_000, per_gpu_batch=per_gpu_batch,
                   requested_gpus=requested, stopping=StoppingRule("epochs", epochs=epochs),
                   submit_time_s=submit, **kw)


def obs_for(c0, c1, s0, s1, x0, x1, batch, gpn=4, counts=(1, 2, 4, 8)):
    """Exact observations of a compute + sync step-time model at the given GPU counts, splitting ``batch``."""
    out = []
    for n in counts:
        k, b = -(-n // gpn), max(1, batch // n)
        sync = (s0 + s1 * (n - 1) if n > 1 else 0.0) + (x0 + x1 * (k - 1) if k > 1 else 0.0)
        out.append(ThroughputObs(n, k, b, c0 + c1 * b + sync, sync))
    return tuple(out)


def random_spec(rng, i: int, max_request: int) -> JobSpec:
    """A random job ``job-<i>`` for the property tests: requested GPUs, per-GPU batch, submit time, model,
    global and per-GPU batch caps, GPU cap, drawn from ``rng`` in that order."""
    req = int(rng.integers(1, max_request + 1))
    pgb = int(rng.choice([8, 32, 128]))
    return spec(f"job-{i}", req, per_gpu_batch=pgb, submit=float(rng.uniform(0, 1000)),
                model=str(rng.choice(["cifar10", "ncf", "bert"])),
                max_global_batch=pgb * req * int(rng.choice([1, 4, 16])),
                max_per_gpu_batch=int(rng.choice([pgb, 2 * pgb])),
                max_gpus=None if rng.random() < 0.5 else int(rng.integers(1, 2 * max_request)))
