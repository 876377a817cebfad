"""Pollux's goodput model (Qiao et al., OSDI'21): step time with compute/network overlap, fitted online,
times the statistical efficiency of the batch; and the job's goodput-optimal batch for an allocation.

This is an independent numpy formulation of the model the Pollux authors' simulator and AdaptDL use
(``adaptdl/goodput.py``); ``pollux``, ``sia`` and the simulator's job-side batch tuning share it.

Step time of one optimizer step on ``k`` nodes and ``n`` replicas (GPUs), micro-batch ``b`` per GPU and
``a`` extra accumulation micro-steps, with the 7 parameters ``(ac, bc, an, bn, ar, br, gamma)``::

    compute(b)  = ac + bc * b                                  # one forward + backward pass
    network     = an + bn * max(n - 2, 0)   if k > 1           # ring all-reduce across nodes
                = ar + br * max(n - 2, 0)   if k == 1, n > 1   # ... inside one node
                = 0                          if n == 1
    optim_step  = (compute^gamma + network^gamma)^(1/gamma)    # gamma in [1, 10]: 1 = no overlap,
                                                               # large = full overlap (max)
    step        = a * compute(b) + optim_step
    throughput  = n * b * (a + 1) / step                       # samples / s

The fit minimises the root-mean-square log error of the compute and the step time over what the job has
observed, plus two small penalties (towards gamma = 1, and against the "retrogression" slopes bn, br).
Parameters the data cannot inform stay at their floor: with no multi-GPU observation the network is
nearly free, with no multi-node one crossing nodes costs 1.1x the in-node network, with one micro-batch
size ``ac`` is half the compute time. The model is therefore optimistic about what a job has not tried,
which is what lets a goodput-driven scheduler scale a job out (and then correct itself).
Fits are memoised per observation tuple in the ``GoodputModel`` its owner keeps (``fitted``); a policy fits all
its jobs' new tuples in one batched BFGS run (``fit_many``, ``core.perf_fit``) rather than one job after the
other. ``GoodputModel`` is the object every policy, the simulator's jobs and the live batch tuner value jobs
with: this equation for measured jobs, ``core.throughput``'s as the prior of unmeasured ones.

Statistical efficiency of a total batch ``M`` with gradient noise scale ``gns`` measured at base batch
``M0``: ``(gns + M0) / (gns + M)`` (``core.efficiency``). Goodput = throughput x efficiency, in base-batch
samples per second.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core import throughput as tp
from ones_pipeline.core.perf_fit import _FLOOR, N_PERF, fit_perf_params, fit_perf_params_many
from ones_pipeline.core.types import JobSpec, JobView, ThroughputObs, obs_key

__all__ = ["N_PERF", "fit_perf_params"]  # the fit (core.perf_fit), part of this model's interface

BATCH_CANDIDATES = 50  # geometric grid of total batch sizes searched per allocation
_EPS = 1e-8


# ------------------------------------------------------------------------------------------ model
def _network(p: np.ndarray, nodes, replicas) -> np.ndarray:
    k = np.asarray(nodes, dtype=float)
    n = np.asarray(replicas, dtype=float)
    inter = k > 1
    intra = ~inter & (n > 1)
    alpha = np.where(inter, p[..., 2], np.where(intra, p[..., 4], _FLOOR))
    beta = np.where(inter, p[..., 3], np.where(intra, p[..., 5], _FLOOR))
    return alpha + beta * np.maximum(n - 2.0, _FLOOR)


def step_time(params: np.ndarray, nodes, replicas, micro_batch, accum_steps=0) -> np.ndarray:
    """Seconds per optimizer step (arrays broadcast; ``params`` (..., 7))."""
    p = np.asarray(params, dtype=float)
    compute = p[..., 0] + p[..., 1] * np.asarray(micro_batch, dtype=float)
    net = _network(p, nodes, replicas)
    g = p[..., 6]
    # (c^g + n^g)^(1/g) computed as max * (1 + (min/max)^g)^(1/g): no overflow for any gamma.
    hi = np.maximum(compute, net)
    lo = np.minimum(compute, net)
    optim = hi * (1.0 + (lo / hi) ** g) ** (1.0 / g)
    return np.asarray(accum_steps, dtype=float) * compute + optim


def throughput(params: np.ndarray, nodes, replicas, micro_batch, accum_steps=0) -> np.ndarray:
    """Samples per second."""
    n = np.asarray(replicas, dtype=float)
    b = np.asarray(micro_batch, dtype=float)
    a1 = np.asarray(accum_steps, dtype=float) + 1.0
    return n * b * a1 / step_time(params, nodes, replicas, micro_batch, accum_steps)


# ------------------------------------------------------------------------------------------ batch choice
def split_for(batch, replicas, max_micro, base_batch):
    """(micro-batch, accumulation steps) for total batches ``batch`` on ``replicas`` GPUs.

    Accumulate when the per-GPU batch exceeds ``max_micro``; on a single GPU above the base batch always
    at least two micro-steps (AdaptDL: the gradient statistics need two micro-batches to be estimated).
    """
    local = np.asarray(batch, dtype=float) / np.asarray(replicas, dtype=float)
    accum = np.ceil(local / np.asarray(max_micro, dtype=float) - _EPS) - 1.0
    single = (np.asarray(replicas) == 1) & (local > np.asarray(base_batch, dtype=float) + _EPS)
    accum = np.where(single, np.maximum(accum, 1.0), accum)
    accum = np.maximum(accum, 0.0)
    micro = np.ceil(local / (accum + 1.0) - _EPS)
    return micro, accum


def _goodput_in_place(p, k, n, micro, accum, total, gns, m0) -> np.ndarray:
    """``best_batch``'s goodput of each candidate: ``throughput x efficiency`` as ``step_time``,
    ``throughput`` and ``efficiency`` compute it, operation for operation, in ``total``'s memory."""
    # step time (step_time): compute, then the optimiser step against the network
    compute = np.multiply(p[..., 1], micro)
    np.add(compute, p[..., 0], out=compute)
    net = _network(p, k, n)
    g = p[..., 6]
    top = np.maximum(compute, net)
    r = np.minimum(compute, net)
    np.divide(r, top, out=r)
    np.power(r, g, out=r)
    np.add(r, 1.0, out=r)
    np.power(r, 1.0 / g, out=r)
    np.multiply(top, r, out=r)  # optim
    np.multiply(accum, compute, out=compute)
    np.add(compute, r, out=compute)  # step time
    eff = np.maximum(total, m0)  # efficiency at the total batch
    gn = np.maximum(np.asarray(gns, dtype=float), 0.0)
    np.add(eff, gn, out=eff)
    np.divide(gn + m0, eff, out=eff)
    good = np.divide(total, compute, out=total)  # throughput
    return np.multiply(good, eff, out=good)


