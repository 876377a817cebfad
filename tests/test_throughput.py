import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ones_pipeline.core import throughput as tp
from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.types import ThroughputObs

TRUE = tp.ThroughputParams(c0=0.02, c1=0.002, s0=0.01, s1=0.004, x0=0.05, x1=0.02)


def _obs(params, placements):
    out = []
    for n, k, b in placements:
        step = float(tp.step_time(params, n, k, b))
        sync = float(tp.step_time(params._replace(c0=0.0, c1=0.0), n, k, b)) if n > 1 else 0.0
        out.append(ThroughputObs(n, k, b, step, sync if n > 1 else 0.0))
    return out


def test_fit_recovers_parameters_from_enough_placements():
    placements = [(1, 1, 32), (1, 1, 64), (2, 1, 32), (4, 1, 64), (8, 2, 32), (16, 4, 64)]
    fitted = tp.fit_params(_obs(TRUE, placements), ridge=1e-6)
    assert isinstance(fitted, tp.ThroughputParams)
    np.testing.assert_allclose(fitted.as_array(), TRUE.as_array(), rtol=0.05, atol=1e-4)


def test_one_observation_predicts_it_and_prior_fills_the_rest():
    obs = [ThroughputObs(1, 1, 64, 0.2, 0.0)]
    fitted = tp.fit_params(obs)
    assert abs(float(tp.step_time(fitted, 1, 1, 64)) - 0.2) / 0.2 < 0.05
    # Scaling out is predicted to help, but sub-linearly (sync prior > 0).
    t1, t4 = (float(tp.throughput(fitted, n, 1, 64)) for n in (1, 4))
    assert t1 < t4 < 4 * t1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 512), st.floats(1e-4, 10.0)), min_size=0, max_size=8),
       st.integers(1, 128), st.integers(1, 16), st.integers(1, 1024))
def test_throughput_is_always_positive(raw, n, k, b):
    obs = [ThroughputObs(g, max(1, g // 4), bb, t, 0.0) for g, bb, t in raw]
    params = tp.fit_params(obs)
    assert np.all(params.as_array() >= 0)
    assert float(tp.throughput(params, n, min(k, n), b)) > 0
    assert float(tp.step_time(params, n, min(k, n), b)) > 0


def test_step_time_is_the_equation_term_by_term():
    # The named equation gives exactly the sum ``features @ params`` (same terms, same order), for one
    # job's parameters and for many jobs' broadcast against a grid of configurations.
    rng = np.random.default_rng(0)
    many = tp.ThroughputParams.from_array(rng.uniform(0, 0.1, size=(5, 6)))
    n = np.array([1, 2, 3, 8])[None, :, None]
    k = np.array([1, 1, 2, 3])[None, :, None]
    b = np.array([8.0, 32.0, 100.0])[None, None, :]
    for params in (TRUE, many.select(np.s_[:, None, None])):
        want = np.maximum(np.sum(tp.features(n, k, b, 1) * params.as_array(), axis=-1), tp.MIN_STEP_S)
        np.testing.assert_array_equal(tp.step_time(params, n, k, b, 1), want)
    c0, c1, s0, s1, x0, x1 = TRUE
    assert float(tp.step_time(TRUE, 8, 2, 32, 1)) == pytest.approx(2 * (c0 + c1 * 32) + s0 + s1 * 7 + x0 + x1 * 1)
    with pytest.raises(TypeError, match="ThroughputParams"):
        tp.step_time(TRUE.as_array(), 1, 1, 32)


def test_params_select_and_round_trip_through_arrays():
    table = np.arange(12.0).reshape(2, 6)
    params = tp.ThroughputParams.from_array(table)
    np.testing.assert_array_equal(params.as_array(), table)
    assert params.select(1) == tp.ThroughputParams(*table[1])
    assert params.select(np.s_[:, None]).c0.shape == (2, 1)
    with pytest.raises(ValueError, match="last axis of 6"):
        tp.ThroughputParams.from_array(np.zeros(5))


def test_efficiency_is_one_at_base_and_falls_with_batch():
    e = efficiency(1000.0, 32, np.array([32, 64, 256, 4096]))
    assert e[0] == 1.0
    assert np.all(np.diff(e) < 0)
    assert efficiency(1e12, 32, 4096) > 0.99  # huge noise: large batches are free


def test_the_batched_fit_gives_each_job_its_own_fit_exactly():
    """``fit_params_many`` (stacked least squares, used for the first decision's thousands of fits) equals
    ``fit_params`` job by job, bit for bit: 1 to 12 observations, with and without sync times, some whose
    unconstrained solution is negative (the active set shrinks), and no observation at all (the prior)."""
    rng = np.random.default_rng(3)
    sets = [()]
    for _ in range(600):
        obs = []
        for _ in range(int(rng.integers(1, 13))):
            n = int(rng.choice([1, 2, 4, 8, 16]))
            step = float(rng.uniform(0.01, 2.0))
            sync = float(rng.choice([0.0, rng.uniform(0.0, step / 2)]))
            nodes = max(1, n // int(rng.choice([4, 8])))
            obs.append(ThroughputObs(n, nodes, int(rng.choice([8, 32, 128])), step, sync))
        sets.append(tuple(obs))
    one_by_one = np.array([tp.fit_params(s).as_array() for s in sets])
    assert np.array_equal(tp.fit_params_many(sets), one_by_one)
    assert (one_by_one[:, 2:] == 0).any()  # the non-negativity bound was active somewhere
