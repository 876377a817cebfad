"""The five findings of issue 40, each as a named case through the command line (in process, and the real
``ones`` for the hangs): each failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fuzz_values import within

from ones_pipeline.cli import main
from ones_pipeline.config import load_job_specs

GOOD = {"model": "mlp-digits", "per_gpu_batch": 32, "base_lr": 0.05, "max_lr": 0.2, "stopping": {"epochs": 2}}
ONES = [str(Path(sys.executable).parent / "ones")]


def project(tmp_path: Path, env: str = "cluster: {gpus: none, cpu_slots: 1}\n") -> Path:
    (tmp_path / "resources").mkdir(parents=True, exist_ok=True)
    (tmp_path / "resources" / "local.yaml").write_text(env)
    (tmp_path / "assets" / "jobs").mkdir(parents=True, exist_ok=True)
    return tmp_path


def refused_in_one_line(capsys, argv: list[str], *needles: str) -> str:
    with within():
        code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"ones {argv[0]}: "), err
    assert len(err[0]) < 800, err[0][:300]
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def spec_text(**changes) -> str:
    return yaml.safe_dump({**GOOD, **changes})


# -- finding 1: a spec that stopped every tick is refused at submit (and quarantined at the tick:
#    tests/test_scheduler.py::test_a_spec_that_would_fail_the_tick_is_quarantined_and_the_others_are_scheduled)
@pytest.mark.parametrize("text, field", [
    ("max_lr: .nan", "max_lr"),
    ("max_lr: .inf", "max_lr"),
    ("base_lr: 1.0e-300\nmax_lr: 1.0e+10", "base_lr"),
    ("requested_gpus: 100000000000000000000", "requested_gpus"),
    ("stopping: {epochs: .inf}", "stopping.epochs"),
    ("stopping: {epochs: 2, min_delta: .nan}", "stopping.min_delta"),  # NaN in a field the rule ignores
    ('name: "job\\n"', "name"),  # the name pattern's "$" accepted a trailing newline
])
def test_finding1_a_spec_that_stopped_every_tick_is_refused_by_submit(tmp_path, capsys, text, field):
    proj = project(tmp_path / "p")
    given = {line.split(":")[0] for line in text.splitlines()}
    base = {k: v for k, v in GOOD.items() if k not in given}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(base) + text + "\n")
    refused_in_one_line(capsys, ["submit", "--project", str(proj), str(path)], f"field '{field}'")
    assert not list((proj / "assets" / "jobs").iterdir())  # nothing submitted


# -- finding 2: --fresh deleted the project
@pytest.mark.parametrize("state_dir", [".", "''"])
def test_finding2_fresh_never_deletes_the_project(tmp_path, capsys, state_dir):
    proj = project(tmp_path, f"state_dir: {state_dir}\ncluster: {{gpus: none}}\n")
    (proj / "assets" / "jobs" / "a.yaml").write_text(spec_text())
    (proj / "dagster").mkdir()  # what `ones init` leaves: it satisfied the old safety check
    refused_in_one_line(capsys, ["run", "--project", str(proj), "--fresh"], "--fresh refuses to clear")
    assert (proj / "assets" / "jobs" / "a.yaml").exists() and (proj / "resources" / "local.yaml").exists()


# -- finding 3: a 485-byte alias bomb hung `ones submit` and every tick
# Anchors under `stopping` (a known field), the expansion in `model`: the old message printed all 9^9 values.
BOMB = "stopping:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "model: *i\n"


def test_finding3_an_alias_bomb_is_refused_at_once_by_the_real_command(tmp_path):
    proj = project(tmp_path / "p")
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 600
    t0 = time.monotonic()
    out = subprocess.run([*ONES, "submit", "--project", str(proj), str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and time.monotonic() - t0 < 30
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "expands to more than 10000 values" in lines[0], lines[:3]


def test_finding3_the_sensor_loader_skips_an_alias_bomb_and_keeps_the_others(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "bomb.yaml").write_text(BOMB)
    (jobs / "good.yaml").write_text(spec_text())
    with within(5):
        specs, errors = load_job_specs(jobs)
    assert list(specs) == ["good"] and len(errors) == 1 and len(str(errors[0])) < 300


# -- finding 4: huge integers in a trace hung the simulator
@pytest.mark.parametrize("header, row, field", [
    ("name,time,application,num_replicas,batch_size", "a,0,cifar10,1000000000000000000,128", "num_replicas"),
    ("name,time,application,num_replicas,batch_size", "a,0,cifar10,9223372036854775808,128", "num_replicas"),
    ("name,time,application,num_replicas,batch_size", "a,0,cifar10,1,1000000000000000", "batch_size"),
    ("time,model,task,epoch_size,patience,batch_size,lr,max_lr,target_acc,num_gpus",
     "0,bert,cola,1000000000000,5,16,5e-06,2e-5,0.8,2", "epoch_size"),
    ("time,model,task,epoch_size,patience,batch_size,lr,max_lr,target_acc,num_gpus",
     "0,bert,cola,8000,5,16,5e-06,2e-5,0.8,1000000000000000000", "num_gpus"),
])
def test_finding4_huge_integers_in_a_trace_are_one_line_not_a_hang(tmp_path, capsys, header, row, field):
    path = tmp_path / "trace.csv"
    path.write_text(f"{header}\n{row}\n")
    with within(60):
        code = main(["simulate", "--workload", str(path), "--policies", "fifo", "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ones simulate:")]
    assert code == 2 and len(err) == 1, err
    assert f"{path}, row 1, field '{field}': out-of-range value" in err[0] and "allowed: an integer in [1, " in err[0]


# -- finding 5: tracebacks instead of errors
@pytest.mark.parametrize("data, needle", [
    (b"model: caf\xe9\n", "not UTF-8 text"),  # latin-1
    ("model: mlp-digits\n".encode("utf-16"), "not UTF-8 text"),
    (bytes(range(256)), "not UTF-8 text"),
    (b"model: mlp-digits\nper_gpu_batch: !!float abc\n", "YAML tag"),
    (b"model: mlp-digits\nper_gpu_batch: !!timestamp 2001-12-14\n", "YAML tag"),
    (b"model: 2001-13-45\nper_gpu_batch: 32\nstopping: {epochs: 1}\n", "unknown built-in model '2001-13-45'"),
    (b"1: a\nmodel: mlp-digits\n", "field names are text"),
])
def test_finding5_bad_spec_files_are_one_line(tmp_path, capsys, data, needle):
    proj = project(tmp_path / "p")
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    refused_in_one_line(capsys, ["submit", "--project", str(proj), str(path)], needle)


@pytest.mark.parametrize("env, needle", [
    ("cluster: {cpu_slots: 1099511627776}\n", "an integer in [1, 1024]"),  # beyond a C int
    ("state_dir: /proc/self/ones\n", "is under /proc"),
    ("state_dir: afile/state\n", "is a file, not a directory"),
    ("scheduler: {tick_interval_s: .nan}\n", "expected int"),
    ("launcher: {grace_period_s: .inf}\n", "non-finite value inf"),
])
def test_finding5_bad_environments_are_one_line(tmp_path, capsys, env, needle):
    proj = project(tmp_path, env)
    (proj / "afile").write_text("x")
    refused_in_one_line(capsys, ["status", "--project", str(proj)], needle)


def test_a_fifo_or_a_link_to_an_endless_file_in_the_jobs_folder_is_refused_not_read(tmp_path):
    import os

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.mkfifo(jobs / "fifo.yaml")  # reading it would block every tick
    (jobs / "zero.yaml").symlink_to("/dev/zero")  # reading it would never end
    (jobs / "big.yaml").write_bytes(b"#" * (2 << 20))
    (jobs / "good.yaml").write_text(spec_text())
    with within(5):
        specs, errors = load_job_specs(jobs)
    assert list(specs) == ["good"]
    assert sorted((os.path.basename(e.path), str(e).split(": ", 1)[1]) for e in errors) == [
        ("big.yaml", "larger than 1048576 bytes; not a job spec or environment"),
        ("fifo.yaml", "not a regular file"), ("zero.yaml", "not a regular file")]
