"""The live A/B's figures (``benchmarks/live_ab.py``) and its simulator prediction, as pure functions of plain records.

Live (per policy): mean JCT and makespan as the live cluster report defines them
(``adapters.live_report.job_metrics``: finish - submit, submit = the first tick that saw the spec file;
makespan = last finish - first submit), restarts = generations beyond the first that started, summed over
the jobs, and per run that started: ``startup`` = its Dagster start -> its first training progress, and
``queued`` = its creation by the sensor -> its start (it waits there for the slots of the run it replaces).

First training progress of a generation: the first ``samples`` point the job's MLflow run logged during that
run with more samples than the generation resumed from, less the time it took to train those samples at the
``samples_per_s`` logged with it (the built-in script logs its first point after its first step).

Simulated: ``ones_pipeline.sim`` replays the same specs with ``MeasuredTruth`` (statistical efficiency 1: the
stopping rules count samples). A policy's run is replayed as it ran (``adapters.live_as_ran``): each job
trains at the samples per wall-clock second it trained at in that run beside the other jobs
(``MeasuredTruth.rates``), starts cost that run's mean creation -> first progress, jobs arrive at its submit
offsets, the policy sees the noise scales the jobs logged and decides at the run's sensor ticks, and young
runs are held as the tick holds them (``LiveViews``). Without that record, each job's step time per GPU count
is the median its live runs measured (MLflow ``step_time_s`` per configuration, pooled over every policy's
run of the job), every start costs the runs' mean creation -> first progress, and ``LiveViews`` hides the
noise scale.

The mix (``draw_mix``), each policy's project settings (``live_env``) and the run-every-policy loop
(``run_each``) are here too, so that the script keeps only what drives Dagster and prints.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ones_pipeline import reporting
from ones_pipeline.adapters.live_report import FinishedJob, RunSpan, job_metrics
from ones_pipeline.core.policies import POLICIES, make_policy
from ones_pipeline.core.types import Cluster, JobSpec, JobView, Schedule, ThroughputObs
from ones_pipeline.scheduler.holds import Slots, hold_young_runs, keep_stopped_for_nothing, stopped, young_runs
from ones_pipeline.scheduler.runs import RunInfo
from ones_pipeline.sim.change_costs import PRESETS, ChangeCosts
from ones_pipeline.sim.engine import SimConfig, SimResult, simulate
from ones_pipeline.sim.truth import SimJob

# The mix, in arrival order: (model, per-GPU batch, stopping field, (low, high) of its length, (low, high)
# of the gap to the previous arrival in s). The first is the longest job. About 10 slot-minutes on idle cores
# at scale 1.
TEMPLATES = (
    ("resnet18-cifar-synthetic", 32, "samples", (8000, 9000), (0, 0)),
    ("cnn-digits", 32, "epochs", (120, 160), (10, 20)),
    ("mlp-digits", 32, "epochs", (80, 110), (20, 30)),
    ("resnet18-cifar-synthetic", 32, "samples", (3000, 4000), (20, 30)),
    ("cnn-digits", 16, "epochs", (150, 200), (20, 30)),
    ("mlp-digits", 64, "epochs", (60, 90), (20, 30)),
    ("cnn-digits", 32, "epochs", (80, 120), (15, 25)),
    ("resnet18-cifar-synthetic", 32, "samples", (2500, 3500), (15, 25)),
)
LR = {"resnet18-cifar-synthetic": (0.02, 0.08), "cnn-digits": (0.02, 0.08), "mlp-digits": (0.05, 0.2)}
# The GPU path: the same shapes, every job ResNet-18 on synthetic CIFAR at per-GPU batch 128, lengths in samples
# for a device that trains about 1000 samples/s at scale 1 (benchmarks/gpu_check.sh sets --scale from the rate
# it measured first).
GPU_TEMPLATES = tuple(("resnet18-cifar-synthetic", 128, "samples", length, gap) for length, gap in (
    ((180_000, 200_000), (0, 0)), ((60_000, 80_000), (10, 20)), ((40_000, 55_000), (20, 30)),
    ((50_000, 70_000), (20, 30)), ((70_000, 90_000), (20, 30)), ((30_000, 45_000), (20, 30)),
    ((45_000, 60_000), (15, 25)), ((40_000, 55_000), (15, 25))))
CPU_SLOTS = 2  # the CPU benchmark's slots
# (unix seconds, samples, samples_per_s or None) of one job's MLflow points, in logging order.
Point = tuple[float, float, "float | None"]


@dataclass(frozen=True)
class MixJob:
    spec: dict  # the YAML of the spec
    offset_s: float  # after the first job's start decision

    @property
    def name(self) -> str:
        return self.spec["name"]


def draw_mix(n: int, rng: np.random.Generator, scale: float = 1.0, templates=TEMPLATES,
             slots: int = CPU_SLOTS) -> list[MixJob]:
    """The first ``n`` templates with lengths and arrival gaps drawn uniformly from their ranges, lengths
    times ``scale``; every job may grow to ``slots``."""
    mix, offset = [], 0.0
    for i, (model, batch, rule, (lo, hi), (g_lo, g_hi)) in enumerate(templates[:n]):
        offset += float(rng.integers(g_lo, g_hi + 1))
        length = max(int(round(int(rng.integers(lo, hi + 1)) * scale)), 1)
        base_lr, max_lr = LR[model]
        spec = {"name": f"j{i}-{model.split('-')[0]}", "model": model, "per_gpu_batch": batch, "base_lr": base_lr,
                "max_lr": max_lr, "requested_gpus": 1, "max_gpus": slots, "stopping": {rule: length}}
        mix.append(MixJob(spec, offset))
    return mix


def live_env(policy: str, seed: int, params: Mapping | None, slots: int = CPU_SLOTS, gpus: bool = False,
             tick_s: float = 5) -> dict:
    """The ``resources/local.yaml`` of one policy's project: ``slots`` CPU slots (with ``gpus``: the GPUs
    NVML finds, those slots without one), ticks every ``tick_s`` s, the policy with its ``seed`` and
    ``params`` (the ones options reach the ones project only because only it is given them)."""
    return {"cluster": {"gpus": "auto" if gpus else "none", "cpu_slots": slots}, "launcher": {"grace_period_s": 20},
            "scheduler": {"tick_interval_s": tick_s, "decision_budget_s": 1.0},
            "policy": {"name": policy, "seed": seed, "params": dict(params or {})}}


def gpu_slots() -> tuple[int, str]:
    """The GPU path's slots: the GPUs NVML finds, else ``CPU_SLOTS``; and what was found, in words."""
    from ones_pipeline.adapters.inventory import discover

    inv = discover()
    if inv.gpus:
        return len(inv.gpus), f"{len(inv.gpus)} GPU(s): {inv.reason}"
    return CPU_SLOTS, f"no GPU ({inv.reason}): {CPU_SLOTS} CPU slots"


