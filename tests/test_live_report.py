"""The live cluster report: per-job metrics, summary arithmetic, the files it writes, markdown."""

import base64
import json
import math

import numpy as np
import pandas as pd
import pytest

from ones_pipeline.adapters.live_report import (
    SUMMARY_KEYS,
    TABLE_COLUMNS,
    FinishedJob,
    RunSpan,
    build_report,
    job_metrics,
    png_markdown,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path, width=800, height=450):
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert mpimg.imread(path).shape[:2] == (height, width)  # figsize (8, 4.5) at dpi 100


def test_job_metrics_on_a_resized_job():
    job = FinishedJob("a", submit_s=1000.0, finish_s=2950.0, accuracy=0.9, samples=5e4, restarts=1)
    spans = [
        RunSpan("a", 0, (0,), 1060.0, 1660.0, "CANCELED"),  # 600 s on 1 slot, then resized
        RunSpan("a", 1, (0, 1), 1700.0, 2900.0, "SUCCESS"),  # 1200 s on 2 slots
        RunSpan("a", 2, (2,), None, None, "CANCELED"),  # never started: not a generation
        RunSpan("b", 0, (3,), 0.0, 5000.0, "SUCCESS"),  # another job's span
    ]
    m = job_metrics(job, spans, now_s=9999.0)
    assert m == {"jct_s": 1950.0, "wait_s": 60.0, "run_s": 1800.0, "gpu_s": 3000.0, "generations": 2}


def test_job_metrics_counts_running_span_up_to_now():
    job = FinishedJob("a", submit_s=0.0, finish_s=500.0, accuracy=None, samples=None, restarts=0)
    m = job_metrics(job, [RunSpan("a", 0, (0, 1, 2), 100.0, None, "STARTED")], now_s=400.0)
    assert (m["run_s"], m["gpu_s"], m["wait_s"], m["generations"]) == (300.0, 900.0, 100.0, 1)
    assert math.isnan(job_metrics(job, [], now_s=400.0)["wait_s"])


def _known_cluster():
    """2 slots over [0, 100]: a holds 100 slot-seconds (grown to 2 slots for 20 s), b 40, unfinished c 20 of its
    running span inside the window."""
    jobs = [
        FinishedJob("job-a", submit_s=0.0, finish_s=100.0, accuracy=0.91, samples=1000.0, restarts=2, model="resnet"),
        FinishedJob("job-b|x", submit_s=0.0, finish_s=60.0, accuracy=None, samples=None, restarts=0, model="bert"),
    ]
    spans = [
        RunSpan("job-a", 0, (0,), 10.0, 50.0, "CANCELED"),  # 40 slot-s
        RunSpan("job-a", 1, (0, 1), 60.0, 80.0, "CANCELED"),  # 40 slot-s, after b left slot 1
        RunSpan("job-a", 2, (0,), 80.0, 100.0, "SUCCESS"),  # 20 slot-s, c took slot 1
        RunSpan("job-b|x", 0, (1,), 20.0, 60.0, "SUCCESS"),
        RunSpan("job-c", 0, (1,), 80.0, None, "STARTED"),  # counts 20 s inside the window
    ]
    return jobs, spans


