"""The one reader and validator of the CSV files the simulator loads: traces, workloads, profiles, histories.

A loader declares its columns as :class:`Field` values (:func:`number`, :func:`integer`, :func:`text`);
:func:`read_rows` checks the header, the field count of every row and every typed value, and returns the
rows typed. Every problem raises :class:`TraceError` naming the file, the 1-based data row, the field, the
value and what is allowed; nothing is skipped (a blank row is an error too). Checks that involve more than
one field stay in the loader, which reports them through :meth:`Row.out_of_range` / :meth:`Row.error` so
they read the same.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ones_pipeline.core.limits import Range, shown
from ones_pipeline.sim.truth import TraceError

_KINDS = ("float", "int", "text")


@dataclass(frozen=True)
class Field:
    """One column: its name, its type and the values allowed (bounds for numbers, choices for text)."""

    name: str
    kind: str = "float"  # "float" (finite), "int" (integral, read as a number first: "1e3" is 1000; at most
    # core.limits.MAX_INT unless ``high`` says less) or "text"
    low: float | None = None
    low_open: bool = False  # the bound ``low`` itself is not allowed
    high: float | None = None
    high_open: bool = False
    choices: tuple[str, ...] | None = None  # text: allowed values (compared after stripping and any lower-casing)
    lower: bool = False  # text: the value is lower-cased

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Field {self.name!r}: kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")

    @property
    def range(self) -> Range:
        """The one number check (``core.limits.Range``): finite, within the bounds, integers bounded."""
        return Range(self.kind == "int", self.low, self.high, self.low_open, self.high_open)

    def allowed(self) -> str:
        """What the field accepts, in words: ``an integer in [1, 4096]``, ``a number in (0, 1]``, ``one of a, b``."""
        if self.kind == "text":
            return f"one of {', '.join(self.choices)}" if self.choices else "any text"
        return self.range.allowed()

    def parse(self, raw: str, path: Path, row: int) -> Any:
        """The typed value of ``raw`` (already stripped), or a TraceError saying what is allowed."""
        if self.kind == "text":
            value = raw.lower() if self.lower else raw
            if self.choices is not None and value not in self.choices:
                raise TraceError(path, f"unknown value {shown(raw)}; allowed: {', '.join(self.choices)}", row=row,
                                 field=self.name)
            return value
        try:
            value = float(raw)
        except ValueError:
            raise self._bad(path, row, "non-numeric value", raw) from None
        problem = self.range.problem(value)
        if problem is not None:
            raise self._bad(path, row, problem, raw)
        return int(value) if self.kind == "int" else value

    def _bad(self, path: Path, row: int, problem: str, raw: str) -> TraceError:
        return TraceError(path, f"{problem} {shown(raw)}; allowed: {self.allowed()}", row=row, field=self.name)


def number(name: str, *, low: float | None = None, low_open: bool = False, high: float | None = None,
           high_open: bool = False) -> Field:
    """A finite number, optionally bounded (``low_open``/``high_open``: the bound itself is excluded)."""
    return Field(name, "float", low, low_open, high, high_open)


def integer(name: str, *, minimum: int | None = None, maximum: int | None = None) -> Field:
    """An integral number, optionally at least ``minimum``, at most ``maximum`` (default ``core.limits.MAX_INT``)."""
    return Field(name, "int", low=minimum, high=maximum)


def text(name: str, *, choices: Sequence[str] | None = None, lower: bool = False) -> Field:
    """Text (stripped), optionally one of ``choices`` (after lower-casing when ``lower``)."""
    return Field(name, "text", choices=tuple(choices) if choices is not None else None, lower=lower)


@dataclass(frozen=True)
class Row:
    """One validated data row: typed ``values`` and the stripped ``raw`` text, by column name."""

    path: Path
    number: int  # 1-based data row (the header and leading blank lines not counted)
    values: dict[str, Any]
    raw: dict[str, str]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def error(self, field: str, message: str) -> TraceError:
        """A TraceError about ``field`` of this row (for checks a single field cannot make)."""
        return TraceError(self.path, message, row=self.number, field=field)

    def out_of_range(self, field: str, allowed: str) -> TraceError:
        """The error of a value that parsed but breaks a rule involving other fields (``allowed`` says which)."""
        return self.error(field, f"out-of-range value {shown(self.raw[field])}; allowed: {allowed}")


def _read_lines(path: Path, what: str) -> list[list[str]]:
    if not path.is_file():
        raise TraceError(path, f"{what} is not a regular file" if path.exists() else f"{what} not found")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: a spreadsheet's BOM is not a column
            return list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(path, f"cannot parse CSV: {exc}") from None


def _is_blank(cells: Sequence[str]) -> bool:
    return not any(c.strip() for c in cells)


def _split_header(path: Path, lines: list[list[str]], expected: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(stripped header, data lines) after any leading blank lines."""
    start = next((i for i, cells in enumerate(lines) if not _is_blank(cells)), None)
    if start is None:
        raise TraceError(path, f"empty file; expected a header with columns {', '.join(expected)}")
    return [c.strip() for c in lines[start]], lines[start + 1:]


