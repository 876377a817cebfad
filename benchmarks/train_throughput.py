"""Throughput of the built-in workloads and the cost of a stop + resume and of a resize.

Samples/s (steady state, as the step reports it to MLflow) at 1, 2 and 4 processes and two per-process
batch sizes; then, on a longer run, the seconds from SIGTERM to a clean exit (checkpoint written, MLflow
run KILLED), from relaunch to the first progress after the checkpoint (resume), and the same for a relaunch
at another process count and batch (resize). On this 2-core machine 4 processes oversubscribe the CPU.

``--gns-overhead``: instead, the cost of measuring the gradient noise scale. Each rank runs the built-in
workload's step loop through two sessions on the same process group, one measuring (the default
``Placement.noise_scale_budget``) and one not (budget 0), alternating blocks of steps between them (ABBA);
a step is timed whole (forward, backward with the probe's hooks, optimizer step and ``step_done``, where
the estimate is finished), by the wall clock and by the process's CPU time. No MLflow, no evaluation, no
checkpoint: they cost the same either way. Overhead: the median over pairs of neighbouring blocks (run
under the same load) of on / off - 1, and the ratio of the total times; also the probe's own account (its
CPU seconds per measurement over the measuring interval times the step's). ``--control`` runs off against
off: on a loaded machine, the noise floor of the same figures.

    python benchmarks/train_throughput.py [--models mlp-digits,cnn-digits] [--slots 1,2,4] [--batches 16,64]
    python benchmarks/train_throughput.py --gns-overhead [--batches 32] [--blocks 40] [--block-steps 32] [--runs 1]
        [--control]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
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
            *(["--tracking-uri", uri] if uri else [])]


def throughput(model, slots, batch, tmp: Path, uri: str, epochs: float) -> float:
    name = f"tp-{model}-{slots}-{batch}"
    subprocess.run(cmd(model, name, slots, batch, tmp / name, uri, epochs), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(read_progress(uri, "ones", [name])[name].metrics.get("samples_per_s", float("nan")))


def _gns_loops(model: str, rank: int, world: int, batch: int, state: Path, control: bool = False) -> dict:
    """Two copies of the built-in workload's training state, one session measuring the noise scale and one
    not (``control``: neither), both on the process group already initialised: ``{on: (session, model,
    optimizer, batches)}``."""
    import torch

    from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
    from ones_pipeline.train.api import Placement, TrainingSession
    from ones_pipeline.train.catalogue import resolve_workload
    from ones_pipeline.train.data import load_dataset
    from ones_pipeline.train.models import build_model
    from ones_pipeline.train.noise_probe import DEFAULT_BUDGET

    arch, dataset = resolve_workload(model)
    train, _, info = load_dataset(dataset)
    spec = JobSpec(name="gns-overhead", model=model, dataset_size=len(train), per_gpu_batch=batch,
                   requested_gpus=world, stopping=StoppingRule(StopKind.EPOCHS, epochs=10**6))
    loops = {}
    for on in (True, False):
        torch.manual_seed(0)
        net = build_model(arch, info.num_classes, info.input_shape)
        opt = torch.optim.SGD(net.parameters(), lr=0.01 * world, momentum=0.9)
        placement = Placement(spec=spec, rank=rank, world_size=world, global_batch=batch * world, lr=0.01 * world,
                              generation=0, state_dir=state / f"{on}-{rank}", tracking_uri=None, experiment="bench",
                              noise_scale_budget=DEFAULT_BUDGET if on and not control else 0.0)
        session = TrainingSession(placement, len(train), checkpoint_interval_s=1e9)
        net = session.prepare(net, opt)
        loops[on] = (session, net, opt, session.batches())
    return {"loops": loops, "data": train.tensors}


def gns_worker(model: str, rank: int, world: int, port: int, batch: int, blocks: int, block_steps: int,
               control: bool, state: Path) -> dict:
    """One rank of ``--gns-overhead``: the built-in step loop (as ``train.builtin``), in blocks of
    ``block_steps`` steps alternating between the two sessions (ABBA, so that a drifting load hits both
    alike); every step's full cycle is timed, ``step_done`` included. Per-step seconds of each block, and
    the probe's own account of itself (its interval, seconds per measurement and per step, observations)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    setup = _gns_loops(model, rank, world, batch, state, control)
    x, y = setup["data"]
    times: dict = {"on": [], "off": []}
    for b in range(2 * blocks):
        on = (b % 2 == 0) != (b // 2 % 2 == 1)
        session, net, opt, batches = setup["loops"][on]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(block_steps):
            idx = torch.as_tensor(next(batches), dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx], reduction="sum")
            opt.zero_grad(set_to_none=True)
            (loss * session.loss_scale()).backward()
            opt.step()
            session.step_done(loss=float(loss.detach()) / len(idx))
        times["on" if on else "off"].append(((time.perf_counter() - t0) / block_steps,
                                             (time.process_time() - c0) / block_steps))
    probe = setup["loops"][True][0]._gns
    times["probe"] = [probe.interval, probe.cost_s or 0.0, probe.step_s or 1.0, probe.smoother.observations]
    if world > 1:
        dist.destroy_process_group()
    return times


