"""Time of the scheduler's MLflow read-back (``read_progress``) against the naive client-API approach.

Builds a temporary SQLite store with ``--jobs`` runs (default 50), each with ``--points`` points (default
200) of every metric the training step logs (13 metrics; the GPU count changes half-way so the throughput
read sees two configurations), then times, median of ``--repeats`` (default 5) after one warm-up call:

* ``read_progress`` (direct SQL on the SQLite file, the default for sqlite URIs): target under 200 ms;
* the naive way: ``MlflowClient.search_runs`` plus one ``get_metric_history`` per run and metric
  (``read_progress(..., method="client")``, the path used for tracking servers);
* ``search_runs`` alone (latest values only, no histories) for reference.

    .venv/bin/python benchmarks/mlflow_reader.py [--jobs 50] [--points 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric

from ones_pipeline.adapters.mlflow import (
    HISTORY_KEYS,
    TAG_JOB,
    JobRun,
    default_tracking_uri,
    ensure_store,
    read_progress,
)

TARGET_S = 0.200
EXPERIMENT = "bench"
FALLBACK = ("global_batch", "samples_per_s")  # histories read only when step_time_s/per_gpu_batch lack


def populate(uri: str, state_root: Path, jobs: int, points: int) -> None:
    """``jobs`` runs with ``points`` steps of 13 metrics each, logged in batches of 1000."""
    t0_ms = int(time.time() * 1000) - 10_000_000
    for j in range(jobs):
        name = f"job-{j:03d}"
        run = JobRun.open(uri, EXPERIMENT, name, state_root / name,
                          {"model": "resnet18", "per_gpu_batch": 32, "dataset_size": 50_000}, generation=0)
        batch = []
        for i in range(points):
            gpus = 2 if i < points // 2 else 4
            global_batch = 32 * gpus
            samples = (i + 1) * global_batch
            step_time = 0.1 + 0.01 * gpus + 0.001 * (i % 7)
            values = {
                "loss": 2.0 / (1 + i), "accuracy": i / points, "samples_per_s": global_batch / step_time,
                "global_batch": global_batch, "gpus": gpus, "lr": 0.1 * gpus, "epoch": samples / 50_000,
                "samples": samples, "grad_noise_scale": 100.0 + i, "step_time_s": step_time,
                "sync_time_s": 0.01 * gpus, "per_gpu_batch": 32, "num_nodes": 1,
            }
            batch += [Metric(k, float(v), t0_ms + 1000 * i, samples) for k, v in values.items()]
        for k in range(0, len(batch), 1000):
            run.client.log_batch(run.run_id, metrics=batch[k:k + 1000], synchronous=True)
        run.finish("KILLED" if j % 3 else "FINISHED")


def median_time(fn, repeats: int) -> tuple[float, float, object]:
    """(first call s, median of ``repeats`` further calls s, last result)."""
    t0 = time.perf_counter()
    result = fn()  # the first call also pays MLflow's store/engine set-up
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    with tempfile.TemporaryDirectory(prefix="ones-mlflow-bench-") as tmp:
        uri = default_tracking_uri(tmp)
        t0 = time.perf_counter()
        exp_id = ensure_store(uri, EXPERIMENT)
        t1 = time.perf_counter()
        populate(uri, Path(tmp) / "state", args.jobs, args.points)
        t2 = time.perf_counter()
        print(f"store: {args.jobs} runs x {args.points} points x 13 metrics "
              f"(schema {t1 - t0:.1f} s, logging {t2 - t1:.1f} s)")

        fast_first, fast_s, fast = median_time(lambda: read_progress(uri, EXPERIMENT), args.repeats)
        naive_first, naive_s, naive = median_time(
            lambda: read_progress(uri, EXPERIMENT, method="client"), args.repeats)
        client = MlflowClient(tracking_uri=uri)
        _, search_s, _ = median_time(
            lambda: list(client.search_runs([exp_id], filter_string=f"tags.`{TAG_JOB}` LIKE '%'",
                                            max_results=1000)), args.repeats)
        assert fast == naive, "direct SQL and client reads disagree"
        assert len(fast) == args.jobs
        sample = fast["job-000"]
        configs = [(o.num_gpus, o.per_gpu_batch, round(o.step_time_s, 4)) for o in sample.throughput_obs]
        print(f"  job-000: samples {sample.samples_done:g}, {len(sample.loss_history)} loss points, "
              f"throughput (gpus, per-GPU batch, step s) {configs}")
        calls = len([k for k in HISTORY_KEYS if k in sample.metrics and k not in FALLBACK])
        verdict = "OK" if fast_s < TARGET_S else "OVER TARGET"
        print(f"read_progress, direct SQL (default)   : {1000 * fast_s:7.1f} ms median, first call "
              f"{1000 * fast_first:.1f} ms (target < {1000 * TARGET_S:.0f} ms: {verdict})")
        print(f"naive search_runs + get_metric_history: {1000 * naive_s:7.1f} ms median, first call "
              f"{1000 * naive_first:.1f} ms ({args.jobs} runs x {calls} histories; "
              f"{naive_s / fast_s:.0f}x slower)")
        print(f"search_runs alone (latest values only): {1000 * search_s:7.1f} ms median")
    return 0 if fast_s < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
