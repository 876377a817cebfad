"""Simulator guarantees: it rejects infeasible policies, stops runaway runs, is deterministic, and
shows policies only what a live job would report."""

import pytest

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Allocation, Cluster, Schedule, lr_for_batch
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.runner import WorkloadSpec
from ones_pipeline.sim.synthetic import synthetic_job


class _DoubleBooker:
    name = "double-booker"

    def decide(self, now_s, cluster, jobs, current):
        return Schedule({j.name: Allocation(j.name, (0,), 32, lr_for_batch(j.spec, 32)) for j in jobs})

    def to_dict(self):
        return {}

    def load_state(self, state):
        pass


class _Idle(_DoubleBooker):
    name = "idle"

    def decide(self, now_s, cluster, jobs, current):
        return Schedule()


class _Recorder:
    """Wraps a policy and keeps every view it was shown."""

    def __init__(self, inner):
        self.inner, self.name, self.views = inner, inner.name, []

    def decide(self, now_s, cluster, jobs, current):
        self.views.extend(jobs)
        return self.inner.decide(now_s, cluster, jobs, current)


def two_jobs():
    return [synthetic_job("a", 0, 4_000, 1), synthetic_job("b", 0, 4_000, 1)]


def test_double_booking_policy_is_rejected():
    with pytest.raises(RuntimeError, match="double-booked"):
        simulate(two_jobs(), _DoubleBooker(), Cluster.uniform(1, 2), SimConfig(interval_s=10))


def test_a_policy_that_never_schedules_is_stopped():
    with pytest.raises(RuntimeError, match="unfinished"):
        simulate(two_jobs(), _Idle(), Cluster.uniform(1, 2), SimConfig(interval_s=10, max_time_s=1_000))


def test_simulation_is_deterministic_for_a_seed(traces):
    spec = WorkloadSpec(traces / "pollux" / "workloads" / "workload-5.csv", "pollux", max_jobs=8)
    jobs = spec.load()
    runs = [simulate(jobs, make_policy("ones", seed=4), Cluster.uniform(2, 4)) for _ in range(2)]
    assert [j.jct_s for j in runs[0].jobs] == [j.jct_s for j in runs[1].jobs]
    assert runs[0].timeline == runs[1].timeline
    assert sum(j.restarts for j in runs[0].jobs) > 0  # the search moved jobs: there was something to repeat


def test_policies_see_histories_and_measurements_not_the_truth(traces):
    spec = WorkloadSpec(traces / "ones_sc21" / "trace_1.csv", "ones", max_jobs=6)
    recorder = _Recorder(make_policy("fifo"))
    simulate(spec.load(), recorder, Cluster.uniform(4, 4), SimConfig(interval_s=30))
    late = [v for v in recorder.views if v.samples_done > 2 * v.spec.dataset_size]
    assert late, "some job should have run a few epochs"
    for v in late:
        assert v.known_total_samples() is None  # accuracy rule: the total is not given away
        assert len(v.accuracy_history) >= 2 and len(v.loss_history) == len(v.accuracy_history)
        assert v.throughput_obs and v.grad_noise_scale is not None and v.grad_noise_scale > 0
        samples = [s for s, _ in v.accuracy_history]
        assert samples == sorted(samples)


def _same_model_in_turn():
    """Three jobs of one model (synthetic jobs share a model name), the third arriving after the first two end."""
    return [synthetic_job("a", 0, 4_000, 1), synthetic_job("b", 0, 4_000, 2), synthetic_job("c", 50_000, 4_000, 1)]


def test_a_job_that_measured_nothing_sees_what_its_models_earlier_jobs_measured():
    recorder = _Recorder(make_policy("fifo"))
    simulate(_same_model_in_turn(), recorder, Cluster.uniform(1, 4), SimConfig(interval_s=10))
    first_c = next(v for v in recorder.views if v.name == "c")
    assert not first_c.throughput_obs
    measured = {(o.num_gpus, o.num_nodes, o.per_gpu_batch): o for v in recorder.views if v.name in "ab"
                for o in v.throughput_obs}  # later views overwrite earlier ones: the newest of each configuration
    assert {1, 2} <= {g for g, _, _ in measured}  # both earlier jobs measured, on 1 and on 2 GPUs
    # one row per configuration, the newest measurement of each (the last one either job reported)
    assert {(o.num_gpus, o.num_nodes, o.per_gpu_batch) for o in first_c.model_obs} == set(measured)
    assert set(first_c.model_obs) == set(measured.values()) and len(first_c.model_obs) == len(measured)
    # once the job has measured itself, it still sees its model's step times (``ones`` values it by them where it
    # has not run itself: ``ones_goodput.memory_filled_views``), its own among them, but no longer its model's
    # noise scale
    measured_c = [v for v in recorder.views if v.name == "c" and v.throughput_obs]
    assert measured_c and all(v.model_obs and v.model_gns is None for v in measured_c)
    assert set(measured_c[-1].throughput_obs) <= set(measured_c[-1].model_obs)


