"""YAML -> dataclasses: job specs (``assets/jobs/*.yaml``) and environments (``resources/<env>.yaml``).

Every error is a ``ConfigError`` naming the file, the field, the bad value and what is allowed, so a
user can fix a spec without reading code. The scheduler skips a bad job spec with that message and
keeps the others running.

A job spec::

    name: mlp-a                # optional; defaults to the file name without .yaml; a slug
    model: mlp-digits          # built-in workload, or any label when `command` is given
    dataset_size: 1437         # samples per epoch; optional for built-in workloads
    per_gpu_batch: 32
    base_lr: 0.05              # LR at per_gpu_batch on one GPU
    max_lr: 0.2                # LR cap: fixes the largest global batch (ONES's rule)
    requested_gpus: 1
    max_gpus: 2                # default 4 x requested_gpus
    stopping: {epochs: 10}     # or {samples: N} or {target_accuracy: 0.95, patience: 3}
    command: [python, my_train.py]   # optional: the job's own script (the ones_pipeline.train API)

An environment: see ``resources/local.yaml``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ones_pipeline.core.types import JOB_NAME_RE, JobSpec, StopKind, StoppingRule
from ones_pipeline.train.catalogue import WORKLOADS, train_size

JOB_SUFFIXES = (".yaml", ".yml")


class ConfigError(ValueError):
    """A bad job spec or environment file; the message names file, field, value and what is allowed."""

    def __init__(self, path: str | os.PathLike, field_name: str | None, message: str):
        self.path = str(path)
        self.field = field_name
        where = f"{self.path}: field '{field_name}'" if field_name else self.path
        super().__init__(f"{where}: {message}")


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc.strerror}") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~4x faster
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(path, None, f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None


def _check_keys(path: Path, data: Mapping, allowed: set[str], prefix: str = "") -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(path, prefix + unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _get(path: Path, data: Mapping, key: str, kind: type | tuple, default: Any = None, *, required: bool = False,
         prefix: str = "", minimum: float | None = None) -> Any:
    name = prefix + key
    if key not in data or data[key] is None:
        if required:
            raise ConfigError(path, name, "missing (required)")
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(path, name, f"expected {names}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(path, name, f"must be >= {minimum:g}, got {value!r}")
    return value


# -- job specs ------------------------------------------------------------------------------------------
JOB_FIELDS = {"name", "model", "dataset_size", "per_gpu_batch", "base_lr", "max_lr", "max_global_batch",
              "max_per_gpu_batch", "requested_gpus", "max_gpus", "stopping", "priority", "command", "image"}
STOPPING_FIELDS = {"epochs", "samples", "target_accuracy", "patience", "min_delta"}


BUILTIN_MODELS = tuple(WORKLOADS)


def parse_job_spec(data: Any, path: str | os.PathLike, default_name: str | None = None) -> JobSpec:
    path = Path(path)
    if not isinstance(data, Mapping):
        raise ConfigError(path, None, f"a job spec must be a mapping of fields, got {type(data).__name__}")
    _check_keys(path, data, JOB_FIELDS)
    name = _get(path, data, "name", str, default_name, required=default_name is None)
    if not JOB_NAME_RE.match(name):
        raise ConfigError(path, "name", f"{name!r} is not a job name: lowercase letters, digits and '-', "
                                        "starting with a letter or digit, at most 63 characters")
    model = _get(path, data, "model", str, required=True)
    command = data.get("command")
    if command is not None:
        if isinstance(command, str) or not isinstance(command, list) or not command or \
                not all(isinstance(a, (str, int, float)) for a in command):
            raise ConfigError(path, "command", f"expected a non-empty list of arguments (argv), got {command!r}")
        command = tuple(str(a) for a in command)
    elif model not in BUILTIN_MODELS:
        raise ConfigError(path, "model", f"unknown built-in model {model!r}; allowed: {', '.join(BUILTIN_MODELS)} "
                                         "(or give a `command` to run your own script)")
    builtin_size = train_size(model) if command is None else None
    dataset_size = _get(path, data, "dataset_size", int, builtin_size, required=builtin_size is None, minimum=1)
    stopping_data = data.get("stopping")
    if not isinstance(stopping_data, Mapping):
        raise ConfigError(path, "stopping", "missing or not a mapping; give one of {epochs: N}, {samples: N}, "
                                            "{target_accuracy: A, patience: P}")
    _check_keys(path, stopping_data, STOPPING_FIELDS, "stopping.")
    kinds = [k for k in ("epochs", "samples", "target_accuracy") if stopping_data.get(k) is not None]
    if len(kinds) != 1:
        raise ConfigError(path, "stopping", f"give exactly one of epochs, samples, target_accuracy; got "
                                            f"{', '.join(kinds) or 'none'}")
    kind = {"epochs": StopKind.EPOCHS, "samples": StopKind.SAMPLES, "target_accuracy": StopKind.ACCURACY}[kinds[0]]
    try:
        stopping = StoppingRule(
            kind, epochs=_get(path, stopping_data, "epochs", float, prefix="stopping."),
            samples=_get(path, stopping_data, "samples", float, prefix="stopping."),
            target_accuracy=_get(path, stopping_data, "target_accuracy", float, prefix="stopping."),
            patience=_get(path, stopping_data, "patience", int, 5, prefix="stopping."),
            min_delta=_get(path, stopping_data, "min_delta", float, 0.01, prefix="stopping."))
    except ValueError as exc:
        raise ConfigError(path, "stopping", str(exc)) from None
    kwargs = dict(
        name=name, model=model, dataset_size=dataset_size,
        per_gpu_batch=_get(path, data, "per_gpu_batch", int, required=True, minimum=1),
        base_lr=_get(path, data, "base_lr", float, 0.1),
        max_lr=_get(path, data, "max_lr", float),
        max_global_batch=_get(path, data, "max_global_batch", int, minimum=1),
        max_per_gpu_batch=_get(path, data, "max_per_gpu_batch", int, minimum=1),
        requested_gpus=_get(path, data, "requested_gpus", int, 1, minimum=1),
        max_gpus=_get(path, data, "max_gpus", int, minimum=1),
        stopping=stopping, priority=_get(path, data, "priority", int, 0), command=command,
        image=_get(path, data, "image", str))
    if kwargs["max_gpus"] is not None and kwargs["requested_gpus"] > kwargs["max_gpus"]:
        raise ConfigError(path, "requested_gpus", f"{kwargs['requested_gpus']} exceeds max_gpus {kwargs['max_gpus']}")
    try:
        return JobSpec(**kwargs)
    except ValueError as exc:  # cross-field checks of JobSpec; find the field the message names
        msg = str(exc).removeprefix(f"job {name}: ")
        bad = next((f for f in sorted(JOB_FIELDS, key=len, reverse=True) if msg.startswith(f)), None)
        raise ConfigError(path, bad, msg) from None


def load_job_spec(path: str | os.PathLike) -> JobSpec:
    path = Path(path)
    spec = parse_job_spec(_read_yaml(path), path, default_name=path.stem)
    if spec.name != path.stem:
        raise ConfigError(path, "name", f"{spec.name!r} differs from the file name {path.stem!r}: name the file "
                                        f"{spec.name}.yaml (one file = one job)")
    return spec


def job_spec_files(jobs_dir: str | os.PathLike) -> list[Path]:
    jobs_dir = Path(jobs_dir)
    if not jobs_dir.is_dir():
        return []
    return sorted(p for p in jobs_dir.iterdir() if p.suffix in JOB_SUFFIXES and not p.name.startswith("."))


def load_job_specs(jobs_dir: str | os.PathLike) -> tuple[dict[str, JobSpec], list[ConfigError]]:
    """Every spec under ``jobs_dir``: ``(good specs by name, errors of the bad files)``."""
    specs: dict[str, JobSpec] = {}
    errors: list[ConfigError] = []
    seen: dict[str, Path] = {}
    for path in job_spec_files(jobs_dir):
        try:
            spec = load_job_spec(path)
        except ConfigError as exc:
            errors.append(exc)
            continue
        if spec.name in seen:
            errors.append(ConfigError(path, "name", f"job {spec.name!r} is already defined by {seen[spec.name]}; "
                                                    "keep one file per job"))
            continue
        seen[spec.name] = path
        specs[spec.name] = spec
    return specs, errors


def job_spec_to_yaml_dict(spec: JobSpec) -> dict[str, Any]:
    """The YAML form of a spec (inverse of ``parse_job_spec``), without defaults."""
    out: dict[str, Any] = {"name": spec.name, "model": spec.model, "dataset_size": spec.dataset_size,
                           "per_gpu_batch": spec.per_gpu_batch, "base_lr": spec.base_lr}
    for key in ("max_lr", "max_global_batch", "max_per_gpu_batch", "max_gpus", "image"):
        if getattr(spec, key) is not None:
            out[key] = getattr(spec, key)
    out["requested_gpus"] = spec.requested_gpus
    rule = spec.stopping
    out["stopping"] = ({"epochs": rule.epochs} if rule.kind is StopKind.EPOCHS else
                       {"samples": rule.samples} if rule.kind is StopKind.SAMPLES else
                       {"target_accuracy": rule.target_accuracy})
    defaults = StoppingRule(StopKind.EPOCHS, epochs=1)
    for key in ("patience", "min_delta"):
        if rule.kind is StopKind.ACCURACY or getattr(rule, key) != getattr(defaults, key):
            out["stopping"][key] = getattr(rule, key)
    if spec.priority:
        out["priority"] = spec.priority
    if spec.command:
        out["command"] = list(spec.command)
    return out


# -- environments ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterConfig:
    gpus: str | tuple[int, ...] = "auto"  # "auto" (NVML, else CPU slots), "none" (CPU slots), or GPU ids
    cpu_slots: int = 2
    gpus_per_node: int | None = None


@dataclass(frozen=True)
class DockerConfig:
    image: str
    python: str = "python"
    shm_size: str = "1g"
    network: str = "none"
    init: bool = True
    volumes: tuple[tuple[str, str, str], ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class LauncherConfig:
    kind: str = "subprocess"  # or "docker"
    grace_period_s: float = 20.0
    docker: DockerConfig | None = None


@dataclass(frozen=True)
class MlflowConfig:
    tracking_uri: str | None = None  # None: sqlite file in the state directory
    tracking_uri_env: str | None = None  # read the URI (a secret) from this environment variable
    experiment: str = "ones"


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "ones"
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerConfig:
    tick_interval_s: int = 15
    decision_budget_s: float = 2.0  # wall-clock budget of the policy inside one tick
    max_retries: int = 3  # failed runs of a job before it is marked failed
    retry_backoff_s: float = 30.0  # doubled after each failure
    min_run_s: float = 30.0  # a run younger than this keeps its allocation (start-up is not wasted)


@dataclass(frozen=True)
class EnvConfig:
    name: str
    path: Path
    project_dir: Path
    jobs_dir: Path
    state_dir: Path
    cluster: ClusterConfig = ClusterConfig()
    launcher: LauncherConfig = LauncherConfig()
    mlflow: MlflowConfig = MlflowConfig()
    policy: PolicyConfig = PolicyConfig()
    scheduler: SchedulerConfig = SchedulerConfig()

    def tracking_uri(self) -> str:
        if self.mlflow.tracking_uri_env:
            value = os.environ.get(self.mlflow.tracking_uri_env)
            if not value:
                raise ConfigError(self.path, "mlflow.tracking_uri_env",
                                  f"environment variable {self.mlflow.tracking_uri_env} is not set")
            return value
        return self.mlflow.tracking_uri or f"sqlite:///{self.state_dir / 'mlflow.db'}"

    def job_state_dir(self, job: str) -> Path:
        if not JOB_NAME_RE.match(job):  # never a path outside the state directory
            raise ValueError(f"bad job name {job!r}")
        return self.state_dir / "jobs" / job


ENV_FIELDS = {"cluster", "launcher", "mlflow", "policy", "scheduler", "state_dir", "jobs_dir"}
LAUNCHER_KINDS = ("subprocess", "docker")
ENV_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _expand(text: str, project_dir: Path) -> str:
    """``{project}``: the project directory; ``{python_prefix}``: the Python installation this runs on
    (what a host-shim image mounts to run the project's virtualenv inside a container)."""
    import sys

    return text.replace("{project}", str(project_dir)).replace("{python_prefix}", sys.base_prefix)


def _section(path: Path, data: Mapping, key: str) -> Mapping:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, key, f"expected a mapping, got {value!r}")
    return value


