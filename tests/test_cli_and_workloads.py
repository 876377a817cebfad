"""End to end through the simulator and the `ones simulate` command on small real workloads."""

import json

import pandas as pd
import pytest

from ones_pipeline.cli import main
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.runner import ALL_POLICIES, WorkloadSpec, detect_workload, run_one
from ones_pipeline.sim.truth import TraceError


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_completes_every_job_of_a_small_pollux_workload(traces, policy):
    spec = WorkloadSpec(traces / "pollux" / "workloads" / "workload-3.csv", "pollux", max_jobs=25)
    # Rounds of 120 s (the default is 60 s): completion does not depend on them, and pollux's search every
    # round made this the suite's slowest simulation (90-141 s under CI's load at 60 s).
    result = run_one(spec, policy, Cluster.uniform(4, 4), SimConfig(interval_s=120), seed=1)
    assert len(result.jobs) == 25
    for job in result.jobs:
        assert job.finish_s is not None and job.finish_s > job.submit_s
        assert job.first_start_s >= job.submit_s
        # A job cannot finish faster than its work allows on the whole cluster: GPU-seconds > 0.
        assert job.gpu_s > 0 and job.run_s <= job.jct_s + 1e-6
    # GPUs held never exceed the cluster: busy GPU-seconds fit in makespan x GPUs.
    assert result.busy_gpu_s <= 16 * result.makespan_s


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_completes_the_first_ones_trace_jobs(traces, policy):
    spec = WorkloadSpec(traces / "ones_sc21" / "trace_1.csv", "ones", max_jobs=12)
    result = run_one(spec, policy, Cluster.uniform(4, 4), SimConfig(interval_s=30), seed=0)
    assert all(j.finish_s is not None for j in result.jobs)


def test_simulate_command_writes_tables_json_and_plots(traces, tmp_path, capsys):
    out = tmp_path / "out"
    # The first 10 jobs: the 12th is an imagenet job, hours of simulated time on 8 GPUs (most of the test's time).
    rc = main(["simulate", "--workload", str(traces / "pollux" / "workloads" / "workload-1.csv"), "--jobs", "10",
               "--policies", "ones,fifo", "--gpus", "8", "--processes", "1", "--out", str(out), "--no-progress"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "ones" in table and "fifo" in table and "vs ones" in table
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"ones", "fifo"}
    for stats in summary["policies"].values():
        assert stats["p99_jct_s"] >= stats["p95_jct_s"] >= stats["median_jct_s"] > 0
        assert 0 < stats["utilisation"] <= 1
    jobs = pd.read_csv(out / "jobs-fifo.csv")
    assert len(jobs) == 10 and (jobs["jct_s"] >= jobs["run_s"] - 1e-6).all()
    assert summary["policies"]["fifo"]["mean_jct_s"] == pytest.approx(jobs["jct_s"].mean())
    for png in ("jct_cdf.png", "gpus-ones.png", "gpus-fifo.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parallel_processes_give_the_same_result_as_serial(traces, tmp_path):
    args = ["simulate", "--workload", str(traces / "pollux" / "workloads" / "workload-2.csv"), "--jobs", "6",
            "--policies", "ones,tiresias", "--gpus", "8", "--no-progress"]
    assert main(args + ["--processes", "1", "--out", str(tmp_path / "a")]) == 0
    assert main(args + ["--processes", "2", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())["policies"]
    b = json.loads((tmp_path / "b" / "summary.json").read_text())["policies"]
    for policy in a:
        for key in ("mean_jct_s", "makespan_s", "restarts"):
            assert a[policy][key] == b[policy][key]


def test_bad_workloads_fail_with_file_row_and_field(tmp_path, capsys):
    bad = tmp_path / "w.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,2,256\nx-1,5,resnet,2,128\n")
    assert main(["simulate", "--workload", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "w.csv, row 2, field 'application'" in err and "allowed" in err
    header = tmp_path / "h.csv"
    header.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="header"):
        detect_workload(header)
    with pytest.raises(TraceError, match="not found"):
        detect_workload(tmp_path / "missing.csv")
    negative = tmp_path / "n.csv"
    negative.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,-5,cifar10,2,256\n")
    assert main(["simulate", "--workload", str(negative), "--no-progress"]) == 2
    assert "row 1, field 'time'" in capsys.readouterr().err


def test_bad_options_are_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "x.csv", "--policies", "nope"])
    assert "allowed: ones,ones-paper" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "x.csv", "--gpus", "0"])
    with pytest.raises(SystemExit):
        main(["simulate", "--workload", "x.csv", "--restart-cost-by-model", "imagenet=-3"])
    assert "MODEL=SECONDS" in capsys.readouterr().err


def test_an_absurd_arrival_time_is_rejected_with_file_row_and_field(tmp_path, capsys):
    """Fuzzing found that an arrival of 1e99 ran the simulation away and ended in a traceback."""
    bad = tmp_path / "far.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nj1,0,cifar10,1,128\nj2,1e99,cifar10,1,128\n")
    assert main(["simulate", "--workload", str(bad), "--policies", "fifo", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "far.csv, row 2, field 'time'" in err and "1e99" in err and "allowed: a number in [0," in err


def test_an_ones_trace_away_from_its_calibration_data_names_the_option(traces, tmp_path, capsys):
    trace = tmp_path / "trace_1.csv"
    trace.write_text((traces / "ones_sc21" / "trace_1.csv").read_text())
    args = ["simulate", "--workload", str(trace), "--jobs", "3", "--policies", "fifo", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "job_history.csv: not found" in err and "--history DIR" in err and "pollux_traces_dir" not in err
    assert main([*args, "--history", str(traces / "ones_sc21")]) == 0
    assert "fifo" in capsys.readouterr().out
