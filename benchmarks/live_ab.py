"""Live A/B of scheduling policies: one job mix on the real pipeline under each policy, and the simulator's
prediction for the same mix.

For each policy in ``--policies`` (fifo, ones, pollux), one after the other, a fresh temporary project
(``resources/local.yaml``: 2 CPU slots, the subprocess launcher, MLflow and Dagster on sqlite, ticks every
``TICK_S`` s, the policy and ``--seed``) is run by ``ones run`` (the real Dagster daemon). The mix
(``--jobs`` jobs of the built-in workloads, lengths and arrival gaps drawn from ``--seed``) arrives
staggered: the first job's spec is in ``assets/jobs`` when ``ones run`` starts; every other one is written
there (atomically, as ``ones submit`` does) at its offset after the first job's start decision, and the
sensor takes it up at its next tick, whose time is the job's submit time (the JCT counts from it). The
first job is the longest, so the cluster never idles before the last arrival (``ones run`` would finish).

Printed per policy: mean JCT, makespan, restarts (generations beyond the first, summed), start-up (a run's
Dagster start -> its first training progress, mean), queued (its creation -> start, mean), the mean 1-min
load average while it ran (the cores may be shared: a busy machine slows, and skews, every figure) and the
ratios of mean JCT and makespan to fifo's; then the same from ``ones_pipeline.sim`` replaying each policy's
run as it ran (``adapters.live_as_ran``: its jobs' samples per wall-clock second beside the other jobs, its
start-up, submit offsets and sensor ticks; recorded per policy as ``as_ran`` in ``--json``), per-job JCTs
live and simulated, and each job's step-time rate against the wall-clock rate it really trained at.
Definitions: ``ones_pipeline/adapters/live_ab.py``, ``live_as_ran.py``.

Exit status 1 when a run does not finish within ``--timeout`` s (or fails); the other policies still run,
and the figures (and ``--json``) of those that finished are written. Every draw comes from
``numpy.random.default_rng(--seed)``.

    .venv/bin/python benchmarks/live_ab.py [--policies fifo,ones,pollux] [--seed 0] [--jobs 6]
                                           [--scale 0.7] [--timeout 1200] [--keep] [--json OUT]
                                           [--ones-params '{"min_hold_s": 0}']

``--ones-params``: options of ``ones`` (its project's ``policy.params``, and the prediction's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from ones_pipeline import reporting
from ones_pipeline.adapters.live_ab import (
    CPU_SLOTS,
    GPU_TEMPLATES,
    TEMPLATES,
    MixJob,
    draw_mix,
    gpu_slots,
    live_env,
    live_figures,
    pooled_step_times,
    ratios_to,
    run_each,
    run_timings,
    wall_rate,
)
from ones_pipeline.adapters.live_as_ran import mlflow_history, project_as_ran, replay
from ones_pipeline.adapters.live_report import FinishedJob
from ones_pipeline.config import EnvConfig, load_env
from ones_pipeline.scheduler.settings import live_policy_params

ONES = str(Path(sys.executable).parent / "ones")
SLOTS = CPU_SLOTS  # the GPUs found with --gpu
GPU = False  # --gpu: the cluster finds its GPUs (gpus: auto)
TICK_S = 5


# ------------------------------------------------------------------------------------------- one policy
class LiveRun:
    """``ones run`` on a fresh project under one policy, with the staggered submissions."""

    def __init__(self, root: Path, policy: str, seed: int, mix: list[MixJob], timeout_s: float,
                 params: dict | None = None):
        self.project, self.policy, self.mix, self.timeout_s = root / policy, policy, mix, timeout_s
        (self.project / "resources").mkdir(parents=True)
        (self.project / "assets" / "jobs").mkdir(parents=True)
        env = live_env(policy, seed, params, SLOTS, GPU, TICK_S)
        (self.project / "resources" / "local.yaml").write_text(yaml.safe_dump(env))
        self.env: EnvConfig = load_env(self.project)
        self.log_path = self.project / "ones-run.log"
        self.written: dict[str, float] = {}  # job -> unix seconds its spec was written
        self.load: list[float] = []  # the 1-min load average, sampled while it ran (the cores are shared)

    def submit(self, job: MixJob) -> None:
        target = self.env.jobs_dir / f"{job.name}.yaml"
        tmp = target.with_name(f".{job.name}.yaml.tmp")  # a dot file: the sensor skips it
        tmp.write_text(yaml.safe_dump(job.spec, sort_keys=False))
        tmp.replace(target)
        self.written[job.name] = time.time()

    def first_decision_s(self) -> float | None:
        try:
            line = self.env.layout.decisions.read_text().splitlines()[0]
            return float(json.loads(line)["time_s"])
        except (OSError, IndexError, ValueError, KeyError):
            return None

    def run(self) -> tuple[bool, float, str]:
        """(finished, wall seconds, why not). The first job is submitted before ``ones run`` starts."""
        self.submit(self.mix[0])
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(
                [ONES, "run", "--project", str(self.project), "--timeout", f"{self.timeout_s:.0f}",
                 "--status-every", "60"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "ONES_PROJECT_DIR": str(self.project)})
        pending, start = list(self.mix[1:]), None
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > self.timeout_s + 120:
                    return False, time.monotonic() - t0, "ones run did not stop after its timeout"
                start = start or self.first_decision_s()
                if len(self.load) < (time.monotonic() - t0) / 5:
                    self.load.append(os.getloadavg()[0])
                while start is not None and pending and time.time() >= start + pending[0].offset_s:
                    self.submit(pending.pop(0))
                time.sleep(0.5)
        finally:
            _stop(proc)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            return False, wall, f"ones run exited {proc.returncode} (log: {self.log_path})"
        if pending:
            return False, wall, (f"ones run finished before {', '.join(j.name for j in pending)} arrived "
                                 "(the cluster went idle): lengthen the first job")
        return True, wall, ""


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (``ones run`` drains: every step checkpoints), then SIGKILL after 90 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------------- records
def finished_jobs(instance) -> list[FinishedJob]:
    """The materialized jobs, as the report asset reads them (submit time from the run's allocation)."""
    import dagster as dg

    from ones_pipeline.defs.instance import TRAINING_ASSET

    key, out = dg.AssetKey(TRAINING_ASSET), []
    for job in sorted(instance.get_materialized_partitions(key)):
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[job]),
                                                  limit=1).records
        event = records[0].event_log_entry
        meta = {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}
        out.append(FinishedJob(job=job, submit_s=float(meta.get("submit_time_s") or event.timestamp),
                               finish_s=float(event.timestamp), accuracy=None, samples=None, restarts=0,
                               model=str(meta.get("model", ""))))
    return out


