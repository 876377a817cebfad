"""Input errors raised in a worker process reach the parent as themselves, message intact.

``benchmarks/policy_quality.py --processes N`` and the simulator's runners simulate in a process pool; an
exception that cannot be rebuilt from its pickle (a custom ``__init__`` with required arguments) broke the
pool with ``BrokenProcessPool`` and lost the message naming the bad file and field.
"""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from ones_pipeline.config.fields import ConfigError
from ones_pipeline.config.jobs import parse_job_spec
from ones_pipeline.sim.packaged import UnknownWorkloadError, check_profiles_dir
from ones_pipeline.sim.truth import TraceError


def _missing_profiles(path: str) -> Path:
    return check_profiles_dir(path)


def _bad_spec(path: str):
    return parse_job_spec({"name": "a", "model": "mlp-digits", "per_gpu_batch": 32, "base_lr": 0.05,
                           "stopping": {"epochs": 1}, "requested_gpus": "many"}, path)


@pytest.mark.parametrize("error", [
    TraceError("/data/trace.csv", "duration must be > 0", row=7, field="duration"),
    TraceError("/data/trace.csv", "not found"),
    ConfigError("/jobs/a.yaml", "requested_gpus", "must be an integer >= 1"),
    ConfigError("/jobs/a.yaml", None, "not a mapping"),
    UnknownWorkloadError("nope"),
])
def test_input_errors_pickle_with_their_message_and_fields(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back) == vars(error)


def test_errors_raised_in_a_worker_reach_the_parent(tmp_path: Path):
    missing = tmp_path / "no-profiles"
    spec = str(tmp_path / "a.yaml")
    with pytest.raises(ConfigError) as here:  # the same error raised in this process
        _bad_spec(spec)
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(TraceError) as trace:
            pool.submit(_missing_profiles, str(missing)).result()
        with pytest.raises(ConfigError) as config:
            pool.submit(_bad_spec, spec).result()
    assert str(missing) in str(trace.value) and "folder not found" in str(trace.value)
    assert str(config.value) == str(here.value) and "requested_gpus" in str(config.value)
    assert config.value.path == spec and config.value.field == "requested_gpus"
