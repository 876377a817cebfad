"""The Pollux goodput model (core/goodput.py) and jobs that tune their own batch in the simulator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from ones_pipeline.core import goodput as gp
from ones_pipeline.core import perf_fit as pf
from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.types import (
    Allocation,
    Cluster,
    JobSpec,
    JobStatus,
    JobView,
    Schedule,
    SharedObs,
    StoppingRule,
    ThroughputObs,
    lr_for_batch,
    obs_key,
)
from ones_pipeline.sim.engine import SimConfig, simulate
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.workloads import load_pollux_workload

TRUE = np.array([0.05, 0.002, 0.08, 0.004, 0.02, 0.001, 1.5])


def obs_of(params, configs):
    out = []
    for k, n, b in configs:
        step = float(gp.step_time(params, k, n, b))
        compute = params[0] + params[1] * b
        out.append(ThroughputObs(n, k, b, step, step - compute))
    return tuple(out)


def test_fit_reproduces_what_it_observed():
    configs = [(1, 1, 32), (1, 1, 128), (1, 2, 64), (1, 4, 64), (2, 8, 64), (4, 16, 32), (2, 6, 128)]
    params = gp.fit_perf_params(obs_of(TRUE, configs))
    for k, n, b in configs:
        assert float(gp.step_time(params, k, n, b)) == pytest.approx(float(gp.step_time(TRUE, k, n, b)), rel=0.05)
    assert 1.0 <= params[6] <= 10.0 and (params[:6] > 0).all()


def test_unobserved_communication_is_optimistic():
    """One 1-GPU observation: scaling out looks free (the model has seen no communication)."""
    params = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 64)]))
    one = float(gp.throughput(params, 1, 1, 64))
    assert float(gp.throughput(params, 1, 4, 64)) == pytest.approx(4 * one, rel=0.01)
    assert float(gp.throughput(params, 2, 8, 64)) == pytest.approx(8 * one, rel=0.01)
    # Once a multi-GPU step was seen, crossing nodes costs at least 1.1x the in-node network.
    seen = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 64), (1, 4, 64)]))
    assert seen[2] >= 1.1 * seen[4] - 1e-12
    assert float(gp.throughput(seen, 2, 8, 64)) < 8 * float(gp.throughput(seen, 1, 1, 64))



# ------------------------------------------------------------------------------------------ the batched fit
# The per-job fit the policies used before the batched one (``gp.fit_perf_params_many``), verbatim: BFGS
# over one job's free coordinates. The reference the batched fit is checked against.
def _ref_objective(p: np.ndarray, k, n, b, log_compute, log_step, free: np.ndarray) -> tuple[float, np.ndarray]:
    """Objective and its gradient with respect to ``p`` (7,), zero on fixed parameters."""
    ac, bc, an, bn, ar, br, g = p
    compute = ac + bc * b
    inter = k > 1
    intra = ~inter & (n > 1)
    r = np.maximum(n - 2.0, pf._FLOOR)
    alpha = np.where(inter, an, np.where(intra, ar, pf._FLOOR))
    beta = np.where(inter, bn, np.where(intra, br, pf._FLOOR))
    net = alpha + beta * r
    lc, ln = np.log(compute), np.log(net)
    m = np.maximum(g * lc, g * ln)
    wc, wn = np.exp(g * lc - m), np.exp(g * ln - m)
    s = wc + wn
    log_optim = (m + np.log(s)) / g
    e1 = lc - log_compute
    e2 = log_optim - log_step
    cnt = float(len(b))
    rm1 = np.sqrt(np.mean(e1 * e1) + 1e-16)
    rm2 = np.sqrt(np.mean(e2 * e2) + 1e-16)
    reg1 = 1e-3 * (g - 1.0) ** 2
    reg2 = 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    f = rm1 + rm2 + reg1 + reg2
    # Gradients.
    d1 = e1 / (cnt * rm1)  # d rm1 / d lc
    d2 = e2 / (cnt * rm2)  # d rm2 / d log_optim
    dlo_dc = wc / s / compute  # d log_optim / d compute
    dlo_dn = wn / s / net
    dlo_dg = (wc * lc + wn * ln) / s / g - log_optim / g
    dc = d1 / compute + d2 * dlo_dc  # d f / d compute, per observation
    dn = d2 * dlo_dn
    grad = np.array([
        dc.sum(),
        (dc * b).sum(),
        (dn * inter).sum() - 2e-2 * bn * bn / an ** 3,
        (dn * inter * r).sum() + 2e-2 * bn / an ** 2,
        (dn * intra).sum() - 2e-2 * br * br / ar ** 3,
        (dn * intra * r).sum() + 2e-2 * br / ar ** 2,
        (d2 * dlo_dg).sum() + 2e-3 * (g - 1.0),
    ])
    return float(f), np.where(free, grad, 0.0)


def _ref_to_params(z: np.ndarray, fixed: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Unconstrained ``z`` -> parameters within their bounds (positive; gamma in [1, 10])."""
    p = fixed.copy()
    pos = free.copy()
    pos[6] = False
    p[pos] = pf._FLOOR + np.exp(np.clip(z[pos], -40.0, 8.0))  # up to ~3000 s: far beyond any step time
    if free[6]:
        p[6] = 1.0 + (pf._GAMMA_MAX - 1.0) / (1.0 + np.exp(-np.clip(z[6], -40.0, 40.0)))
    return p


