"""Reading YAML and checking its fields: every error names the file, the field, the value and what is allowed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A bad job spec or environment file; the message names file, field, value and what is allowed."""

    def __init__(self, path: str | os.PathLike, field_name: str | None, message: str):
        self.path = str(path)
        self.field = field_name
        where = f"{self.path}: field '{field_name}'" if field_name else self.path
        super().__init__(f"{where}: {message}")
        self._message = message

    def __reduce__(self):  # raised in another process: rebuilt with its message, not a TypeError
        return type(self), (self.path, self.field, self._message)


def read_yaml(path: Path) -> Any:
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


def check_keys(path: Path, data: Mapping, allowed: set[str], prefix: str = "") -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(path, prefix + unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


def get_field(path: Path, data: Mapping, key: str, kind: type | tuple, default: Any = None, *, required: bool = False,
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

