"""Sia: heterogeneity-aware, goodput-optimised scheduling (Jayaram Subramanya et al., SOSP'23), on a
homogeneous cluster, written from the paper (§3.2 configurations, §3.3 objective and restart factor, §4
default parameters) and the authors' simulator (github siasosp23/artifacts, ``sia-simulator/sia.py``,
``cluster.py``, ``simulator_config.py``; read for understanding, not copied). ``docs/sia.md`` has the
measurements.

Every round (the simulator's 60 s) the policy chooses, for every active job, at most one
*configuration* and solves that choice exactly:

* **Configurations** (paper §3.2; ``CONFIGS_4GPU`` in the artifact): with ``R`` GPUs per node, the
  single-node counts 1, 2, 4, ... (powers of two below ``R``) and ``R``, then whole nodes: 2R, 3R, ...,
  up to every full-size node of the cluster. A configuration is (nodes, GPUs): (1, 1), (1, 2), (1, 4),
  (2, 8), ... on 4-GPU nodes. The artifact's table stops at 64 GPUs; here the list runs to the cluster
  and the per-job limit below caps it (64 by default, as the artifact's job limit). Open in the paper
  for ``R`` not a power of two (it suggests virtual nodes): here the list holds the powers of two below
  ``R`` and ``R`` itself.
* **Per-job limit** (artifact ``cluster.py``, ``get_sia_multi_job_info``): at most ``max_scale_out``
  (2) x the most GPUs the job has been profiled on (at least 1), at most ``max_replicas`` (64; None:
  the cluster), at most its largest batch / smallest micro-batch; and, in this repository, at most the
  spec's ``gpu_cap`` (the simulator rejects more). A job never profiled therefore gets 1 GPU (its first
  round profiles it, the next may double it): Sia's bootstrapping on one GPU type.
* **Goodput** of job ``j`` on configuration ``c``: its goodput at its best batch there, from its own
  fitted model and measured gradient noise scale (``core.goodput.best_batch``, the model Pollux and the
  artifact use), up to the job's largest batch (``goodput.batch_limits``).
* **Normalisation** (paper §3.3, "row-normalise using the minimum value in each row"): divided by the
  smallest positive goodput over the job's valid configurations (the 1-GPU one in practice), so every
  row starts at 1. A job with no model yet, a pinned job, or one whose model finds no valid batch
  anywhere: 1 on the 1-GPU configuration only (the artifact's rows for jobs without a speedup function).
  Positive values are floored at ``ZERO_ALLOC_GAIN`` (1e-4), as the artifact does.
* **Restart factor** (paper eq. 2; artifact with ``sia_use_pollux_realloc_factor``): a job holding GPUs
  has every configuration other than its current one multiplied by
  ``max(age - restarts x S, 0) / (age + S)`` (age = seconds since submission, ``S`` =
  ``restart_penalty_s``, 30 s as this simulator's restart, or per model from
  ``restart_penalty_by_model``; the artifact uses per-model measured costs, 25 s deepspeech2 ... 250 s
  imagenet, and 30 s otherwise); 1 while ``age < S``. A job holding nothing (new or preempted) is
  not penalised on any configuration (the artifact's previous configuration is then "none").
* **Objective** (paper eq. 1; artifact ``__solve_mip_rescaled``): ``A = min(round(G ** p, 2), 3000)``
  (``fairness_p`` = -0.5, the paper's and artifact's default; ``round_decimals`` 2 and
  ``goodput_clip`` 3000 as the artifact) and, for p < 0, minimise ``sum of A over the chosen (job,
  configuration) pairs + lambda_n x (jobs without a configuration)`` (``lambda_n`` = 1.1); for p > 0
  maximise the same expression (``lambda_n`` must then be negative: the artifact requires
  sign(lambda_n) != sign(p)). Minimising sum G^p for p < 0 is maximising the power mean of the
  normalised goodputs. Constraints: at most one configuration per job, GPUs used <= the cluster's.
  Configurations outside a job's limit or with zero goodput are excluded; the artifact keeps them at
  ``ZERO_ALLOC_GAIN`` (cost 1e-4^-0.5 = 100 > lambda_n), so under the defaults this is the same problem.
  ``lambda_a`` (default 0): an extra cost for every choice other than its current configuration of a
  job holding GPUs. The artifact's CLI takes ``--mip_lambda_a`` (0.01) but its Sia solver never reads
  it (only the older ``sia_fix.py`` uses it, on each changed configuration entry); 0 reproduces Sia.
* **Solver**: the problem is a multiple-choice knapsack over GPU counts, solved exactly by a dynamic
  programme over (jobs x GPUs), vectorised over the GPU axis (numpy only; the artifact calls CBC through
  cvxpy with a 1e-4 relative gap). Ties: a job earlier in (submit time, name) order wins equal
  objectives, smaller configurations win over larger ones, and a running job keeping its configuration
  gets a bonus of ``10^-round_decimals / (4 (J + 1))`` (1e-9 / (J + 1) without rounding), too small in
  total to change the optimum of the rounded objective, so restarts are avoided wherever they cost
  nothing.
* **Jobs being restarted** (artifact ``preserve_ckpt_allocs``): a running job still inside its restart
  (``now - last change < S``) keeps its allocation (``preserve_restarting``; never the case when the
  restart is shorter than the round, as in this simulator's default 30 s / 60 s).
* **Pinned models** (``pinned_models``, default NCF): one GPU and the trace's fixed batch, as the Pollux
  simulator runs NCF. The Sia artifact means to do the same (it marks NCF rigid with one replica) but
  tests ``'ncf' in job.applications``, a dict keyed by GPU type, so in its runs NCF stays adaptive
  (with its batch capped at 32768 for the scheduler's estimates): ``pinned_models=()`` does that.
* **Batch**: jobs tune their own (``Allocation.batch_tuned_by_job``), as AdaptDL's trainer does in the
  artifact, picking their goodput-optimal batch for the GPUs they get (``goodput.job_batch``). (The
  artifact's scheduler estimates each job's goodput with its trace batch as the largest batch while the
  job tunes up to the profile's largest; here both use the job's largest batch.)
* **Placement** (paper §3.2 Placer; artifact ``alloc_to_placement``): a job keeping its configuration
  keeps its GPUs; the others, largest first, take whole free nodes (multi-node configurations; nodes
  they already use first) or one node with room (nodes they already use first, then best fit), GPUs
  they hold first. If fragmentation leaves a job without room, every job is placed again in that order
  (multi-node first), each preferring the GPUs it holds: with power-of-two single-node counts on
  power-of-two nodes this always fits. Where it still cannot (odd node sizes), the job falls back to
  the largest of its smaller configurations that model, or waits.

No random choice is made; the generator of ``PolicyBase`` is kept for the common interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ones_pipeline.core import goodput as gp
from ones_pipeline.core.policies.base import PolicyBase, check_bool, check_float, check_int
from ones_pipeline.core.policies.common import active_views, held_gpus, new_allocation, workload_batch
from ones_pipeline.core.types import Allocation, Cluster, JobView, Schedule

ZERO_ALLOC_GAIN = 1e-4  # floor of a normalised goodput (artifact)


# ------------------------------------------------------------------------------------------------ configs
def configurations(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, gpus)`` of Sia's configuration set for ``cluster``, ascending in GPUs."""
    R = max(cluster.gpus_per_node)
    single = []
    g = 1
    while g < R:
        single.append(g)
        g *= 2
    single.append(R)
    full = sum(1 for c in cluster.gpus_per_node if c == R)
    nodes = [1] * len(single) + list(range(2, full + 1))
    gpus = single + [k * R for k in range(2, full + 1)]
    return np.array(nodes, dtype=np.int64), np.array(gpus, dtype=np.int64)