def read_header(path: str | os.PathLike, what: str = "file") -> list[str]:
    """The column names of a CSV (stripped; leading blank lines skipped), e.g. to tell trace formats apart."""
    path = Path(path)
    lines = _read_lines(path, what)
    if all(_is_blank(cells) for cells in lines):
        raise TraceError(path, "empty file: expected a CSV header")
    return _split_header(path, lines, ())[0]


def _check_header(path: Path, header: list[str], names: Sequence[str], extra_columns: bool) -> None:
    listed = ", ".join(names)
    if not extra_columns:
        unknown = [c for c in header if c not in names]
        if unknown:
            raise TraceError(path, f"unknown column {unknown[0]!r} in the header; allowed columns: {listed}",
                             field=unknown[0])
    missing = [c for c in names if c not in header]
    if missing:
        which = "column" if len(missing) == 1 else "columns"
        kind = "required" if extra_columns else "allowed"
        raise TraceError(path, f"missing {which} {', '.join(map(repr, missing))} in the header; {kind} columns: "
                               f"{listed}", field=missing[0])
    dup = next((c for c in header if header.count(c) > 1), None)
    if dup is not None:
        raise TraceError(path, f"duplicate column {dup!r} in the header", field=dup)


def read_rows(path: str | os.PathLike, fields: Sequence[Field], *, what: str = "file",
              extra_columns: bool = False) -> list[Row]:
    """Every data row of the CSV at ``path``, validated against ``fields``.

    ``what`` names the file in "not found" errors (``"trace file"``, ``"profile file"``). The header must
    hold every field's column; other columns are an error unless ``extra_columns`` (then they are ignored).
    Leading blank lines are skipped; a blank row after the header, a row with a different number of fields
    than the header, a value its field does not allow, or no data row at all raise :class:`TraceError`.
    """
    path = Path(path)
    names = [f.name for f in fields]
    header, data = _split_header(path, _read_lines(path, what), names)
    _check_header(path, header, names, extra_columns)
    index = {c: i for i, c in enumerate(header)}
    rows = []
    for row_no, cells in enumerate(data, start=1):
        if _is_blank(cells):
            raise TraceError(path, "blank row", row=row_no)
        if len(cells) != len(header):
            raise TraceError(path, f"{len(cells)} fields, expected {len(header)} ({', '.join(header)})",
                             row=row_no)
        raw = {f.name: cells[index[f.name]].strip() for f in fields}
        values = {f.name: f.parse(raw[f.name], path, row_no) for f in fields}
        rows.append(Row(path, row_no, values, raw))
    if not rows:
        raise TraceError(path, "no data rows (the file has only a header)")
    return rows