def run_each(policies: Sequence[str], one) -> tuple[dict, dict, dict]:
    """Run ``one(policy) -> (ok, wall_s, why, result)`` for every policy, whatever another's outcome:
    ``(results of those that finished, their wall seconds, why each other one failed)``."""
    results, walls, failed = {}, {}, {}
    for policy in policies:
        ok, wall, why, result = one(policy)
        if ok:
            results[policy], walls[policy] = result, wall
        else:
            failed[policy] = why
    return results, walls, failed


@dataclass(frozen=True)
class RunTiming:
    """One started run of a job: when the sensor created it, when it started, when it first trained."""

    job: str
    generation: int
    created_s: float
    start_s: float
    first_progress_s: float | None  # None: it never trained (stopped during its start-up)

    @property
    def startup_s(self) -> float | None:
        return None if self.first_progress_s is None else self.first_progress_s - self.start_s

    @property
    def queued_s(self) -> float:
        return self.start_s - self.created_s

    @property
    def to_progress_s(self) -> float | None:
        """Creation -> first progress: the time a start or change costs the job (the simulator's restart cost)."""
        return None if self.first_progress_s is None else self.first_progress_s - self.created_s


def first_progress_s(points: Sequence[Point], start_s: float, end_s: float | None) -> float | None:
    """When a run that held the job from ``start_s`` to ``end_s`` (None: still running) first trained: see the
    module docstring. None when it logged no progress."""
    before = [s for t, s, _ in points if t < start_s]
    resumed_from = max(before, default=0.0)
    for t, samples, rate in points:
        if t < start_s or (end_s is not None and t > end_s):
            continue
        if samples > resumed_from:
            back = (samples - resumed_from) / rate if rate and rate > 0 and math.isfinite(rate) else 0.0
            return max(start_s, t - back)
    return None