def test_build_report_writes_files_and_computes_summary(tmp_path):
    jobs, spans = _known_cluster()
    report = build_report(jobs, spans, num_slots=2, out_dir=tmp_path / "out", now_s=200.0)

    assert set(report.files) == {"csv", "json", "jct_cdf", "allocation"}
    assert all(p.is_file() and p.parent == tmp_path / "out" for p in report.files.values())
    assert not list((tmp_path / "out").glob("*.tmp"))  # temp files were renamed, none left behind

    s = report.summary
    assert set(s) == set(SUMMARY_KEYS)
    assert s["jobs"] == 2 and s["restarts"] == 2
    assert s["makespan_s"] == 100.0
    # Over the time work was pending: [0, 100] for a and b, and c's run until now (200 s): 200 s in all.
    assert s["utilisation"] == pytest.approx((100 + 40 + 120) / (2 * 200))
    assert s["gpu_s"] == 140.0
    assert (s["mean_jct_s"], s["median_jct_s"]) == (80.0, 80.0)
    assert s["p95_jct_s"] == pytest.approx(98.0)

    t = report.table
    assert list(t.columns) == list(TABLE_COLUMNS)
    assert list(t["job"]) == ["job-b|x", "job-a"]  # in order of finish
    assert list(t["generations"]) == [1, 3] and list(t["wait_s"]) == [20.0, 10.0]
    assert np.isnan(t["accuracy"].iloc[0]) and t["accuracy"].iloc[1] == 0.91

    pd.testing.assert_frame_equal(pd.read_csv(report.files["csv"]), t)
    on_disk = json.loads(report.files["json"].read_text())["summary"]
    assert on_disk == pytest.approx(s)

    for key in ("jct_cdf", "allocation"):
        _assert_png(report.files[key])

    assert "job-a" in report.markdown and "job-b\\|x" in report.markdown  # the pipe is escaped
    assert "65%" in report.markdown and "JCT (s)" in report.markdown and "GPU-h" in report.markdown
    rows = [line for line in report.markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # header + 2 jobs


def test_build_report_rewrites_files_in_place(tmp_path):
    jobs, spans = _known_cluster()
    build_report(jobs, spans, num_slots=2, out_dir=tmp_path, now_s=200.0)
    report = build_report(jobs[:1], spans, num_slots=2, out_dir=tmp_path, now_s=200.0)
    assert len(pd.read_csv(report.files["csv"])) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["allocation.png", "jct_cdf.png", "jobs.csv",
                                                          "summary.json"]


def test_build_report_with_no_finished_jobs(tmp_path):
    report = build_report([], [], num_slots=4, out_dir=tmp_path)
    assert report.table.empty and list(report.table.columns) == list(TABLE_COLUMNS)
    assert report.summary["jobs"] == 0 and math.isnan(report.summary["mean_jct_s"])
    assert "no finished jobs yet" in report.markdown
    assert json.loads(report.files["json"].read_text())["summary"]["mean_jct_s"] is None  # valid JSON, no NaN
    assert list(pd.read_csv(report.files["csv"]).columns) == list(TABLE_COLUMNS)
    for key in ("jct_cdf", "allocation"):
        _assert_png(report.files[key])


def test_build_report_with_only_unfinished_spans(tmp_path):
    spans = [RunSpan("running", 0, (0, 1), 0.0, 30.0, "CANCELED"), RunSpan("running", 1, (0,), 40.0, None, "STARTED")]
    report = build_report([], spans, num_slots=2, out_dir=tmp_path, now_s=100.0)
    assert report.summary["jobs"] == 0
    _assert_png(report.files["allocation"])


def test_build_report_refuses_bad_slot_count(tmp_path):
    with pytest.raises(ValueError, match="num_slots=0"):
        build_report([], [], num_slots=0, out_dir=tmp_path)


def test_png_markdown_inlines_small_files_and_names_large_ones(tmp_path):
    report = build_report(*_known_cluster(), num_slots=2, out_dir=tmp_path, now_s=200.0)
    path = report.files["allocation"]
    size = path.stat().st_size

    inline = png_markdown(path, "allocation", max_bytes=size)
    prefix = "![allocation](data:image/png;base64,"
    assert inline.startswith(prefix) and inline.endswith(")")
    assert base64.b64decode(inline[len(prefix):-1]) == path.read_bytes()

    named = png_markdown(path, "allocation", max_bytes=size - 1)
    assert "data:" not in named and "allocation.png" in named


def test_cpu_slots_are_not_called_gpus_and_jct_has_one_unit(tmp_path):
    jobs = [FinishedJob("short", submit_s=0.0, finish_s=90.0, accuracy=0.9, samples=10.0, restarts=0),
            FinishedJob("long", submit_s=0.0, finish_s=3000.0, accuracy=0.9, samples=10.0, restarts=0)]
    spans = [RunSpan("short", 0, (0,), 0.0, 90.0, "SUCCESS"), RunSpan("long", 0, (1,), 0.0, 3000.0, "SUCCESS")]
    md = build_report(jobs, spans, num_slots=2, out_dir=tmp_path, now_s=3000.0, device="cpu").markdown
    assert "GPU" not in md and "2 CPU slots" in md and "CPU-slot-h" in md
    assert "JCT (min)" in md and "| 1.5 |" in md and "| 50.0 |" in md  # 90 s and 3000 s, both in minutes


def test_neighbouring_jobs_get_distinct_colours():
    """tab20 pairs shades of one hue; in job order the first 20 jobs must not repeat a hue side by side."""
    from ones_pipeline.reporting import job_colors

    names = [f"j{i}" for i in range(20)]
    colors = job_colors(names)
    assert len(set(colors.values())) == 20
    import colorsys

    def hue(c):
        h, s, _ = colorsys.rgb_to_hsv(*c[:3])
        return h if s > 0.05 else None  # greys have no hue

    for a, b in zip(names, names[1:], strict=False):
        ha, hb = hue(colors[a]), hue(colors[b])
        if ha is not None and hb is not None:
            assert min(abs(ha - hb), 1 - abs(ha - hb)) > 0.02, (a, b)  # not two shades of one hue
