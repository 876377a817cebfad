"""Plumbing every policy shares: ``PolicyBase`` (seed, the policy's random generator, ``params``,
``to_dict`` / ``load_state``, ``repr``), ``PolicyParams`` (base of a frozen dataclass holding a policy's
constructor keywords) and the parameter checks behind both.

Every check's message names the policy, the parameter, the value and what is allowed. This module
imports nothing of the policies package, so every policy module can import it without a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

import numpy as np

# --------------------------------------------------------------------------------------------------
# Parameter checks.


def check_bool(policy: str, field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{policy}: {field} must be true or false, got {value!r}")
    return bool(value)


def check_int(policy: str, field: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{policy}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(policy: str, field: str, value: Any, minimum: float | None = None,
                maximum: float | None = None, strict_min: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok:
        value = float(value)
        ok = math.isfinite(value)
        if ok and minimum is not None:
            ok = value > minimum if strict_min else value >= minimum
        if ok and maximum is not None:
            ok = value <= maximum
    if not ok:
        lo = "" if minimum is None else f"{'>' if strict_min else '>='} {minimum}"
        hi = "" if maximum is None else f"<= {maximum}"
        allowed = " and ".join(s for s in (lo, hi) if s) or "finite"
        raise ValueError(f"{policy}: {field} must be a finite number {allowed}, got {value!r}")
    return value


def check_choice(policy: str, field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{policy}: {field} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def check_probability(policy: str, field: str, value: Any) -> float:
    return check_float(policy, field, value, 0.0, 1.0)


# --------------------------------------------------------------------------------------------------
# Parameters as a value.


@dataclass(frozen=True)
class PolicyParams:
    """Base of a policy's parameters: a subclass is a frozen dataclass whose fields are the policy's
    constructor keywords (same names, same defaults), checked once, in its ``__post_init__``."""

    policy: ClassVar[str] = ""  # the policy's name, for error messages

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Parameters from keyword values; an unknown name is a TypeError listing the allowed ones."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise TypeError(f"{cls.policy}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                            f"allowed: {', '.join(allowed)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able keyword values (tuples as lists); ``from_dict`` of it gives back an equal value."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


# --------------------------------------------------------------------------------------------------
# The base class.


class PolicyBase:
    """Seed, random generator and persistence shared by every policy.

    ``to_dict()`` returns ``{"name", "seed", "params", "state"}``; ``state`` holds the generator's
    bit-generator state and whatever ``_extra_state`` adds, so a policy rebuilt with ``policy_from_dict``
    draws the same numbers and continues from the same search state.
    """

    name = ""

    def __init__(self, seed: int = 0) -> None:
        self.seed = check_int(self.name, "seed", seed, 0)
        self._rng = np.random.default_rng(self.seed)

    # Subclasses: constructor keyword parameters, and extra state beyond the generator.
    def params(self) -> dict[str, Any]:
        return {}

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "params": self.params(),
            "state": {"rng": self._rng.bit_generator.state, **self._extra_state()},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        if "rng" in state:
            try:
                self._rng.bit_generator.state = dict(state["rng"])
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"{self.name}: state['rng'] is not a {type(self._rng.bit_generator).__name__} "
                                 f"state: {exc}") from exc
        self._load_extra_state(state)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}(seed={self.seed}{', ' if args else ''}{args})"
