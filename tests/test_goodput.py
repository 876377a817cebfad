"""The Pollux goodput model (core/goodput.py) and jobs that tune their own batch in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from ones_pipeline.core import goodput as gp
from ones_pipeline.core.types import Allocation, Cluster, JobSpec, Schedule, StoppingRule, ThroughputObs, lr_for_batch
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.workloads import load_pollux_workload

TRUE = np.array([0.05, 0.002, 0.08, 0.004, 0.02, 0.001, 1.5])


def obs_of(params, configs):
    out = []
    for k, n, b in configs:
        step = float(gp.step_time(params, k, n, b))
        compute = params[0] + params[1] * b
        out.append(ThroughputObs(n, k, b, step, step - compute))
    return tuple(out)


def test_fit_reproduces_what_it_observed():
    configs = [(1, 1, 32), (1, 1, 128), (1, 2, 64), (1, 4, 64), (2, 8, 64), (4, 16, 32), (2, 6, 128)]
    params = gp.fit_perf_params(obs_of(TRUE, configs))
    for k, n, b in configs:
        assert float(gp.step_time(params, k, n, b)) == pytest.approx(float(gp.step_time(TRUE, k, n, b)), rel=0.05)
    assert 1.0 <= params[6] <= 10.0 and (params[:6] > 0).all()


def test_unobserved_communication_is_optimistic():
    """One 1-GPU observation: scaling out looks free (the model has seen no communication)."""
    params = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 64)]))
    one = float(gp.throughput(params, 1, 1, 64))
    assert float(gp.throughput(params, 1, 4, 64)) == pytest.approx(4 * one, rel=0.01)
    assert float(gp.throughput(params, 2, 8, 64)) == pytest.approx(8 * one, rel=0.01)
    # Once a multi-GPU step was seen, crossing nodes costs at least 1.1x the in-node network.
    seen = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 64), (1, 4, 64)]))
    assert seen[2] >= 1.1 * seen[4] - 1e-12
    assert float(gp.throughput(seen, 2, 8, 64)) < 8 * float(gp.throughput(seen, 1, 1, 64))


def test_split_rules():
    micro, accum = gp.split_for(np.array([100, 300, 64]), np.array([1, 1, 1]), 128, 64)
    assert accum.tolist() == [1, 2, 0]  # above M0 on one GPU: at least two micro-steps
    assert micro.tolist() == [50, 100, 64]
    micro, accum = gp.split_for(1000, 4, 128, 64)
    assert (micro, accum) == (125, 1)


def test_best_batch_grows_with_the_noise_scale_and_stays_in_bounds():
    params = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 32), (1, 1, 128), (1, 4, 64)]))
    batches = []
    for gns in (10.0, 1e3, 1e5):
        good, micro, accum = gp.best_batch(params, gns, 32, 4096, 8, 256, 1, 4)
        assert good > 0 and 8 <= micro <= 256
        batches.append(4 * micro * (accum + 1))
    assert batches[0] < batches[1] < batches[2]
    # Vectorised over allocations and jobs alike.
    good, micro, _ = gp.best_batch(params[None], np.array([10.0, 1e5]), 32, 4096, 8, 256, np.array([1, 2]),
                                   np.array([4, 8]))
    assert good.shape == micro.shape == (2,)


def spec(**kw) -> JobSpec:
    base = dict(name="j", model="m", dataset_size=1000, per_gpu_batch=32, max_global_batch=4096,
                max_per_gpu_batch=256, min_global_batch=32, min_per_gpu_batch=8,
                stopping=StoppingRule("epochs", epochs=1))
    base.update(kw)
    return JobSpec(**base)


def test_job_batch_before_and_after_measuring():
    s = spec()
    assert gp.job_batch(s, (), None, 1, 4) == (8, 0)  # max(M0 = 32, 8 per GPU x 4)
    assert gp.job_batch(s, (), None, 1, 1) == (32, 0)
    obs = obs_of(TRUE, [(1, 1, 32)])
    micro, accum = gp.job_batch(s, obs, 1e5, 1, 4)
    assert 4 * micro * (accum + 1) <= 4096 and micro > 8


def test_spec_validates_batch_bounds():
    with pytest.raises(ValueError, match="min_global_batch"):
        spec(min_global_batch=10_000)
    with pytest.raises(ValueError, match="min_per_gpu_batch"):
        spec(min_per_gpu_batch=512)


class _FixedTuned:
    """Two GPUs from the first round on, the job tunes its batch; records the batches it is told of."""

    name = "fixed-tuned"

    def __init__(self):
        self.seen = []

    def decide(self, now_s, cluster, jobs, current):
        out = {}
        for v in jobs:
            old = current.allocations.get(v.name)
            self.seen.append(old.global_batch if old else None)
            out[v.name] = old or Allocation(v.name, (0, 1), 2 * v.spec.per_gpu_batch,
                                           lr_for_batch(v.spec, 2 * v.spec.per_gpu_batch), batch_tuned_by_job=True)
        return Schedule(out)

    def to_dict(self):
        return {}

    def load_state(self, state):
        return None


def test_a_job_that_tunes_its_batch_changes_it_without_restarts():
    job = load_pollux_workload(workload_path("pollux:workload-6"))[0]  # a cifar10 job
    pol = _FixedTuned()
    res = simulate([job], pol, Cluster.uniform(1, 4), SimConfig())
    assert res.jobs[0].restarts == 0
    batches = {b for b in pol.seen if b is not None}
    assert len(batches) > 1  # it re-tuned as its noise scale grew
    assert max(batches) > job.spec.min_global_batch
