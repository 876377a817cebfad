"""What the fuzz suite feeds the product (issue 40): hostile values for every field, and the one property
every input must have: the product accepts it, or refuses it with one clear line, within a time budget.

``--fuzz-long`` (tests/conftest.py) multiplies the examples and draws them at random; without it every run
replays the same few examples (``derandomize``), so CI stays fast and deterministic."""

from __future__ import annotations

import contextlib
import os
import signal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG = os.environ.get("ONES_FUZZ_LONG") == "1"
TIME_BUDGET_S = 10.0  # a single input: accepted or refused within this (a hang fails the test, never the run)


def fuzz_settings(examples: int, long_examples: int | None = None) -> settings:
    """``examples`` per property in CI (deterministic), ``long_examples`` (default 40x) with --fuzz-long."""
    return settings(max_examples=(long_examples or 40 * examples) if LONG else examples, derandomize=not LONG,
                    deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much, HealthCheck.data_too_large])


class Hang(AssertionError):
    pass


@contextlib.contextmanager
def within(seconds: float = TIME_BUDGET_S):
    """Fail (``Hang``) when the block runs longer than ``seconds`` (SIGALRM: main thread only)."""
    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_clear_line(exc: BaseException, path) -> None:
    """The refusal names the file, fits on one line and quotes no more than a short prefix of the value."""
    message = str(exc)
    assert message.startswith(str(path)), message[:300]
    assert "\n" not in message, message[:300]
    assert len(message) < len(str(path)) + 600, f"{len(message)} characters: {message[:300]}"


NUMBERS = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, -1, 1, 2, 2**31, 2**53 + 1, 2**63, 2**64, 10**12, 10**15, 10**18, 10**20]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 1e300, 1e10, 1e-12, float("nan"), float("inf"), float("-inf"), -0.0, 0.5]),
)
TEXTS = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "\n", "a\n", "2001-13-45", "2001-12-14", "!!float abc", "x" * 5000, "..", "/etc/passwd",
                     "../../outside", "\x00", "é", "auto", "none", "slurm", "docker", "ones", "fifo", "mlp-digits",
                     "{project}/x:/y:rw", "-", "--account=x", "1e18", "nan"]),
)
SCALARS = st.one_of(NUMBERS, TEXTS, st.booleans(), st.none())
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(st.text(max_size=6), SCALARS, max_size=3))

# Number-like cells of a CSV: what a broken or hostile trace holds.
CELLS = st.one_of(
    st.sampled_from(["0", "1", "2", "8", "32", "128", "-1", "1.5", "nan", "inf", "-inf", "1e18", "1e15", "1e12",
                     "9223372036854775808", "18446744073709551616", "1" + "0" * 400, "1e999", "0x10", "", " ", "abc",
                     "１", "1_000", "1e-300", "5e-06", "2e-5", "0.8", "1e99"]),
    st.integers(min_value=-2**70, max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10),
)


def put(data: dict, dotted, value) -> dict:
    """``data`` with ``value`` at ``dotted`` ("stopping.epochs"; a non-text key is put as is)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    if not isinstance(dotted, str) or "." not in dotted:
        out[dotted] = value
        return out
    head, rest = dotted.split(".", 1)
    inner = out.get(head) if isinstance(out.get(head), dict) else {}
    out[head] = put(inner, rest, value)
    return out
