"""Fuzzing environments (issue 40): every ``resources/<env>.yaml`` is accepted or refused with one clear
line within the time budget; an accepted one keeps its numbers within their stated ranges."""

from __future__ import annotations

import math

import yaml
from fuzz_values import VALUES, assert_one_clear_line, fuzz_settings, put, within
from hypothesis import example, given
from hypothesis import strategies as st

from ones_pipeline.config import ConfigError, load_env
from ones_pipeline.core.limits import MAX_CPU_SLOTS, MAX_GPUS, MAX_SECONDS

KEYS = ["cluster.gpus", "cluster.cpu_slots", "cluster.gpus_per_node", "cluster.slurm", "cluster.slurm.partition",
        "cluster.slurm.nodes", "launcher.kind", "launcher.grace_period_s", "launcher.docker.image",
        "launcher.docker.volumes", "launcher.docker.environment", "launcher.docker.stop_timeout_s",
        "launcher.docker.shm_size", "launcher.slurm.pending_timeout_s", "launcher.slurm.sbatch_args",
        "launcher.slurm.rank_device", "mlflow.tracking_uri", "mlflow.tracking_uri_env", "mlflow.experiment",
        "policy.name", "policy.seed", "policy.params", "policy.params.generations", "policy.params.population",
        "scheduler.tick_interval_s", "scheduler.decision_budget_s", "scheduler.max_retries",
        "scheduler.retry_backoff_s", "scheduler.min_run_s", "state_dir", "jobs_dir", "cluster", "launcher", 7]
BASE = {"cluster": {"gpus": "none", "cpu_slots": 2}}


def check_env(project):
    try:
        with within():
            env = load_env(project, "local")
    except ConfigError as exc:
        assert_one_clear_line(exc, exc.path)
        assert exc.path.startswith(str(project)), exc.path
        return None
    assert 1 <= env.cluster.cpu_slots <= MAX_CPU_SLOTS
    assert env.cluster.gpus_per_node is None or 1 <= env.cluster.gpus_per_node <= MAX_GPUS
    for value in (env.launcher.grace_period_s, env.scheduler.retry_backoff_s, env.scheduler.min_run_s,
                  env.scheduler.decision_budget_s, env.launcher.slurm.pending_timeout_s):
        assert math.isfinite(value) and 0 <= value <= MAX_SECONDS
    assert env.state_dir.is_absolute() and env.jobs_dir.is_absolute()
    return env


@fuzz_settings(40)
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=3))
@example({"state_dir": "\x00"})  # found by --fuzz-long: ValueError (embedded null byte) from Path.resolve
@example({"cluster.cpu_slots": 2**40})  # issue 40: beyond a C int
@example({"state_dir": "/proc/self/x"})
@example({"state_dir": "x" * 5000})  # found by --fuzz-long: OSError (file name too long) from Path.exists
@example({"jobs_dir": "x" * 5000})
def test_a_mutated_environment_is_accepted_or_refused_in_one_line(tmp_path_factory, mutations):
    project = tmp_path_factory.mktemp("project")
    data = dict(BASE)
    for key, value in mutations.items():
        data = put(data, key, value)
    (project / "resources").mkdir()
    (project / "resources" / "local.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    check_env(project)


@fuzz_settings(15)
@given(st.binary(max_size=200))
def test_environment_bytes_are_accepted_or_refused_in_one_line(tmp_path_factory, data):
    project = tmp_path_factory.mktemp("project")
    (project / "resources").mkdir()
    (project / "resources" / "local.yaml").write_bytes(data)
    check_env(project)