def parse_env(data: Any, path: str | os.PathLike, project_dir: str | os.PathLike, name: str) -> EnvConfig:
    path, project_dir = Path(path), Path(project_dir).resolve()
    data = data or {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, None, f"an environment must be a mapping, got {type(data).__name__}")
    _check_keys(path, data, ENV_FIELDS)

    c = _section(path, data, "cluster")
    _check_keys(path, c, {"gpus", "cpu_slots", "gpus_per_node"}, "cluster.")
    gpus = c.get("gpus", "auto")
    if isinstance(gpus, list):
        if not gpus or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus) \
                or len(set(gpus)) != len(gpus):
            raise ConfigError(path, "cluster.gpus", f"expected distinct GPU ids >= 0, got {gpus!r}")
        gpus = tuple(gpus)
    elif gpus not in ("auto", "none"):
        raise ConfigError(path, "cluster.gpus", f"got {gpus!r}; allowed: auto, none, or a list of GPU ids")
    cluster = ClusterConfig(gpus=gpus, cpu_slots=_get(path, c, "cpu_slots", int, 2, prefix="cluster.", minimum=1),
                            gpus_per_node=_get(path, c, "gpus_per_node", int, prefix="cluster.", minimum=1))

    lz = _section(path, data, "launcher")
    _check_keys(path, lz, {"kind", "grace_period_s", "docker"}, "launcher.")
    kind = _get(path, lz, "kind", str, "subprocess", prefix="launcher.")
    if kind not in LAUNCHER_KINDS:
        raise ConfigError(path, "launcher.kind", f"got {kind!r}; allowed: {', '.join(LAUNCHER_KINDS)}")
    docker = None
    d = _section(path, lz, "docker")
    if d or kind == "docker":
        fields = {"image", "python", "shm_size", "network", "init", "volumes", "environment", "user", "stop_timeout_s"}
        _check_keys(path, d, fields, "launcher.docker.")
        volumes = []
        raw_volumes = d.get("volumes") or []
        if not isinstance(raw_volumes, list):
            raise ConfigError(path, "launcher.docker.volumes", f"expected a list of 'HOST:CONTAINER[:ro|rw]', "
                                                               f"got {raw_volumes!r}")
        for i, v in enumerate(raw_volumes):
            if isinstance(v, str):
                v = _expand(v, project_dir)
            parts = v.split(":") if isinstance(v, str) else []
            if len(parts) == 2:
                parts.append("ro")
            if len(parts) != 3 or parts[2] not in ("ro", "rw") or not parts[0] or not parts[1]:
                raise ConfigError(path, f"launcher.docker.volumes[{i}]",
                                  f"expected 'HOST:CONTAINER[:ro|rw]', got {v!r}")
            host = parts[0] if os.path.isabs(parts[0]) else str(project_dir / parts[0])
            if not os.path.isabs(parts[1]):
                raise ConfigError(path, f"launcher.docker.volumes[{i}]", f"container path {parts[1]!r} must be "
                                  "absolute (use {project} for the project directory)")
            volumes.append((host, parts[1], parts[2]))
        env = d.get("environment") or {}
        if not isinstance(env, Mapping):
            raise ConfigError(path, "launcher.docker.environment", f"expected a mapping, got {env!r}")
        for k, v in env.items():
            if v is None or isinstance(v, (Mapping, list)):
                raise ConfigError(path, f"launcher.docker.environment.{k}", f"expected a string or number, got {v!r}")
        docker = DockerConfig(
            image=_get(path, d, "image", str, required=True, prefix="launcher.docker."),
            python=_expand(_get(path, d, "python", str, "python", prefix="launcher.docker."), project_dir),
            shm_size=str(_get(path, d, "shm_size", (str, int), "1g", prefix="launcher.docker.")),
            network=_get(path, d, "network", str, "none", prefix="launcher.docker."),
            init=_get(path, d, "init", bool, True, prefix="launcher.docker."),
            volumes=tuple(volumes), environment={str(k): str(v) for k, v in env.items()},
            user=_get(path, d, "user", str, prefix="launcher.docker."),
            stop_timeout_s=_get(path, d, "stop_timeout_s", float, 30.0, prefix="launcher.docker.", minimum=0))
    launcher = LauncherConfig(kind=kind, docker=docker,
                              grace_period_s=_get(path, lz, "grace_period_s", float, 20.0, prefix="launcher.",
                                                  minimum=1))
    if docker is not None and docker.stop_timeout_s <= launcher.grace_period_s:
        raise ConfigError(path, "launcher.docker.stop_timeout_s",
                          f"{docker.stop_timeout_s:g} must exceed launcher.grace_period_s {launcher.grace_period_s:g} "
                          "(Docker kills the container when it runs out, before the step could checkpoint)")

    m = _section(path, data, "mlflow")
    _check_keys(path, m, {"tracking_uri", "tracking_uri_env", "experiment"}, "mlflow.")
    mlflow = MlflowConfig(tracking_uri=_get(path, m, "tracking_uri", str, prefix="mlflow."),
                          tracking_uri_env=_get(path, m, "tracking_uri_env", str, prefix="mlflow."),
                          experiment=_get(path, m, "experiment", str, "ones", prefix="mlflow."))

    p = _section(path, data, "policy")
    _check_keys(path, p, {"name", "seed", "params"}, "policy.")
    from ones_pipeline.core.policy import make_policy, policy_names

    policy = PolicyConfig(name=_get(path, p, "name", str, "ones", prefix="policy."),
                          seed=_get(path, p, "seed", int, 0, prefix="policy.", minimum=0),
                          params=dict(_section(path, p, "params")))
    if policy.name not in policy_names():
        raise ConfigError(path, "policy.name", f"got {policy.name!r}; allowed: {', '.join(policy_names())}")
    try:
        make_policy(policy.name, seed=policy.seed, **policy.params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(path, "policy.params", f"not accepted by policy {policy.name!r}: {exc}") from None

    s = _section(path, data, "scheduler")
    _check_keys(path, s, {"tick_interval_s", "decision_budget_s", "max_retries", "retry_backoff_s", "min_run_s"},
                "scheduler.")
    scheduler = SchedulerConfig(
        tick_interval_s=_get(path, s, "tick_interval_s", int, 15, prefix="scheduler.", minimum=1),
        decision_budget_s=_get(path, s, "decision_budget_s", float, 2.0, prefix="scheduler.", minimum=0.01),
        max_retries=_get(path, s, "max_retries", int, 3, prefix="scheduler.", minimum=0),
        retry_backoff_s=_get(path, s, "retry_backoff_s", float, 30.0, prefix="scheduler.", minimum=0),
        min_run_s=_get(path, s, "min_run_s", float, 30.0, prefix="scheduler.", minimum=0))

    def _dir(key: str, default: str) -> Path:
        value = Path(_get(path, data, key, str, default))
        return value if value.is_absolute() else project_dir / value

    return EnvConfig(name=name, path=path, project_dir=project_dir, jobs_dir=_dir("jobs_dir", "assets/jobs"),
                     state_dir=_dir("state_dir", ".ones/state"), cluster=cluster, launcher=launcher, mlflow=mlflow,
                     policy=policy, scheduler=scheduler)


def load_env(project_dir: str | os.PathLike | None = None, name: str | None = None) -> EnvConfig:
    """``resources/<name>.yaml`` of the project (default: ``$ONES_PROJECT_DIR`` or the working directory;
    name: ``$ONES_ENV`` or ``local``)."""
    project_dir = Path(project_dir or os.environ.get("ONES_PROJECT_DIR") or os.getcwd()).resolve()
    name = name or os.environ.get("ONES_ENV") or "local"
    if not ENV_NAME_RE.match(name):
        raise ConfigError(project_dir / "resources", None, f"bad environment name {name!r}")
    path = project_dir / "resources" / f"{name}.yaml"
    if not path.exists():
        present = sorted(p.stem for p in (project_dir / "resources").glob("*.yaml"))
        raise ConfigError(path, None, f"no such environment; present: {', '.join(present) or 'none'}")
    return parse_env(_read_yaml(path), path, project_dir, name)