def test_model_memory_can_be_switched_off():
    recorder = _Recorder(make_policy("fifo"))
    simulate(_same_model_in_turn(), recorder, Cluster.uniform(1, 4), SimConfig(interval_s=10, model_memory=False))
    assert all(v.model_obs == () for v in recorder.views)


def test_model_memory_keeps_the_newest_row_per_configuration_and_at_most_kept_rows():
    from ones_pipeline.core import model_memory
    from ones_pipeline.core.types import ThroughputObs
    memory = {}
    model_memory.remember(memory, "m", [ThroughputObs(1, 1, 32, 0.1, 0.0), ThroughputObs(2, 1, 32, 0.12, 0.02)])
    model_memory.remember(memory, "m", [ThroughputObs(1, 1, 32, 0.09, 0.0)])  # newer at 1 GPU: replaces, moves last
    expected = (ThroughputObs(2, 1, 32, 0.12, 0.02), ThroughputObs(1, 1, 32, 0.09, 0.0))
    assert model_memory.recalled(memory, "m") == expected
    model_memory.remember(memory, "m", [ThroughputObs(4, 1, 32, 0.2, 0.1)], kept=2)  # the oldest configuration goes
    assert [o.num_gpus for o in model_memory.recalled(memory, "m")] == [1, 4]
    assert model_memory.recalled(memory, "other") == ()


class _OneAtATimeTuned(_DoubleBooker):
    """Runs the first active job on GPU 0, letting it tune its own batch (AdaptDL's trainer)."""

    name = "one-at-a-time-tuned"

    def __init__(self, batch_factor=1):
        self.batch_factor = batch_factor  # the start batch: this many times the per-GPU batch

    def decide(self, now_s, cluster, jobs, current):
        if not jobs:
            return Schedule()
        j = jobs[0]
        if j.name in current.allocations:
            return Schedule({j.name: current.allocations[j.name]})
        batch = j.spec.per_gpu_batch * self.batch_factor
        return Schedule({j.name: Allocation(j.name, (0,), batch, lr_for_batch(j.spec, batch), batch_tuned_by_job=True)})


def test_what_a_job_measured_after_its_last_decision_is_remembered_when_it_finishes():
    # "a" starts and finishes within one long round (re-tuning its batch at every epoch end): the policy only
    # ever saw it unmeasured. "c" arrives later: its model memory must hold what "a" measured.
    jobs = [synthetic_job("a", 0, 40_000, 1), synthetic_job("c", 10_000, 4_000, 1)]
    recorder = _Recorder(_OneAtATimeTuned())
    simulate(jobs, recorder, Cluster.uniform(1, 4), SimConfig(interval_s=5_000))
    assert all(not v.throughput_obs for v in recorder.views if v.name == "a")  # never seen measured
    first_c = next(v for v in recorder.views if v.name == "c")
    assert not first_c.throughput_obs
    assert first_c.model_obs and {(o.num_gpus, o.num_nodes) for o in first_c.model_obs} == {(1, 1)}
    assert all(o.step_time_s > 0 for o in first_c.model_obs)


def test_model_memory_keeps_the_noise_scale_measured_earliest_in_training():
    from ones_pipeline.core import model_memory

    noise = {}
    model_memory.remember_noise(noise, "m", 5_000.0, 300.0)
    model_memory.remember_noise(noise, "m", 9_000.0, 900.0)  # later in training: not kept
    model_memory.remember_noise(noise, "m", 1_000.0, None)  # nothing measured: ignored
    assert model_memory.recalled_noise(noise, "m") == 300.0
    model_memory.remember_noise(noise, "m", 2_000.0, 200.0)  # another job, earlier in its training
    assert model_memory.recalled_noise(noise, "m") == 200.0 and model_memory.recalled_noise(noise, "x") is None


def test_an_unmeasured_job_sees_its_models_earliest_noise_scale_and_trains_at_the_batch_it_was_given():
    recorder = _Recorder(_OneAtATimeTuned(batch_factor=4))
    simulate(_same_model_in_turn(), recorder, Cluster.uniform(1, 4), SimConfig(interval_s=10))
    first_c = next(v for v in recorder.views if v.name == "c")
    earliest = min((v.samples_done, v.grad_noise_scale) for v in recorder.views
                   if v.name in "ab" and v.grad_noise_scale is not None)
    assert first_c.model_gns == earliest[1]
    assert all(v.model_gns is None for v in recorder.views if v.throughput_obs)
    # Given 4x its per-GPU batch on 1 GPU before measuring anything, "a" trains at it (as the live trainer does),
    # split in two micro-batches (one GPU above the base batch), not at its smallest batch.
    first_measured = next(v for v in recorder.views if v.name == "a" and v.throughput_obs)
    assert first_measured.throughput_obs[0].per_gpu_batch == 2 * first_measured.spec.per_gpu_batch
