import re

import numpy as np
import pytest

from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    Schedule,
    StopKind,
    StoppingRule,
    batch_and_lr,
    lr_for_batch,
)


def spec(**kw):
    base = dict(name="job-1", model="m", dataset_size=1000, per_gpu_batch=32, base_lr=0.1, max_lr=0.4,
                requested_gpus=2)
    base.update(kw)
    return JobSpec(**base)


def test_lr_scales_linearly_up_to_the_cap_then_batch_is_fixed():
    s = spec()
    assert batch_and_lr(s, 1) == (32, pytest.approx(0.1))
    assert batch_and_lr(s, 2) == (64, pytest.approx(0.2))
    assert batch_and_lr(s, 4) == (128, pytest.approx(0.4))
    # Past the cap (max_lr / base_lr = 4x): same global batch, split over more GPUs.
    assert batch_and_lr(s, 8) == (128, pytest.approx(0.4))
    assert Allocation.for_spec(s, range(8)).per_gpu_batch == 16


def test_max_global_batch_caps_too():
    s = spec(max_lr=None, max_global_batch=96)
    assert batch_and_lr(s, 4)[0] == 96
    assert s.global_batch_cap == 96


@pytest.mark.parametrize("kw, field", [
    (dict(name="Bad Name"), "name"), (dict(name="../etc"), "name"), (dict(dataset_size=0), "dataset_size"),
    (dict(per_gpu_batch=0), "per_gpu_batch"), (dict(requested_gpus=0), "requested_gpus"),
    (dict(base_lr=0.0), "base_lr"), (dict(max_lr=0.01), "max_lr"), (dict(max_global_batch=8), "max_global_batch"),
])
def test_bad_specs_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        spec(**kw)


def test_stopping_rules_validate():
    with pytest.raises(ValueError, match="epochs"):
        StoppingRule(StopKind.EPOCHS)
    with pytest.raises(ValueError, match="target_accuracy"):
        StoppingRule(StopKind.ACCURACY, target_accuracy=1.5)
    assert StoppingRule(StopKind.EPOCHS, epochs=3).total_samples(100) == 300
    assert StoppingRule(StopKind.ACCURACY, target_accuracy=0.9).total_samples(100) is None


def test_cluster_placement_and_slots():
    c = Cluster.from_total(10, 4)
    assert c.gpus_per_node == (4, 4, 2)
    assert c.placement([0, 1, 4, 8, 9]) == (2, 2, 1)
    assert c.slot_to_gpu(9) == (2, 1)
    np.testing.assert_array_equal(c.node_of, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2])


def test_schedule_validation_catches_double_booking_and_caps():
    c = Cluster.uniform(1, 4)
    ok = Schedule({"a": Allocation("a", (0, 1), 64, 0.2), "b": Allocation("b", (2,), 32, 0.1)})
    ok.validate(c)
    with pytest.raises(ValueError, match="double-booked"):
        Schedule({"a": Allocation("a", (0, 1), 64, 0.2), "b": Allocation("b", (1,), 32, 0.1)}).validate(c)
    with pytest.raises(ValueError, match="outside"):
        Schedule({"a": Allocation("a", (4,), 64, 0.2)}).validate(c)
    s = spec(name="a", requested_gpus=1, max_gpus=1)
    with pytest.raises(ValueError, match="cap"):
        Schedule({"a": Allocation("a", (0, 1), 64, 0.2)}).validate(c, {"a": s})
    assert Schedule.from_dict(ok.to_dict()) == ok


@pytest.mark.parametrize("lr", [0.0, -0.1, float("nan"), float("inf"), None, "0.1", True])
def test_an_allocation_needs_a_finite_positive_lr(lr):
    with pytest.raises(ValueError, match=f"allocation of a: lr must be a finite number > 0, got {re.escape(repr(lr))}"):
        Allocation("a", (0,), 32, lr)
    with pytest.raises(TypeError):
        Allocation("a", (0,), 32)  # type: ignore[call-arg]  # lr is required


def test_allocations_follow_the_batch_lr_rule_and_schedules_need_their_lr():
    s = spec()
    alloc = Allocation.for_spec(s, (0, 1))
    assert (alloc.global_batch, alloc.lr) == (64, pytest.approx(lr_for_batch(s, 64)))
    data = Schedule({"job-1": alloc}).to_dict()
    assert data == {"job-1": {"gpus": [0, 1], "global_batch": 64, "lr": alloc.lr}}
    del data["job-1"]["lr"]
    with pytest.raises(ValueError, match="allocation of job-1: missing lr"):
        Schedule.from_dict(data)
