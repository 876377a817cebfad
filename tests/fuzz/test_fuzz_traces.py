"""Fuzzing traces (issue 40): every Pollux workload or ONES trace CSV, with hostile cells, loads or is
refused with one clear line (file, row, field, allowed range) within the time budget, never a traceback
or a hang; what loads is within core.limits (the simulator gets nothing it would hang on)."""

from __future__ import annotations

import csv
from pathlib import Path

from fuzz_values import CELLS, assert_one_clear_line, fuzz_settings, within
from hypothesis import example, given
from hypothesis import strategies as st

from ones_pipeline.core.limits import spec_problem
from ones_pipeline.sim.ones_trace import load_ones_trace
from ones_pipeline.sim.ones_trace_reader import TRACE_COLUMNS
from ones_pipeline.sim.truth import TraceError
from ones_pipeline.sim.workloads import POLLUX_WORKLOAD_COLUMNS, load_pollux_workload

POLLUX_ROW = ["j0", "0", "cifar10", "1", "128"]
ONES_ROW = ["0", "bert", "cola", "8000", "5", "16", "5e-06", "2e-5", "0.8", "2"]
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces" / "ones_sc21"


def _csv(path: Path, header, rows) -> Path:
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    return path


def mutated(base: list[str], changes: dict[int, str]) -> list[str]:
    row = list(base)
    for i, cell in changes.items():
        row[i % len(row)] = cell
    return row


def check(load, path: Path):
    try:
        with within():
            jobs = load(path)
    except TraceError as exc:
        assert_one_clear_line(exc, path)
        return None
    for job in jobs:
        assert spec_problem(job.spec) is None, spec_problem(job.spec)
    return jobs


ROW_CHANGES = st.dictionaries(st.integers(0, 9), CELLS, min_size=1, max_size=3)


@fuzz_settings(40)
@given(st.lists(ROW_CHANGES, min_size=1, max_size=3))
@example([{3: "1000000000000000000"}])  # issue 40, finding 4: num_replicas 1e18 hung the simulator
@example([{3: "9223372036854775808"}])  # 2^63
@example([{4: "1000000000000000"}])  # batch_size 1e15: "RuntimeError ... unfinished"
def test_a_pollux_workload_with_hostile_cells_loads_or_is_refused_in_one_line(tmp_path_factory, changes):
    folder = tmp_path_factory.mktemp("pollux")
    rows = [mutated([f"j{i}", *POLLUX_ROW[1:]], c) for i, c in enumerate(changes)]
    check(load_pollux_workload, _csv(folder / "w.csv", POLLUX_WORKLOAD_COLUMNS, rows))


@fuzz_settings(25)
@given(st.lists(ROW_CHANGES, min_size=1, max_size=3))
@example([{3: "1000000000000"}])  # issue 40, finding 4: an ONES epoch_size 1e12 hung the simulator
@example([{9: "1000000000000000000"}])  # num_gpus 1e18
def test_an_ones_trace_with_hostile_cells_loads_or_is_refused_in_one_line(traces, tmp_path_factory, changes):
    folder = tmp_path_factory.mktemp("ones")
    rows = [mutated(ONES_ROW, c) for c in changes]
    check(lambda p: load_ones_trace(p, history_dir=traces / "ones_sc21"), _csv(folder / "t.csv", TRACE_COLUMNS, rows))


@fuzz_settings(15)
@given(st.binary(max_size=300))
def test_trace_bytes_load_or_are_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "w.csv"
    path.write_bytes(data)
    check(load_pollux_workload, path)


@fuzz_settings(5, 200)
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 2**20)), min_size=1, max_size=2))
@example([(4096, 2**20), (1, 2**20)])
@example([(1, 1), (4096, 1)])
def test_every_accepted_pollux_workload_simulates_to_the_end(tmp_path_factory, jobs):
    """The extremes the trace's ranges allow still finish under fifo, within the time budget."""
    from ones_pipeline.core.policies import make_policy
    from ones_pipeline.core.types import Cluster
    from ones_pipeline.sim.engine import SimConfig, simulate

    folder = tmp_path_factory.mktemp("sim")
    rows = [[f"j{i}", str(10 * i), "cifar10", str(r), str(b)] for i, (r, b) in enumerate(jobs)]
    loaded = load_pollux_workload(_csv(folder / "w.csv", POLLUX_WORKLOAD_COLUMNS, rows))
    with within(60):
        result = simulate(loaded, make_policy("fifo"), Cluster.from_total(64, 4), SimConfig())
    assert result is not None