def _ref_to_z(p: np.ndarray) -> np.ndarray:
    z = np.log(np.maximum(p - pf._FLOOR, 1e-300))
    frac = np.clip((p[6] - 1.0) / (pf._GAMMA_MAX - 1.0), 1e-9, 1 - 1e-9)
    z[6] = np.log(frac / (1 - frac))
    return z


def reference_fit(observations: Sequence[ThroughputObs], max_iter: int = 60) -> np.ndarray:
    """(7,) parameters fitted to a job's observed steps (compute = step - sync, and step).

    BFGS in unconstrained coordinates (log for the positive parameters, logistic for gamma) with the
    analytic gradient. Parameters the observations cannot inform are fixed (see the module docstring).
    """
    if not observations:
        raise ValueError("reference_fit needs at least one observation")
    k = np.array([o.num_nodes for o in observations], dtype=float)
    n = np.array([o.num_gpus for o in observations], dtype=float)
    b = np.array([o.per_gpu_batch for o in observations], dtype=float)
    step = np.array([o.step_time_s for o in observations], dtype=float)
    compute = np.maximum(step - np.array([o.sync_time_s for o in observations], dtype=float), 1e-9)
    step = np.maximum(step, compute)
    p0 = pf._INIT.copy()
    free = np.ones(gp.N_PERF, dtype=bool)
    if len(np.unique(b)) == 1:  # one micro-batch size: split compute evenly into constant and slope
        p0[0] = float(np.mean(compute)) / 2.0
        free[0] = False
        p0[1] = max(float(np.mean(compute - p0[0]) / np.mean(b)), 1e-7)
    else:  # start the compute line from least squares (a start close to the optimum, not a prior)
        slope, icpt = np.polyfit(b, compute, 1)
        p0[0], p0[1] = max(float(icpt), 1e-4 * float(np.mean(compute))), max(float(slope), 1e-7)
    if not (k > 1).any():
        p0[2:4] = pf._FLOOR
        free[2:4] = False
    if not ((k == 1) & (n > 1)).any():
        p0[4:6] = pf._FLOOR
        free[4:6] = False
    if not (n > 2).any():
        p0[[3, 5]] = pf._FLOOR
        free[[3, 5]] = False
    args = (k, n, b, np.log(compute), np.log(step), free)
    fixed = p0.copy()
    z = _ref_to_z(p0)
    idx = np.flatnonzero(free)

    def fg(zz: np.ndarray) -> tuple[float, np.ndarray]:
        p = _ref_to_params(zz, fixed, free)
        f, grad = _ref_objective(p, *args)
        # Chain rule through the coordinate maps.
        dp = p - pf._FLOOR
        dp[6] = (p[6] - 1.0) * (pf._GAMMA_MAX - p[6]) / (pf._GAMMA_MAX - 1.0)
        return f, grad * dp

    with np.errstate(all="ignore"):
        p = _ref_bfgs(fg, z, idx, max_iter)
    p = _ref_to_params(p, fixed, free)
    if not (k > 1).any():  # prior: crossing nodes costs at least 1.1x the in-node network
        p[2] = max(p[2], 1.1 * p[4])
        p[3] = max(p[3], 1.1 * p[5])
    return p


