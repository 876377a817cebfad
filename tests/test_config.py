"""ones_pipeline.config: job specs and environment files -> dataclasses, and the errors a user sees.

Every bad input must raise a ``ConfigError`` whose message names the file, the field and what is
allowed, so the tests assert on the message text, not only on the exception type.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ones_pipeline.config import (
    BUILTIN_MODELS,
    ConfigError,
    EnvConfig,
    job_spec_to_yaml_dict,
    load_env,
    load_job_spec,
    load_job_specs,
    parse_env,
    parse_job_spec,
)
from ones_pipeline.core.policies import policy_names
from ones_pipeline.core.types import StopKind

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_SPECS = sorted((REPO / "assets" / "jobs").glob("*.yaml"))

GOOD = {"model": "mlp-digits", "per_gpu_batch": 32, "base_lr": 0.05, "max_lr": 0.2, "stopping": {"epochs": 2}}


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _without(data: dict, key: str) -> dict:
    return {k: v for k, v in data.items() if k != key}


# -- job specs ------------------------------------------------------------------------------------------
def test_examples_exist():
    assert len(EXAMPLE_SPECS) >= 4, f"example specs missing under {REPO / 'assets' / 'jobs'}"


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_every_example_spec_loads(path: Path):
    spec = load_job_spec(path)
    assert spec.name == path.stem
    assert spec.model in BUILTIN_MODELS
    assert spec.dataset_size >= 1 and spec.per_gpu_batch >= 1
    assert spec.gpu_cap >= spec.requested_gpus


def test_examples_load_together():
    specs, errors = load_job_specs(REPO / "assets" / "jobs")
    assert errors == []
    assert sorted(specs) == [p.stem for p in EXAMPLE_SPECS]


def test_good_spec_fields_and_defaults(tmp_path: Path):
    spec = load_job_spec(_write(tmp_path / "mlp-a.yaml", GOOD))
    assert spec.name == "mlp-a"
    assert spec.dataset_size == 1437  # built-in digits training set
    assert spec.requested_gpus == 1 and spec.max_gpus is None and spec.gpu_cap == 4
    assert spec.stopping.kind is StopKind.EPOCHS and spec.stopping.epochs == 2.0
    assert spec.global_batch_cap == 128  # 32 x 0.2 / 0.05
    assert isinstance(spec.base_lr, float)


def test_accuracy_stopping_and_command(tmp_path: Path):
    data = {**GOOD, "model": "my-model", "dataset_size": 1000, "command": ["python", "train.py", 3],
            "stopping": {"target_accuracy": 0.9, "patience": 2}}
    spec = load_job_spec(_write(tmp_path / "own.yaml", data))
    assert spec.command == ("python", "train.py", "3")
    assert spec.stopping.kind is StopKind.ACCURACY
    assert (spec.stopping.target_accuracy, spec.stopping.patience) == (0.9, 2)


# (case id, spec data or raw YAML text, field named in the error, substrings the message must contain)
BAD_SPECS = [
    ("unknown-field", {**GOOD, "colour": "red"}, "colour",
     ["unknown field", "allowed:", "per_gpu_batch", "stopping"]),
    ("unknown-model", {**GOOD, "model": "gpt-5"}, "model", ["'gpt-5'", "allowed:", *BUILTIN_MODELS, "command"]),
    ("missing-stopping", _without(GOOD, "stopping"), "stopping", ["{epochs: N}", "{samples: N}", "target_accuracy"]),
    ("two-stopping-kinds", {**GOOD, "stopping": {"epochs": 2, "samples": 1000}}, "stopping",
     ["exactly one of epochs, samples, target_accuracy", "got epochs, samples"]),
    ("no-stopping-kind", {**GOOD, "stopping": {"patience": 3}}, "stopping", ["exactly one of", "got none"]),
    ("unknown-stopping-field", {**GOOD, "stopping": {"epochs": 2, "epoch": 3}}, "stopping.epoch",
     ["unknown field", "allowed:", "patience", "target_accuracy"]),
    ("zero-epochs", {**GOOD, "stopping": {"epochs": 0}}, "stopping.epochs", ["out-of-range value 0", "(0, 1000000]"]),
    ("accuracy-above-one", {**GOOD, "stopping": {"target_accuracy": 1.5}}, "stopping.target_accuracy",
     ["(0, 1]", "1.5"]),
    ("infinite-epochs", {**GOOD, "stopping": {"epochs": float("inf")}}, "stopping.epochs", ["non-finite value inf"]),
    ("nan-max-lr", {**GOOD, "max_lr": float("nan")}, "max_lr", ["non-finite value nan", "[1e-12, 1000]"]),
    ("inf-max-lr", {**GOOD, "max_lr": float("inf")}, "max_lr", ["non-finite value inf"]),
    ("tiny-base-lr", {**GOOD, "base_lr": 1e-300, "max_lr": 1e10}, "base_lr", ["out-of-range value 1e-300"]),
    ("huge-requested-gpus", {**GOOD, "requested_gpus": 10**20}, "requested_gpus", ["[1, 4096]"]),
    ("nan-in-an-ignored-field", {**GOOD, "stopping": {"epochs": 2, "min_delta": float("nan")}}, "stopping.min_delta",
     ["non-finite value nan"]),
    ("huge-priority", {**GOOD, "priority": 2**70}, "priority", ["out-of-range value", "[-1000000, 1000000]"]),
    ("name-differs-from-file", {**GOOD, "name": "other"}, "name", ["'other'", "file name", "other.yaml"]),
    ("name-not-a-slug", {**GOOD, "name": "Big_Job"}, "name", ["'Big_Job'", "lowercase letters, digits and '-'"]),
    ("command-a-string", {**GOOD, "command": "python train.py"}, "command",
     ["non-empty list of arguments", "'python train.py'"]),
    ("command-empty", {**GOOD, "command": []}, "command", ["non-empty list"]),
    ("negative-batch", {**GOOD, "per_gpu_batch": -4}, "per_gpu_batch", ["[1, 1048576]", "-4"]),
    ("missing-batch", _without(GOOD, "per_gpu_batch"), "per_gpu_batch", ["missing (required)"]),
    ("batch-not-int", {**GOOD, "per_gpu_batch": "big"}, "per_gpu_batch", ["expected int", "'big'"]),
    ("batch-bool", {**GOOD, "per_gpu_batch": True}, "per_gpu_batch", ["expected int", "True"]),
    ("zero-requested-gpus", {**GOOD, "requested_gpus": 0}, "requested_gpus", ["[1, 4096]", "0"]),
    ("max-lr-below-base-lr", {**GOOD, "max_lr": 0.01}, "max_lr", ["max_lr 0.01", ">= base_lr 0.05"]),
    ("base-lr-zero", {**GOOD, "base_lr": 0, "max_lr": None}, "base_lr", ["[1e-12, 1000]", "0"]),
    ("max-global-batch-below-batch", {**GOOD, "max_global_batch": 8}, "max_global_batch",
     ["max_global_batch 8", ">= per_gpu_batch 32"]),
    ("own-command-without-dataset-size", {**GOOD, "model": "mine", "command": ["python", "t.py"]}, "dataset_size",
     ["missing (required)"]),
    ("not-a-mapping", "- model: mlp-digits\n- per_gpu_batch: 32\n", None, ["mapping of fields", "list"]),
    # Line 3 is the one with the stray indentation.
    ("invalid-yaml", "model: mlp-digits\nper_gpu_batch: 32\n  stopping: {epochs: 2}\nbase_lr: 0.1\n", None,
     ["not valid YAML", "line 3"]),
    ("name-trailing-newline", {**GOOD, "name": "name-trailing-newline\n"}, "name", ["is not a job name"]),
    ("yaml-tag", "model: mlp-digits\nper_gpu_batch: !!float abc\n", None, ["YAML tag", "not allowed"]),
    ("yaml-date", {**GOOD, "model": "2001-13-45"}, "model", ["unknown built-in model '2001-13-45'"]),
    ("yaml-date-unquoted", "model: 2001-13-45\nper_gpu_batch: 32\nstopping: {epochs: 1}\n", "model",
     ["unknown built-in model '2001-13-45'"]),
    ("mixed-key-types", "1: a\nmodel: mlp-digits\n", "1", ["field names are text", "int 1"]),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)), None,
     ["expands to more than 10000 values"]),
    ("deep-nesting", "model: " + "[" * 100 + "]" * 100 + "\n", None, ["nested deeper than 32"]),
    ("long-bad-value", {**GOOD, "model": "m" * 100_000}, "model", ["unknown built-in model 'mmmm"]),
]


def test_a_non_utf8_spec_is_one_clear_line(tmp_path: Path):
    for i, data in enumerate([b"model: caf\xe9\n", "model: x\n".encode("utf-16"), bytes(range(256))]):
        path = tmp_path / f"bin-{i}.yaml"
        path.write_bytes(data)
        with pytest.raises(ConfigError, match="not UTF-8 text"):
            load_job_spec(path)


@pytest.mark.parametrize("case, data, field, needles", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_names_file_field_and_allowed(tmp_path: Path, case, data, field, needles):
    path = _write(tmp_path / f"{case}.yaml", data)
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    err = info.value
    message = str(err)
    assert err.path == str(path)
    assert message.startswith(str(path)), message
    assert err.field == field, message
    if field is not None:
        assert f"field '{field}'" in message
    assert len(message) < len(str(path)) + 400, message  # a short prefix of a bad value, never all of it
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_missing_spec_file(tmp_path: Path):
    path = tmp_path / "gone.yaml"
    with pytest.raises(ConfigError, match="file not found") as info:
        load_job_spec(path)
    assert info.value.path == str(path)


def test_parse_job_spec_without_file_name_needs_name():
    with pytest.raises(ConfigError, match=r"field 'name': missing \(required\)"):
        parse_job_spec(GOOD, "<stdin>")
    assert parse_job_spec({**GOOD, "name": "from-data"}, "<stdin>").name == "from-data"


def test_load_job_specs_keeps_good_ones_and_reports_each_bad_one(tmp_path: Path):
    jobs = tmp_path / "assets" / "jobs"
    _write(jobs / "good-a.yaml", GOOD)
    _write(jobs / "good-b.yml", {**GOOD, "stopping": {"samples": 5000}})
    _write(jobs / "bad-model.yaml", {**GOOD, "model": "gpt-5"})
    _write(jobs / "bad-yaml.yaml", "model: [unclosed\n")
    _write(jobs / "bad-batch.yaml", {**GOOD, "per_gpu_batch": 0})
    _write(jobs / ".hidden.yaml", {**GOOD, "model": "gpt-5"})  # editor swap files and the like
    _write(jobs / "README.md", "not a spec")
    specs, errors = load_job_specs(jobs)
    assert sorted(specs) == ["good-a", "good-b"]
    assert specs["good-b"].stopping.kind is StopKind.SAMPLES
    assert sorted(Path(e.path).name for e in errors) == ["bad-batch.yaml", "bad-model.yaml", "bad-yaml.yaml"]
    assert {Path(e.path).name: e.field for e in errors}["bad-batch.yaml"] == "per_gpu_batch"


def test_load_job_specs_of_missing_dir(tmp_path: Path):
    assert load_job_specs(tmp_path / "nowhere") == ({}, [])


@pytest.mark.parametrize("path", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_yaml_dict_round_trips(path: Path, tmp_path: Path):
    spec = load_job_spec(path)
    data = job_spec_to_yaml_dict(spec)
    assert parse_job_spec(data, path) == spec
    # ... also through YAML text and a file, as `ones submit` would write it.
    again = load_job_spec(_write(tmp_path / f"{spec.name}.yaml", yaml.safe_dump(data)))
    assert again == spec


def test_yaml_dict_round_trips_every_optional_field(tmp_path: Path):
    data = {"name": "full", "model": "mine", "dataset_size": 500, "per_gpu_batch": 16, "base_lr": 0.01,
            "max_lr": 0.04, "max_global_batch": 48, "max_per_gpu_batch": 8, "requested_gpus": 2, "max_gpus": 6,
            "stopping": {"target_accuracy": 0.8, "patience": 4, "min_delta": 0.02}, "priority": 3,
            "command": ["python", "t.py"], "image": "me/train:1"}
    spec = parse_job_spec(data, tmp_path / "full.yaml")
    assert job_spec_to_yaml_dict(spec) == data
    assert parse_job_spec(job_spec_to_yaml_dict(spec), tmp_path / "full.yaml") == spec


# -- environments ---------------------------------------------------------------------------------------
def _project(tmp_path: Path, env: dict | str | None, name: str = "local") -> Path:
    _write(tmp_path / "resources" / f"{name}.yaml", "" if env is None else env)
    return tmp_path


def test_empty_env_file_gives_defaults(tmp_path: Path):
    env = load_env(_project(tmp_path, None))
    assert env.name == "local"
    assert env.project_dir == tmp_path.resolve()
    assert env.jobs_dir == tmp_path.resolve() / "assets" / "jobs"
    assert env.state_dir == tmp_path.resolve() / ".ones" / "state"
    assert (env.cluster.gpus, env.cluster.cpu_slots, env.cluster.gpus_per_node) == ("auto", 2, None)
    assert (env.launcher.kind, env.launcher.docker) == ("subprocess", None)
    assert (env.policy.name, env.policy.seed, dict(env.policy.params)) == ("ones", 0, {})
    assert env.scheduler.tick_interval_s == 15 and env.scheduler.decision_budget_s == 2.0
    assert env.tracking_uri() == f"sqlite:///{env.state_dir / 'mlflow.db'}"


def test_live_ones_gets_the_decision_budget_and_no_churn_override(tmp_path: Path):
    """A live deployment's ``ones`` gets the tick's decision budget as its time budget and nothing else: its
    churn charge follows what the deployment measured its changes to cost (``JobView.change_costs``), so no
    live override of it is left; other policies get nothing."""
    from ones_pipeline.scheduler import SchedulerSettings

    live = SchedulerSettings.from_env(load_env(_project(tmp_path / "a", None)))
    assert live.params == {"time_budget_s": 2.0}
    own = SchedulerSettings.from_env(load_env(_project(tmp_path / "b", {"policy": {"params": {"min_hold_s": 10}}})))
    assert own.params == {"min_hold_s": 10, "time_budget_s": 2.0}
    fifo = SchedulerSettings.from_env(load_env(_project(tmp_path / "c", {"policy": {"name": "fifo"}})))
    assert fifo.params == {}


def test_repo_local_env_loads():
    env = load_env(REPO, "local")
    assert env.launcher.kind == "subprocess" and env.policy.name == "ones"


def test_full_env(tmp_path: Path):
    env = load_env(_project(tmp_path, {
        "cluster": {"gpus": [0, 2], "gpus_per_node": 1},
        "launcher": {"kind": "docker", "docker": {"image": "ones:latest", "volumes": ["data:/data", "/abs:/x:rw"],
                                                  "environment": {"A": 1}}},
        "policy": {"name": "fifo", "seed": 3},
        "scheduler": {"tick_interval_s": 5}}))
    assert env.cluster.gpus == (0, 2) and env.cluster.gpus_per_node == 1
    assert env.launcher.docker.image == "ones:latest"
    assert env.launcher.docker.volumes == ((str(tmp_path.resolve() / "data"), "/data", "ro"), ("/abs", "/x", "rw"))
    assert dict(env.launcher.docker.environment) == {"A": "1"}
    assert (env.policy.name, env.policy.seed, env.scheduler.tick_interval_s) == ("fifo", 3, 5)


# (case id, environment data, field named in the error, substrings the message must contain)
BAD_ENVS = [
    ("gpus-word", {"cluster": {"gpus": "some"}}, "cluster.gpus",
     ["'some'", "allowed: auto, none, or a list of GPU ids"]),
    ("gpus-duplicate", {"cluster": {"gpus": [0, 0]}}, "cluster.gpus", ["distinct GPU ids"]),
    ("cpu-slots-zero", {"cluster": {"cpu_slots": 0}}, "cluster.cpu_slots", ["[1, 1024]"]),
    ("cpu-slots-beyond-a-c-int", {"cluster": {"cpu_slots": 2**40}}, "cluster.cpu_slots", ["[1, 1024]"]),
    ("gpu-id-huge", {"cluster": {"gpus": [0, 2**70]}}, "cluster.gpus", ["distinct GPU ids in [0, 4096)"]),
    ("grace-period-inf", {"launcher": {"grace_period_s": float("inf")}}, "launcher.grace_period_s",
     ["non-finite value inf"]),
    ("state-dir-under-proc", {"state_dir": "/proc/self"}, "state_dir", ["under /proc"]),
    ("policy-param-nan", {"policy": {"name": "fifo", "params": {"x": float("nan")}}}, "policy.params.x",
     ["non-finite value nan"]),
    ("policy-param-huge", {"policy": {"name": "fifo", "params": {"x": 2**80}}}, "policy.params.x",
     ["out-of-range value"]),
    ("launcher-k8s", {"launcher": {"kind": "k8s"}}, "launcher.kind", ["'k8s'", "allowed: subprocess, docker, slurm"]),
    ("policy-lottery", {"policy": {"name": "lottery"}}, "policy.name", ["'lottery'", "allowed:", *policy_names()]),
    ("policy-params-unknown", {"policy": {"params": {"bogus_knob": 1}}}, "policy.params",
     ["not accepted by policy 'ones'", "bogus_knob"]),
    ("unknown-top-level", {"clusters": {"gpus": "none"}}, "clusters",
     ["unknown field", "allowed:", "cluster", "launcher", "scheduler"]),
    ("unknown-section-key", {"scheduler": {"tick_s": 5}}, "scheduler.tick_s", ["unknown field", "tick_interval_s"]),
    ("section-not-mapping", {"cluster": "big"}, "cluster", ["expected a mapping", "'big'"]),
    ("docker-volume-malformed", {"launcher": {"kind": "docker", "docker": {"image": "x", "volumes": ["a:b:c:d"]}}},
     "launcher.docker.volumes[0]", ["HOST:CONTAINER[:ro|rw]", "'a:b:c:d'"]),
    ("docker-volume-mode", {"launcher": {"kind": "docker", "docker": {"image": "x", "volumes": ["/a", "a:b:rx"]}}},
     "launcher.docker.volumes[0]", ["HOST:CONTAINER[:ro|rw]", "'/a'"]),
    ("docker-without-image", {"launcher": {"kind": "docker"}}, "launcher.docker.image", ["missing (required)"]),
    ("tick-interval-zero", {"scheduler": {"tick_interval_s": 0}}, "scheduler.tick_interval_s", ["[1, 86400]"]),
    ("slurm-launcher-without-cluster", {"launcher": {"kind": "slurm"}}, "cluster.slurm",
     ["launcher.kind: slurm needs cluster.slurm"]),
    ("slurm-cluster-without-launcher", {"cluster": {"slurm": {"partition": "gpu"}}}, "launcher.kind",
     ["a Slurm cluster needs launcher.kind: slurm"]),
    ("slurm-partition-missing", {"cluster": {"slurm": {"nodes": ["n1"]}}, "launcher": {"kind": "slurm"}},
     "cluster.slurm.partition", ["missing (required)"]),
    ("slurm-nodes-duplicate", {"cluster": {"slurm": {"partition": "gpu", "nodes": ["n1", "n1"]}},
                               "launcher": {"kind": "slurm"}}, "cluster.slurm.nodes", ["distinct node names"]),
    ("slurm-rank-device", {"cluster": {"slurm": {"partition": "gpu"}},
                           "launcher": {"kind": "slurm", "slurm": {"rank_device": "tpu"}}},
     "launcher.slurm.rank_device", ["'tpu'", "allowed: cuda, cpu"]),
    ("slurm-sbatch-args", {"cluster": {"slurm": {"partition": "gpu"}},
                           "launcher": {"kind": "slurm", "slurm": {"sbatch_args": "--account=ml"}}},
     "launcher.slurm.sbatch_args", ["list of sbatch options"]),
    ("not-a-mapping", "- cluster\n", None, ["must be a mapping", "list"]),
    ("invalid-yaml", "cluster:\n  gpus: none\n cpu_slots: 2\n", None, ["not valid YAML", "line 3"]),
]


@pytest.mark.parametrize("case, data, field, needles", BAD_ENVS, ids=[c[0] for c in BAD_ENVS])
def test_bad_env_names_file_and_field(tmp_path: Path, case, data, field, needles):
    project = _project(tmp_path, data)
    path = project / "resources" / "local.yaml"
    with pytest.raises(ConfigError) as info:
        load_env(project)
    err = info.value
    message = str(err)
    assert err.path == str(path.resolve()), message
    assert err.field == field, message
    if field is not None:
        assert f"field '{field}'" in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_repo_slurm_env_loads():
    env = load_env(REPO, "slurm")
    assert env.launcher.kind == "slurm" and env.cluster.slurm.partition == "gpu"
    assert env.launcher.slurm.python.endswith("python") and env.launcher.slurm.pending_timeout_s == 300


def test_tracking_uri_env_unset_names_variable(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("ONES_TEST_TRACKING_URI", raising=False)
    env = load_env(_project(tmp_path, {"mlflow": {"tracking_uri_env": "ONES_TEST_TRACKING_URI"}}))
    with pytest.raises(ConfigError) as info:
        env.tracking_uri()
    assert info.value.field == "mlflow.tracking_uri_env"
    assert "ONES_TEST_TRACKING_URI" in str(info.value) and "not set" in str(info.value)
    assert str(env.path) in str(info.value)


def test_tracking_uri_env_set_is_used(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ONES_TEST_TRACKING_URI", "http://mlflow.internal:5000")
    env = load_env(_project(tmp_path, {"mlflow": {"tracking_uri_env": "ONES_TEST_TRACKING_URI",
                                                  "tracking_uri": "sqlite:///ignored.db"}}))
    assert env.tracking_uri() == "http://mlflow.internal:5000"


def test_explicit_tracking_uri(tmp_path: Path):
    env = load_env(_project(tmp_path, {"mlflow": {"tracking_uri": "sqlite:////srv/m.db", "experiment": "x"}}))
    assert env.tracking_uri() == "sqlite:////srv/m.db" and env.mlflow.experiment == "x"


def test_relative_dirs_resolve_against_project_not_cwd(tmp_path: Path, monkeypatch):
    project = _project(tmp_path / "proj", {"state_dir": "run/state", "jobs_dir": "specs"})
    monkeypatch.chdir(tmp_path)  # somewhere else
    env = load_env(project)
    assert env.state_dir == project.resolve() / "run" / "state"
    assert env.jobs_dir == project.resolve() / "specs"
    absolute = load_env(_project(tmp_path / "abs", {"state_dir": str(tmp_path / "elsewhere")}))
    assert absolute.state_dir == tmp_path / "elsewhere"


def test_project_and_env_from_environment_variables(tmp_path: Path, monkeypatch):
    project = _project(tmp_path, {"policy": {"name": "fifo"}}, name="staging")
    monkeypatch.setenv("ONES_PROJECT_DIR", str(project))
    monkeypatch.setenv("ONES_ENV", "staging")
    env = load_env()
    assert (env.name, env.policy.name, env.project_dir) == ("staging", "fifo", project.resolve())


def test_missing_env_names_the_present_ones(tmp_path: Path):
    project = _project(tmp_path, None, "local")
    _write(project / "resources" / "docker.yaml", "")
    with pytest.raises(ConfigError) as info:
        load_env(project, "prod")
    message = str(info.value)
    assert "prod.yaml" in message and "no such environment" in message
    assert "present: docker, local" in message


def test_an_absent_local_yaml_is_the_embedded_default_and_a_present_one_is_validated(tmp_path: Path):
    env = load_env(tmp_path, "local")  # an empty project: no resources/ at all
    assert (env.name, env.state_dir, env.jobs_dir) == ("local", tmp_path.resolve() / ".ones/state",
                                                      tmp_path.resolve() / "assets/jobs")
    assert env.policy.name == "ones" and env.launcher.kind == "subprocess"
    _write(tmp_path / "resources" / "local.yaml", {"cluster": {"cpu_slots": 0}})
    with pytest.raises(ConfigError, match="cpu_slots"):
        load_env(tmp_path, "local")


def test_a_state_dir_on_a_file_is_refused(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    for state_dir in ("afile", "afile/state"):
        with pytest.raises(ConfigError, match="is a file, not a directory") as info:
            parse_env({"state_dir": state_dir}, tmp_path / "e.yaml", tmp_path, "e")
        assert info.value.field == "state_dir"


def test_bad_env_name(tmp_path: Path):
    with pytest.raises(ConfigError, match="bad environment name"):
        load_env(_project(tmp_path, None), "../local")


def test_parse_env_accepts_none(tmp_path: Path):
    env = parse_env(None, tmp_path / "resources" / "x.yaml", tmp_path, "x")
    assert isinstance(env, EnvConfig) and env.cluster.gpus == "auto"


def test_job_state_dir_stays_inside_state_dir(tmp_path: Path):
    env = load_env(_project(tmp_path, None))
    assert env.job_state_dir("mlp-a") == env.state_dir / "jobs" / "mlp-a"
    for bad in ("../x", "a/b", "", "..", "/etc"):
        with pytest.raises(ValueError, match="bad job name"):
            env.job_state_dir(bad)


def test_review_findings_are_errors_now(tmp_path):
    """Duplicates across .yaml/.yml, requested above max, non-mapping sections, string volumes, null env."""
    from ones_pipeline.config import ConfigError, load_job_specs, parse_env, parse_job_spec

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    text = "model: mlp-digits\nper_gpu_batch: 8\nstopping: {epochs: 1}\n"
    (jobs / "x.yaml").write_text(text)
    (jobs / "x.yml").write_text(text)
    specs, errors = load_job_specs(jobs)
    assert list(specs) == ["x"] and len(errors) == 1 and "already defined" in str(errors[0])
    with pytest.raises(ConfigError, match="requested_gpus"):
        parse_job_spec({"model": "mlp-digits", "per_gpu_batch": 8, "requested_gpus": 4, "max_gpus": 2,
                        "stopping": {"epochs": 1}}, tmp_path / "j.yaml", default_name="j")
    for bad, field in [({"cluster": []}, "cluster"), ({"policy": ""}, "policy"),
                       ({"launcher": {"kind": "docker", "docker": {"image": "i", "volumes": "a:/b"}}},
                        "launcher.docker.volumes"),
                       ({"launcher": {"kind": "docker", "docker": {"image": "i", "environment": {"A": None}}}},
                        "launcher.docker.environment.A")]:
        with pytest.raises(ConfigError) as exc:
            parse_env(bad, tmp_path / "e.yaml", tmp_path, "e")
        assert exc.value.field == field
