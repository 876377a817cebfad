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


def test_a_rerun_with_the_results_file_simulates_only_what_is_missing(tmp_path):
    runs, out = tmp_path / "runs.jsonl", tmp_path / "regimes.json"
    first = _run("--cells", "small-4", "--workloads", "2", "--seeds", "0,1", "--policies", "fifo,tiresias",
                 "--processes", "1", "--results", str(runs), "--json", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    # neither draws a random number: one run each stands for both seeds
    assert sorted(r["policy"] for r in rows) == ["fifo", "tiresias"] and all(r["seed"] == 0 for r in rows)
    assert all(r["any_seed"] for r in rows) and "stands for every seed" in first.stderr
    before = json.loads(out.read_text())["cells"]["small-4"]
    # a line of other code and a line cut short by a crash are not used
    with runs.open("a") as f:
        f.write(json.dumps({**rows[0], "policy": "ones", "mean_jct_s": 1.0, "code": "elsewhere"}) + "\n")
        f.write('{"instance": "small-4/w2", "pol')
    again = _run("--cells", "small-4", "--workloads", "2", "--seeds", "0", "--policies", "fifo,tiresias,ones",
                 "--processes", "1", "--results", str(runs), "--json", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "2 simulation(s) read from" in again.stderr and "1 at most to run" in again.stderr
    assert "1 line(s) of other code ignored" in again.stderr and "runs.jsonl:4: ignored" in again.stderr
    after = json.loads(out.read_text())["cells"]["small-4"]
    assert after["fifo"] == before["fifo"] and after["tiresias"] == before["tiresias"]
    assert after["ones"] > after["bound"] and after["ones"] != 1.0
    ones = [json.loads(line) for line in runs.read_text().splitlines()[4:]]  # after the line cut short
    assert [(r["policy"], r["mean_jct_s"]) for r in ones] == [("ones", after["ones"])]
    assert "any_seed" not in ones[0]  # ones draws: each seed is its own run