def collect(live: LiveRun) -> dict:
    """Everything measured in one policy's run: figures, runs, points, throughput observations."""
    from ones_pipeline.adapters.mlflow import read_progress
    from ones_pipeline.defs.instance import job_run_infos, open_instance

    env = live.env
    with open_instance(env) as instance:
        jobs, runs = finished_jobs(instance), job_run_infos(instance, env.job_state_dir)
    names = [j.name for j in live.mix]
    points = {name: mlflow_history(env, name)[0] for name in names}
    progress = read_progress(env.tracking_uri(), env.mlflow.experiment, names)
    figures = live_figures(jobs, runs, run_timings(runs, points), time.time())
    first = min(j.submit_s for j in jobs)
    # The first job's spec is written before `ones run` starts: its lag would be the start-up of Dagster.
    figures["arrival_lag_s"] = {j.job: j.submit_s - live.written[j.job] for j in jobs if j.job != live.mix[0].name}
    figures["submit_offset_s"] = {j.job: j.submit_s - first for j in jobs}
    figures["load"] = float(np.mean(live.load)) if live.load else math.nan
    return {"figures": figures, "runs": runs, "points": points, "as_ran": project_as_ran(env, names),
            "obs": {n: list(progress[n].throughput_obs) if n in progress else [] for n in names}}


# --------------------------------------------------------------------------------------------- printing
def _s(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.0f}"


def _r(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.2f}"