def _paired(on: list[float], off: list[float]) -> str:
    """Per-step ms off and on, the median over neighbouring blocks of on / off - 1, the ratio of the totals."""
    ratios = sorted(a / b - 1 for a, b in zip(on, off, strict=True))
    return (f"{statistics.median(off) * 1e3:>9.3f}{statistics.median(on) * 1e3:>8.3f}"
            f"{statistics.median(ratios):>+8.1%}{sum(on) / sum(off) - 1:>+8.1%}")


def _gns_run(model: str, n: int, batch: int, blocks: int, block_steps: int, control: bool, tmp: Path) -> dict:
    """One ``--gns-overhead`` measurement: ``n`` worker processes; rank 0's timings, warm-up blocks dropped."""
    port, out = _free_port(), tmp / f"gns-{model}-{n}.json"
    procs = [subprocess.Popen([sys.executable, __file__, "--gns-worker", json.dumps(
        [model, r, n, port, batch, blocks, block_steps, control, str(tmp), str(out) if r == 0 else ""])], cwd=ROOT)
        for r in range(n)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError(f"{model} on {n} process(es): a worker failed")
    times = json.loads(out.read_text())
    return {"on": times["on"][2:], "off": times["off"][2:], "probe": times["probe"]}


def gns_overhead(models: list[str], slots: list[int], batch: int, blocks: int, block_steps: int, control: bool,
                 runs: int, tmp: Path) -> None:
    print(f"gradient-noise-scale overhead{' (CONTROL: off against off)' if control else ''}: per-process batch "
          f"{batch}, {runs} run(s) of {blocks} blocks of {block_steps} steps each way, interleaved in the same "
          "processes; a step is a full cycle, step_done included.\n"
          "ms/step off and on (medians over blocks), overhead: median over neighbouring blocks, and ratio of totals"
          " (blocks of all runs pooled); wall clock, then process CPU time (rank 0); CPU runs: each run's ratio of"
          " totals; self: the probe's timing of its own work (last run)")
    print(f"{'model':<12}{'procs':>6}{'wall off':>9}{'on':>8}{'median':>8}{'total':>8}{'cpu off':>9}{'on':>8}"
          f"{'median':>8}{'total':>8}{'CPU runs':>18}{'self':>7}{'interval':>9}{'obs':>6}")
    for model in models:
        for n in slots:
            results = [_gns_run(model, n, batch, blocks, block_steps, control, tmp) for _ in range(runs)]
            on = [t for r in results for t in r["on"]]
            off = [t for r in results for t in r["off"]]
            per_run = sorted(sum(t[1] for t in r["on"]) / sum(t[1] for t in r["off"]) - 1 for r in results)
            interval, cost, cycle, obs = results[-1]["probe"]
            own = cost / (interval * cycle) if cost else 0.0  # seconds per measurement / seconds between them
            print(f"{model:<12}{n:>6}{_paired([t[0] for t in on], [t[0] for t in off])}"
                  f"{_paired([t[1] for t in on], [t[1] for t in off])}"
                  f"{f'[{per_run[0]:+.1%}, {per_run[-1]:+.1%}]':>18}{own:>7.2%}{interval:>9}{obs:>6}", flush=True)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    parser.add_argument("--gns-overhead", action="store_true", help="step time with and without the noise scale")
    parser.add_argument("--blocks", type=int, default=40, help="--gns-overhead: blocks of steps each way")
    parser.add_argument("--block-steps", type=int, default=32, help="--gns-overhead: steps per block")
    parser.add_argument("--control", action="store_true", help="--gns-overhead: off against off (the noise floor)")
    parser.add_argument("--runs", type=int, default=1, help="--gns-overhead: measurements per configuration")
    parser.add_argument("--gns-worker", help=argparse.SUPPRESS)  # one rank of --gns-overhead (JSON arguments)
    args = parser.parse_args()
    if args.gns_worker:
        *worker_args, state, out = json.loads(args.gns_worker)
        times = gns_worker(*worker_args, state=Path(state))
        if out:
            Path(out).write_text(json.dumps(times))
        return
    global GPU
    GPU = args.gpu
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.gns_overhead:
            gns_overhead(args.models.split(","), [int(s) for s in args.slots.split(",")],
                         int(args.batches.split(",")[0]), args.blocks, args.block_steps, args.control, args.runs, tmp)
            return
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