def _ref_bfgs(fg, z: np.ndarray, idx: np.ndarray, max_iter: int) -> np.ndarray:
    """Minimise ``fg`` (value, gradient) over the coordinates ``idx`` of ``z`` (BFGS, Armijo backtracking)."""
    f, g = fg(z)
    h = np.eye(len(idx))
    for _ in range(max_iter):
        gi = g[idx]
        if np.max(np.abs(gi)) < 1e-5:
            break
        d = -h @ gi
        if d @ gi >= 0:  # not a descent direction: restart from steepest descent
            h = np.eye(len(idx))
            d = -gi
        t = 1.0
        while True:
            zn = z.copy()
            zn[idx] += t * d
            fn, gn = fg(zn)
            if (np.isfinite(fn) and fn <= f + 1e-4 * t * (d @ gi)) or t < 1e-10:
                break
            t *= 0.5
        if t < 1e-10:
            break
        s_vec = zn[idx] - z[idx]
        y_vec = gn[idx] - gi
        sy = float(s_vec @ y_vec)
        z, f_old, f, g = zn, f, fn, gn
        if sy > 1e-12:
            rho = 1.0 / sy
            eye = np.eye(len(idx))
            h = ((eye - rho * np.outer(s_vec, y_vec)) @ h @ (eye - rho * np.outer(y_vec, s_vec))
                 + rho * np.outer(s_vec, s_vec))
        if abs(f_old - f) < 1e-9 * max(1.0, abs(f)):
            break
    return z


def _noisy_obs(params, configs, rng, noise=0.05):
    out = []
    for k, n, b in configs:
        step = float(gp.step_time(params, k, n, b)) * float(np.exp(rng.normal(0, noise)))
        compute = min((params[0] + params[1] * b) * float(np.exp(rng.normal(0, noise))), step)
        out.append(ThroughputObs(n, k, b, step, step - compute))
    return tuple(out)


CONFIGS = [(1, 1, 32), (1, 1, 128), (1, 2, 64), (1, 4, 64), (2, 8, 64), (4, 16, 32), (2, 6, 128), (1, 3, 16),
           (3, 12, 64), (1, 4, 256)]


def well_posed_sets() -> list[tuple[ThroughputObs, ...]]:
    """Observation sets of 1 to 20 steps, exact or with 5 % noise, that pin the fit down well enough for
    the per-job fit to be reproducible: a 1e-12 change of a step time moves its throughputs by < 2e-3
    (most by < 1e-9; compare ``test_where_the_data_leave_the_network_open_both_fits_are_as_good``)."""
    sets = [obs_of(TRUE, CONFIGS[:7]), obs_of(TRUE, [(1, 1, 64)]), obs_of(TRUE, [(1, 1, 32), (1, 1, 128), (1, 4, 64)]),
            obs_of(TRUE, [(1, 1, 32), (1, 2, 32), (1, 4, 32), (1, 4, 128)])]
    rng = np.random.default_rng(7)
    for size in (3, 5, 8, 10, 12, 16, 20, 9):
        params = TRUE * np.exp(rng.normal(0, 0.5, 7))
        params[6] = 1.0 + 3.0 * rng.random()
        sets.append(_noisy_obs(params, [CONFIGS[j] for j in rng.integers(0, len(CONFIGS), size)], rng))
    return sets