def run_timings(runs: Sequence[RunInfo], points: Mapping[str, Sequence[Point]]) -> list[RunTiming]:
    """A ``RunTiming`` per run that started, from the runs and each job's MLflow points."""
    out = []
    for r in sorted(runs, key=lambda r: (r.job, r.generation)):
        if r.start_s is None:
            continue
        first = first_progress_s(points.get(r.job, ()), r.start_s, r.end_s)
        out.append(RunTiming(r.job, r.generation, r.created_s, r.start_s, first))
    return out


def _mean(values: Sequence[float | None]) -> float:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else math.nan


def live_figures(jobs: Sequence[FinishedJob], runs: Sequence[RunInfo], timings: Sequence[RunTiming],
                 now_s: float) -> dict:
    """Per policy: ``mean_jct_s``, ``makespan_s``, ``restarts``, ``startup_s``, ``queued_s``,
    ``to_progress_s`` (means over the started runs) and ``jct_s`` per job."""
    spans = [RunSpan(r.job, r.generation, r.slot_ids, r.start_s, r.end_s, r.status) for r in runs]
    metrics = {j.job: job_metrics(j, spans, now_s) for j in jobs}
    jct = {name: m["jct_s"] for name, m in metrics.items()}
    stats = reporting.jct_statistics(list(jct.values()), percentiles=())
    makespan = max(j.finish_s for j in jobs) - min(j.submit_s for j in jobs) if jobs else math.nan
    return {
        "jobs": len(jobs), "mean_jct_s": stats["mean_jct_s"], "makespan_s": float(makespan),
        "restarts": int(sum(max(m["generations"] - 1, 0) for m in metrics.values())),
        "startup_s": _mean([t.startup_s for t in timings]), "queued_s": _mean([t.queued_s for t in timings]),
        "to_progress_s": _mean([t.to_progress_s for t in timings]), "jct_s": jct,
    }


def ratios_to(figures: Mapping[str, Mapping], baseline: str = "fifo") -> dict[str, dict[str, float]]:
    """Mean JCT and makespan of each policy over ``baseline``'s (NaN without the baseline)."""
    base = figures.get(baseline)
    out = {}
    for policy, f in figures.items():
        out[policy] = {key: (f[key] / base[key] if base and base[key] > 0 else math.nan)
                       for key in ("mean_jct_s", "makespan_s")}
    return out


# --------------------------------------------------------------------------------------------- measured
def pooled_step_times(observations: Sequence[ThroughputObs]) -> dict[tuple[int, int], float]:
    """(GPUs, per-GPU batch) -> median step time over every observation of that configuration."""
    by_key: dict[tuple[int, int], list[float]] = {}
    for o in observations:
        if o.step_time_s > 0 and math.isfinite(o.step_time_s):
            by_key.setdefault((int(o.num_gpus), int(o.per_gpu_batch)), []).append(float(o.step_time_s))
    return {k: float(np.median(v)) for k, v in sorted(by_key.items())}


def step_time_at(measured: Mapping[tuple[int, int], float], gpus: int, local_batch: int) -> float:
    """Step time at ``gpus`` x ``local_batch`` from the measured configurations: the nearest per-GPU batch
    measured at that GPU count, scaled in proportion to the batch; with nothing measured at that count, the
    nearest count's (its per-GPU time, i.e. perfect scaling). KeyError when nothing was measured."""
    if not measured:
        raise KeyError("no step time measured")
    counts = sorted({n for n, _ in measured})
    n = min(counts, key=lambda c: (abs(c - gpus), -c))
    batch = min((b for c, b in measured if c == n), key=lambda b: (abs(b - local_batch), b))
    return measured[(n, batch)] * local_batch / batch


