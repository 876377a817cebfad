"""What a change of a running job's slot count costs, in place (``train.resize_control``) and through the
checkpoint path, measured in one run on real training (cnn-digits, gloo, CPU slots).

In place: one launcher (``python -m ones_pipeline.train``) trains on ``--slots // 2`` slots (at least 1);
``request_resize`` grows it to ``--slots`` and shrinks it back, ``--repeats`` times each. Checkpoint path: what
the scheduler does today without it, less Dagster's own run start (queueing, run worker: 3-5 s more, see
docs/live.md): the generation is asked to stop through its preemption file (it checkpoints and exits), and a
new launcher starts at the other count from the checkpoint, ``--repeats`` times each way.

Every rank logs each optimizer step (``benchmarks/step_log.py``, the job's command), so for each change:

* **training lost**: seconds in which no member trains, from the end of the last step at the old size to the
  start of the first step at the new size (new processes that warm up while the old ones train cost nothing);
* **latency**: from the request to the end of the first step at the new size.

It prints both per change and writes their medians as JSON: ``in_place_grow_s``, ``in_place_shrink_s``,
``restart_grow_s``, ``restart_shrink_s`` (training lost) and the same names ending in ``_latency_s``, with
every sample and the ratios in place / checkpoint path.

    python benchmarks/resize_cost.py --slots 2 --json OUT.json [--repeats 3] [--settle 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ones_pipeline.config.layout import PROGRESS_FILE, preempt_request_file
from ones_pipeline.train.resize_control import request_resize

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"name": "resize-cost", "model": "cnn-digits", "dataset_size": 1437, "per_gpu_batch": 32, "base_lr": 0.01,
        "max_lr": 0.04, "requested_gpus": 1, "stopping": {"kind": "epochs", "epochs": 100000},
        "command": ["python", str(ROOT / "benchmarks" / "step_log.py")]}


def launcher(state: Path, slots: int, generation: int, log) -> subprocess.Popen:
    (state.parent / "spec.json").write_text(json.dumps(SPEC))
    return subprocess.Popen([sys.executable, "-m", "ones_pipeline.train", "--spec", str(state.parent / "spec.json"),
                             "--slots", str(slots), "--generation", str(generation), "--state-dir", str(state),
                             "--grace-period", "30"], cwd=ROOT, stdout=log, stderr=log)


def events(state: Path, name: str) -> list[dict]:
    path = state / PROGRESS_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in rows if r.get("event") == name]


def steps(state: Path) -> list[dict]:
    return [json.loads(line) for f in state.glob("steps-*.jsonl") for line in f.read_text().splitlines() if line]


def wait_for(what, timeout: float = 180.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := what()):
            return found
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the launcher exited with {proc.returncode} (see its log)")
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:.0f} s")


def cost(state: Path, requested: float, old: tuple[int, int], new: tuple[int, int]) -> tuple[float, float]:
    """(training lost, latency) of the change requested at ``requested`` from (world size, generation) ``old``
    to ``new``, from the ranks' step logs."""
    rows = steps(state)
    after = [r for r in rows if (r["world"], r["gen"]) == new and r["t0"] >= requested]
    first = min(after, key=lambda r: r["t0"])
    before = [r["t1"] for r in rows if (r["world"], r["gen"]) == old and r["t1"] <= first["t0"]]
    first_end = min(r["t1"] for r in after if r["t0"] == first["t0"])
    return first["t0"] - max(before), first_end - requested


def new_steps(state: Path, world: int, gen: int, since: float, n: int = 5) -> bool:
    return sum(r["world"] == world and r["gen"] == gen and r["t0"] >= since for r in steps(state)) >= n


def in_place(tmp: Path, small: int, big: int, repeats: int, settle: float, log) -> dict[str, list]:
    state = tmp / "in-place" / "job"
    state.mkdir(parents=True)
    out: dict[str, list] = {"grow": [], "shrink": []}
    proc = launcher(state, small, 0, log)
    try:
        wait_for(lambda: new_steps(state, small, 0, 0.0), proc=proc)
        for _ in range(repeats):
            for kind, (a, b) in (("grow", (small, big)), ("shrink", (big, small))):
                t = time.time()
                request_resize(state, 0, list(range(b)))
                wait_for(lambda b=b, t=t: new_steps(state, b, 0, t), proc=proc)
                time.sleep(settle)
                out[kind].append(cost(state, t, (a, 0), (b, 0)))
                print(f"in place   {kind:<6} {a} -> {b}: {out[kind][-1][0]:5.2f} s lost, "
                      f"{out[kind][-1][1]:5.2f} s latency", flush=True)
        fallbacks = events(state, "resize_fallback")
        if fallbacks:
            raise SystemExit(f"in-place changes fell back to the checkpoint: {fallbacks}")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return out


