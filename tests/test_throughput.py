import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ones_pipeline.core import throughput as tp
from ones_pipeline.core.efficiency import efficiency
from ones_pipeline.core.types import ThroughputObs

TRUE = np.array([0.02, 0.002, 0.01, 0.004, 0.05, 0.02])


def _obs(params, placements):
    out = []
    for n, k, b in placements:
        step = float(tp.step_time(params, n, k, b))
        sync = float(tp.step_time(np.r_[0, 0, params[2:]], n, k, b)) if n > 1 else 0.0
        out.append(ThroughputObs(n, k, b, step, sync if n > 1 else 0.0))
    return out


def test_fit_recovers_parameters_from_enough_placements():
    placements = [(1, 1, 32), (1, 1, 64), (2, 1, 32), (4, 1, 64), (8, 2, 32), (16, 4, 64)]
    fitted = tp.fit_params(_obs(TRUE, placements), ridge=1e-6)
    np.testing.assert_allclose(fitted, TRUE, rtol=0.05, atol=1e-4)


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
    assert np.all(params >= 0)
    assert float(tp.throughput(params, n, min(k, n), b)) > 0
    assert float(tp.step_time(params, n, min(k, n), b)) > 0


def test_efficiency_is_one_at_base_and_falls_with_batch():
    e = efficiency(1000.0, 32, np.array([32, 64, 256, 4096]))
    assert e[0] == 1.0
    assert np.all(np.diff(e) < 0)
    assert efficiency(1e12, 32, 4096) > 0.99  # huge noise: large batches are free