@dataclass(frozen=True)
class MeasuredTruth:
    """A live job as the simulator's ground truth (``sim.truth.JobTruth``), from what its live runs measured."""

    model: str
    base_batch: int
    total_progress: float
    restart_cost_s: float
    measured: Mapping[tuple[int, int], float]  # pooled_step_times
    max_local_batch: int = 1 << 20  # the live step has no gradient accumulation
    # (slots held, slots the other jobs held) -> samples/s as the job trained live (``rates_as_ran``); empty:
    # the step times alone, as if nothing but its steps took time and nothing shared its cores.
    rates: Mapping[tuple[int, int], float] = field(default_factory=dict)
    # (samples, gradient noise scale) as the job's live run logged them, in order; empty: none recorded.
    noise: Sequence[tuple[float, float]] = ()

    def step_time(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        return step_time_at(self.measured, sum(placement), local_batch), 0.0

    def step_time_among(self, placement: tuple[int, ...], local_batch: int, others: int) -> tuple[float, float]:
        """The wall-clock time a step takes with ``others`` slots of the host held by other jobs: the global
        batch over the samples/s the job trained at live in that condition (``rate_among``)."""
        if not self.rates:
            return self.step_time(placement, local_batch)
        n = sum(placement)
        return n * local_batch / self.rate_among(n, others), 0.0

    def rate_among(self, gpus: int, others: int) -> float:
        """Samples/s at ``gpus`` slots beside ``others``: as measured there; else as measured in the nearest
        condition (the same slot count first, then the nearest count), times the step times' ratio of the
        two slot counts' samples/s (``step_time_at``, at the base batch)."""
        if (gpus, others) in self.rates:
            return float(self.rates[(gpus, others)])
        n, o = min(self.rates, key=lambda k: (k[0] != gpus, abs(k[0] - gpus), abs(k[1] - others), k))
        if n == gpus or not self.measured:
            return float(self.rates[(n, o)])
        per_sample = {c: step_time_at(self.measured, c, self.base_batch) / (c * self.base_batch) for c in (n, gpus)}
        return float(self.rates[(n, o)]) * per_sample[n] / per_sample[gpus]

    def efficiency(self, progress: float, global_batch: float) -> float:
        return 1.0

    def grad_noise_scale(self, progress: float, global_batch: float | None = None) -> float:
        """The noise scale the live job last logged at or before ``progress`` samples (its first before
        that); 1e9 when none was recorded (hidden from the policies by ``LiveViews``)."""
        if not self.noise:
            return 1e9
        i = bisect.bisect_right([s for s, _ in self.noise], progress) - 1
        return float(self.noise[max(i, 0)][1])

    def metrics(self, progress: float) -> tuple[float, float]:
        frac = min(progress / self.total_progress, 1.0)
        return 1.0 - 0.9 * frac, 0.1 + 0.8 * frac


class LiveViews:
    """A policy as the live scheduler runs it. It sees the jobs as the live sensor shows them: with the gradient
    noise scale each job measured when the replay has them (``noise``: the sensor reads it from MLflow), else
    without one. And with ``min_run_s`` (the live default ``SchedulerConfig.min_run_s``, 30 s), as the tick
    does (``scheduler.holds``), a job whose run started less than that long ago is not stopped
    (a change in place is made), and neither is any job whose new allocation needs its slots, nor one stopped
    for nothing then (``holds.keep_stopped_for_nothing``). With ``ticks_s``
    (the live sensor's tick times, s after its first; the daemon ticks every 5 or 10 s, not every 5), the policy
    decides at the round nearest each, in rounds of 1 s (after the last, every mean interval); at the other
    rounds nothing changes. With ``epoch_end`` (job -> its (samples, ``epoch_end_s``) MLflow points), each job
    carries the time of its evaluation points it had logged by then, as the sensor reads it (0 before one)."""

    def __init__(self, policy, noise: bool = False, min_run_s: float = 0.0, ticks_s: Sequence[float] = (),
                 epoch_end: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> None:
        self.policy = policy
        self.epoch_end = {job: sorted(rows) for job, rows in (epoch_end or {}).items() if rows}
        self.name = policy.name
        self.noise = noise
        self.min_run_s = float(min_run_s)
        self.ticks = sorted(float(t) for t in ticks_s)
        self._every = float(np.mean(np.diff(self.ticks))) if len(self.ticks) > 1 else 0.0
        self._next = 0
        self._started: dict[str, float] = {}  # job -> when it was given GPUs after holding none (its run's start)

    def _tick(self, i: int) -> float:
        """The ``i``-th tick: as recorded; after the last recorded one, every mean interval."""
        last = len(self.ticks) - 1
        return self.ticks[i] if i <= last else self.ticks[last] + (i - last) * self._every

    def _due(self, now_s: float) -> bool:
        """Whether a live tick fell since the last round (always, without recorded ticks)."""
        if not self.ticks or (self._next >= len(self.ticks) and self._every <= 0):
            return True
        due = False
        while self._tick(self._next) < now_s + 0.5:
            self._next, due = self._next + 1, True
        return due

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        self._started = {j: self._started.get(j, now_s) for j in current.allocations}
        if not self._due(now_s):
            return Schedule(dict(current.allocations))
        if not self.noise:
            jobs = [replace(j, grad_noise_scale=None, model_gns=None) for j in jobs]
        if self.epoch_end:
            jobs = [replace(j, epoch_end_s=_logged_by(self.epoch_end.get(j.name, ()), j.samples_done)) for j in jobs]
        new = self.policy.decide(now_s, cluster, jobs, current)
        slots = Slots("subprocess", "cpu", tuple(range(cluster.num_gpus)))  # live_ab.py's launcher and slots
        young = young_runs(now_s, self.min_run_s, self._started, stopped(current, new, slots))
        out = keep_stopped_for_nothing(hold_young_runs(new, current, young), current, {j.name for j in jobs})
        self._started.update({j: now_s for j in out.allocations if j not in current.allocations})
        return out

    def to_dict(self) -> dict:
        return self.policy.to_dict()

    def load_state(self, state) -> None:
        self.policy.load_state(state)


def _logged_by(points: Sequence[tuple[float, float]], samples: float) -> float:
    """The value of the last of ``points`` (samples, value; sorted) logged at or before ``samples``; 0 if none."""
    i = bisect.bisect_right([s for s, _ in points], samples) - 1
    return float(points[i][1]) if i >= 0 else 0.0


def sim_workload(specs: Sequence[JobSpec], offsets_s: Mapping[str, float], totals: Mapping[str, float],
                 measured: Mapping[str, Mapping[tuple[int, int], float]], restart_cost_s: float,
                 rates: Mapping[str, Mapping[tuple[int, int], float]] | None = None,
                 noise: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> list[SimJob]:
    """The live mix as simulator jobs: each spec arriving at its offset, ``totals[job]`` samples long, training
    at ``rates[job]`` (``rates_as_ran``) where given, else at its step times."""
    return [SimJob(replace(s, submit_time_s=float(offsets_s[s.name])),
                   MeasuredTruth(s.model, s.per_gpu_batch, float(totals[s.name]), float(restart_cost_s),
                                 dict(measured[s.name]), rates=dict((rates or {}).get(s.name, {})),
                                 noise=tuple(map(tuple, (noise or {}).get(s.name, ())))))
            for s in specs]


def sim_figures(result: SimResult) -> dict:
    """The simulated counterpart of ``live_figures`` (no start-up split: it is the restart cost)."""
    jct = {r.name: r.jct_s for r in result.jobs}
    return {"jobs": len(result.jobs), "mean_jct_s": float(np.mean(list(jct.values()))),
            "makespan_s": float(result.makespan_s - min(r.submit_s for r in result.jobs)),
            "restarts": int(sum(r.restarts for r in result.jobs)), "jct_s": jct}


# What a change costs in the live A/B (2 CPU slots, the subprocess launcher): a start and a restart the jobs'
# own recorded start-up (``restart_cost_s``), a grow and a shrink in place as measured there (the ``live``
# preset), for every policy: the live scheduler resizes in place whichever policy decided (issue 36).
LIVE_CHANGE_COSTS = ChangeCosts(grow=PRESETS["live"].grow, shrink=PRESETS["live"].shrink, in_place=tuple(POLICIES))


def simulate_policies(workload: Sequence[SimJob], policies: Sequence[str], slots: int, interval_s: float,
                      seed: int, params: Mapping[str, Mapping] | None = None) -> dict[str, dict]:
    """``sim_figures`` per policy: one node of ``slots`` slots, a round every ``interval_s`` (the live tick);
    ``params``: options per policy name (those not named run their defaults)."""
    cluster = Cluster.uniform(1, slots)
    out = {}
    for name in policies:
        policy = make_policy(name, seed=seed, **dict((params or {}).get(name, {})))
        config = SimConfig(interval_s=interval_s, change_costs=LIVE_CHANGE_COSTS)
        result = simulate(workload, LiveViews(policy), cluster, config)
        out[name] = sim_figures(result)
    return out


def wall_rate(points: Sequence[Point], runs: Sequence[RunInfo], gpus: int) -> float:
    """Samples per second of wall-clock time the job's runs on ``gpus`` slots trained (from each run's first
    point to its last: evaluation, checkpoints and logging included, start-up left out); NaN if none."""
    gained, seconds = 0.0, 0.0
    for r in runs:
        if r.start_s is None or len(r.slot_ids) != gpus:
            continue
        inside = [(t, s) for t, s, _ in points if t >= r.start_s and (r.end_s is None or t <= r.end_s)]
        if len(inside) >= 2:
            gained += inside[-1][1] - inside[0][1]
            seconds += inside[-1][0] - inside[0][0]
    return gained / seconds if seconds > 0 else math.nan

