"""Reading YAML and checking its fields: every error names the file, the field, the value and what is allowed.

The loader reads bytes as UTF-8, refuses explicit tags (``!!float``, ``!!python/...``) and anchors/aliases
whose expansion exceeds a small budget (an alias bomb), keeps dates as text, and every number goes
through ``core.limits.Range`` (finite, within the field's range, integers bounded). Errors quote at most a
short prefix of a bad value (``core.limits.shown``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ones_pipeline.core.limits import Range, shown

MAX_YAML_BYTES = 1 << 20  # a job spec or an environment is a few hundred bytes
MAX_YAML_NODES = 10_000  # nodes of the document with every alias expanded
MAX_YAML_DEPTH = 32


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


def _loader():
    """A safe loader (libyaml's when present: ~4x faster) that keeps dates as text: a spec has no dates,
    and a bad one (2001-13-45) must not end in a traceback."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # noqa: D101 (a class per call keeps no module-level state)
        pass

    Loader.yaml_implicit_resolvers = {
        k: [(tag, regexp) for tag, regexp in v if tag != "tag:yaml.org,2002:timestamp"]
        for k, v in base.yaml_implicit_resolvers.items()}
    return Loader


def _check_events(path: Path, text: str, loader) -> None:
    """Refuse explicit tags, nesting deeper than ``MAX_YAML_DEPTH`` and a document whose aliases expand
    to more than ``MAX_YAML_NODES`` nodes, from the event stream (before anything is built)."""
    import yaml

    sizes: dict[str, int] = {}
    stack: list[list] = []  # [anchor, nodes so far]
    total = 0

    def done(anchor: str | None, size: int) -> None:
        nonlocal total
        if anchor:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size
        else:
            total += size
        if total + sum(f[1] for f in stack) > MAX_YAML_NODES:
            raise ConfigError(path, None, f"YAML expands to more than {MAX_YAML_NODES} values (anchors and "
                                          "aliases); write the values out")

    for event in yaml.parse(text, Loader=loader):
        tag = getattr(event, "tag", None)
        if tag is not None and tag != "!":  # an explicit tag: none of our files needs one
            raise ConfigError(path, None, f"YAML tag {shown(tag)} is not allowed; write plain values")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([event.anchor, 1])
            if len(stack) > MAX_YAML_DEPTH:
                raise ConfigError(path, None, f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = stack.pop()
            done(anchor, size)
        elif isinstance(event, yaml.ScalarEvent):
            done(event.anchor, 1)
        elif isinstance(event, yaml.AliasEvent):
            done(None, sizes.get(event.anchor, 1))


def _check_text(path: Path, data: Any, where: str = "") -> None:
    """No NUL character in any key or value: no path, argv or name can hold one (a launch would fail)."""
    if isinstance(data, str):
        if "\x00" in data:
            raise ConfigError(path, where or None, f"{shown(data)} contains a NUL character")
    elif isinstance(data, Mapping):
        for key, value in data.items():
            _check_text(path, key, where)
            name = shown(str(key)).strip("'")
            _check_text(path, value, f"{where}.{name}" if where else name)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _check_text(path, value, f"{where}[{i}]")


def read_yaml(path: Path) -> Any:
    """The document in ``path``: UTF-8, plain YAML (no tags, small alias expansion), or a ConfigError."""
    import yaml

    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # a FIFO or /dev/zero would block or never end
            raise ConfigError(path, None, "not a regular file")
        with open(path, "rb") as fh:
            data = fh.read(MAX_YAML_BYTES + 1)
        if len(data) > MAX_YAML_BYTES:
            raise ConfigError(path, None, f"larger than {MAX_YAML_BYTES} bytes; not a job spec or environment")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                                      "save the file as UTF-8") from None
    loader = _loader()
    try:
        _check_events(path, text, loader)
        data = yaml.load(text, Loader=loader)
        _check_text(path, data)
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = str(getattr(exc, "problem", None) or exc).splitlines()[0][:200]
        raise ConfigError(path, None, f"not valid YAML{where}: {problem}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(path, None, f"not valid YAML: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}") \
            from None


def check_keys(path: Path, data: Mapping, allowed: set[str], prefix: str = "") -> None:
    odd = next((k for k in data if not isinstance(k, str)), None)
    if odd is not None:
        raise ConfigError(path, prefix + shown(odd), f"field names are text; got {type(odd).__name__} "
                                                    f"{shown(odd)}; allowed: {', '.join(sorted(allowed))}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(path, prefix + shown(unknown[0]).strip("'"),
                          f"unknown field; allowed: {', '.join(sorted(allowed))}")


def get_field(path: Path, data: Mapping, key: str, kind: type | tuple, default: Any = None, *, required: bool = False,
              prefix: str = "", minimum: float | None = None, maximum: float | None = None,
              allowed: Range | None = None) -> Any:
    """``data[key]`` checked: of ``kind``; a number finite and within ``allowed`` (a ``core.limits.Range``)
    or ``[minimum, maximum]`` (an integer without a maximum is still bounded: ``core.limits.MAX_INT``)."""
    name = prefix + key
    if key not in data or data[key] is None:
        if required:
            raise ConfigError(path, name, "missing (required)")
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > 2**1000:  # float() of it would raise OverflowError
            raise ConfigError(path, name, f"out-of-range value {shown(value)}; allowed: "
                                          f"{(allowed or Range(False, minimum, maximum)).allowed()}")
        value = float(value)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(path, name, f"expected {names}, got {shown(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        integer = isinstance(value, int) and float not in kinds
        rng = Range(integer, minimum, maximum) if allowed is None else Range(
            integer, allowed.low, allowed.high, allowed.low_open, allowed.high_open)
        problem = rng.problem(value)
        if problem is not None:
            raise ConfigError(path, name, f"{problem} {shown(value)}; allowed: {rng.allowed()}")
    return value
