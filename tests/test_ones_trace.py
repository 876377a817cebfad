"""ONES trace loader and job-type catalogue, on the real trace, history and Pollux profiles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ones_pipeline.core.types import JOB_NAME_RE, StopKind, batch_and_lr
from ones_pipeline.sim.ones_trace import (
    JOB_TYPES,
    MIN_DELTA,
    TRACE_COLUMNS,
    catalogue,
    load_ones_trace,
    read_ones_trace,
    standalone_time_s,
    stopping_epoch,
)
from ones_pipeline.sim.pollux_profiles import consolidated_placement
from ones_pipeline.sim.truth import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
ONES = SHARED / "ones_sc21"
TRACE = ONES / "trace_1.csv"
POLLUX = SHARED / "pollux" / "traces"

if not (TRACE.is_file() and POLLUX.is_dir()):
    pytest.skip(f"ONES trace or Pollux profiles not found under {SHARED}", allow_module_level=True)


@pytest.fixture(scope="module")
def jobs():
    return load_ones_trace(TRACE)


def test_trace_1_loads_400_jobs(jobs):
    assert len(jobs) == 400
    names = [j.spec.name for j in jobs]
    assert len(set(names)) == 400
    assert all(JOB_NAME_RE.match(n) for n in names)
    assert names[1] == "inception-v3-imagenet-1"
    raw = pd.read_csv(TRACE)
    for j, (_, r) in zip(jobs, raw.iterrows()):
        s = j.spec
        assert s.submit_time_s == r["time"] and s.dataset_size == r["epoch_size"]
        assert s.per_gpu_batch == r["batch_size"] and s.requested_gpus == r["num_gpus"]
        assert s.base_lr == pytest.approx(r["lr"]) and s.max_lr == pytest.approx(r["max_lr"])
        assert s.stopping.kind is StopKind.ACCURACY
        assert s.stopping.target_accuracy == pytest.approx(r["target_acc"]) and s.stopping.patience == r["patience"]
        assert s.max_per_gpu_batch >= s.per_gpu_batch


def test_first_50_option_matches_the_full_load(jobs):
    first = load_ones_trace(TRACE, max_jobs=50, pollux_traces_dir=POLLUX)
    assert [j.spec for j in first] == [j.spec for j in jobs[:50]]
    assert [j.truth.total_progress for j in first] == [j.truth.total_progress for j in jobs[:50]]  # deterministic
    assert first[-1].spec.submit_time_s == 1558


def test_every_model_task_of_the_trace_is_in_the_catalogue():
    raw = pd.read_csv(TRACE)
    pairs = set(zip(raw["model"], raw["task"]))
    assert pairs <= set(JOB_TYPES)
    assert len(pairs) == 10
    cat = catalogue(ONES, POLLUX)
    for key in pairs:
        ct = cat[key]
        assert ct.kappa_compute > 0 and 0 < ct.kappa_net < 1 and ct.curves
        # Every (type, epoch size) of trace_1 has its own history run.
        sizes = set(raw.loc[(raw["model"] == key[0]) & (raw["task"] == key[1]), "epoch_size"])
        assert sizes <= set(ct.curves)


def test_truths_are_physical(jobs):
    seen = set()
    for j in jobs:
        t, s = j.truth, j.spec
        if t.model in seen:
            continue
        seen.add(t.model)
        assert t.base_batch == s.per_gpu_batch and t.restart_cost_s == 30.0
        assert t.total_progress > 0 and t.epochs >= s.stopping.patience
        for placement in [(1,), (2,), (4,), (4, 4), (4, 4, 4, 4), (4,) * 16, (3, 1)]:
            for local in (1, s.per_gpu_batch // 2 or 1, s.per_gpu_batch, t.max_local_batch):
                step, sync = t.step_time(placement, local)
                assert step > 0 and 0 <= sync <= step
        for frac in (0.0, 0.3, 1.0):
            p = frac * t.total_progress
            assert t.efficiency(p, s.per_gpu_batch) == pytest.approx(1.0)
            assert 0 < t.efficiency(p, 4 * s.per_gpu_batch) < 1
            assert t.grad_noise_scale(p) > 0
            loss, acc = t.metrics(p)
            assert loss > 0 and 0 <= acc <= 1
        # More GPUs on one node at the same per-GPU batch: more samples per second.
        b = s.per_gpu_batch
        thr = [n * b / t.step_time(consolidated_placement(n), b)[0] for n in (1, 2, 4)]
        assert thr[0] < thr[2]


def test_throughput_is_calibrated_to_the_history(jobs):
    """At the history run's GPU count and batch the truth reproduces the measured throughput."""
    cat = catalogue(ONES, POLLUX)
    for key, ct in cat.types.items():
        j = next(j for j in jobs if (j.spec.model == ct.job_type.key))
        (n,) = ct.history_gpus
        gb, _ = batch_and_lr(j.spec, n)
        step, _ = j.truth.step_time(consolidated_placement(n), gb // n)
        assert gb / step == pytest.approx(ct.history_thr, rel=0.25), key


def test_metrics_replay_the_stopping_rule_at_the_reference_batch(jobs):
    """Accuracies at the ends of reference-batch epochs fire the ONES rule exactly at the job's epoch count."""
    for j in jobs[:50]:
        t = j.truth
        grid = np.linspace(0.0, t.total_progress, 2001)
        ref = np.array([t.reference_epochs(p) for p in grid])
        assert ref[0] == 0 and ref[-1] == pytest.approx(t.epochs)
        progress_at = np.interp(np.arange(1, t.epochs + 1), ref, grid)
        accs = [t.metrics(p)[1] for p in progress_at]
        assert stopping_epoch(accs, j.spec.stopping.target_accuracy, j.spec.stopping.patience, MIN_DELTA) == t.epochs


def test_standalone_durations_are_plausible(jobs):
    times = np.array([standalone_time_s(j) for j in jobs[:50]])
    assert np.all(np.isfinite(times)) and np.all(times > 30)
    assert 60 < np.median(times) < 3600  # minutes, as the ONES testbed history shows


# ----------------------------------------------------------------------------- validation
GOOD = "0,resnet50,imagenet,10000,10,32,5.00E-04,0.008,0.55,16"
HEADER = ",".join(TRACE_COLUMNS)


def _write(tmp_path, lines, name="trace.csv"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _replace(field: str, value: str) -> str:
    vals = GOOD.split(",")
    vals[TRACE_COLUMNS.index(field)] = value
    return ",".join(vals)


def test_a_good_trace_validates(tmp_path):
    rows = read_ones_trace(_write(tmp_path, [HEADER, GOOD, GOOD]))
    assert len(rows) == 2 and rows[1].index == 1


def test_missing_file_raises(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(TraceError, match="not found") as exc:
        load_ones_trace(path)
    assert exc.value.path == str(path)


@pytest.mark.parametrize("field, value, match", [
    ("time", "-5", ">= 0"),
    ("time", "soon", "non-numeric"),
    ("model", "resnet101", "allowed: alexnet/imagenet"),
    ("task", "cifar", "unknown model/task resnet50/cifar"),
    ("batch_size", "0", ">= 1"),
    ("batch_size", "12.5", "integer"),
    ("num_gpus", "0", ">= 1"),
    ("lr", "0", "> 0"),
    ("lr", "", "non-numeric"),
    ("max_lr", "1e-5", ">= lr"),
    ("target_acc", "0", r"\(0, 1\]"),
    ("target_acc", "1.5", r"\(0, 1\]"),
    ("patience", "0", ">= 1"),
    ("epoch_size", "nan", "non-finite"),
])
def test_bad_values_name_file_row_and_field(tmp_path, field, value, match):
    path = _write(tmp_path, [HEADER, GOOD, GOOD, _replace(field, value)])
    with pytest.raises(TraceError, match=match) as exc:
        load_ones_trace(path, pollux_traces_dir=POLLUX)
    err = exc.value
    assert err.path == str(path) and err.row == 3 and err.field == field
    assert str(path) in str(err) and "row 3" in str(err) and repr(field) in str(err)


def test_missing_and_unknown_columns(tmp_path):
    cols = [c for c in TRACE_COLUMNS if c != "patience"]
    path = _write(tmp_path, [",".join(cols), "0,resnet50,imagenet,10000,32,5e-4,0.008,0.55,16"])
    with pytest.raises(TraceError, match="missing column") as exc:
        read_ones_trace(path)
    assert exc.value.field == "patience" and "allowed columns" in str(exc.value)
    path = _write(tmp_path, [HEADER + ",owner", GOOD + ",alice"], name="extra.csv")
    with pytest.raises(TraceError, match="unknown column") as exc:
        read_ones_trace(path)
    assert exc.value.field == "owner" and "target_acc" in str(exc.value)


def test_ragged_rows_and_empty_files(tmp_path):
    path = _write(tmp_path, [HEADER, GOOD, GOOD + ",1"])
    with pytest.raises(TraceError, match="fields") as exc:
        read_ones_trace(path)
    assert exc.value.row == 2
    with pytest.raises(TraceError, match="no data rows"):
        read_ones_trace(_write(tmp_path, [HEADER], name="header_only.csv"))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty"):
        read_ones_trace(empty)


def test_max_jobs_must_be_positive():
    with pytest.raises(ValueError):
        load_ones_trace(TRACE, max_jobs=0)


def test_history_elsewhere_is_reported(tmp_path):
    path = _write(tmp_path, [HEADER, GOOD])
    with pytest.raises(TraceError, match="trace_dev.csv"):
        load_ones_trace(path, pollux_traces_dir=POLLUX)
    jobs = load_ones_trace(path, pollux_traces_dir=POLLUX, history_dir=ONES)
    assert len(jobs) == 1 and jobs[0].spec.name == "resnet50-imagenet-0"
    assert math.isfinite(jobs[0].truth.total_progress)
