"""Configuration: job specs (``assets/jobs/*.yaml``), environments (``resources/<env>.yaml``) and the
layout of the state directory. YAML in, frozen dataclasses out; every error a ``ConfigError`` naming
file, field, value and what is allowed."""

from ones_pipeline.config.env import (
    ClusterConfig,
    DockerConfig,
    EnvConfig,
    LauncherConfig,
    MlflowConfig,
    PolicyConfig,
    SchedulerConfig,
    SlurmClusterConfig,
    SlurmLaunchConfig,
    load_env,
    parse_env,
    project_dir_from_environment,
    traces_dir_from_environment,
)
from ones_pipeline.config.fields import ConfigError, read_yaml
from ones_pipeline.config.jobs import (
    BUILTIN_MODELS,
    JOB_FIELDS,
    job_spec_files,
    job_spec_to_yaml_dict,
    load_job_spec,
    load_job_specs,
    parse_job_spec,
)
from ones_pipeline.config.layout import StateLayout

__all__ = [
    "BUILTIN_MODELS", "JOB_FIELDS", "ClusterConfig", "ConfigError", "DockerConfig", "EnvConfig", "LauncherConfig",
    "MlflowConfig", "PolicyConfig", "SchedulerConfig", "SlurmClusterConfig", "SlurmLaunchConfig", "StateLayout",
    "job_spec_files", "job_spec_to_yaml_dict",
    "load_env", "load_job_spec", "load_job_specs", "parse_env", "parse_job_spec", "project_dir_from_environment",
    "read_yaml", "traces_dir_from_environment",
]
