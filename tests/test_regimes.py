"""``benchmarks/regimes.py`` run as a user runs it: a small cell, two policies, its JSON and table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "regimes.py"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_small_cluster_cell_gives_each_policy_a_mean_and_the_ratios(tmp_path):
    out = tmp_path / "regimes.json"
    done = _run("--cells", "small-4", "--workloads", "2", "--seeds", "0", "--policies", "ones,fifo,tiresias",
                "--processes", "1", "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    row = doc["cells"]["small-4"]
    assert set(row) == {"ones", "fifo", "tiresias", "bound"}
    assert all(math.isfinite(v) and v > 0 for v in row.values())
    assert all(row[p] >= row["bound"] for p in ("ones", "fifo", "tiresias"))  # the bound is a lower bound
    assert doc["worst_ratio"] == row["ones"] / min(row["fifo"], row["tiresias"])
    assert doc["geo_vs_pollux"] is None  # no pollux in this run
    assert "| small-4 |" in done.stdout and "worst cell, ones / best other" in done.stdout


def test_bad_arguments_name_the_flag_and_what_is_allowed(tmp_path):
    bad = _run("--cells", "huge-9", cwd=tmp_path)
    assert bad.returncode == 2 and "--cells: unknown huge-9; allowed: pollux@0.5" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = _run("--workloads", "9", "--cells", "cold", cwd=tmp_path)
    assert bad.returncode == 2 and "--workloads: [9] outside 1-8" in bad.stderr
    bad = _run("--policies", "ones,lifo", "--cells", "cold", cwd=tmp_path)
    assert bad.returncode == 2 and "--policies: unknown policy 'lifo'" in bad.stderr
