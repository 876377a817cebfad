"""``benchmarks/ones_informed.py``: ``ones`` valuing jobs by the simulator's ground truth."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.policies import make_policy, ones_goodput
from ones_pipeline.core.types import Cluster, JobStatus, JobView, Schedule, ThroughputObs
from ones_pipeline.sim.bound import _batch_grid, _config_rate
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.runner import WorkloadSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ones_informed as oi  # noqa: E402

CLUSTER = Cluster.uniform(4, 4)


@pytest.fixture(scope="module")
def jobs():
    """The first six jobs of the packaged Pollux workload-1 (their specs and ground truth)."""
    return WorkloadSpec(workload_path("pollux:workload-1"), "pollux", max_jobs=6).load()


def _views(jobs, progress_fraction: float) -> list[JobView]:
    out = []
    for k, job in enumerate(jobs):
        running = k % 2 == 0  # half measured and running on 2 GPUs, half queued and unmeasured
        obs = (ThroughputObs(2, 1, job.spec.per_gpu_batch, *job.truth.step_time((2,), job.spec.per_gpu_batch)),)
        out.append(JobView(job.spec, JobStatus.RUNNING if running else JobStatus.PENDING, 0.0,
                           progress_samples=progress_fraction * job.truth.total_progress,
                           throughput_obs=obs if running else (),
                           grad_noise_scale=job.truth.grad_noise_scale(0.0) if running else None))
    return out


def test_ones_values_every_job_by_the_truth_inside_the_block_and_by_its_estimates_after(jobs):
    views = _views(jobs, 0.3)
    truths = {j.spec.name: j.truth for j in jobs}
    original = ones_goodput.tuned_goodput
    with oi.informed(truths, "goodput", 4):
        truth_rate = ones_goodput.tuned_goodput
        ctx, _ = make_policy("ones", seed=0)._context(CLUSTER, views, Schedule(), 0.0)
    assert ones_goodput.tuned_goodput is original and not isinstance(ones_goodput._ROWS, oi._NoMemo)
    n = 8  # two nodes: the table's consolidated placement
    for i, view in enumerate(views):
        if ctx.table.shape[1] > n and ctx.table[i, n] > 0:
            assert ctx.table[i, n] == pytest.approx(truth_rate.rate(view, 2, n, True))
    # The same state valued by ones' own estimates differs (what the benchmark measures the worth of).
    after, _ = make_policy("ones", seed=0)._context(CLUSTER, views, Schedule(), 0.0)
    assert not np.allclose(after.table[:, 1:], ctx.table[:, 1:])


def test_the_truth_rate_is_the_best_batch_of_the_grid_at_the_jobs_progress(jobs):
    job = jobs[0]
    view = _views(jobs, 0.6)[0]
    rates = oi.TruthGoodput({job.spec.name: job.truth}, "goodput", 4)
    at = (int(oi.PROGRESS_STEPS * 0.6) + 0.5) / oi.PROGRESS_STEPS * job.truth.total_progress
    want = 0.0
    for b in _batch_grid(job.spec, 24) | {job.spec.per_gpu_batch * 6}:
        rated = _config_rate(job.truth, (3, 3), b)  # 6 GPUs over two nodes: spread evenly
        if rated is not None:
            want = max(want, rated[1] * job.truth.efficiency(at, rated[0]))
    assert rates.rate(view, 2, 6, True) == pytest.approx(want)
    # "throughput": the same step times, the efficiency from the job's own noise scale.
    thr = oi.TruthGoodput({job.spec.name: job.truth}, "throughput", 4)
    want_thr = max(r[1] * float(efficiency(view.grad_noise_scale, job.spec.per_gpu_batch, r[0]))
                   for b in _batch_grid(job.spec, 24) | {job.spec.per_gpu_batch * 6}
                   if (r := _config_rate(job.truth, (3, 3), b)) is not None)
    assert thr.rate(view, 2, 6, True) == pytest.approx(want_thr)
    # Raw samples/s: the two modes agree; too few nodes for the GPUs are raised to what a node holds.
    assert thr.rate(view, 2, 6, False) == pytest.approx(rates.rate(view, 2, 6, False))
    assert rates.rate(view, 1, 6, True) == rates.rate(view, 2, 6, True)
    with pytest.raises(ValueError, match="throughput or goodput"):
        oi.TruthGoodput({}, "steps", 4)
