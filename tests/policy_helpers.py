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
