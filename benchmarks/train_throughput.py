"""Throughput of the built-in workloads and the cost of a stop + resume and of a resize.

Samples/s (steady state, as the step reports it to MLflow) at 1, 2 and 4 processes and two per-process
batch sizes; then, on a longer run, the seconds from SIGTERM to a clean exit (checkpoint written, MLflow
run KILLED), from relaunch to the first progress after the checkpoint (resume), and the same for a relaunch
at another process count and batch (resize). On this 2-core machine 4 processes oversubscribe the CPU.

    python benchmarks/train_throughput.py [--models mlp-digits,cnn-digits] [--slots 1,2,4] [--batches 16,64]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ones_pipeline.adapters.mlflow import read_progress
from ones_pipeline.train.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


GPU = False  # --gpu: processes on GPUs 0..n-1 instead of CPU slots


def cmd(model, name, slots, batch, state, uri, epochs, generation=0):
    where = ["--gpus", ",".join(str(i) for i in range(slots))] if GPU else ["--slots", str(slots)]
    return [sys.executable, "-m", "ones_pipeline.train", "--model", model, "--name", name, "--epochs", str(epochs),
            "--per-gpu-batch", str(batch), "--base-lr", "0.01", *where,
            "--global-batch", str(batch * slots), "--generation", str(generation), "--state-dir", str(state),
            "--tracking-uri", uri]


def throughput(model, slots, batch, tmp: Path, uri: str, epochs: float) -> float:
    name = f"tp-{model}-{slots}-{batch}"
    subprocess.run(cmd(model, name, slots, batch, tmp / name, uri, epochs), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(read_progress(uri, "ones", [name])[name].metrics.get("samples_per_s", float("nan")))


def wait_for(predicate, timeout=300.0, poll=0.05) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(poll)
    raise TimeoutError("condition not reached")


def stop_resume_costs(model: str, tmp: Path, uri: str) -> dict[str, float]:
    name, state = "costs", tmp / "costs"
    out = {}
    first = 1 if GPU else 2
    proc = subprocess.Popen(cmd(model, name, first, 16, state, uri, 50), cwd=ROOT, stderr=subprocess.DEVNULL)
    out["start_to_first_checkpoint_s"] = wait_for(lambda: (state / "checkpoint-latest.pt").exists())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out["stop_s"] = time.monotonic() - t0
    for label, slots, batch, gen in (("resume", first, 16, 1), ("resize", 1, 48, 2)):
        done = load_checkpoint(state)["progress"]["samples_done"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd(model, name, slots, batch, state, uri, 50, gen), cwd=ROOT,
                                stderr=subprocess.DEVNULL)
        wait_for(lambda done=done: read_progress(uri, "ones", [name]).get(name) is not None
                 and read_progress(uri, "ones", [name])[name].samples_done > done)
        out[f"{label}_to_progress_s"] = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp-digits,cnn-digits")
    parser.add_argument("--slots", default="1,2,4")
    parser.add_argument("--batches", default="16,64", help="per-process batch sizes")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--gpu", action="store_true", help="run the processes on GPUs instead of CPU slots")
    args = parser.parse_args()
    global GPU
    GPU = args.gpu
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        slots = [int(s) for s in args.slots.split(",")]
        batches = [int(b) for b in args.batches.split(",")]
        print(f"steady-state samples/s ({args.epochs:g} epochs per run)")
        print(f"{'model':<26}{'batch/proc':>11}" + "".join(f"{f'{s} proc':>11}" for s in slots))
        for model in args.models.split(","):
            for batch in batches:
                cells = [throughput(model, s, batch, tmp, uri, args.epochs) for s in slots]
                print(f"{model:<26}{batch:>11}" + "".join(f"{c:>11.0f}" for c in cells), flush=True)
        costs = stop_resume_costs(args.models.split(",")[-1], tmp, uri)
        print("\nstop / resume / resize (seconds, includes process start and imports):")
        for key, value in costs.items():
            print(f"  {key:<28}{value:>7.2f}")


if __name__ == "__main__":
    main()