GRID = [(k, n, b) for k, n in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (2, 16), (4, 16), (8, 64)) for b in (8, 32, 128)]


def max_rel_throughput_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest relative difference of the throughputs two parameter vectors predict over ``GRID``."""
    k, n, mb = (np.array(c, dtype=float) for c in zip(*GRID, strict=True))
    return float(np.max(np.abs(gp.throughput(a, k, n, mb) / gp.throughput(b, k, n, mb) - 1.0)))


def test_the_batched_fit_matches_the_per_job_fit():
    sets = well_posed_sets()
    batched = gp.fit_perf_params_many(sets)
    diffs = [max_rel_throughput_diff(p, reference_fit(s)) for p, s in zip(batched, sets, strict=True)]
    assert max(diffs) < 1e-3, diffs
    # The check can fail: a fit stopped after 3 iterations is told apart.
    early = gp.fit_perf_params_many(sets, max_iter=3)
    assert max(max_rel_throughput_diff(p, reference_fit(s)) for p, s in zip(early, sets, strict=True)) > 1e-3


def _objective_of(params: np.ndarray, observations: Sequence[ThroughputObs]) -> float:
    k, n, b = (np.array([getattr(o, a) for o in observations], dtype=float)
               for a in ("num_nodes", "num_gpus", "per_gpu_batch"))
    step = np.array([o.step_time_s for o in observations])
    compute = np.maximum(step - np.array([o.sync_time_s for o in observations]), 1e-9)
    return _ref_objective(params, k, n, b, np.log(compute), np.log(np.maximum(step, compute)),
                          np.ones(gp.N_PERF, dtype=bool))[0]


def test_where_the_data_leave_the_network_open_both_fits_are_as_good():
    """A 1-GPU and one n-GPU step: only ar + (n - 2) br is observed, and where along that line BFGS stops
    moves with the last bits of the data (for the per-job fit as well), so compare how well each fit
    explains the steps rather than the parameters."""
    rng = np.random.default_rng(3)
    moved = 0.0
    for n in (5, 7, 8, 5, 7, 8):
        obs = _noisy_obs(TRUE * np.exp(rng.normal(0, 0.5, 7)), [(1, 1, 32), (1, n, 32)], rng)
        want = reference_fit(obs)
        nudged = reference_fit(tuple(replace(o, step_time_s=o.step_time_s * (1 + 1e-12)) for o in obs))
        moved = max(moved, max_rel_throughput_diff(nudged, want))
        assert _objective_of(gp.fit_perf_params(obs), obs) <= _objective_of(want, obs) + 1e-4
    assert moved > 1e-3  # the per-job fit itself is not reproducible to 1e-3 here


def test_a_jobs_batched_fit_does_not_depend_on_its_batch(monkeypatch):
    sets = well_posed_sets()
    together = gp.fit_perf_params_many(sets)
    alone = np.stack([gp.fit_perf_params(s) for s in sets])
    reordered = gp.fit_perf_params_many(sets[::-1])[::-1]
    assert np.array_equal(together, alone) and np.array_equal(together, reordered)
    assert np.array_equal(gp.fit_perf_params_many(sets[4:7] + sets[:1]), together[[4, 5, 6, 0]])
    # Nor on how many line-search steps a round tries.
    monkeypatch.setattr(pf, "_TRIAL_CELLS", 0)
    assert np.array_equal(gp.fit_perf_params_many(sets), together)


def test_fit_many_fills_the_memo_that_fitted_reads():
    sets = [s[:-1] + (ThroughputObs(1, 1, 48, 0.123, 0.0),) for s in well_posed_sets()[:4]]
    fits = gp.GoodputModel()
    gp.fit_many(sets + [()], fits)
    assert set(fits.perf) == set(sets)
    for s in sets:
        p = gp.fitted(s, fits)
        assert gp.fitted(s, fits) is p and not p.flags.writeable
        assert np.array_equal(p, gp.fit_perf_params(s))
        alone = gp.fitted(s)  # no memo: fitted afresh, to the same parameters
        assert alone is not p and np.array_equal(alone, p)
    with pytest.raises(ValueError, match="at least one observation"):
        gp.fitted((), fits)


def test_each_owner_keeps_its_own_fits_within_its_limit():
    sets = [s[:-1] + (ThroughputObs(1, 1, 40 + k, 0.111, 0.0),) for k, s in enumerate(well_posed_sets()[:5])]
    mine, yours = gp.GoodputModel(limit=4), gp.GoodputModel()
    for s in sets[:4]:
        gp.fitted(s, mine)
    assert len(mine.perf) == 4 and not yours.perf  # nothing shared through the module
    gp.fitted(sets[4], mine)  # past the limit: the oldest half goes
    assert list(mine.perf) == sets[3:] and np.array_equal(gp.fitted(sets[0], mine), gp.fit_perf_params(sets[0]))
    views = [JobView(spec=JobSpec(name=f"j{k}", model="m", dataset_size=1000, per_gpu_batch=32),
                     status=JobStatus.RUNNING, submit_time_s=0.0, throughput_obs=s) for k, s in enumerate(sets)]
    a = yours.prior(views)
    assert len(yours.linear) == 5 and not yours.perf
    assert np.array_equal(a.as_array(), gp.GoodputModel().prior(views).as_array())


def test_split_rules():
    micro, accum = gp.split_for(np.array([100, 300, 64]), np.array([1, 1, 1]), 128, 64)
    assert accum.tolist() == [1, 2, 0]  # above M0 on one GPU: at least two micro-steps
    assert micro.tolist() == [50, 100, 64]
    micro, accum = gp.split_for(1000, 4, 128, 64)
    assert (micro, accum) == (125, 1)


def test_best_batch_grows_with_the_noise_scale_and_stays_in_bounds():
    params = gp.fit_perf_params(obs_of(TRUE, [(1, 1, 32), (1, 1, 128), (1, 4, 64)]))
    batches = []
    for gns in (10.0, 1e3, 1e5):
        good, micro, accum = gp.best_batch(params, gns, 32, 4096, 8, 256, 1, 4)
        assert good > 0 and 8 <= micro <= 256
        batches.append(4 * micro * (accum + 1))
    assert batches[0] < batches[1] < batches[2]
    # Vectorised over allocations and jobs alike.
    good, micro, _ = gp.best_batch(params[None], np.array([10.0, 1e5]), 32, 4096, 8, 256, np.array([1, 2]),
                                   np.array([4, 8]))
    assert good.shape == micro.shape == (2,)


def test_best_batch_is_the_composition_of_the_model_functions_bit_for_bit():
    """``best_batch`` computes in place; it must give exactly what split_for -> throughput x efficiency
    give, over random jobs and allocations (one GPU, several nodes, micro-batches out of bounds, no GPU)."""
    rng = np.random.default_rng(3)
    sets = well_posed_sets()
    params = np.stack([gp.fit_perf_params(s) for s in sets])
    for _ in range(20):
        R = int(rng.integers(1, 40))
        p = params[rng.integers(0, len(params), R)]
        gns = rng.choice([0.0, 50.0, 2e3, 1e5], R)
        m0 = rng.choice([16.0, 32.0, 128.0], R)
        top = m0 * rng.choice([1.0, 8.0, 64.0], R)
        lo_micro, hi_micro = rng.choice([1.0, 8.0], R), rng.choice([16.0, 64.0, 512.0], R)
        n = rng.choice([0.0, 1.0, 2.0, 4.0, 8.0, 64.0], R)
        k = np.maximum(1.0, np.ceil(n / rng.choice([1.0, 4.0, 8.0], R)))
        with np.errstate(all="ignore"):
            got = gp.best_batch(p, gns, m0, top, lo_micro, hi_micro, k, n)
            lo = np.maximum(m0, lo_micro * n)
            batch = lo * (top / lo) ** np.linspace(0.0, 1.0, gp.BATCH_CANDIDATES)[:, None]
            micro, accum = gp.split_for(batch, n, hi_micro, m0)
            total = n * micro * (accum + 1.0)
            good = gp.throughput(p, k, n, micro, accum) * efficiency(gns, m0, np.maximum(total, m0))
            good = np.where((micro >= lo_micro) & (micro <= hi_micro) & (n > 0), good, 0.0)
            i = np.argmax(good, axis=0)[None]
            want = [np.take_along_axis(a, i, axis=0)[0] for a in (good, micro, accum)]
            assert np.array_equal(got[0], want[0])
            assert np.array_equal(got[1], want[1].astype(np.int64))
            assert np.array_equal(got[2], want[2].astype(np.int64))
    # Scalars (one allocation of one job, as ``job_batch`` asks) take the same path.
    one = gp.best_batch(params[0], 2e3, 32.0, 4096.0, 8.0, 256.0, 1.0, 1.0)
    assert all(np.ndim(x) == 0 for x in one) and 8 <= one[1] <= 256


def spec(**kw) -> JobSpec:
    base = dict(name="j", model="m", dataset_size=1000, per_gpu_batch=32, max_global_batch=4096,
                max_per_gpu_batch=256, min_global_batch=32, min_per_gpu_batch=8,
                stopping=StoppingRule("epochs", epochs=1))
    base.update(kw)
    return JobSpec(**base)


def test_job_batch_before_and_after_measuring():
    s = spec()
    assert gp.job_batch(s, (), None, 1, 4) == (8, 0)  # max(M0 = 32, 8 per GPU x 4)
    assert gp.job_batch(s, (), None, 1, 1) == (32, 0)
    obs = obs_of(TRUE, [(1, 1, 32)])
    micro, accum = gp.job_batch(s, obs, 1e5, 1, 4)
    assert 4 * micro * (accum + 1) <= 4096 and micro > 8


def test_job_batches_gives_each_allocation_what_job_batch_gives_it():
    """The batched form (one batch search for all measured jobs) picks, allocation by allocation, exactly
    the batch of the one-at-a-time ``job_batch``: measured and unmeasured jobs, one and several nodes."""
    rng = np.random.default_rng(5)
    specs, obs, gns, nodes, reps = [], [], [], [], []
    for i in range(40):
        n = int(rng.integers(1, 17))
        specs.append(spec(min_global_batch=int(rng.choice([16, 32, 64]))))
        measured = i % 3 != 0
        obs.append(obs_of(TRUE * rng.uniform(0.5, 2.0, 7).clip(max=[9] * 6 + [5]), [(1, 1, 32), (1, 2, 32)])
                   if measured else ())
        gns.append(float(rng.uniform(1e2, 1e5)) if measured else None)
        nodes.append(-(-n // 4))
        reps.append(n)
    batched = gp.job_batches(specs, obs, gns, nodes, reps)
    assert batched == [gp.job_batch(*args) for args in zip(specs, obs, gns, nodes, reps, strict=True)]
    assert len({b for b, o in zip(batched, obs, strict=True) if o}) > 5  # the jobs really differ


def test_spec_validates_batch_bounds():
    with pytest.raises(ValueError, match="min_global_batch"):
        spec(min_global_batch=10_000)
    with pytest.raises(ValueError, match="min_per_gpu_batch"):
        spec(min_per_gpu_batch=512)


class _FixedTuned:
    """Two GPUs from the first round on, the job tunes its batch; records the batches it is told of."""

    name = "fixed-tuned"

    def __init__(self):
        self.seen = []

    def decide(self, now_s, cluster, jobs, current):
        out = {}
        for v in jobs:
            old = current.allocations.get(v.name)
            self.seen.append(old.global_batch if old else None)
            out[v.name] = old or Allocation(v.name, (0, 1), 2 * v.spec.per_gpu_batch,
                                           lr_for_batch(v.spec, 2 * v.spec.per_gpu_batch), batch_tuned_by_job=True)
        return Schedule(out)

    def to_dict(self):
        return {}

    def load_state(self, state):
        return None


def test_a_job_that_tunes_its_batch_changes_it_without_restarts():
    job = load_pollux_workload(workload_path("pollux:workload-6"))[0]  # a cifar10 job
    pol = _FixedTuned()
    res = simulate([job], pol, Cluster.uniform(1, 4), SimConfig())
    assert res.jobs[0].restarts == 0
    batches = {b for b in pol.seen if b is not None}
    assert len(batches) > 1  # it re-tuned as its noise scale grew
    assert max(batches) > job.spec.min_global_batch


def test_shared_obs_is_the_plain_tuple_as_a_key():
    obs = (ThroughputObs(1, 1, 32, 0.1, 0.0), ThroughputObs(4, 1, 32, 0.3, 0.2))
    shared = SharedObs(obs)
    assert shared == obs and hash(shared) == hash(obs) and hash(shared) == hash(shared)
    memo = {obs: 1}
    assert memo[shared] == 1 and obs_key(shared) is shared and obs_key(list(obs)) == obs
    fits = gp.GoodputModel()
    gp.fit_many([shared], fits)
    assert gp.fitted(obs, fits) is gp.fitted(shared, fits)


def test_a_policy_values_jobs_by_the_goodput_model_it_is_given():
    """``make_policy(name, model=...)``: ``ones``, ``pollux`` and ``sia`` value measured jobs by the model they are
    given (an oracle experiment overrides its fits; no monkeypatching) and keep their fits in it. Here a model
    whose all-reduce costs 100 s a step: no measured job is worth more than 1 GPU, so pollux and sia give each
    one GPU (with the fitted model they scale some out), and ones' goodput table drops past 1 GPU."""
    from ones_pipeline.core.policies import make_policy
    from ones_pipeline.sim.synthetic import random_scheduler_state

    class SlowNetwork(gp.GoodputModel):
        def fitted(self, observations):
            p = super().fitted(observations).copy()
            p[2:6] = 100.0  # alpha_n, beta_n, alpha_r, beta_r
            p.setflags(write=False)
            return p

    cluster, jobs, current = random_scheduler_state(np.random.default_rng(3), 6, 4, 4)
    measured = {j.name for j in jobs if j.throughput_obs and j.grad_noise_scale is not None}
    assert len(measured) >= 2
    for name in ("pollux", "sia"):
        counts = {}
        for model in (gp.GoodputModel(), SlowNetwork()):
            s = make_policy(name, seed=0, model=model).decide(3600.0, cluster, jobs, current)
            counts[type(model).__name__] = {n: a.num_gpus for n, a in s.allocations.items() if n in measured}
            assert len(model.perf) >= len(measured)  # the policy's fits are in the model it was given
        assert max(counts["GoodputModel"].values()) > 1, counts
        assert set(counts["SlowNetwork"].values()) == {1}, counts
    for model, slower in ((gp.GoodputModel(), False), (SlowNetwork(), True)):
        table = make_policy("ones", seed=0, model=model).context(cluster, jobs, current, 3600.0).table
        rows = [i for i, j in enumerate(jobs) if j.name in measured]
        assert (table[rows, 2:5].max(axis=1) < table[rows, 1]).all() == slower
