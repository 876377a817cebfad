"""Jobs declared in code or in a component's YAML (besides the spec files of ``assets/jobs``), and their
upstream assets.

A declared job is a job spec (the fields of a spec file) plus ``deps``: the asset keys it trains on. The
sensor schedules it only once every one of them is materialized (``hold_for_upstream``); until then it
is a partition of ``training_job`` that waits, and says for what. The training asset depends on every
key a job names, so the asset graph shows the edge. ``ones_job`` is the small Python factory.

No ``from __future__ import annotations`` (Dagster resolves annotations at runtime where it meets them).
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from ones_pipeline.config import ConfigError, parse_job_spec
from ones_pipeline.core.types import JobSpec


@dataclass(frozen=True)
class DeclaredJob:
    spec: JobSpec
    deps: tuple[dg.AssetKey, ...] = ()


def ones_job(name: str, *, deps: Sequence[str | dg.AssetKey] = (), **fields: Any) -> dict[str, Any]:
    """A job for ``OnesComponent(jobs=[...])`` in Python: the fields of a spec file (``model``,
    ``per_gpu_batch``, ``stopping``, ...), and ``deps``, the upstream asset keys (``"a/b"`` or
    ``AssetKey``). Checked now: a bad field raises ``ConfigError`` naming it."""
    data = {"name": name, **fields, "deps": [k.to_user_string() if isinstance(k, dg.AssetKey) else str(k)
                                             for k in deps]}
    declared_jobs([data], Path(f"ones_job({name!r})"))
    return data


def declared_jobs(items: Iterable[Mapping[str, Any]], path: Path) -> dict[str, DeclaredJob]:
    """Each item: a spec's fields and optional ``deps`` (asset keys as ``"a/b"`` strings). ``path``: where
    they were written (defs.yaml), named by every error."""
    out: dict[str, DeclaredJob] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ConfigError(path, f"jobs[{i}]", f"a job must be a mapping of spec fields, got {type(item).__name__}")
        fields = dict(item)
        deps = fields.pop("deps", None) or []
        if isinstance(deps, str) or not isinstance(deps, (list, tuple)) or not all(
                isinstance(d, str) and d.strip() for d in deps):
            raise ConfigError(path, f"jobs[{i}].deps", f"expected a list of asset keys (\"name\" or \"a/b\"), got "
                                                       f"{deps!r}"[:200])
        if "name" not in fields:
            raise ConfigError(path, f"jobs[{i}].name", "missing (required for a job declared here)")
        spec = parse_job_spec(fields, path)
        if spec.name in out:
            raise ConfigError(path, f"jobs[{i}].name", f"job {spec.name!r} is declared twice")
        out[spec.name] = DeclaredJob(spec, tuple(dg.AssetKey.from_user_string(d) for d in deps))
    return out


def upstream_keys(declared: Mapping[str, DeclaredJob]) -> list[dg.AssetKey]:
    return sorted({k for job in declared.values() for k in job.deps}, key=lambda k: k.to_user_string())


def hold_for_upstream(instance: dg.DagsterInstance, declared: Mapping[str, DeclaredJob]
                      ) -> tuple[dict[str, JobSpec], dict[str, str]]:
    """The declared jobs whose upstream assets are all materialized (their specs), and why each other one
    waits."""
    ready, held = {}, {}
    for name, job in declared.items():
        missing = [k.to_user_string() for k in job.deps if instance.get_latest_materialization_event(k) is None]
        if missing:
            held[name] = f"waits for upstream asset(s) {', '.join(missing)} to be materialized"
        else:
            ready[name] = job.spec
    return ready, held


def merge_specs(files: dict[str, JobSpec], errors: list, declared: Mapping[str, DeclaredJob],
                ready: Mapping[str, JobSpec], jobs_dir: Path) -> dict[str, JobSpec]:
    """The spec files' jobs and the declared jobs that may run; a file naming a declared job is an error
    (the declaration wins)."""
    for name in sorted(set(files) & set(declared)):
        errors.append(ConfigError(jobs_dir / f"{name}.yaml", "name", f"job {name!r} is also declared in the ONES "
                                                                "component; remove one of the two"))
    return {**{k: v for k, v in files.items() if k not in declared}, **ready}


def with_declared(instance: dg.DagsterInstance, files: dict[str, JobSpec], errors: list,
                  declared: Mapping[str, DeclaredJob] | None, jobs_dir: Path
                  ) -> tuple[dict[str, JobSpec], dict[str, str]]:
    """The tick's specs (spec files and declared jobs whose upstream assets are materialized) and why each
    other declared job waits."""
    if not declared:
        return files, {}
    ready, held = hold_for_upstream(instance, declared)
    return merge_specs(files, errors, declared, ready, jobs_dir), held
