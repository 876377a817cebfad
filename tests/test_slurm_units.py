"""The Slurm adapter's parsing and the launcher's job shape, without a cluster (the real thing is in
test_slurm.py)."""

from pathlib import Path

import pytest

from ones_pipeline.adapters.slurm import JobState, SlurmNode, _fields, gres_gpus, rendezvous_port


@pytest.mark.parametrize("gres, gpus", [("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8), ("gpu:2,shard:8", 2),
                                        ("gpu:a100:2,gpu:v100:1", 3), ("", 0), ("(null)", 0), ("shard:4", 0)])
def test_gres_gpus(gres, gpus):
    assert gres_gpus(gres) == gpus


def test_node_usability_and_reason():
    ok = SlurmNode("n1", "10.0.0.1", "mixed", (), 4, "")
    drained = SlurmNode("n2", "10.0.0.2", "idle", ("DRAIN",), 4, "disk swap")
    down = SlurmNode("n3", "10.0.0.3", "down", ("NOT_RESPONDING",), 4, "")
    assert ok.usable and not drained.usable and not down.usable
    assert drained.why_unusable() == "n2: idle+drain (disk swap)"
    assert down.why_unusable() == "n3: down+not_responding"


def test_scontrol_fields_and_job_states():
    line = "JobId=7 JobName=ones-a-g0 JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n1 NodeList=(null)"
    f = _fields(line)
    assert f["JobState"] == "PENDING" and f["Reason"].startswith("ReqNodeNotAvail")
    assert JobState("7", "PENDING", "", "", "").pending and JobState("7", "RUNNING", "", "n1", "").active
    assert not JobState("7", "COMPLETED", "", "n1", "0:0").active


def test_rendezvous_port_differs_per_generation_and_is_stable():
    ports = {rendezvous_port("job-a", g) for g in range(50)}
    assert len(ports) >= 45 and all(20000 <= p < 40000 for p in ports)
    assert rendezvous_port("job-a", 3) == rendezvous_port("job-a", 3) != rendezvous_port("job-b", 3)
    assert rendezvous_port("job-a", 3, "run-1") != rendezvous_port("job-a", 3, "run-2")


def test_sbatch_args_one_shape_per_node_counts(tmp_path: Path):
    """Equal GPU counts per node: --nodes/--ntasks-per-node; different counts: one heterogeneous component
    per node, so each node holds exactly its GPUs."""
    from ones_pipeline.config import parse_env
    from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
    from ones_pipeline.defs.slurm_step import _sbatch_args
    from ones_pipeline.scheduler import RunAllocation

    env = parse_env({"cluster": {"slurm": {"partition": "gpu"}},
                     "launcher": {"kind": "slurm", "slurm": {"sbatch_args": ["--account=ml"]}}},
                    tmp_path / "slurm.yaml", tmp_path, "slurm")
    spec = JobSpec(name="a", model="mlp-digits", dataset_size=100, per_gpu_batch=8, base_lr=0.1,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=1))
    n1, n2 = SlurmNode("n1", "127.0.0.1", "idle", (), 4, ""), SlurmNode("n2", "127.0.0.1", "idle", (), 4, "")
    even = RunAllocation.make(spec, (0, 1, 4, 5), "gpu", 32, 2)
    args, het = _sbatch_args(env, even, [(n1, 2), (n2, 2)], tmp_path)
    assert het == "" and ":" not in args
    assert {"--nodelist=n1,n2", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=1", "--account=ml",
            "--job-name=ones-a-g2"} <= set(args)
    uneven = RunAllocation.make(spec, (0, 1, 2, 4), "gpu", 32, 3)
    args, het = _sbatch_args(env, uneven, [(n1, 3), (n2, 1)], tmp_path)
    assert het == "--het-group=0-1 " and args.count(":") == 1
    first, second = args[:args.index(":")], args[args.index(":") + 1:]
    assert {"--nodelist=n1", "--ntasks=3"} <= set(first) and {"--nodelist=n2", "--ntasks=1"} <= set(second)


def test_output_tail_gives_the_last_non_empty_lines_for_a_failed_jobs_error(tmp_path: Path):
    from ones_pipeline.defs.slurm_step import _output_tail

    out = tmp_path / "slurm-7.out"
    assert _output_tail(out) == ""  # no output file yet
    out.write_text("".join(f"line {i}\n\n" for i in range(20)) + "Traceback: boom\n")
    assert _output_tail(out, lines=3) == "line 18\nline 19\nTraceback: boom"
    out.write_text("x" * 20000 + "\nlast words\n")  # only the end of a large file is read
    assert _output_tail(out, lines=1) == "last words"