def restart(tmp: Path, small: int, big: int, repeats: int, settle: float, log) -> dict[str, list]:
    state = tmp / "restart" / "job"
    state.mkdir(parents=True)
    out: dict[str, list] = {"grow": [], "shrink": []}
    gen, size = 0, small
    proc = launcher(state, small, gen, log)
    wait_for(lambda: new_steps(state, small, 0, 0.0), proc=proc)
    try:
        for _ in range(repeats):
            for kind, b in (("grow", big), ("shrink", small)):
                t = time.time()
                preempt_request_file(state, gen).write_text(json.dumps({"reason": "resize_cost"}))
                if proc.wait(timeout=120) != 0:
                    raise SystemExit(f"generation {gen} did not stop cleanly ({proc.returncode})")
                proc = launcher(state, b, gen + 1, log)
                wait_for(lambda b=b, g=gen + 1, t=t: new_steps(state, b, g, t), proc=proc)
                time.sleep(settle)
                out[kind].append(cost(state, t, (size, gen), (b, gen + 1)))
                print(f"checkpoint {kind:<6} {size} -> {b}: {out[kind][-1][0]:5.2f} s lost, "
                      f"{out[kind][-1][1]:5.2f} s latency", flush=True)
                gen, size = gen + 1, b
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return out


def summary(inplace: dict[str, list], restarted: dict[str, list]) -> dict:
    res: dict = {}
    for path, data in (("in_place", inplace), ("restart", restarted)):
        for kind in ("grow", "shrink"):
            res[f"{path}_{kind}_s"] = round(statistics.median(lost for lost, _ in data[kind]), 3)
            res[f"{path}_{kind}_latency_s"] = round(statistics.median(lat for _, lat in data[kind]), 3)
            res[f"{path}_{kind}_samples"] = [[round(a, 3), round(b, 3)] for a, b in data[kind]]
    for kind in ("grow", "shrink"):
        res[f"ratio_{kind}"] = round(res[f"in_place_{kind}_s"] / res[f"restart_{kind}_s"], 3)
        res[f"ratio_{kind}_latency"] = round(res[f"in_place_{kind}_latency_s"] / res[f"restart_{kind}_latency_s"], 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=2, help="the larger slot count; the smaller is half of it (>= 1)")
    ap.add_argument("--repeats", type=int, default=3, help="changes of each kind per path (>= 3 for the medians)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of training after each change")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    if args.slots < 2:
        ap.error("--slots must be >= 2 (a change needs two sizes)")
    small, big = max(args.slots // 2, 1), args.slots
    with tempfile.TemporaryDirectory(prefix="resize-cost-") as tmp, open(Path(tmp) / "launchers.log", "w") as log:
        try:
            inplace = in_place(Path(tmp), small, big, args.repeats, args.settle, log)
            restarted = restart(Path(tmp), small, big, args.repeats, args.settle, log)
        except SystemExit:
            log.flush()
            print((Path(tmp) / "launchers.log").read_text()[-4000:], file=sys.stderr)
            raise
    res = {"slots": [small, big], "repeats": args.repeats, **summary(inplace, restarted)}
    print(f"\n{'change':<8} {'in place lost':>14} {'checkpoint lost':>16} {'ratio':>6} {'in place latency':>17} "
          f"{'checkpoint latency':>19}")
    for kind in ("grow", "shrink"):
        print(f"{kind:<8} {res[f'in_place_{kind}_s']:>12.2f} s {res[f'restart_{kind}_s']:>14.2f} s "
              f"{res[f'ratio_{kind}']:>6.3f} {res[f'in_place_{kind}_latency_s']:>15.2f} s "
              f"{res[f'restart_{kind}_latency_s']:>17.2f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