# ------------------------------------------------------------------------------------------------ solver
def solve_mckp(gains: np.ndarray, widths: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
    """Exact multiple-choice knapsack: pick at most one column per row of ``gains`` (J, K) (the gain
    over choosing nothing; -inf where not allowed), columns costing ``widths`` (K,) GPUs, at most
    ``capacity`` GPUs in all, maximising the sum of gains. Returns (chosen column per row, -1 = none;
    the optimal total gain).

    Dynamic programme over rows: ``best[c]`` = the best total with at most ``c`` GPUs, one numpy pass
    over the capacity axis per (row, useful column); columns with gain <= 0 never help and are skipped.
    Ties keep the earlier option (nothing, then narrower columns; earlier rows win).
    """
    gains = np.asarray(gains, dtype=float)
    widths = np.asarray(widths, dtype=np.int64)
    J, K = gains.shape
    choice = np.full(J, -1, dtype=np.int64)
    if J == 0 or capacity <= 0:
        return choice, 0.0
    useful = (gains > 0) & (widths[None, :] <= capacity)
    widest = np.where(useful, widths[None, :], 0).max(axis=1) if K else np.zeros(J, dtype=np.int64)
    C = int(min(capacity, widest.sum()))
    if C == 0:
        return choice, 0.0
    best = np.zeros(C + 1)
    arg = np.full((J, C + 1), -1, dtype=np.int16 if K < 32000 else np.int32)
    rows = np.flatnonzero(useful.any(axis=1))
    for j in rows:
        new = best.copy()
        a = arg[j]
        for k in np.flatnonzero(useful[j]):
            w = int(widths[k])
            if w > C:
                continue
            cand = best[: C + 1 - w] + gains[j, k]
            better = cand > new[w:]
            new[w:] = np.where(better, cand, new[w:])
            a[w:] = np.where(better, k, a[w:])
        best = new
    c = C
    for j in rows[::-1]:
        k = int(arg[j, c])
        if k >= 0:
            choice[j] = k
            c -= int(widths[k])
    return choice, float(best[C])


# ------------------------------------------------------------------------------------------------ policy
class SiaPolicy(PolicyBase):
    """Sia on a homogeneous cluster (see the module docstring)."""

    name = "sia"

    def __init__(self, seed: int = 0, fairness_p: float = -0.5, lambda_n: float = 1.1, lambda_a: float = 0.0,
                 restart_penalty_s: float = 30.0, restart_penalty_by_model: Mapping[str, float] | None = None,
                 max_scale_out: float = 2.0, max_replicas: int | None = 64, goodput_clip: float = 3000.0,
                 round_decimals: int | None = 2, pinned_models: Sequence[str] = ("ncf",),
                 jobs_tune_batch: bool = True, preserve_restarting: bool = True,
                 model: gp.GoodputModel | None = None) -> None:
        super().__init__(seed)
        self.model = model if model is not None else gp.GoodputModel()  # values the jobs; fits kept
        n = self.name
        self.fairness_p = check_float(n, "fairness_p", fairness_p, -10.0, 10.0)
        if self.fairness_p == 0:
            raise ValueError(f"{n}: fairness_p must be non-zero (the artifact rejects p = 0), got {fairness_p!r}")
        self.lambda_n = check_float(n, "lambda_n", lambda_n)
        self.lambda_a = check_float(n, "lambda_a", lambda_a)
        for field, value in (("lambda_n", self.lambda_n), ("lambda_a", self.lambda_a)):
            if value != 0 and (value > 0) == (self.fairness_p > 0):
                raise ValueError(f"{n}: {field} must be 0 or of the opposite sign of fairness_p "
                                 f"({self.fairness_p}): it is a cost, got {value!r}")
        self.restart_penalty_s = check_float(n, "restart_penalty_s", restart_penalty_s, 0.0)
        by_model = {} if restart_penalty_by_model is None else restart_penalty_by_model
        if not isinstance(by_model, Mapping) or not all(isinstance(k, str) for k in by_model):
            raise ValueError(f"{n}: restart_penalty_by_model must map model names to seconds, "
                             f"got {restart_penalty_by_model!r}")
        self.restart_penalty_by_model = {k: check_float(n, f"restart_penalty_by_model[{k!r}]", v, 0.0)
                                         for k, v in by_model.items()}
        self.max_scale_out = check_float(n, "max_scale_out", max_scale_out, 1.0)
        self.max_replicas = None if max_replicas is None else check_int(n, "max_replicas", max_replicas, 1)
        self.goodput_clip = check_float(n, "goodput_clip", goodput_clip, 0.0, strict_min=True)
        self.round_decimals = None if round_decimals is None else check_int(n, "round_decimals", round_decimals, 0)
        if isinstance(pinned_models, (str, bytes)) or not all(isinstance(m, str) for m in pinned_models):
            raise ValueError(f"{n}: pinned_models must be a list of model names, got {pinned_models!r}")
        self.pinned_models = tuple(pinned_models)
        self.jobs_tune_batch = check_bool(n, "jobs_tune_batch", jobs_tune_batch)
        self.preserve_restarting = check_bool(n, "preserve_restarting", preserve_restarting)

    def params(self) -> dict[str, Any]:
        return {"fairness_p": self.fairness_p, "lambda_n": self.lambda_n, "lambda_a": self.lambda_a,
                "restart_penalty_s": self.restart_penalty_s,
                "restart_penalty_by_model": dict(self.restart_penalty_by_model),
                "max_scale_out": self.max_scale_out, "max_replicas": self.max_replicas,
                "goodput_clip": self.goodput_clip, "round_decimals": self.round_decimals,
                "pinned_models": list(self.pinned_models), "jobs_tune_batch": self.jobs_tune_batch,
                "preserve_restarting": self.preserve_restarting}

    def restart_penalty(self, model: str) -> float:
        return self.restart_penalty_by_model.get(model, self.restart_penalty_s)

    # ----------------------------------------------------------------------------------------------
    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        views = sorted(active_views(self.name, jobs), key=lambda v: (v.submit_time_s, v.name))
        if not views:
            return Schedule({})
        pb = SiaProblem(self, now_s, cluster, views, current)
        choice, _ = solve_mckp(pb.gains, pb.widths, pb.capacity)
        return pb.schedule(choice, self.jobs_tune_batch)


class SiaProblem:
    """One round: configurations, per-job limits, the normalised goodput matrix, the objective's gains
    over "no configuration", and turning a choice into a ``Schedule``."""

    def __init__(self, policy: SiaPolicy, now_s: float, cluster: Cluster, views: Sequence[JobView],
                 current: Schedule) -> None:
        self.policy, self.cluster, self.current = policy, cluster, current
        self.views = list(views)
        self.names = [v.name for v in views]
        self.cfg_nodes, self.widths = configurations(cluster)
        self.held = held_gpus(cluster, current, self.names)
        self.pinned = np.array([v.spec.model in policy.pinned_models for v in views], dtype=bool)
        self.limit = self._limits()  # (J,)
        valid = self.widths[None, :] <= self.limit[:, None]  # (J, K)
        self.cur = self._current_configurations(valid)  # (J,)
        running = self.cur > -2
        self.fixed = self._restarting(now_s, running)  # (J,)
        self.capacity = cluster.num_gpus - sum(len(self.held[self.names[j]]) for j in np.flatnonzero(self.fixed))
        self.speedup = normalised_goodput(views, self.cfg_nodes, self.widths, valid, self.pinned,
                                          policy.model)  # (J, K)
        self.factor = self._restart_factor(now_s)  # (J,)
        self.A, self.value, self.value_none, self.gains = self._objective_terms(valid, running)

    # ---------------------------------------------------------------- setup steps
    def _limits(self) -> np.ndarray:
        """(J,) the most GPUs each job may get (see the module docstring; pinned jobs: 1)."""
        policy, G = self.policy, self.cluster.num_gpus
        limit = np.ones(len(self.views), dtype=np.int64)
        for j, v in enumerate(self.views):
            if self.pinned[j]:
                continue
            _, top, lo_micro, _ = gp.batch_limits(v.spec)
            seen = max((o.num_gpus for o in v.throughput_obs), default=0)
            cap = min(max(int(policy.max_scale_out * seen), 1), int(top // lo_micro), v.spec.gpu_cap, G)
            if policy.max_replicas is not None:
                cap = min(cap, policy.max_replicas)
            limit[j] = max(cap, 1)
        return limit

    def _current_configurations(self, valid: np.ndarray) -> np.ndarray:
        """(J,) index of each job's current configuration: -1 when it holds GPUs in no valid Sia
        configuration, -2 when it holds none."""
        cur = np.full(len(self.views), -2, dtype=np.int64)
        for j, name in enumerate(self.names):
            gpus = self.held.get(name)
            if not gpus:
                continue
            k_nodes = len(self.cluster.placement(gpus))
            match = np.flatnonzero((self.widths == len(gpus)) & (self.cfg_nodes == k_nodes) & valid[j])
            cur[j] = int(match[0]) if match.size else -1
        return cur

    def _restarting(self, now_s: float, running: np.ndarray) -> np.ndarray:
        """(J,) bool: running jobs still inside their restart, which keep their allocation
        (``preserve_restarting``)."""
        policy = self.policy
        fixed = np.zeros(len(self.views), dtype=bool)
        if not policy.preserve_restarting:
            return fixed
        for j, v in enumerate(self.views):
            alloc = self.current.allocations.get(v.name)
            if running[j] and v.last_change_s is not None and alloc is not None and \
                    tuple(sorted(self.held[v.name])) == alloc.gpus and \
                    now_s - v.last_change_s < policy.restart_penalty(v.spec.model):
                fixed[j] = True
        return fixed

    def _restart_factor(self, now_s: float) -> np.ndarray:
        """(J,) ``max(age - restarts x S, 0) / (age + S)``, 1 while ``age < S`` (paper eq. 2)."""
        views = self.views
        age = np.array([max(now_s - v.submit_time_s, 0.0) for v in views])
        restarts = np.array([v.restarts for v in views], dtype=float)
        delay = np.array([self.policy.restart_penalty(v.spec.model) for v in views])
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(delay > 0, np.maximum(age - restarts * delay, 0.0) / (age + delay), 1.0)
        return np.where((age < delay) | ~np.isfinite(factor), 1.0, factor)

    def _objective_terms(self, valid: np.ndarray,
                         running: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(A, value, value_none, gains)``: ``A = clip(round(G^p, d))`` (J, K) with the restart factor on
        configurations other than a running job's current one, the objective value of each choice (J, K)
        and of choosing nothing (J,), and the knapsack's gains over nothing (J, K; -inf where not
        allowed, a tie-break bonus for a running job keeping its configuration)."""
        policy = self.policy
        J, K = valid.shape
        changed = running[:, None] & (np.arange(K)[None, :] != self.cur[:, None])  # (J, K)
        scaled = np.where(changed, self.speedup * self.factor[:, None], self.speedup)
        p = policy.fairness_p
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            A = np.power(scaled, p)
        A = np.where(np.isfinite(A), A, np.inf)
        if policy.round_decimals is not None:
            A = np.round(A, policy.round_decimals)
        A = np.minimum(A, policy.goodput_clip)
        sign = -1.0 if p < 0 else 1.0
        value = sign * (A + policy.lambda_a * changed)
        value_none = sign * (policy.lambda_n + policy.lambda_a * running)
        gains = value - value_none[:, None]
        grid = 10.0 ** -policy.round_decimals if policy.round_decimals is not None else 1e-8
        keep = running[:, None] & ~changed
        gains = gains + np.where(keep, grid / (4.0 * (J + 1)), 0.0)
        gains = np.where(valid & (self.speedup > 0), gains, -np.inf)
        gains[self.fixed] = -np.inf  # placed as they are, outside the knapsack
        return A, value, value_none, gains

    # ---------------------------------------------------------------- result
    def objective(self, choice: np.ndarray) -> float:
        """The artifact's objective (minimised for p < 0, maximised for p > 0) of a choice over the jobs
        not fixed (tie-break bonus excluded)."""
        sign = -1.0 if self.policy.fairness_p < 0 else 1.0
        total = 0.0
        for j, k in enumerate(choice):
            if self.fixed[j]:
                continue
            total += self.value[j, k] if k >= 0 else self.value_none[j]
        return sign * total

    def schedule(self, choice: np.ndarray, tune_batch: bool) -> Schedule:
        cluster, current = self.cluster, self.current
        out: dict[str, Allocation] = {}
        taken = np.zeros(cluster.num_gpus, dtype=bool)
        for j in np.flatnonzero(self.fixed):
            name = self.names[j]
            out[name] = current.allocations[name]
            taken[list(self.held[name])] = True
        wanted = [(j, int(k)) for j, k in enumerate(choice) if k >= 0 and not self.fixed[j]]
        placed = place(cluster, self.cfg_nodes, self.widths, wanted, self.held, self.names,
                       keep={j for j, k in wanted if k == self.cur[j]}, taken=taken)
        for j, (k, slots) in placed.items():
            v = self.views[j]
            alloc = current.allocations.get(v.name)
            n = len(slots)
            tuned = tune_batch and not self.pinned[j]
            if alloc is not None and tuple(sorted(alloc.gpus)) == tuple(sorted(slots)):
                batch = alloc.global_batch
            elif tuned:
                micro, accum = self.policy.model.batch(v.spec, tuple(v.throughput_obs), v.grad_noise_scale,
                                                       int(self.cfg_nodes[k]), n)
                batch = n * micro * (accum + 1)
            else:
                batch = workload_batch(v.spec)
            new = new_allocation(v, slots, int(batch), current)
            out[v.name] = replace(new, batch_tuned_by_job=tuned) if new.batch_tuned_by_job != tuned else new
        return Schedule(out)


def normalised_goodput(views: Sequence[JobView], cfg_nodes: np.ndarray, widths: np.ndarray, valid: np.ndarray,
                       pinned: np.ndarray, model: gp.GoodputModel | None = None) -> np.ndarray:
    """(J, K) goodput of each job on each configuration at its best batch, over its smallest positive
    value on its valid configurations; 0 where invalid. Jobs without a model (or pinned, or without any
    positive goodput): 1 on the 1-GPU configuration only."""
    J, K = valid.shape
    out = np.zeros((J, K))
    modelled = [j for j, v in enumerate(views) if v.throughput_obs and v.grad_noise_scale is not None
                and not pinned[j]]
    one = np.flatnonzero(widths == 1)[0]
    if modelled:
        idx = np.array(modelled)
        jj, kk = np.nonzero(valid[idx])
        jj = idx[jj]
        lim = np.array([gp.batch_limits(views[j].spec) for j in modelled])  # (M, 4)
        model = model if model is not None else gp.GoodputModel()
        model.fit(tuple(views[j].throughput_obs) for j in modelled)  # all new fits in one batch
        params = np.stack([model.fitted(views[j].throughput_obs) for j in modelled])
        gns = np.array([float(views[j].grad_noise_scale) for j in modelled])
        pos = np.full(J, -1, dtype=np.int64)
        pos[idx] = np.arange(len(modelled))
        m = pos[jj]
        good, _, _ = gp.best_batch(params[m], gns[m], lim[m, 0], lim[m, 1], lim[m, 2], lim[m, 3],
                                   cfg_nodes[kk], widths[kk])
        out[jj, kk] = good
    positive = out > 0
    has = positive.any(axis=1)
    base = np.where(positive, out, np.inf).min(axis=1)
    out = np.where(has[:, None], out / np.where(has, base, 1.0)[:, None], 0.0)
    out[~has, one] = 1.0
    return np.where(valid & (out > 0), np.maximum(out, ZERO_ALLOC_GAIN), 0.0)


# ------------------------------------------------------------------------------------------------ placement
def place(cluster: Cluster, cfg_nodes: np.ndarray, widths: np.ndarray, wanted: Sequence[tuple[int, int]],
          held: Mapping[str, Sequence[int]], names: Sequence[str], keep: set[int],
          taken: np.ndarray | None = None) -> dict[int, tuple[int, list[int]]]:
    """Concrete GPUs for ``wanted`` (job index, configuration index): ``{job: (configuration, GPUs)}``.
    Jobs in ``keep`` keep their held GPUs; see the module docstring for the rest and the fallbacks."""
    placer = _Placer(cluster, cfg_nodes, widths, wanted, held, names, keep, taken)
    out, failed = placer.run(keep_first=True)
    if not failed:
        return out
    out, failed = placer.run(keep_first=False)  # repack everything, each job preferring its GPUs
    free = ~placer.base
    for _, slots in out.values():
        free[slots] = False
    for j, k in failed:  # only with odd node sizes: the largest smaller configuration that fits
        for k2 in range(k - 1, -1, -1):
            slots = placer.put(free, j, k2)
            if slots is not None:
                out[j] = (k2, slots)
                free[slots] = False
                break
    return out


class _Placer:
    """The fixed inputs of one ``place`` call and its steps: put one job, keep one job, place them all."""

    def __init__(self, cluster: Cluster, cfg_nodes: np.ndarray, widths: np.ndarray,
                 wanted: Sequence[tuple[int, int]], held: Mapping[str, Sequence[int]], names: Sequence[str],
                 keep: set[int], taken: np.ndarray | None) -> None:
        self.cluster, self.cfg_nodes, self.widths = cluster, cfg_nodes, widths
        self.wanted, self.held, self.names, self.keep = wanted, held, names, keep
        self.node_of = node_of = cluster.node_of
        self.cap = np.array(cluster.gpus_per_node, dtype=np.int64)  # (N,)
        self.R = int(self.cap.max())
        self.base = np.zeros(cluster.num_gpus, dtype=bool) if taken is None else taken.copy()  # (G,) taken
        self.order = {j: i for i, (j, _) in enumerate(wanted)}
        self.kept_nodes = np.zeros(cluster.num_nodes, dtype=np.int64)  # (N,) GPUs of kept jobs per node (now)
        for j in keep:
            np.add.at(self.kept_nodes, node_of[list(held[names[j]])], 1)
        self.held_by = np.full(cluster.num_gpus, -1, dtype=np.int64)  # (G,) job index holding each GPU now
        for j, _ in wanted:
            self.held_by[list(held.get(names[j], ()))] = j

    def put(self, free: np.ndarray, j: int, k: int) -> list[int] | None:
        """GPUs for job ``j`` in configuration ``k`` among ``free`` (G,), or None if it does not fit."""
        node_of, num_nodes = self.node_of, self.cluster.num_nodes
        mine = np.array(self.held.get(self.names[j], ()), dtype=np.int64)
        own = np.bincount(node_of[mine], minlength=num_nodes) if mine.size else np.zeros(num_nodes, dtype=np.int64)
        free_per = np.bincount(node_of[free], minlength=num_nodes)
        n_nodes, n = int(self.cfg_nodes[k]), int(self.widths[k])
        if n_nodes > 1:
            ok = np.flatnonzero((self.cap == self.R) & (free_per == self.R))
            if ok.size < n_nodes:
                return None
            pick = sorted(ok, key=lambda x: (-own[x], self.kept_nodes[x], x))[:n_nodes]
            return [int(g) for x in pick for g in np.flatnonzero(node_of == x)]
        ok = np.flatnonzero(free_per >= n)
        if not ok.size:
            return None
        x = min(ok, key=lambda y: (-own[y], free_per[y], y))
        slots = np.flatnonzero(free & (node_of == x))
        # Its own GPUs first, then GPUs nobody else placed later holds, lowest first.
        held_by = self.held_by
        ranked = sorted((int(g) for g in slots), key=lambda g: (held_by[g] != j, held_by[g] >= 0, g))
        return sorted(ranked[:n])

    def can_keep(self, free: np.ndarray, j: int, k: int) -> bool:
        gpus = list(self.held.get(self.names[j], ()))
        return len(gpus) == int(self.widths[k]) and bool(free[gpus].all())

    def run(self, keep_first: bool) -> tuple[dict[int, tuple[int, list[int]]], list[tuple[int, int]]]:
        """Place every wanted job: ``(placed, failed (job, configuration) pairs)``."""
        free = ~self.base
        out: dict[int, tuple[int, list[int]]] = {}
        if keep_first:
            for j, k in self.wanted:
                if j in self.keep and self.can_keep(free, j, k):
                    gpus = sorted(int(g) for g in self.held[self.names[j]])
                    out[j] = (k, gpus)
                    free[gpus] = False
        failed = []
        # Multi-node configurations first, then single-node ones; largest first; among equals, a job
        # whose GPUs are still free first (it keeps them), then (submit, name) order.
        for multi in (True, False):
            group = [(j, k) for j, k in self.wanted if j not in out and (self.cfg_nodes[k] > 1) == multi]
            group.sort(key=lambda jk: (-self.widths[jk[1]], not self.can_keep(free, *jk), self.order[jk[0]]))
            for j, k in group:
                slots = self.put(free, j, k)
                if slots is None:
                    failed.append((j, k))
                    continue
                out[j] = (k, slots)
                free[slots] = False
        return out, failed