def best_batch(params: np.ndarray, gns, base_batch, max_batch, min_micro, max_micro, nodes, replicas,
               candidates: int = BATCH_CANDIDATES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Goodput-optimal batch of each allocation: ``(goodput, micro_batch, accum_steps)``, each of the
    broadcast shape of ``nodes``/``replicas`` (per-job arguments broadcast against them; ``params``
    (..., 7)).

    Candidates: ``candidates`` total batches geometrically spaced from max(base batch, min micro-batch x
    GPUs) to ``max_batch``, each split by :func:`split_for`; a candidate whose micro-batch falls outside
    [min_micro, max_micro] has goodput 0. Goodput in base-batch samples per second. In place (the (C, ...)
    arrays reach tens of MB), operation for operation as ``split_for`` and the model functions (tested).
    """
    k, n = np.broadcast_arrays(np.asarray(nodes, dtype=float), np.asarray(replicas, dtype=float))
    p = np.asarray(params, dtype=float)
    m0 = np.asarray(base_batch, dtype=float)
    lo_micro, hi_micro = np.asarray(min_micro, dtype=float), np.asarray(max_micro, dtype=float)
    lo = np.maximum(m0, lo_micro * n)
    hi = np.broadcast_to(np.asarray(max_batch, dtype=float), lo.shape)
    frac = np.linspace(0.0, 1.0, candidates) if candidates > 1 else np.zeros(1)
    frac = frac.reshape((candidates,) + (1,) * lo.ndim)
    local = np.power(hi / lo, frac)
    np.multiply(lo, local, out=local)  # the candidate total batches, geometric from lo to hi
    np.divide(local, n, out=local)  # split_for: per-GPU batch
    accum = np.divide(local, hi_micro)
    np.subtract(accum, _EPS, out=accum)
    np.ceil(accum, out=accum)
    np.subtract(accum, 1.0, out=accum)
    single = np.greater(local, m0 + _EPS)
    np.logical_and(single, n == 1, out=single)
    np.maximum(accum, single, out=accum)  # at least 1 where single, at least 0 everywhere
    a1 = accum + 1.0
    micro = np.divide(local, a1, out=local)
    np.subtract(micro, _EPS, out=micro)
    np.ceil(micro, out=micro)
    total = np.multiply(n, micro)
    np.multiply(total, a1, out=total)  # samples per step
    good = _goodput_in_place(p, k, n, micro, accum, total, gns, m0)
    bad = np.less(micro, lo_micro)
    np.logical_or(bad, micro > hi_micro, out=bad)
    np.logical_or(bad, ~(n > 0), out=bad)
    np.copyto(good, 0.0, where=bad)
    i = np.argmax(good, axis=0)[None]
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, good.shape), i, axis=0)[0]  # noqa: E731
    return pick(good), pick(micro).astype(np.int64), pick(accum).astype(np.int64)


# ------------------------------------------------------------------------------------------ per job
def batch_limits(spec: JobSpec) -> tuple[float, float, float, float]:
    """``(base batch M0, largest total batch, smallest micro-batch, largest micro-batch)`` of a job.

    M0 is ``min_global_batch`` when the spec gives it (the Pollux profiles' smallest validated batch),
    else the 1-GPU recipe ``per_gpu_batch``. Without a cap on the total batch: 64 x M0.
    """
    m0 = float(spec.min_global_batch or spec.per_gpu_batch)
    cap = spec.global_batch_cap
    has_cap = spec.max_lr is not None or spec.max_global_batch is not None
    top = float(cap) if has_cap else 64.0 * m0
    top = max(top, m0)
    lo_micro = float(spec.min_per_gpu_batch or 1)
    hi_micro = float(spec.max_per_gpu_batch or top)
    return m0, top, lo_micro, max(hi_micro, lo_micro)


class PerfParams(NamedTuple):
    """The 7 parameters of the step-time equation, named as AdaptDL's ``PerfParams``; the model's functions take
    them as a ``(..., 7)`` array in this order (``np.asarray(params)``). On ``k`` nodes, ``n`` GPUs, micro-batch
    ``b``, ``a`` extra accumulation micro-steps::

        compute = alpha_c + beta_c * b
        network = alpha_n + beta_n * max(n - 2, 0) if k > 1, alpha_r + beta_r * max(n - 2, 0) if n > 1, else 0
        step    = a * compute + (compute^gamma + network^gamma)^(1 / gamma)
    """

    alpha_c: float  # compute: constant (s)
    beta_c: float  # compute: per sample of the micro-batch (s)
    alpha_n: float  # all-reduce across nodes: constant (s)
    beta_n: float  # ... per GPU beyond two (s)
    alpha_r: float  # all-reduce inside one node: constant (s)
    beta_r: float  # ... per GPU beyond two (s)
    gamma: float  # overlap of compute and all-reduce, in [1, 10]


class GoodputModel:
    """The goodput model one owner (a policy, a simulated job's batch tuner, a live job's ``BatchTuner``)
    values jobs with, and its memo of fits: nothing is shared through module state, and a policy built with
    a model (``make_policy(name, model=...)``) values jobs by that one (an experiment can give it another).

    A job's goodput on ``k`` nodes x ``n`` GPUs is ``throughput x efficiency`` at the batch the job picks
    there itself (``batch``: the goodput-optimal one under its fit and noise scale, as AdaptDL's trainer):

    * **measured** (step times and a noise scale of its own; or, before it has any, those its model's
      earlier jobs measured, which ``ones`` gives it, ``core.model_memory``): the step-time equation of the
      module docstring (``PerfParams``) fitted to them (``params``), searched over batches (``best_batch``);
    * **unmeasured otherwise** (``prior``): ``core.throughput``'s additive equation
      ``step = (a + 1)(c0 + c1 b) + [n > 1](s0 + s1 (n - 1)) + [k > 1](x0 + x1 (k - 1))``, ridge-fitted to
      its own steps, else the mean fit of its model's running jobs, else to its model's remembered steps,
      else a generic prior; at its smallest batch and the prior noise scale.

    The two equations are not one with two parameterisations: Pollux's overlaps compute and all-reduce
    (``gamma``) and prices the all-reduce by GPUs, inside or across nodes; the prior's adds them and prices
    crossing nodes by the node count. Valuing unmeasured jobs by the first changes decisions, so it is not
    done here (docs/ones_policy.md). Fits are memoised per observation tuple, at most ``limit`` per
    equation, the oldest half forgotten past it: a job refits only when it has run somewhere new.
    """

    def __init__(self, limit: int = 65536) -> None:
        self.limit = limit
        self.perf: dict[tuple[ThroughputObs, ...], np.ndarray] = {}
        self.linear: dict[tuple[ThroughputObs, ...], object] = {}

    def make_room(self, memo: dict, adding: int) -> None:
        for key in list(memo)[: len(memo) // 2 + adding] if len(memo) + adding > self.limit else ():
            del memo[key]

    def fit(self, observation_sets: Iterable[Sequence[ThroughputObs]]) -> None:
        """Fit every new observation tuple in one batch (``fit_many``)."""
        fit_many(observation_sets, self)

    def fitted(self, observations: Sequence[ThroughputObs]) -> np.ndarray:
        """(7,) read-only ``params`` as an array (``fitted``): what every goodput of a measured job is computed
        from, so a model that overrides it (an oracle's exact step times) values every such job by it."""
        return fitted(obs_key(observations), self)

    def params(self, observations: Sequence[ThroughputObs]) -> PerfParams:
        """The step-time equation's parameters fitted to ``observations`` (memoised)."""
        return PerfParams(*(float(v) for v in self.fitted(observations)))

    def batch(self, spec: JobSpec, observations: Sequence[ThroughputObs], gns: float | None, nodes: int,
              replicas: int) -> tuple[int, int]:
        """``(micro-batch, accumulation steps)`` the job picks on ``nodes`` x ``replicas`` (``job_batch``)."""
        return job_batch(spec, observations, gns, nodes, replicas, self)

    def batches(self, specs: Sequence[JobSpec], observations: Sequence[Sequence[ThroughputObs]],
                gns: Sequence[float | None], nodes: Sequence[int], replicas: Sequence[int]) -> list[tuple[int, int]]:
        """``batch`` of many allocations at once (``job_batches``)."""
        return job_batches(specs, observations, gns, nodes, replicas, self)

    def prior(self, jobs: Sequence[JobView], rows: np.ndarray | None = None) -> tp.ThroughputParams:
        """The prior equation's parameters of every job (``(J,)`` fields; with ``rows``, only those jobs')."""
        return prior_params(jobs, rows, self)

    def goodput(self, jobs: Sequence[JobView], rows: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """(R,) goodput of ``jobs[rows[i]]`` on ``nodes[i]`` x ``replicas[i]`` GPUs (``job_goodput``)."""
        return job_goodput(jobs, rows, nodes, replicas, self)


def fit_many(observation_sets: Iterable[Sequence[ThroughputObs]], model: GoodputModel) -> None:
    """Fit in one batch (``fit_perf_params_many``) every non-empty observation tuple not in ``model`` yet: a
    policy calls it once per decision, before it asks ``fitted`` job by job."""
    todo = list(dict.fromkeys(t for s in observation_sets if (t := obs_key(s)) and t not in model.perf))
    model.make_room(model.perf, len(todo))
    for key, p in zip(todo, fit_perf_params_many(todo), strict=True):
        p.setflags(write=False)
        model.perf[key] = p


def fitted(observations: tuple[ThroughputObs, ...], model: GoodputModel | None = None) -> np.ndarray:
    """(7,) read-only ``fit_perf_params`` of one job, memoised in ``model`` (fitted afresh without)."""
    if not observations:
        raise ValueError("fitted needs at least one observation")
    model = model if model is not None else GoodputModel()
    if observations not in model.perf:
        fit_many([observations], model)
    return model.perf[observations]


def job_batch(spec: JobSpec, observations: Sequence[ThroughputObs], gns: float | None, nodes: int,
              replicas: int, model: GoodputModel | None = None) -> tuple[int, int]:
    """``(micro-batch, accumulation steps)`` a job picks for itself on ``nodes`` nodes x ``replicas``
    GPUs, as AdaptDL's trainer does: the goodput-optimal batch under its own fitted model and measured
    noise scale; before it has measured anything, max(M0, smallest micro-batch x GPUs). The micro-batch is
    then capped so the total stays within the largest batch."""
    return job_batches([spec], [observations], [gns], [nodes], [replicas], model)[0]


def _settled(limits: tuple[float, float, float, float], picked: tuple[int, int] | None,
             replicas: int) -> tuple[int, int]:
    """``job_batch``'s last step: the searched ``picked`` (micro-batch, accumulation steps), or, unmeasured
    (None) or with no valid candidate, the smallest batch; the micro-batch capped so the total stays
    within the largest batch."""
    m0, top, lo_micro, hi_micro = limits
    n = int(replicas)
    if picked is None or picked[0] < 1:
        picked = tuple(int(v) for v in split_for(max(m0, lo_micro * n), n, hi_micro, m0))
    micro, accum = picked
    micro = min(micro, int(top // (n * (accum + 1))))
    return max(micro, 1), accum


def job_batches(specs: Sequence[JobSpec], observations: Sequence[Sequence[ThroughputObs]],
                gns: Sequence[float | None], nodes: Sequence[int], replicas: Sequence[int],
                model: GoodputModel | None = None) -> list[tuple[int, int]]:
    """``job_batch`` of many allocations at once (the i-th job on ``nodes[i]`` x ``replicas[i]``), the same
    values: the measured jobs' batch searches run as one ``best_batch`` call (a decision that starts or resizes
    thousands of jobs would otherwise search them one after the other)."""
    out: list[tuple[int, int] | None] = [None] * len(specs)
    measured = [i for i in range(len(specs)) if observations[i] and gns[i] is not None]
    if measured:
        obs = [tuple(observations[i]) for i in measured]
        model = model if model is not None else GoodputModel()
        model.fit(obs)
        lim = np.array([batch_limits(specs[i]) for i in measured])  # (M, 4)
        _, micro, accum = best_batch(np.stack([model.fitted(t) for t in obs]),
                                     np.array([gns[i] for i in measured], dtype=float), *lim.T,
                                     np.array([nodes[i] for i in measured], dtype=float),
                                     np.array([replicas[i] for i in measured], dtype=float))
        for r, i in enumerate(measured):
            out[i] = (int(micro[r]), int(accum[r]))
    return [_settled(batch_limits(spec), out[i], replicas[i]) for i, spec in enumerate(specs)]


# ------------------------------------------------------------------------------------------ unmeasured jobs
def prior_params(jobs: Sequence[JobView], rows: np.ndarray | None = None,
                 model: GoodputModel | None = None) -> tp.ThroughputParams:
    """``core.throughput`` parameters of every job, ``(J,)`` fields: each job's own fit, else the mean fit of
    jobs of the same model, else the fit of the step times earlier jobs of its model measured
    (``JobView.model_obs``), else the generic prior. With ``rows`` (indices into ``jobs``): only those
    jobs', ``(R,)`` fields, the same values, and only the fits they need are made (a job's own, and its
    model's other jobs' when it has none). Fits are memoised in ``model`` (``linear``) when given."""
    model = model if model is not None else GoodputModel()
    idx = np.arange(len(jobs)) if rows is None else np.asarray(rows, dtype=np.int64)
    wanted = {int(i) for i in idx}
    need_models = {jobs[i].spec.model for i in wanted if not jobs[i].throughput_obs}
    _fit_all(model, [obs_key(j.throughput_obs) for i, j in enumerate(jobs)
              if j.throughput_obs and (i in wanted or j.spec.model in need_models)]
             + [tuple(jobs[i].model_obs) for i in wanted if not jobs[i].throughput_obs and jobs[i].model_obs])
    own: dict[int, np.ndarray] = {}
    by_model: dict[str, list[np.ndarray]] = defaultdict(list)
    for i, j in enumerate(jobs):  # in job order: the model means sum their fits in the same order
        if j.throughput_obs and (i in wanted or j.spec.model in need_models):
            own[i] = p = _linear(model, obs_key(j.throughput_obs))
            by_model[j.spec.model].append(p)
    model_mean = {model: np.mean(ps, axis=0) for model, ps in by_model.items()
                  if model in need_models}  # once per model
    default = np.asarray(tp.DEFAULT_PARAMS, dtype=float)
    out = np.empty((len(idx), tp.N_PARAMS))
    for r, i in enumerate(idx):
        j = jobs[i]
        p = own.get(int(i))
        if p is None:
            p = model_mean.get(j.spec.model)
        if p is None and j.model_obs:
            p = _linear(model, tuple(j.model_obs))
        out[r] = default if p is None else p
    return tp.ThroughputParams.from_array(out)


def _linear(model: GoodputModel, observations: tuple) -> np.ndarray:
    """The linear fit of ``observations`` as an array, from ``model`` (fitted now if it was forgotten)."""
    if observations not in model.linear:
        _fit_all(model, [observations])
    return np.asarray(model.linear[observations], dtype=float)


def _fit_all(model: GoodputModel, observation_sets) -> None:
    """Fit, in one batch (``tp.fit_params_many``: the same values), every observation tuple not in
    ``model.linear`` yet (the result of a fit is an immutable tuple of numbers, safe to share)."""
    todo = list(dict.fromkeys(t for t in observation_sets if t not in model.linear))
    if not todo:
        return
    model.make_room(model.linear, len(todo))
    for key, row in zip(todo, tp.fit_params_many(todo), strict=True):
        model.linear[key] = tp.ThroughputParams(*(float(v) for v in row))


def _measured(job: JobView) -> bool:
    return bool(job.throughput_obs) and job.grad_noise_scale is not None


def _untuned_goodput(jobs: Sequence[JobView], rows: np.ndarray, nodes: np.ndarray, replicas: np.ndarray,
                     model: GoodputModel) -> np.ndarray:
    """Goodput of not-yet-measured jobs (``rows`` index ``jobs``) at the batch they start with (as
    ``job_batch``: max(M0, smallest micro-batch x GPUs)), from ``prior_params`` and the prior noise scale."""
    params = model.prior(jobs, rows)
    gns = estimates.noise_scales(jobs)[rows]
    lim = np.array([batch_limits(j.spec) for j in jobs])[rows]  # (R, 4)
    batch = np.maximum(lim[:, 0], lim[:, 2] * replicas)
    micro, accum = split_for(batch, replicas, lim[:, 3], lim[:, 0])
    return estimates.goodput_of(params, gns, lim[:, 0], lim[:, 3], replicas, nodes, micro * (accum + 1) * replicas)


def job_goodput(jobs: Sequence[JobView], rows: np.ndarray, nodes: np.ndarray, replicas: np.ndarray,
                model: GoodputModel | None = None) -> np.ndarray:
    """(R,) goodput (base-equivalent samples/s) of ``jobs[rows[i]]`` on ``nodes[i]`` nodes x ``replicas[i]``
    GPUs with the batch the job will pick there itself (``job_batch``); fits memoised in ``model`` when given.
    Measured jobs: ``best_batch`` under their fitted step-time equation and noise scale. Others:
    ``_untuned_goodput`` (the prior equation)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(rows))
    measured = np.array([_measured(j) for j in jobs], dtype=bool)
    m = measured[rows]
    if m.any():
        rj = rows[m]
        uniq, inv = np.unique(rj, return_inverse=True)
        model = model if model is not None else GoodputModel()
        model.fit(jobs[j].throughput_obs for j in uniq)  # all new fits in one batch
        params = np.stack([model.fitted(jobs[j].throughput_obs) for j in uniq])[inv]  # (R', 7)
        gns = np.array([jobs[j].grad_noise_scale for j in uniq], dtype=float)[inv]
        lim = np.array([batch_limits(jobs[j].spec) for j in uniq])[inv]  # (R', 4)
        out[m], _, _ = best_batch(params, gns, lim[:, 0], lim[:, 1], lim[:, 2], lim[:, 3],
                                  nodes[m].astype(float), replicas[m].astype(float))
    if (~m).any():
        model = model if model is not None else GoodputModel()
        out[~m] = _untuned_goodput(jobs, rows[~m], nodes[~m].astype(float), replicas[~m].astype(float), model)
    return np.where(np.isfinite(out), np.maximum(out, 0.0), 0.0)