def summary_table(live: dict[str, dict], sim: dict[str, dict]) -> str:
    cols = [("policy", "<8"), ("mean JCT s", ">10"), ("makespan s", ">10"), ("restarts", ">8"), ("start-up s", ">10"),
            ("queued s", ">8"), ("load", ">4"), ("JCT/fifo", ">8"), ("mksp/fifo", ">9"), ("| sim JCT s", ">11"),
            ("sim mksp s", ">10"), ("sim rst", ">7"), ("JCT/fifo", ">8"), ("mksp/fifo", ">9")]
    lr, sr = ratios_to(live), ratios_to(sim)
    rows = []
    for p, f in live.items():
        s = sim.get(p, {})
        rows.append([p, _s(f["mean_jct_s"]), _s(f["makespan_s"]), str(f["restarts"]), _s(f["startup_s"]),
                     _s(f["queued_s"]), f"{f['load']:.1f}", _r(lr[p]["mean_jct_s"]), _r(lr[p]["makespan_s"]),
                     f"| {_s(s.get('mean_jct_s', math.nan))}", _s(s.get("makespan_s", math.nan)),
                     str(s.get("restarts", "-")), _r(sr.get(p, {}).get("mean_jct_s", math.nan)),
                     _r(sr.get(p, {}).get("makespan_s", math.nan))])
    return reporting.text_table(cols, rows)


def jobs_table(mix: list[MixJob], live: dict[str, dict], sim: dict[str, dict], results: dict[str, dict]) -> str:
    policies = list(live)
    cols = [("job", "<16"), ("length", "<15"), ("arrives s", ">9")]
    cols += [(f"{p} JCT live/sim", ">17") for p in policies] + [(f"{p} gens", ">9") for p in policies]
    rows = []
    for job in mix:
        field, length = next(iter(job.spec["stopping"].items()))
        row = [job.name, f"{length} {field}", f"{job.offset_s:.0f}"]
        row += [f"{_s(live[p]['jct_s'].get(job.name, math.nan))}/{_s(sim[p]['jct_s'].get(job.name, math.nan))}"
                for p in policies]
        row += [str(sum(1 for r in results[p]["runs"] if r.job == job.name and r.start_s is not None))
                for p in policies]
        rows.append(row)
    return reporting.text_table(cols, rows)


def rates_table(mix: list[MixJob], results: dict[str, dict], measured: dict) -> str:
    """Per job and slot count: samples/s by the step time (what the scheduler and the simulator use) and
    by the wall clock (what the runs achieved between their first and last progress point)."""
    cols = [("job", "<16"), ("1 slot step", ">11"), ("1 slot wall", ">11"), ("2 slots step", ">12"),
            ("2 slots wall", ">12")]
    rows = []
    for job in mix:
        row = [job.name]
        for n in (1, 2):
            steps = {b: t for (g, b), t in measured[job.name].items() if g == n}
            step_rate = max((n * b / t for b, t in steps.items()), default=math.nan)
            walls = [wall_rate(r["points"][job.name], [x for x in r["runs"] if x.job == job.name], n)
                     for r in results.values()]
            walls = [w for w in walls if math.isfinite(w)]
            row += [_s(step_rate), _s(float(np.mean(walls)) if walls else math.nan)]
        rows.append(row)
    return reporting.text_table(cols, rows)


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo,ones,pollux", help="comma-separated, run in order (fifo,ones,pollux)")
    ap.add_argument("--seed", type=int, default=0, help="mix draws and the policies' seed (0)")
    ap.add_argument("--jobs", type=int, default=6, help=f"jobs in the mix, 2..{len(TEMPLATES)} (6)")
    ap.add_argument("--scale", type=float, default=0.7,
                    help="every job's length times this (0.7: 10-12 min per policy on 2 cores shared with other "
                         "work, about half that on idle ones)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per policy before giving up (1200)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary projects (their path is printed)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    ap.add_argument("--ones-params", default="{}",
                    help="JSON object of OnesPolicy options for ones, live and in the simulator's prediction ({})")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU path: slots are the GPUs NVML finds (CPU slots where it finds none), every job "
                         "ResNet-18 on synthetic CIFAR (GPU_TEMPLATES); set --scale to the samples/s over 1000")
    args = ap.parse_args(argv)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not 2 <= args.jobs <= len(TEMPLATES):
        ap.error(f"--jobs must be between 2 and {len(TEMPLATES)}")
    if not args.scale > 0:
        ap.error("--scale must be > 0")
    try:
        args.ones_params = json.loads(args.ones_params)
    except json.JSONDecodeError as exc:
        ap.error(f"--ones-params is not JSON: {exc}")
    if not isinstance(args.ones_params, dict):
        ap.error(f"--ones-params must be a JSON object, got {args.ones_params!r}")
    return args


