"""What the jobs of one live A/B run did, as the simulator's replay of that run needs it (``replay``).

A live job does not train at the rate its step times say. Between two of its MLflow points the wall clock also
runs its evaluation, checkpoints and logging, and on a shared host the other jobs' processes (their training and
start-ups) and the host's own load take cores from it: on the seed-0 mix of docs/live.md a cnn-digits job that
its steps alone would train at 6,450 samples/s trained at 1,480 under fifo and at 4,580 under ones. So the replay
of a policy's run trains each job at the samples per wall-clock second it trained at in that run, per
condition: (slots it held, slots the other jobs held) (``rates_as_ran``; the simulator asks for the condition
of each round, ``MeasuredTruth.step_time_among``). Its starts cost that run's mean creation -> first progress
(``to_progress_s``), its jobs arrive at that run's submit offsets, and the policies see the gradient noise
scale each job logged (the live sensor reads it from MLflow).

``project_as_ran`` reads these from a project (Dagster runs, the jobs' slot ledgers, MLflow);
``benchmarks/live_ab.py`` records them per policy (``as_ran``) and ``benchmarks/live_ab_sim.py --kept`` reads
them from kept projects.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ones_pipeline.adapters.live_ab import (
    LIVE_CHANGE_COSTS,
    LiveViews,
    Point,
    sim_figures,
    sim_workload,
)
from ones_pipeline.config import EnvConfig, parse_job_spec
from ones_pipeline.config.env import SchedulerConfig
from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.scheduler.runs import RunInfo, held_periods
from ones_pipeline.sim.engine import SimConfig, simulate

# (start, end, slots the job held) of each stretch of a job's runs with one slot set (``held_periods``).
Stretch = tuple[float, float, int]
NOISE_KEPT = 64  # noise-scale points recorded per job (evenly thinned)


def held_stretches(runs: Sequence[RunInfo], ledgers: Mapping[str, Sequence[Mapping]], now_s: float
                   ) -> dict[str, list[Stretch]]:
    """Per job: its runs' stretches with one slot set, from the runs and each job's slot ledger."""
    out: dict[str, list[Stretch]] = {}
    for r in runs:
        for start, end, slots in held_periods(r, ledgers.get(r.job, ()), now_s):
            out.setdefault(r.job, []).append((start, end, len(slots)))
    return {job: sorted(s) for job, s in out.items()}


def _held_at(stretches: Sequence[Stretch], t: float) -> int:
    return sum(n for a, b, n in stretches if a <= t < b)


def rates_as_ran(points: Mapping[str, Sequence[Point]], stretches: Mapping[str, Sequence[Stretch]]
                 ) -> dict[str, dict[tuple[int, int], float]]:
    """Per job: (slots it held, slots the other jobs held) -> samples it trained per second of wall-clock time
    in that condition: the samples between consecutive MLflow points inside one stretch over the seconds
    between them, each interval counted under the condition at its middle (the other jobs' slots counted
    from their runs' starts: start-ups load the cores too). Evaluation, checkpoints, logging and what else ran
    on the host are in it; start-ups and finishing are not (the replay charges them as the start cost)."""
    out: dict[str, dict[tuple[int, int], float]] = {}
    for job, pts in points.items():
        mine = stretches.get(job, ())
        gained: dict[tuple[int, int], list[float]] = {}
        for (t0, s0, _), (t1, s1, _) in itertools.pairwise(pts):
            inside = [n for a, b, n in mine if a <= t0 and t1 <= b]
            if not inside or s1 <= s0 or t1 <= t0:
                continue
            mid = 0.5 * (t0 + t1)
            others = sum(_held_at(s, mid) for other, s in stretches.items() if other != job)
            acc = gained.setdefault((inside[0], others), [0.0, 0.0])
            acc[0] += s1 - s0
            acc[1] += t1 - t0
        if gained:
            out[job] = {key: s / t for key, (s, t) in sorted(gained.items())}
    return out


def mlflow_history(env: EnvConfig, job: str) -> tuple[list[Point], list[tuple[float, float]],
                                                     list[tuple[float, float]]]:
    """The job's MLflow run: its points (unix s, samples, samples_per_s at that point or None) in logging
    order, its (samples, gradient noise scale) points and its (samples, ``epoch_end_s``) points."""
    from mlflow import MlflowClient

    from ones_pipeline.adapters.mlflow import RUN_ID_FILE

    run_id = (env.layout.job_dir(job) / RUN_ID_FILE).read_text().strip()
    client = MlflowClient(env.tracking_uri())
    rate = {(m.timestamp, m.step): m.value for m in client.get_metric_history(run_id, "samples_per_s")}
    history = sorted(client.get_metric_history(run_id, "samples"), key=lambda m: (m.timestamp, m.step))
    samples = {(m.timestamp, m.step): float(m.value) for m in history}
    noise, epoch_end = (sorted((samples[(m.timestamp, m.step)], float(m.value))
                               for m in client.get_metric_history(run_id, key)
                               if (m.timestamp, m.step) in samples and np.isfinite(m.value) and m.value > 0)
                        for key in ("grad_noise_scale", "epoch_end_s"))
    return ([(m.timestamp / 1000.0, float(m.value), rate.get((m.timestamp, m.step))) for m in history], noise,
            epoch_end)


def thinned(rows: Sequence, most: int = NOISE_KEPT) -> list:
    """At most ``most`` of ``rows``, evenly spaced, the first and last kept."""
    if len(rows) <= most:
        return list(rows)
    return [rows[int(i)] for i in np.unique(np.linspace(0, len(rows) - 1, most).round().astype(int))]


def as_ran_json(rates: Mapping[str, Mapping[tuple[int, int], float]],
                noise: Mapping[str, Sequence[tuple[float, float]]],
                epoch_end: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> dict:
    """The record's ``as_ran`` entry of one policy: rates keyed ``"<slots>+<others>"``, noise and the measured
    evaluation points' time (``epoch_end_s``, where given) thinned."""
    out = {"rates": {job: {f"{n}+{o}": float(r) for (n, o), r in m.items()} for job, m in rates.items()},
           "noise": {job: [[float(s), float(g)] for s, g in thinned(rows)] for job, rows in noise.items() if rows}}
    if epoch_end is not None:
        out["epoch_end"] = {job: [[float(s), float(e)] for s, e in thinned(rows)]
                            for job, rows in epoch_end.items() if rows}
    return out


def sensor_ticks(instance) -> list[float]:
    """Unix times of the scheduler sensor's ticks that decided (``defs.sensor.watch_tick``: not its skips that
    only watched for a run's end), the Dagster instance recorded, oldest first."""
    from ones_pipeline.defs.sensor import SENSOR_NAME, WATCHING

    for state in instance.all_instigator_state():
        if state.instigator_name == SENSOR_NAME:
            ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id)
            return sorted(t.timestamp for t in ticks if not (t.skip_reason or "").startswith(WATCHING))
    return []


