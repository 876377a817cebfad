"""Launch overhead of one generation on Slurm against the subprocess launcher, and a resize cycle's time.

    eval "$(scripts/slurm.sh start)"          # as root: the private 2-node cluster with fake GPUs
    .venv/bin/python benchmarks/slurm_launch.py [--reps 3]

For each launcher, ``--reps`` times: ``dg.materialize`` of one partition (a small cnn-digits job on 2
slots; on Slurm, 2 fake GPUs on n1, and 1+1 across n1 and n2), measured from the start of the Dagster
step to the moment rank 0 has built its model and opened its MLflow run (the ``mlflow_run`` progress
event: all ranks have rendezvoused, so training starts), i.e. start-up a resize pays before it trains.
Then a resize cycle on Slurm: a generation on 2 GPUs is cancelled once it trains (Dagster's interrupt ->
``scancel --signal=TERM`` -> checkpoint -> job gone), and the next generation on 4 GPUs across both nodes
starts training; the cycle's time is from the cancel to the new ranks training. Prints medians and the
ratio Slurm / subprocess, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
JOB = "model: cnn-digits\nper_gpu_batch: 16\nbase_lr: 0.02\nmax_lr: 0.16\nmax_gpus: 4\nstopping: {epochs: %s}\n"


def project(root: Path, kind: str) -> Path:
    (root / "resources").mkdir(parents=True)
    (root / "assets" / "jobs").mkdir(parents=True)
    if kind == "slurm":
        env = (f"cluster:\n  slurm: {{partition: gpu, slurm_conf: {os.environ['SLURM_CONF']}}}\n"
               "launcher: {kind: slurm, grace_period_s: 15, slurm: {rank_device: cpu}}\n")
    else:
        env = "cluster: {gpus: none, cpu_slots: 4}\nlauncher: {kind: subprocess, grace_period_s: 15}\n"
    (root / "resources" / f"{kind}.yaml").write_text(env)
    (root / "assets" / "jobs" / "bench.yaml").write_text(JOB % 1)
    return root


def rows(state_dir: Path) -> list[dict]:
    path = state_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def generation(root: Path, kind: str, slots, gen: int, cancel_when_training: bool = False) -> dict:
    """Materialize one generation; the times (wall clock) of its start, ranks training, cancel, end."""
    from ones_pipeline.config import load_job_spec
    from ones_pipeline.definitions import build_definitions
    from ones_pipeline.defs import slurm_step
    from ones_pipeline.defs.assets import training_job
    from ones_pipeline.scheduler import RunAllocation

    defs = build_definitions(str(root), kind)
    spec = load_job_spec(root / "assets" / "jobs" / "bench.yaml")
    device = "gpu" if kind == "slurm" else "cpu"
    alloc = RunAllocation.make(spec, tuple(slots), device, spec.per_gpu_batch * len(slots), gen)
    state_dir = root / ".ones/state/jobs/bench"
    marks: dict = {}
    real = slurm_step.job_state

    def job_state(job_id, conf=None):
        state = real(job_id, conf)
        if cancel_when_training and "cancel" not in marks and any(
                r.get("event") == "mlflow_run" and r.get("generation") == gen for r in rows(state_dir)):
            marks["cancel"] = time.time()
            raise DagsterExecutionInterruptedError("benchmark: preempted")
        return state

    slurm_step.job_state = job_state
    try:
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("training_jobs", ["bench"])
            marks["start"] = time.time()
            dg.materialize([training_job], partition_key="bench", instance=instance, raise_on_error=False,
                           run_config={"ops": {"training_job": {"config": {"allocation": alloc.to_json()}}}},
                           resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
            marks["end"] = time.time()
    finally:
        slurm_step.job_state = real
    opened = [r["time_s"] for r in rows(state_dir) if r.get("event") == "mlflow_run" and r.get("generation") == gen]
    marks["training"] = opened[0] if opened else float("nan")
    return marks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    if not os.environ.get("SLURM_CONF"):
        print("no SLURM_CONF: start the private cluster first (eval \"$(scripts/slurm.sh start)\")")
        return 2
    start_up: dict[str, list[float]] = {}
    cases = [("subprocess", "subprocess", [0, 1]), ("slurm 1 node x 2", "slurm", [0, 1]),
             ("slurm 2 nodes x 1", "slurm", [0, 4])]
    for label, kind, slots in cases:
        for rep in range(args.reps):
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["ONES_PROJECT_DIR"], os.environ["ONES_ENV"] = tmp, kind
                m = generation(project(Path(tmp), kind), kind, slots, 0)
            start_up.setdefault(label, []).append(m["training"] - m["start"])
            print(f"{label:18s} rep {rep}: step start -> ranks training {start_up[label][-1]:.2f} s", flush=True)
    cycles = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["ONES_PROJECT_DIR"], os.environ["ONES_ENV"] = tmp, "slurm"
            root = project(Path(tmp), "slurm")
            (root / "assets" / "jobs" / "bench.yaml").write_text(JOB % 50)
            first = generation(root, "slurm", [0, 1], 0, cancel_when_training=True)
            second = generation(root, "slurm", [0, 1, 4, 5], 1, cancel_when_training=True)
        cycles.append(second["training"] - first["cancel"])
        print(f"resize cycle rep {rep}: cancel -> checkpoint -> job gone {first['end'] - first['cancel']:.2f} s, "
              f"-> new ranks training {cycles[-1]:.2f} s", flush=True)
    base = statistics.median(start_up["subprocess"])
    print("\nmedian start-up (step start -> ranks training), and the ratio to the subprocess launcher:")
    for label, values in start_up.items():
        print(f"  {label:18s} {statistics.median(values):6.2f} s   x{statistics.median(values) / base:.2f}")
    print(f"median resize cycle on Slurm (2 GPUs on n1 -> 4 GPUs on n1+n2): {statistics.median(cycles):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
