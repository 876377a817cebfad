"""Environments: ``resources/<env>.yaml`` -> ``EnvConfig`` (cluster, launcher, MLflow, policy, scheduler).

The one place the control plane reads environment variables: ``$ONES_PROJECT_DIR`` and ``$ONES_ENV``
choose the environment file, ``mlflow.tracking_uri_env`` names the variable holding a secret tracking
URI, and ``$ONES_TRACES`` points the offline tooling at the public traces. (The training step's
``ONES_*`` protocol is read only by ``train.api.Placement.from_env``.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ones_pipeline.config.fields import ConfigError, check_keys, get_field, read_yaml
from ones_pipeline.config.layout import StateLayout
from ones_pipeline.core.limits import MAX_CPU_SLOTS, MAX_GPUS, MAX_SECONDS, shown


@dataclass(frozen=True)
class SlurmClusterConfig:
    partition: str
    nodes: tuple[str, ...] = ()  # only these nodes of the partition (default: all)
    slurm_conf: str | None = None  # SLURM_CONF for every Slurm command (default: Slurm's own)


@dataclass(frozen=True)
class ClusterConfig:
    gpus: str | tuple[int, ...] = "auto"  # "auto" (NVML, else CPU slots), "none" (CPU slots), or GPU ids
    cpu_slots: int = 2
    gpus_per_node: int | None = None
    slurm: SlurmClusterConfig | None = None  # the slots are a Slurm partition's GPUs


@dataclass(frozen=True)
class SlurmLaunchConfig:
    sbatch_args: tuple[str, ...] = ()  # extra sbatch arguments, e.g. --account=ml
    pending_timeout_s: float = 300.0  # a job still pending after this fails its run (resources taken elsewhere)
    python: str = "python"  # the interpreter on the nodes (the project installed; {python} = this one)
    rank_device: str = "cuda"  # "cpu": train on CPU with gloo even on (fake) GPUs, for test clusters


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
    kind: str = "subprocess"  # or "docker", "slurm"
    grace_period_s: float = 20.0
    docker: DockerConfig | None = None
    slurm: SlurmLaunchConfig = SlurmLaunchConfig()


@dataclass(frozen=True)
class MlflowConfig:
    tracking_uri: str | None = None  # None: sqlite file in the state directory
    tracking_uri_env: str | None = None  # read the URI (a secret) from this environment variable
    experiment: str = "ones"
    # The UIs the links between them point at: MLflow's (None: the tracking server for an http(s) store, else
    # `mlflow ui`'s http://127.0.0.1:5000) and Dagster's, which each job's MLflow run links back to.
    ui_url: str | None = None
    dagster_ui_url: str = "http://127.0.0.1:3000"


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

    @property
    def layout(self) -> StateLayout:
        """Every path inside the state directory."""
        return StateLayout(self.state_dir)

    def tracking_uri(self) -> str:
        """The MLflow tracking URI in force: ``mlflow.tracking_uri``, the variable ``mlflow.tracking_uri_env``
        names (read here, the one place), or the sqlite file of the state directory."""
        if self.mlflow.tracking_uri_env:
            value = os.environ.get(self.mlflow.tracking_uri_env)
            if not value:
                raise ConfigError(self.path, "mlflow.tracking_uri_env",
                                  f"environment variable {self.mlflow.tracking_uri_env} is not set")
            return value
        return self.mlflow.tracking_uri or f"sqlite:///{self.layout.mlflow_db}"

    def job_state_dir(self, job: str) -> Path:
        return self.layout.job_dir(job)


DEFAULT_ENV = "local"  # resources/local.yaml; absent: every setting at its default
ENV_FIELDS = {"cluster", "launcher", "mlflow", "policy", "scheduler", "state_dir", "jobs_dir"}
LAUNCHER_KINDS = ("subprocess", "docker", "slurm")
RANK_DEVICES = ("cuda", "cpu")
ENV_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+\Z")
DOCKER_FIELDS = {"image", "python", "shm_size", "network", "init", "volumes", "environment", "user", "stop_timeout_s"}
SCHEDULER_FIELDS = {"tick_interval_s", "decision_budget_s", "max_retries", "retry_backoff_s", "min_run_s"}


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
        raise ConfigError(path, key, f"expected a mapping, got {shown(value)}")
    return value


def _parse_slurm_cluster(path: Path, c: Mapping) -> SlurmClusterConfig | None:
    s = _section(path, c, "slurm")
    if not s:
        return None
    check_keys(path, s, {"partition", "nodes", "slurm_conf"}, "cluster.slurm.")
    nodes = s.get("nodes") or []
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes) or len(set(nodes)) != len(nodes):
        raise ConfigError(path, "cluster.slurm.nodes", f"expected a list of distinct node names, got {shown(nodes)}")
    return SlurmClusterConfig(partition=get_field(path, s, "partition", str, required=True, prefix="cluster.slurm."),
                              nodes=tuple(nodes),
                              slurm_conf=get_field(path, s, "slurm_conf", str, prefix="cluster.slurm."))


def _parse_slurm_launch(path: Path, lz: Mapping, project_dir: Path) -> SlurmLaunchConfig:
    s = _section(path, lz, "slurm")
    pre = "launcher.slurm."
    check_keys(path, s, {"sbatch_args", "pending_timeout_s", "python", "rank_device"}, pre)
    args = s.get("sbatch_args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) and a.startswith("-") for a in args):
        raise ConfigError(path, pre + "sbatch_args", f"expected a list of sbatch options ('--account=ml'), "
                          f"got {shown(args)}")
    device = get_field(path, s, "rank_device", str, "cuda", prefix=pre)
    if device not in RANK_DEVICES:
        raise ConfigError(path, pre + "rank_device", f"got {shown(device)}; allowed: {', '.join(RANK_DEVICES)}")
    import sys

    python = get_field(path, s, "python", str, "{python}", prefix=pre).replace("{python}", sys.executable)
    return SlurmLaunchConfig(sbatch_args=tuple(args), python=_expand(python, project_dir), rank_device=device,
                             pending_timeout_s=get_field(path, s, "pending_timeout_s", float, 300.0, prefix=pre,
                                                         minimum=1, maximum=MAX_SECONDS))


def _parse_cluster(path: Path, c: Mapping) -> ClusterConfig:
    check_keys(path, c, {"gpus", "cpu_slots", "gpus_per_node", "slurm"}, "cluster.")
    gpus = c.get("gpus", "auto")
    if isinstance(gpus, list):
        if not gpus or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_GPUS for g in gpus) \
                or len(set(gpus)) != len(gpus):
            raise ConfigError(path, "cluster.gpus", f"expected distinct GPU ids in [0, {MAX_GPUS}), got {shown(gpus)}")
        gpus = tuple(gpus)
    elif gpus not in ("auto", "none"):
        raise ConfigError(path, "cluster.gpus", f"got {shown(gpus)}; allowed: auto, none, or a list of GPU ids")
    return ClusterConfig(gpus=gpus, cpu_slots=get_field(path, c, "cpu_slots", int, 2, prefix="cluster.", minimum=1,
                                                      maximum=MAX_CPU_SLOTS),
                         gpus_per_node=get_field(path, c, "gpus_per_node", int, prefix="cluster.", minimum=1,
                                                  maximum=MAX_GPUS),
                         slurm=_parse_slurm_cluster(path, c))


def _parse_volumes(path: Path, raw: Any, project_dir: Path) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(raw, list):
        raise ConfigError(path, "launcher.docker.volumes",
                          f"expected a list of 'HOST:CONTAINER[:ro|rw]', got {shown(raw)}")
    volumes = []
    for i, v in enumerate(raw):
        if isinstance(v, str):
            v = _expand(v, project_dir)
        parts = v.split(":") if isinstance(v, str) else []
        if len(parts) == 2:
            parts.append("ro")
        if len(parts) != 3 or parts[2] not in ("ro", "rw") or not parts[0] or not parts[1]:
            raise ConfigError(path, f"launcher.docker.volumes[{i}]",
                              f"expected 'HOST:CONTAINER[:ro|rw]', got {shown(v)}")
        host = parts[0] if os.path.isabs(parts[0]) else str(project_dir / parts[0])
        if not os.path.isabs(parts[1]):
            raise ConfigError(path, f"launcher.docker.volumes[{i}]", f"container path {shown(parts[1])} must be "
                              "absolute (use {project} for the project directory)")
        volumes.append((host, parts[1], parts[2]))
    return tuple(volumes)


def _parse_docker(path: Path, d: Mapping, project_dir: Path) -> DockerConfig:
    check_keys(path, d, DOCKER_FIELDS, "launcher.docker.")
    env = d.get("environment") or {}
    if not isinstance(env, Mapping):
        raise ConfigError(path, "launcher.docker.environment", f"expected a mapping, got {shown(env)}")
    for k, v in env.items():
        if v is None or isinstance(v, (Mapping, list)):
            raise ConfigError(path, f"launcher.docker.environment.{shown(str(k)).strip(chr(39))}",
                              f"expected a string or number, got {shown(v)}")
    pre = "launcher.docker."
    return DockerConfig(
        image=get_field(path, d, "image", str, required=True, prefix=pre),
        python=_expand(get_field(path, d, "python", str, "python", prefix=pre), project_dir),
        shm_size=str(get_field(path, d, "shm_size", (str, int), "1g", prefix=pre)),
        network=get_field(path, d, "network", str, "none", prefix=pre),
        init=get_field(path, d, "init", bool, True, prefix=pre),
        volumes=_parse_volumes(path, d.get("volumes") or [], project_dir),
        environment={str(k): str(v) for k, v in env.items()},
        user=get_field(path, d, "user", str, prefix=pre),
        stop_timeout_s=get_field(path, d, "stop_timeout_s", float, 30.0, prefix=pre, minimum=0,
                                 maximum=MAX_SECONDS))


def _parse_launcher(path: Path, lz: Mapping, project_dir: Path) -> LauncherConfig:
    check_keys(path, lz, {"kind", "grace_period_s", "docker", "slurm"}, "launcher.")
    kind = get_field(path, lz, "kind", str, "subprocess", prefix="launcher.")
    if kind not in LAUNCHER_KINDS:
        raise ConfigError(path, "launcher.kind", f"got {shown(kind)}; allowed: {', '.join(LAUNCHER_KINDS)}")
    d = _section(path, lz, "docker")
    docker = _parse_docker(path, d, project_dir) if d or kind == "docker" else None
    launcher = LauncherConfig(kind=kind, docker=docker, slurm=_parse_slurm_launch(path, lz, project_dir),
                              grace_period_s=get_field(path, lz, "grace_period_s", float, 20.0, prefix="launcher.",
                                                       minimum=1, maximum=MAX_SECONDS))
    if docker is not None and docker.stop_timeout_s <= launcher.grace_period_s:
        raise ConfigError(path, "launcher.docker.stop_timeout_s",
                          f"{docker.stop_timeout_s:g} must exceed launcher.grace_period_s {launcher.grace_period_s:g} "
                          "(Docker kills the container when it runs out, before the step could checkpoint)")
    return launcher


def _parse_mlflow(path: Path, m: Mapping) -> MlflowConfig:
    check_keys(path, m, {"tracking_uri", "tracking_uri_env", "experiment", "ui_url", "dagster_ui_url"}, "mlflow.")
    urls = {key: get_field(path, m, key, str, default, prefix="mlflow.")
            for key, default in (("ui_url", None), ("dagster_ui_url", MlflowConfig.dagster_ui_url))}
    for key, url in urls.items():
        if url is not None and not re.match(r"https?://[^\s/?#]+[^\s?#]*\Z", url):
            raise ConfigError(path, f"mlflow.{key}", f"{shown(url)} is not a UI address; allowed: http://HOST[:PORT]"
                                                     "[/PATH] or https://...")
    return MlflowConfig(tracking_uri=get_field(path, m, "tracking_uri", str, prefix="mlflow."),
                        tracking_uri_env=get_field(path, m, "tracking_uri_env", str, prefix="mlflow."),
                        experiment=get_field(path, m, "experiment", str, "ones", prefix="mlflow."),
                        ui_url=urls["ui_url"] and urls["ui_url"].rstrip("/"),
                        dagster_ui_url=urls["dagster_ui_url"].rstrip("/"))


def _parse_policy(path: Path, p: Mapping) -> PolicyConfig:
    check_keys(path, p, {"name", "seed", "params"}, "policy.")
    from ones_pipeline.core.policies import make_policy, policy_names

    params = _section(path, p, "params")
    check_keys(path, params, set(params), "policy.params.")  # text names only
    for key in params:  # every number finite, integers bounded (the policy checks its own ranges)
        values = params[key] if isinstance(params[key], list) else [params[key]]
        for value in values:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                get_field(path, {key: value}, key, type(value), prefix="policy.params.")
    policy = PolicyConfig(name=get_field(path, p, "name", str, "ones", prefix="policy."),
                          seed=get_field(path, p, "seed", int, 0, prefix="policy.", minimum=0, maximum=2**32 - 1),
                          params=dict(params))
    if policy.name not in policy_names():
        raise ConfigError(path, "policy.name", f"got {shown(policy.name)}; allowed: {', '.join(policy_names())}")
    try:
        make_policy(policy.name, seed=policy.seed, **policy.params)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(path, "policy.params",
                          f"not accepted by policy {shown(policy.name)}: {str(exc)[:200]}") from None
    return policy


def _parse_scheduler(path: Path, s: Mapping) -> SchedulerConfig:
    check_keys(path, s, SCHEDULER_FIELDS, "scheduler.")
    pre = "scheduler."
    return SchedulerConfig(
        tick_interval_s=get_field(path, s, "tick_interval_s", int, 15, prefix=pre, minimum=1, maximum=86400),
        decision_budget_s=get_field(path, s, "decision_budget_s", float, 2.0, prefix=pre, minimum=0.01, maximum=3600),
        max_retries=get_field(path, s, "max_retries", int, 3, prefix=pre, minimum=0, maximum=1000),
        retry_backoff_s=get_field(path, s, "retry_backoff_s", float, 30.0, prefix=pre, minimum=0, maximum=MAX_SECONDS),
        min_run_s=get_field(path, s, "min_run_s", float, 30.0, prefix=pre, minimum=0, maximum=MAX_SECONDS))


def _usable_dir(path: Path, key: str, folder: Path) -> Path:
    """``folder`` (``state_dir``, ``jobs_dir``), refused when it cannot be one: a file, a name the system
    refuses (too long), or under /proc, /sys or /dev."""
    try:
        resolved = folder.resolve()
        probe = resolved
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        is_dir = probe.is_dir()
    except (OSError, ValueError) as exc:
        raise ConfigError(path, key, f"{shown(str(folder))} cannot be a directory here "
                                     f"({getattr(exc, 'strerror', None) or exc})") from None
    if any(resolved == Path(p) or Path(p) in resolved.parents for p in ("/proc", "/sys", "/dev")):
        raise ConfigError(path, key, f"{shown(str(folder))} is under /{resolved.parts[1]}: choose a directory "
                                     "on a disk")
    if not is_dir:
        raise ConfigError(path, key, f"{shown(str(probe))} is a file, not a directory")
    return folder


def parse_env(data: Any, path: str | os.PathLike, project_dir: str | os.PathLike, name: str) -> EnvConfig:
    path, project_dir = Path(path), Path(project_dir).resolve()
    data = data or {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, None, f"an environment must be a mapping, got {type(data).__name__}")
    check_keys(path, data, ENV_FIELDS)

    def _dir(key: str, default: str) -> Path:
        value = Path(get_field(path, data, key, str, default))
        return value if value.is_absolute() else project_dir / value

    cluster = _parse_cluster(path, _section(path, data, "cluster"))
    launcher = _parse_launcher(path, _section(path, data, "launcher"), project_dir)
    if (launcher.kind == "slurm") != (cluster.slurm is not None):
        raise ConfigError(path, "launcher.kind" if cluster.slurm is not None else "cluster.slurm",
                          "a Slurm cluster needs launcher.kind: slurm, and launcher.kind: slurm needs cluster.slurm "
                          "(partition: NAME): the runs must go where the slots are")
    return EnvConfig(
        name=name, path=path, project_dir=project_dir,
        jobs_dir=_usable_dir(path, "jobs_dir", _dir("jobs_dir", "assets/jobs")),
        state_dir=_usable_dir(path, "state_dir", _dir("state_dir", ".ones/state")), cluster=cluster, launcher=launcher,
        mlflow=_parse_mlflow(path, _section(path, data, "mlflow")),
        policy=_parse_policy(path, _section(path, data, "policy")),
        scheduler=_parse_scheduler(path, _section(path, data, "scheduler")))


def project_dir_from_environment() -> Path:
    """``$ONES_PROJECT_DIR``, else the working directory (absolute)."""
    return Path(os.environ.get("ONES_PROJECT_DIR") or os.getcwd()).resolve()


def traces_dir_from_environment(default: Path) -> Path:
    """``$ONES_TRACES`` (the public traces, for offline tooling and benchmarks), else ``default``."""
    return Path(os.environ.get("ONES_TRACES") or default)


def env_name_from_environment() -> str:
    """``$ONES_ENV``, else ``local``."""
    return os.environ.get("ONES_ENV") or DEFAULT_ENV


def load_env(project_dir: str | os.PathLike | None = None, name: str | None = None) -> EnvConfig:
    """``resources/<name>.yaml`` of the project (default: ``$ONES_PROJECT_DIR`` or the working directory;
    name: ``$ONES_ENV`` or ``local``). An absent ``local.yaml`` is the embedded default environment."""
    project_dir = Path(project_dir).resolve() if project_dir else project_dir_from_environment()
    name = name or env_name_from_environment()
    if not ENV_NAME_RE.match(name):
        raise ConfigError(project_dir / "resources", None, f"bad environment name {shown(name)}")
    path = project_dir / "resources" / f"{name}.yaml"
    if not path.exists():
        if name == DEFAULT_ENV:  # the embedded default environment: every setting at its default
            return parse_env({}, path, project_dir, name)
        present = sorted(p.stem for p in (project_dir / "resources").glob("*.yaml"))
        raise ConfigError(path, None, f"no such environment; present: {', '.join(present) or 'none'}")
    return parse_env(read_yaml(path), path, project_dir, name)