def project_as_ran(env: EnvConfig, jobs: Sequence[str], now_s: float | None = None) -> dict:
    """``as_ran_json`` of one policy's project: its Dagster runs, its jobs' slot ledgers and MLflow runs, with
    ``ticks_s``: its sensor's tick times, s after the first, and ``launch_s``: the mean time from the tick
    that decided a run to the run's creation (the live hold of a young run counts from its creation)."""
    from ones_pipeline.defs.instance import job_run_infos, open_instance
    from ones_pipeline.defs.slot_owner import read_ledger

    with open_instance(env) as instance:
        runs, ticks = job_run_infos(instance, env.job_state_dir), sensor_ticks(instance)
    ledgers = {job: read_ledger(env.layout.job_dir(job)) for job in jobs}
    history = {job: mlflow_history(env, job) for job in jobs}
    stretches = held_stretches(runs, ledgers, time.time() if now_s is None else now_s)
    rates = rates_as_ran({job: h[0] for job, h in history.items()}, stretches)
    launch = [r.created_s - ticks[i] for r in runs if (i := bisect.bisect_right(ticks, r.created_s) - 1) >= 0]
    return {**as_ran_json(rates, {job: h[1] for job, h in history.items()}, {job: h[2] for job, h in history.items()}),
            "ticks_s": [round(t - ticks[0], 2) for t in ticks],
            "launch_s": round(float(np.mean(launch)), 3) if launch else 0.0}


def replay(record: Mapping, policies: Sequence[str], seed: int, ones_params: Mapping | None = None,
           slots: int = 2, interval_s: float = 5.0) -> dict[str, dict]:
    """``sim_figures`` per policy of a ``benchmarks/live_ab.py --json`` record: a policy whose run the record
    has ``as_ran`` of is replayed as that run ran (its rates, noise scales, start cost ``to_progress_s`` and
    submit offsets); any other from the step times alone (pooled over the runs; the recorded start-up; the
    mix's offsets; no noise scale; a round every ``interval_s``). A run with its sensor's ticks (``ticks_s``) is
    replayed in rounds of 1 s, its policy deciding at those ticks (``LiveViews``). ``ones_params``: the ``ones``
    policy's options."""
    try:
        specs = [parse_job_spec(m["spec"], f"<record: {m['spec']['name']}>") for m in record["mix"]]
        steps = {job: {tuple(int(x) for x in key.split("x")): float(t) for key, t in times.items()}
                 for job, times in record["step_times"].items()}
        offsets = {m["spec"]["name"]: float(m["offset_s"]) for m in record["mix"]}
        start_s = float(record["restart_cost_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a live_ab.py --json record (mix, step_times, restart_cost_s): {exc!r}") from None
    totals = {s.name: s.stopping.total_samples(s.dataset_size) for s in specs}
    out = {}
    for name in policies:
        ran, live = record.get("as_ran", {}).get(name), record.get("live", {}).get(name, {})
        rates = noise = None
        epoch_end: dict[str, list[tuple[float, float]]] = {}
        at, cost, ticks, launch = offsets, start_s, (), 0.0
        if ran is not None:
            rates = {job: {tuple(int(x) for x in key.split("+")): float(r) for key, r in m.items()}
                     for job, m in ran["rates"].items()}
            noise = {job: [tuple(row) for row in rows] for job, rows in ran.get("noise", {}).items()}
            epoch_end = {job: [tuple(row) for row in rows] for job, rows in ran.get("epoch_end", {}).items()}
            at = {job: float(live.get("submit_offset_s", {}).get(job, offsets[job])) for job in offsets}
            cost = float(live.get("to_progress_s", math.nan))
            cost = cost if math.isfinite(cost) else start_s
            ticks, launch = ran.get("ticks_s", ()), float(ran.get("launch_s", 0.0))
        workload = sim_workload(specs, at, totals, steps, cost, rates, noise)
        policy = make_policy(name, seed=seed, **(dict(ones_params or {}) if name == "ones" else {}))
        config = SimConfig(interval_s=1.0 if ticks else interval_s, change_costs=LIVE_CHANGE_COSTS)
        hold = SchedulerConfig.min_run_s + launch if ran is not None else 0.0  # from the run's creation
        views = LiveViews(policy, noise=bool(noise), min_run_s=hold, ticks_s=ticks, epoch_end=epoch_end)
        out[name] = sim_figures(simulate(workload, views, Cluster.uniform(1, slots), config))
    return out
