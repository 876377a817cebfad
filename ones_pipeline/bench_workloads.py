"""The simulated workloads of the benchmarks, by token, and the digest their cached results are keyed by.

``benchmarks/policy_quality.py`` (docs/results.md), ``benchmarks/tight_bound.py`` and the research scripts
(``benchmarks/research/``) name workloads by the same tokens: ``N`` (Pollux workload-N at load 1.0,
packaged), ``0.5:N`` / ``1.5:N`` (the Pollux authors' load variants, workloads 1-8, under the traces
folder), ``L:N`` for another load ``L`` (``synthetic_load``), ``ones50`` / ``ones400`` (the ONES trace).
They all simulate them on 16 nodes x 4 GPUs with 60 s rounds and 30 s per start/restart/resize
(``CLUSTER``, ``sim_config``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.runner import WorkloadSpec

PACKAGE = Path(__file__).resolve().parent
CLUSTER = Cluster.uniform(16, 4)
TOKENS = "1-8, 0.5:N, 1.5:N, L:N, ones50, ones400"


def sim_config() -> SimConfig:
    """The benchmarks' simulator settings: 60 s rounds, 30 s for every change, in place for no policy: the Pollux
    authors' simulator, so that the comparison with the published Pollux holds (``PRESETS["pollux"]``)."""
    return SimConfig(interval_s=60.0, restart_cost_s=30.0, change_costs=PRESETS["pollux"])


def workloads(selected: list[str], traces: Path, cache: Path) -> dict[str, WorkloadSpec]:
    """Workloads by token (module docstring), labelled as docs/results.md labels them; the authors' loads
    and the ONES trace read from ``traces``, a synthetic load written under ``cache``/loads."""
    out = {}
    for w in selected:
        load, _, n = w.rpartition(":")
        if w == "ones50":
            out["ones-trace-50"] = WorkloadSpec(traces / "ones_sc21" / "trace_1.csv", "ones", max_jobs=50)
        elif w == "ones400":
            out["ones-trace-400"] = WorkloadSpec(traces / "ones_sc21" / "trace_1.csv", "ones")
        elif not load or float(load) == 1.0:
            out[f"workload-{n}"] = WorkloadSpec(workload_path(f"pollux:workload-{n}"), "pollux")
        elif load in ("0.5", "1.5"):
            out[f"workload-{n}@{load}"] = WorkloadSpec(traces / "pollux" / f"workloads-{load}" / f"workload-{n}.csv",
                                                       "pollux")
        else:
            out[f"workload-{n}@{load}"] = WorkloadSpec(synthetic_load(float(load), int(n), cache), "pollux")
    return out


def synthetic_load(load: float, n: int, cache: Path) -> Path:
    """A Pollux workload at a load the authors did not publish, written under ``cache``/loads: workload-n at
    load 1.0 with each job kept with probability ``load`` (below 1), or all of it plus each job of
    workload-(n mod 8 + 1) with probability ``load - 1`` (above 1, at most 2), renamed so that names stay
    unique. Same 8-hour arrival window; draws from ``numpy.random.default_rng(n)``."""
    import pandas as pd

    if not 0.0 < load <= 2.0:
        raise ValueError(f"workload token {load:g}:{n}: the load must be in (0, 2]")
    rng = np.random.default_rng(n)
    base = pd.read_csv(workload_path(f"pollux:workload-{n}"))
    if load < 1.0:
        df = base[rng.random(len(base)) < load]
    else:
        extra = pd.read_csv(workload_path(f"pollux:workload-{n % 8 + 1}"))
        extra = extra[rng.random(len(extra)) < load - 1.0].copy()
        extra["name"] = extra["name"] + "-b"
        df = pd.concat([base, extra]).sort_values("time", kind="stable")
    path = cache / "loads" / f"workload-{n}@{load:g}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def code_digest(policy: str) -> str:
    """A digest of the code and packaged data a simulation of ``policy`` runs on: ``ones_pipeline/sim``,
    ``ones_pipeline/data`` and ``ones_pipeline/core`` except the other policies' modules (a policy's own
    modules are those named after it: ``ones`` -> ``ones.py``, ``ones_fitness.py``, ...). A cached record
    made by other code is stale and simulated again."""
    own = policy.replace("-", "_")
    files = [f for d in ("core", "sim", "data") for f in sorted((PACKAGE / d).rglob("*")) if f.is_file()
             and "__pycache__" not in f.parts]
    files = [f for f in files if f.parent != PACKAGE / "core" / "policies" or f.stem.startswith(own)
             or f.stem in ("__init__", "base", "common")]
    h = hashlib.sha1()
    for f in files:
        h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
