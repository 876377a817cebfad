"""``benchmarks/policy_quality.py --bound-only`` run as a user runs it: every figure of a results document that
derives from the fast bound is recomputed from the trace, the policies' figures are left as they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.bound import lower_bound
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig
from ones_pipeline.sim.packaged import workload_path
from ones_pipeline.sim.workloads import load_pollux_workload

ROOT = Path(__file__).resolve().parents[1]

# A results document in the layout policy_quality.py and tight_bound.py write (one workload), with the fast
# bound of before issue 38's fix (1031 s for workload-6).
DOC = (ROOT / "tests" / "data" / "bound_only_results.md").read_text()


def test_the_bound_and_every_ratio_to_it_are_recomputed_and_nothing_else(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text(DOC)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "policy_quality.py"), "--bound-only",
                           "--workloads", "6", "--out", str(doc)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    config = SimConfig(interval_s=60.0, restart_cost_s=30.0, change_costs=PRESETS["pollux"])
    b = lower_bound(load_pollux_workload(workload_path("pollux:workload-6")), Cluster.uniform(16, 4), config)
    b = b.mean_jct_s
    assert b < 1010  # below the old 1031 s (fewest nodes) and below the tight bound of this document
    new = doc.read_text()
    assert f"| workload-6 | 2446 s (1.00x) | 2468 s (1.01x) | 2146 s (0.88x) | {b:.0f} s ({b / 2446:.2f}x) |" in new
    assert f"| bound | {b:.0f} s | {b / 2446:.3f}x |" in new and "| ones | 2146 s | 0.877x |" in new
    assert (f"| 1.0 | 1 | 2446 s | 2468 s | 2146 s | {b:.0f} s | 0.877x | 0.870x | {2146 / b:.3f}x | "
            "1.06x / 0.97x |") in new
    # The tight-bound section: the fast bound falls below the tight one, which now binds.
    assert (f"| workload-6 | {b:.0f} s | 1010 s | {1010 / b:.2f}x | tight | 1773 s | 32 / 32 | 2446 s (2.42x) | "
            "2468 s (2.44x) |") in new
    assert f"| 1.0 | 1 | {b:.0f} s | 1010 s | {1010 / b:.2f}x | 2.42x |" in new
    assert new.count("1031 s") == 0 and new.endswith("## JCT CDFs\n")
