"""The Pollux workloads and profiles shipped inside the package (``ones_pipeline/data/pollux``).

They are unmodified copies of petuum/adaptdl's simulator data (Apache-2.0, see the NOTICE in
``ones_pipeline/data/pollux/README.md``). Workload names:

* ``pollux:workload-N`` (N = 1..8): the 8 main workloads (relative load 1.0, 160 jobs each),
* ``pollux-0.5:workload-N``, ``pollux-1.5:workload-N``: the relative-load variants (80 / 240 jobs).

Standard library only: the simulator, the CLI and the tests import it without Dagster, MLflow or torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ones_pipeline.sim.truth import TraceError

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "pollux"
PROFILES_DIR = DATA_DIR / "traces"
WORKLOAD_SETS = {"pollux": "workloads", "pollux-0.5": "workloads-0.5", "pollux-1.5": "workloads-1.5"}
WORKLOAD_INDICES = range(1, 9)
# Anything of the form "<prefix>:<rest>" is taken for a workload name (unless it is an existing file);
# a Windows drive ("C:\\...", "C:/...") is not.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]*:(?![\\/])")
_WORKLOAD_RE = re.compile(r"^workload-(\d+)$")


class UnknownWorkloadError(TraceError):
    """A workload name that is not one of the packaged workloads."""

    def __init__(self, name: str):
        ValueError.__init__(self, f"unknown workload {name!r}; allowed: {allowed_text()}")
        self.path, self.row, self.field = str(name), None, None

    def __reduce__(self):
        return type(self), (self.path,)


def allowed_text() -> str:
    """``pollux:workload-1 ... 8, pollux-0.5:workload-1 ... 8, pollux-1.5:workload-1 ... 8, or a CSV path``."""
    lo, hi = WORKLOAD_INDICES[0], WORKLOAD_INDICES[-1]
    return ", ".join(f"{s}:workload-{lo} ... {hi}" for s in WORKLOAD_SETS) + ", or a CSV path"


def workload_names() -> list[str]:
    """Every packaged workload name, e.g. ``pollux:workload-1``."""
    return [f"{s}:workload-{i}" for s in WORKLOAD_SETS for i in WORKLOAD_INDICES]


def looks_like_name(text: str | os.PathLike) -> bool:
    """Whether ``text`` has the ``<set>:<workload>`` form of a packaged workload name."""
    return bool(_NAME_RE.match(os.fspath(text).strip()))


def canonical_name(name: str) -> str:
    """``name`` stripped and lower-cased if it is a packaged workload; else :class:`UnknownWorkloadError`."""
    text = str(name).strip()
    prefix, sep, rest = text.lower().partition(":")
    m = _WORKLOAD_RE.match(rest)
    if not sep or prefix not in WORKLOAD_SETS or not m or int(m.group(1)) not in WORKLOAD_INDICES:
        raise UnknownWorkloadError(text)
    return f"{prefix}:workload-{int(m.group(1))}"


def workload_path(name: str) -> Path:
    """Path of the packaged CSV of workload ``name`` (e.g. ``pollux:workload-6``)."""
    canon = canonical_name(name)
    prefix, _, rest = canon.partition(":")
    path = DATA_DIR / WORKLOAD_SETS[prefix] / f"{rest}.csv"
    if not path.is_file():
        raise TraceError(path, f"packaged workload {canon!r} is missing from the installed package (reinstall it)")
    return path


def profiles_dir() -> Path:
    """The packaged Pollux profile folder (``<model>/placements.csv``, ``scalability.csv``, ``validation-*.csv``)."""
    if not PROFILES_DIR.is_dir():
        raise TraceError(PROFILES_DIR, "packaged Pollux profiles are missing from the installed package "
                                       "(reinstall it, or give a profile folder with --profiles DIR)")
    return PROFILES_DIR


def default_profiles_for(workload_csv: str | os.PathLike) -> Path:
    """Profile folder of a Pollux workload CSV: ``<its folder>/../traces`` when that folder exists (the
    layout of petuum/adaptdl's ``simulator/``), otherwise the packaged profiles."""
    sibling = Path(workload_csv).resolve().parent.parent / "traces"
    return sibling if sibling.is_dir() else profiles_dir()


def check_profiles_dir(path: str | os.PathLike) -> Path:
    """``path`` as a Path if it is a folder; else a :class:`TraceError` naming it."""
    path = Path(path)
    if not path.is_dir():
        what = "not a folder" if path.exists() else "folder not found"
        raise TraceError(path, f"Pollux profile folder (--profiles DIR): {what}")
    return path
