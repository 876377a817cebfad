"""``benchmarks/policy_quality.py``'s per-load table (``reporting.per_load_table``): ratios of the means, the
tails against ``pollux`` (worst workload and ratio of the means) and restarts per job, from simulation records."""

from __future__ import annotations

import numpy as np

from ones_pipeline.reporting import per_load_table

POLICIES = ["pollux", "sia", "ones"]


def _records(rng: np.random.Generator, labels: list[str]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for label in labels:
        out[label] = {}
        for p in POLICIES:
            mean, p99, span = rng.uniform(500, 5000, size=3)
            out[label][p] = {"summary": {"mean_jct_s": mean, "p99_jct_s": p99, "makespan_s": span},
                             "restarts_per_job": float(rng.uniform(0, 5))}
    return out


def _row(lines: list[str], load: str) -> list[str]:
    row = next(line for line in lines if line.startswith(f"| {load} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_per_load_rows_group_by_load_and_report_tails_both_ways():
    rng = np.random.default_rng(7)
    labels = ["workload-1", "workload-2", "workload-1@0.5", "workload-2@0.5", "workload-3@0.5", "ones-trace-50"]
    records = _records(rng, labels)
    means_by = {lab: {p: records[lab][p]["summary"]["mean_jct_s"] for p in POLICIES} | {"bound": 100.0}
                for lab in labels}
    lines = per_load_table(POLICIES, records, means_by)
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert "p99 / pollux" in header and "restarts per job (pollux, sia, ones)" in header
    # Only Pollux workloads are grouped, in load order; the ONES trace is not a load.
    assert [line.split("|")[1].strip() for line in lines[4:] if line] == ["0.5", "1.0"]
    half = _row(lines, "0.5")
    labs = ["workload-1@0.5", "workload-2@0.5", "workload-3@0.5"]
    assert half[1] == "3"

    def stat(p, key):
        return np.array([records[lab][p]["summary"][key] for lab in labs])

    ones, pollux = stat("ones", "mean_jct_s"), stat("pollux", "mean_jct_s")
    assert half[header.index("ones / pollux")] == f"{ones.mean() / pollux.mean():.3f}x"
    p99 = stat("ones", "p99_jct_s") / stat("pollux", "p99_jct_s")
    assert half[header.index("p99 / pollux")] == (
        f"{p99.max():.2f}x / {stat('ones', 'p99_jct_s').mean() / stat('pollux', 'p99_jct_s').mean():.2f}x")
    span = stat("ones", "makespan_s").mean() / stat("pollux", "makespan_s").mean()
    assert half[header.index("makespan / pollux")].endswith(f" / {span:.2f}x")
    restarts = [np.mean([records[lab][p]["restarts_per_job"] for lab in labs]) for p in POLICIES]
    assert half[header.index("restarts per job (pollux, sia, ones)")] == " / ".join(f"{r:.1f}" for r in restarts)


def test_a_section_of_one_script_survives_another_regenerating_the_document():
    from ones_pipeline.reporting import kept_section, with_section

    doc = with_section("# Results\n\ntable\n", "regimes", "## Regimes\n\n| a |")
    assert doc == "# Results\n\ntable\n\n<!-- regimes -->\n## Regimes\n\n| a |\n<!-- /regimes -->\n"
    again = with_section(doc, "regimes", "## Regimes\n\n| b |")
    assert kept_section(again, "regimes") == "<!-- regimes -->\n## Regimes\n\n| b |\n<!-- /regimes -->"
    assert again.count("<!-- regimes -->") == 1 and kept_section("no markers", "regimes") == ""


def test_regenerating_results_keeps_the_tight_bound_section():
    """docs/results.md's tight-bound section comes from benchmarks/tight_bound.py; regenerating the rest keeps
    it, before the JCT CDFs, and a document without one is left as it is."""
    from ones_pipeline.reporting import keep_tight_bound

    old = "# old\n\n| a |\n\n## The tight lower bound (issue 38)\n\ntable T\n\n## JCT CDFs\n\nold plots\n"
    new = "# new\n\n| b |\n\n## JCT CDFs\n\nnew plots\n"
    out = keep_tight_bound(old, new)
    assert out.index("table T") < out.index("## JCT CDFs") < out.index("new plots")
    assert "| b |" in out and "| a |" not in out and "old plots" not in out
    assert keep_tight_bound("# nothing kept\n", new) == new


def test_the_tight_bound_per_load_table_takes_the_larger_bound_of_each_load():
    from ones_pipeline.reporting import tight_bound_per_load

    rows = ["| workload-1 | 100 s | 120 s | - | - | - | - | 300 s | 330 s | 240 s |",
            "| workload-2 | 200 s | 150 s | - | - | - | - | 400 s | 420 s | - |",
            "| workload-1@0.5 | 50 s | 60 s | - | - | - | - | 90 s | 100 s | 80 s |",
            "| something else | 1 s | 1 s |"]
    lines = tight_bound_per_load(rows, ["pollux", "ones"])
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[5:] == ["published Pollux", "pollux", "ones", "best schedule / bound"]
    one = dict(zip(header, [c.strip() for c in lines[2].strip("|").split("|")], strict=True))
    bound = (120 + 200) / 2  # per workload the larger of the fast and the tight bound
    assert one["load"] == "1.0" and one["workloads"] == "2" and one["fast bound"] == "150 s"
    assert one["published Pollux"] == f"{(300 + 400) / 2 / bound:.2f}x" and one["ones"] == "-"  # one missing
    assert one["best schedule / bound"] == f"{(240 + 400) / 2 / bound:.2f}x"
    half = dict(zip(header, [c.strip() for c in lines[3].strip("|").split("|")], strict=True))
    assert half["load"] == "0.5" and half["ones"] == f"{80 / 60:.2f}x" and len(lines) == 4
