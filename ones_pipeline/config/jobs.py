"""Job specs: ``assets/jobs/*.yaml`` -> ``JobSpec``, and back.

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
    register_as: digits-mlp    # optional: the finished model also becomes a version of this registered model

"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ones_pipeline.config.fields import ConfigError, check_keys, get_field, read_yaml
from ones_pipeline.core.limits import SPEC_RANGES, STOPPING_RANGES, shown
from ones_pipeline.core.types import JOB_NAME_RE, MODEL_NAME_RE, JobSpec, StopKind, StoppingRule
from ones_pipeline.train.catalogue import WORKLOADS, train_size

JOB_SUFFIXES = (".yaml", ".yml")
# -- job specs ------------------------------------------------------------------------------------------
JOB_FIELDS = {"name", "model", "dataset_size", "per_gpu_batch", "base_lr", "max_lr", "max_global_batch",
              "max_per_gpu_batch", "requested_gpus", "max_gpus", "stopping", "priority", "command", "image",
              "register_as"}
STOPPING_FIELDS = {"epochs", "samples", "target_accuracy", "patience", "min_delta"}


BUILTIN_MODELS = tuple(WORKLOADS)
# (field, type, default) of the spec's top-level numbers; their ranges: core.limits.SPEC_RANGES
_NUMBER_FIELDS = (("per_gpu_batch", int, None), ("base_lr", float, 0.1), ("max_lr", float, None),
                  ("max_global_batch", int, None), ("max_per_gpu_batch", int, None), ("requested_gpus", int, 1),
                  ("max_gpus", int, None), ("priority", int, 0))


def parse_job_spec(data: Any, path: str | os.PathLike, default_name: str | None = None) -> JobSpec:
    path = Path(path)
    if not isinstance(data, Mapping):
        raise ConfigError(path, None, f"a job spec must be a mapping of fields, got {type(data).__name__}")
    check_keys(path, data, JOB_FIELDS)
    name = get_field(path, data, "name", str, default_name, required=default_name is None)
    if not JOB_NAME_RE.fullmatch(name):
        raise ConfigError(path, "name", f"{shown(name)} is not a job name: lowercase letters, digits and '-', "
                                        "starting with a letter or digit, at most 63 characters")
    model = get_field(path, data, "model", str, required=True)
    command = data.get("command")
    if command is not None:
        if isinstance(command, str) or not isinstance(command, list) or not command or \
                not all(isinstance(a, (str, int, float)) for a in command):
            raise ConfigError(path, "command", f"expected a non-empty list of arguments (argv), got {shown(command)}")
        command = tuple(str(a) for a in command)
    elif model not in BUILTIN_MODELS:
        raise ConfigError(path, "model", f"unknown built-in model {shown(model)}; allowed: {', '.join(BUILTIN_MODELS)} "
                                         "(or give a `command` to run your own script)")
    builtin_size = train_size(model) if command is None else None
    dataset_size = get_field(path, data, "dataset_size", int, builtin_size, required=builtin_size is None,
                             allowed=SPEC_RANGES["dataset_size"])
    stopping_data = data.get("stopping")
    if not isinstance(stopping_data, Mapping):
        raise ConfigError(path, "stopping", "missing or not a mapping; give one of {epochs: N}, {samples: N}, "
                                            "{target_accuracy: A, patience: P}")
    check_keys(path, stopping_data, STOPPING_FIELDS, "stopping.")
    kinds = [k for k in ("epochs", "samples", "target_accuracy") if stopping_data.get(k) is not None]
    if len(kinds) != 1:
        raise ConfigError(path, "stopping", f"give exactly one of epochs, samples, target_accuracy; got "
                                            f"{', '.join(kinds) or 'none'}")
    kind = {"epochs": StopKind.EPOCHS, "samples": StopKind.SAMPLES, "target_accuracy": StopKind.ACCURACY}[kinds[0]]
    defaults = {"patience": 5, "min_delta": 0.01}
    values = {key: get_field(path, stopping_data, key, int if key == "patience" else float, defaults.get(key),
                             prefix="stopping.", allowed=rng) for key, rng in STOPPING_RANGES.items()}
    try:
        stopping = StoppingRule(kind, **values)
    except ValueError as exc:
        raise ConfigError(path, "stopping", str(exc)) from None
    numbers = {key: get_field(path, data, key, kind, default, required=key == "per_gpu_batch", allowed=SPEC_RANGES[key])
               for key, kind, default in _NUMBER_FIELDS}
    register_as = get_field(path, data, "register_as", str)
    if register_as is not None and not MODEL_NAME_RE.match(register_as):
        raise ConfigError(path, "register_as", f"{shown(register_as)} is not a registered model name: letters, "
                                               "digits, '_', '.' and '-', starting with a letter or digit, at most "
                                               "128 characters")
    kwargs = dict(name=name, model=model, dataset_size=dataset_size, **numbers, stopping=stopping, command=command,
                  image=get_field(path, data, "image", str), register_as=register_as)
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
    spec = parse_job_spec(read_yaml(path), path, default_name=path.stem)
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
    for key in ("max_lr", "max_global_batch", "max_per_gpu_batch", "max_gpus", "image", "register_as"):
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

