"""Run one workload under several policies (in parallel processes), with progress reporting."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.csv_fields import read_header
from ones_pipeline.sim.engine import SimConfig, SimResult, simulate
from ones_pipeline.sim.truth import SimJob, TraceError

POLLUX_COLUMNS = {"name", "time", "application", "num_replicas", "batch_size"}
ONES_COLUMNS = {"time", "model", "task", "epoch_size", "patience", "batch_size", "lr", "max_lr", "target_acc",
                "num_gpus"}
DEFAULT_CLUSTER = (64, 4)  # GPUs, GPUs per node
ALL_POLICIES = ("ones", "ones-paper", "fifo", "tiresias", "optimus", "pollux", "sia")


@dataclass(frozen=True)
class WorkloadSpec:
    """Where a workload comes from and the cluster it runs on by default.

    ``profiles``: the Pollux profile folder the jobs' ground truth is read from (``None``: the loader's
    default, see :func:`detect_workload`); ``name``: the packaged workload name (``pollux:workload-6``) when
    the workload was given by name.
    """

    path: Path
    kind: str  # "pollux" or "ones"
    max_jobs: int | None = None
    restart_cost_s: float = 30.0
    profiles: Path | None = None
    name: str | None = None
    history: Path | None = None  # ONES trace: folder of job_history.csv and trace_dev.csv (default: the trace's)

    @property
    def label(self) -> str:
        """The packaged name, or the file name."""
        return self.name or self.path.name

    def load(self) -> list[SimJob]:
        if self.kind == "pollux":
            from ones_pipeline.sim.workloads import load_pollux_workload

            return load_pollux_workload(self.path, traces_dir=self.profiles, restart_cost_s=self.restart_cost_s,
                                        max_jobs=self.max_jobs)
        from ones_pipeline.sim.ones_trace import load_ones_trace

        return load_ones_trace(self.path, max_jobs=self.max_jobs, pollux_traces_dir=self.profiles,
                               restart_cost_s=self.restart_cost_s, history_dir=self.history)

    def default_cluster(self) -> tuple[int, int]:
        """(GPUs, GPUs per node): 64 x 4 for both kinds (16 nodes of 4, as the Pollux authors' simulator
        and the ONES paper's 64-GPU cluster)."""
        return DEFAULT_CLUSTER


def detect_workload(path: str | os.PathLike, max_jobs: int | None = None, restart_cost_s: float = 30.0,
                    profiles: str | os.PathLike | None = None,
                    history: str | os.PathLike | None = None) -> WorkloadSpec:
    """Recognise a workload: a packaged name (``pollux:workload-N``, ``pollux-0.5:workload-N``,
    ``pollux-1.5:workload-N``, N = 1..8) or a CSV file, by its header (Pollux workload or ONES trace).

    ``profiles``: the Pollux profile folder (it must exist). Default: the packaged profiles for a packaged
    name and for an ONES trace; ``<CSV folder>/../traces`` for a Pollux workload CSV, or the packaged
    profiles when that folder does not exist. An unknown name raises
    :class:`~ones_pipeline.sim.packaged.UnknownWorkloadError` (a :class:`TraceError`) listing the names.
    """
    from ones_pipeline.sim import packaged

    name = None
    if not Path(path).exists() and packaged.looks_like_name(path):
        name = packaged.canonical_name(os.fspath(path))
        path = packaged.workload_path(name)
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise TraceError(path, "not a regular file")
        raise TraceError(path, f"file not found; a workload is {packaged.allowed_text()}")
    if profiles is not None:
        profiles = packaged.check_profiles_dir(profiles)
    cols = set(read_header(path, what="workload file"))
    if cols == POLLUX_COLUMNS:
        if profiles is None:
            profiles = packaged.profiles_dir() if name else packaged.default_profiles_for(path)
        return WorkloadSpec(path, "pollux", max_jobs, restart_cost_s, profiles, name)
    if cols == ONES_COLUMNS:
        return WorkloadSpec(path, "ones", max_jobs, restart_cost_s, profiles or packaged.profiles_dir(), name,
                            Path(history) if history is not None else None)
    pollux_miss, ones_miss = POLLUX_COLUMNS - cols, ONES_COLUMNS - cols
    kind, missing, allowed = (("Pollux workload", pollux_miss, POLLUX_COLUMNS) if len(pollux_miss) <= len(ones_miss)
                              else ("ONES trace", ones_miss, ONES_COLUMNS))
    unknown = cols - allowed
    raise TraceError(
        path,
        f"the header is neither a Pollux workload ({','.join(sorted(POLLUX_COLUMNS))}) nor an ONES trace "
        f"({','.join(sorted(ONES_COLUMNS))}); closest is a {kind}: missing {sorted(missing)}, "
        f"unknown {sorted(unknown)}",
    )


def run_one(workload: WorkloadSpec, policy: str, cluster: Cluster, config: SimConfig, seed: int,
            policy_params: Mapping | None = None, progress: Callable[[str, int, int], None] | None = None,
            jobs: Sequence[SimJob] | None = None) -> SimResult:
    jobs = list(jobs) if jobs is not None else workload.load()
    pol = make_policy(policy, seed=seed, **dict(policy_params or {}))
    cb = (lambda now, done, total: progress(policy, done, total)) if progress else None
    return simulate(jobs, pol, cluster, config, on_round=cb)


def _worker(args) -> tuple[str, SimResult]:
    workload, policy, cluster, config, seed, params, queue = args
    last = [0.0]

    def report(name: str, done: int, total: int) -> None:
        t = time.monotonic()
        if queue is not None and (t - last[0] > 0.5 or done == total):
            last[0] = t
            queue.put((name, done, total))

    return policy, run_one(workload, policy, cluster, config, seed, params, report)


class _Progress:
    """One status line on stderr: jobs finished per policy."""

    def __init__(self, policies: Sequence[str], total: int, stream=sys.stderr, enabled: bool = True):
        self.state = {p: 0 for p in policies}
        self.total, self.stream, self.enabled = total, stream, enabled and stream.isatty()
        self.started = time.monotonic()

    def update(self, policy: str, done: int, total: int) -> None:
        self.state[policy] = done
        self.total = total
        if self.enabled:
            parts = " ".join(f"{p} {d}/{self.total}" for p, d in self.state.items())
            self.stream.write(f"\r[{time.monotonic() - self.started:6.0f}s] jobs done: {parts}\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def run_policies(workload: WorkloadSpec, policies: Sequence[str], cluster: Cluster, config: SimConfig,
                 seed: int = 0, params: Mapping[str, Mapping] | None = None, processes: int | None = None,
                 show_progress: bool = True) -> dict[str, SimResult]:
    """Simulate ``workload`` under each policy; results in the order of ``policies``."""
    params = params or {}
    jobs = workload.load()  # validate the trace once, up front, before forking
    processes = processes or min(len(policies), os.cpu_count() or 1)
    bar = _Progress(policies, len(jobs), enabled=show_progress)
    results: dict[str, SimResult] = {}
    try:
        if processes <= 1 or len(policies) == 1:
            for p in policies:
                results[p] = run_one(workload, p, cluster, config, seed, params.get(p), bar.update, jobs)
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")
            with ctx.Manager() as manager:
                queue = manager.Queue()
                with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
                    futures = [pool.submit(_worker, (workload, p, cluster, config, seed, params.get(p), queue))
                               for p in policies]
                    pending = set(futures)
                    while pending:
                        while not queue.empty():
                            bar.update(*queue.get())
                        pending = {f for f in pending if not f.done()}
                        time.sleep(0.2)
                    for f in futures:
                        name, res = f.result()
                        results[name] = res
    finally:
        bar.close()
    return {p: results[p] for p in policies}
