"""Loading the Pollux workload traces into simulator jobs."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from ones_pipeline.core.types import StopKind, batch_and_lr
from ones_pipeline.sim.pollux_profiles import PolluxModelProfile
from ones_pipeline.sim.truth import TraceError
from ones_pipeline.sim.workloads import load_pollux_workload

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
POLLUX = SHARED / "pollux"
TRACES = POLLUX / "traces"

if not (POLLUX / "workloads").is_dir():
    pytest.skip(f"Pollux workloads not found under {POLLUX}", allow_module_level=True)

HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.mark.parametrize("index", range(1, 9))
def test_main_workloads_load(index):
    path = POLLUX / "workloads" / f"workload-{index}.csv"
    jobs = load_pollux_workload(path)
    assert len(jobs) == 160
    names = [j.spec.name for j in jobs]
    assert len(set(names)) == 160
    times = [j.spec.submit_time_s for j in jobs]
    assert times == sorted(times) and times[0] >= 0
    raw = path.read_text().splitlines()[1:]
    for job, line in zip(jobs, raw, strict=False):
        name, t, app, replicas, batch = line.split(",")
        spec, truth = job.spec, job.truth
        assert isinstance(truth, PolluxModelProfile) and truth.model == app == spec.model
        assert spec.name == name and spec.submit_time_s == float(t)
        assert spec.requested_gpus == int(replicas)
        assert spec.per_gpu_batch == math.ceil(int(batch) / int(replicas))
        assert int(batch) <= spec.per_gpu_batch * spec.requested_gpus < int(batch) + int(replicas)
        # A rigid baseline on its requested GPUs gets (about) the trace batch.
        assert batch_and_lr(spec, spec.requested_gpus)[0] == spec.per_gpu_batch * spec.requested_gpus
        assert spec.dataset_size == truth.dataset_size
        assert spec.max_per_gpu_batch == truth.accum_local_batch <= truth.max_local_batch
        assert spec.stopping.kind is StopKind.EPOCHS
        assert spec.stopping.total_samples(spec.dataset_size) == pytest.approx(truth.total_progress, rel=1e-12)


@pytest.mark.parametrize("folder,count", [("workloads-0.5", 80), ("workloads-1.5", 240)])
def test_load_variants(folder, count):
    assert len(load_pollux_workload(POLLUX / folder / "workload-6.csv")) == count


def test_max_jobs_and_explicit_traces_dir():
    path = POLLUX / "workloads" / "workload-6.csv"
    jobs = load_pollux_workload(path, traces_dir=TRACES, max_jobs=5)
    assert [j.spec.name for j in jobs] == [j.spec.name for j in load_pollux_workload(path)[:5]]
    with pytest.raises(ValueError):
        load_pollux_workload(path, max_jobs=0)


def test_names_are_slugged(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "CIFAR10 Job_7,5,cifar10,2,256\n")
    (job,) = load_pollux_workload(path, traces_dir=TRACES)
    assert job.spec.name == "cifar10-job-7"
    assert job.truth.restart_cost_s == 30.0


def _write(tmp_path, text, name="bad.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = "cifar10-0,10,cifar10,2,256\n"

ROW_ERRORS = [
    ("time-text", GOOD + "ncf-1,soon,ncf,1,32768\n", 2, "time"),
    ("time-negative", GOOD + "ncf-1,-5,ncf,1,32768\n", 2, "time"),
    ("time-nan", GOOD + "ncf-1,nan,ncf,1,32768\n", 2, "time"),
    ("time-empty", GOOD + "ncf-1,,ncf,1,32768\n", 2, "time"),
    ("replicas-zero", "ncf-1,1,ncf,0,32768\n", 1, "num_replicas"),
    ("replicas-fraction", "ncf-1,1,ncf,1.5,32768\n", 1, "num_replicas"),
    ("batch-zero", GOOD + "ncf-1,1,ncf,1,0\n", 2, "batch_size"),
    ("batch-text", GOOD + "ncf-1,1,ncf,1,big\n", 2, "batch_size"),
    ("application", GOOD + GOOD.replace("cifar10-0", "x-1").replace(",cifar10,", ",resnet,"), 2, "application"),
    ("duplicate", GOOD + GOOD, 2, "name"),
    ("bad-name", "___,1,ncf,1,32768\n", 1, "name"),
]


@pytest.mark.parametrize("case,body,row,field", ROW_ERRORS, ids=[c[0] for c in ROW_ERRORS])
def test_row_errors(tmp_path, case, body, row, field):
    path = _write(tmp_path, HEADER + body, name=f"{case}.csv")
    with pytest.raises(TraceError) as info:
        load_pollux_workload(path, traces_dir=TRACES)
    msg = str(info.value)
    assert f"{case}.csv" in msg and f"row {row}" in msg and repr(field) in msg
    assert info.value.row == row and info.value.field == field


def test_unknown_application_lists_models(tmp_path):
    path = _write(tmp_path, HEADER + "a-1,1,gpt,1,8\n")
    with pytest.raises(TraceError, match="cifar10, ncf, deepspeech2, bert, yolov3, imagenet"):
        load_pollux_workload(path, traces_dir=TRACES)


def test_wrong_field_count(tmp_path):
    path = _write(tmp_path, HEADER + GOOD + "ncf-1,1,ncf,1\n")
    with pytest.raises(TraceError, match=r"bad\.csv, row 2"):
        load_pollux_workload(path, traces_dir=TRACES)


@pytest.mark.parametrize(
    "header,field",
    [
        ("name,time,application,num_replicas\n", "batch_size"),
        ("name,time,application,num_replicas,batch_size,gpu_type\n", "gpu_type"),
        ("name,time,app,num_replicas,batch_size\n", "app"),
    ],
)
def test_column_errors(tmp_path, header, field):
    path = _write(tmp_path, header + "x-1,1,ncf,1,8\n")
    with pytest.raises(TraceError) as info:
        load_pollux_workload(path, traces_dir=TRACES)
    msg = str(info.value)
    assert "bad.csv" in msg and repr(field) in msg and "header" in msg
    assert "name, time, application, num_replicas, batch_size" in msg


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.csv.*not found"):
        load_pollux_workload(tmp_path / "nope.csv", traces_dir=TRACES)
    with pytest.raises(TraceError, match=r"empty\.csv.*empty file"):
        load_pollux_workload(_write(tmp_path, "", name="empty.csv"), traces_dir=TRACES)
    with pytest.raises(TraceError, match=r"header\.csv.*no data rows \(the file has only a header\)"):
        load_pollux_workload(_write(tmp_path, HEADER, name="header.csv"), traces_dir=TRACES)


def test_missing_profile(tmp_path):
    path = _write(tmp_path, HEADER + GOOD + "bert-1,3,bert,2,24\n")
    traces = tmp_path / "traces"
    traces.mkdir()
    with pytest.raises(TraceError) as info:  # no profile folders at all
        load_pollux_workload(path, traces_dir=traces)
    msg = str(info.value)
    assert "bad.csv" in msg and "row 1" in msg and "'application'" in msg and "cifar10" in msg
    shutil.copytree(TRACES / "cifar10", traces / "cifar10")
    shutil.copytree(TRACES / "bert", traces / "bert")
    (traces / "bert" / "placements.csv").unlink()
    with pytest.raises(TraceError) as info:  # bert's folder lacks placements.csv
        load_pollux_workload(path, traces_dir=traces)
    msg = str(info.value)
    assert "row 2" in msg and "placements.csv" in msg and "'application'" in msg
