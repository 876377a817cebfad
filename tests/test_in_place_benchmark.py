"""``benchmarks/in_place.py`` run as a user runs it: the ONES trace's first 50 jobs, ``ones-paper`` (resizes in
place) and ``tiresias`` (never in place), its JSON and the section it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ones_pipeline.config import traces_dir_from_environment

ROOT = Path(__file__).resolve().parents[1]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")


@pytest.mark.skipif(not (TRACES / "ones_sc21" / "trace_1.csv").is_file(), reason="the ONES trace is not there")
def test_in_place_changes_pay_less_and_only_where_the_environment_resizes_in_place(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\ntable\n")
    out = tmp_path / "in_place.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "in_place.py"), "--workloads", "ones50",
                           "--policies", "ones-paper,tiresias", "--processes", "1", "--json", str(out),
                           "--doc", str(doc)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]["ones-trace-50"]
    assert set(rows["tiresias"]) == {"pollux"}  # simulated once: it makes no change in place
    restarts, in_place = rows["ones-paper"]["pollux"], rows["ones-paper"]["default"]
    assert restarts[1] == 0 and in_place[1] > 0  # in-place changes per job
    assert in_place[0] < restarts[0]  # cheaper changes, shorter mean JCT
    text = doc.read_text()
    assert text.startswith("# Results\n\ntable\n") and "<!-- in-place -->" in text
    assert f"| ones-trace-50 | ones-paper | {restarts[0]:.0f} s | {in_place[0]:.0f} s |" in text