def predict(mix: list[MixJob], results: dict[str, dict], policies: list[str], seed: int,
            ones_params: dict | None = None) -> tuple[dict, dict, float]:
    """The replay's figures per policy (``adapters.live_as_ran.replay``: each policy's run as it ran), the
    pooled step times per job and the mean start-up over the runs (the replay of a policy without a run)."""
    measured = {j.name: pooled_step_times([o for r in results.values() for o in r["obs"][j.name]]) for j in mix}
    costs = [c for r in results.values() if math.isfinite(c := r["figures"]["to_progress_s"])]
    restart = float(np.mean(costs)) if costs else 30.0
    record = {"mix": [{"spec": j.spec, "offset_s": j.offset_s} for j in mix], "restart_cost_s": restart,
              "step_times": {j: {f"{g}x{b}": t for (g, b), t in m.items()} for j, m in measured.items()},
              "live": {p: r["figures"] for p, r in results.items()},
              "as_ran": {p: r["as_ran"] for p, r in results.items()}}
    return replay(record, policies, seed, ones_params, SLOTS, TICK_S), measured, restart


def report(args, mix, results, walls) -> dict:
    live = {p: r["figures"] for p, r in results.items()}
    ones = live_policy_params("ones", args.ones_params)  # as the live project runs it, less the budget
    sim, measured, restart = predict(mix, results, list(results), args.seed, ones)
    kind = "slots" if args.gpu else "CPU slots"
    print(f"\nlive: {len(mix)} jobs on {SLOTS} {kind}, ticks every {TICK_S} s; wall time per policy: "
          + ", ".join(f"{p} {w:.0f} s" for p, w in walls.items()))
    print("sim: each policy's run replayed as it ran (adapters.live_as_ran): the same specs, its submit offsets, "
          "its jobs' samples per wall-clock second beside the other jobs, its start-up (creation -> first "
          "progress), its sensor's ticks, runs younger than min_run_s held\n")
    print(summary_table(live, sim))
    print("\nper job: JCT in s (live/simulated) and generations started live\n")
    print(jobs_table(mix, live, sim, results))
    print("\nsamples/s: by the measured step time (the model's) vs by the wall clock (trained, start-up excluded)\n")
    print(rates_table(mix, results, measured))
    lags = [v for f in live.values() for v in f["arrival_lag_s"].values()]
    print(f"\narrival lag (spec written -> the scheduler's submit time, jobs after the first): mean "
          f"{np.mean(lags):.1f} s, max {max(lags):.1f} s")
    return {"mix": [{"spec": j.spec, "offset_s": j.offset_s} for j in mix], "live": live, "sim": sim,
            "wall_s": walls, "restart_cost_s": restart, "ones_params": args.ones_params,
            "as_ran": {p: r["as_ran"] for p, r in results.items()},
            "step_times": {j: {f"{g}x{b}": t for (g, b), t in m.items()} for j, m in measured.items()}}


def main(argv: list[str] | None = None) -> int:
    global SLOTS, GPU
    args = parse_args(argv)
    if args.gpu:
        SLOTS, found = gpu_slots()
        GPU = True
        print("GPU path:", found, flush=True)
    mix = draw_mix(args.jobs, np.random.default_rng(args.seed), args.scale, GPU_TEMPLATES if args.gpu else TEMPLATES,
                   SLOTS)
    root = Path(tempfile.mkdtemp(prefix="ones-live-ab-"))
    print(f"live A/B: {', '.join(args.policies)}; {len(mix)} jobs: "
          + ", ".join(f"{j.name} {next(iter(j.spec['stopping'].values()))} at +{j.offset_s:.0f} s" for j in mix)
          + f"; projects in {root}", flush=True)
    try:
        def one(policy: str):
            live = LiveRun(root, policy, args.seed, mix, args.timeout, args.ones_params if policy == "ones" else None)
            ok, wall, why = live.run()
            print(f"{policy}: {'finished' if ok else 'FAILED: ' + why} in {wall:.0f} s", flush=True)
            return ok, wall, why, (collect(live) if ok else None)

        results, walls, failed = run_each(args.policies, one)
        if results:  # a benchmark keeps what it measured: the figures of the policies that finished
            out = report(args, mix, results, walls)
            out["failed"] = failed
            if args.json:
                reporting.write_json(args.json, json.loads(json.dumps(out, default=str)))
        if failed:
            print("failed: " + "; ".join(f"{p}: {why}" for p, why in failed.items())
                  + (f" (figures above: {', '.join(results)} only)" if results else ""), file=sys.stderr)
            return 1
        return 0
    finally:
        if args.keep:
            print(f"projects kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
