"""``ones init | up | run | submit | status``: the live pipeline from the command line.

Every command works on a project directory (``--project``, default ``$ONES_PROJECT_DIR`` or the working
directory) holding ``resources/<env>.yaml`` and ``assets/jobs/*.yaml``. The Dagster instance lives in
``<state_dir>/dagster`` (its ``dagster.yaml`` is written by ``ones init``), so several projects never
share one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ones_pipeline.config import ConfigError, EnvConfig, load_env, load_job_specs


def add_commands(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--project", type=Path, default=None,
                       help="project directory with resources/ and assets/jobs/ (default: $ONES_PROJECT_DIR or .)")
        p.add_argument("--env", default=None, help="environment: resources/<ENV>.yaml (default: $ONES_ENV or local)")
        return p

    common(sub.add_parser("init", help="write the Dagster instance config (GPU tag limits, run monitoring) "
                                       "and create the MLflow store"))
    up = common(sub.add_parser("up", help="start the Dagster webserver and daemon (127.0.0.1); Ctrl-C stops both"))
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=3000)
    run = common(sub.add_parser("run", help="headless: run the scheduler until every job in assets/jobs is "
                                            "materialized, then print the JCT table"))
    run.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (3600)")
    run.add_argument("--status-every", type=float, default=20.0, help="print the status table this often (20 s)")
    run.add_argument("--fresh", action="store_true",
                     help="delete the state directory first (checkpoints, MLflow store, Dagster instance)")
    submit = common(sub.add_parser("submit", help="validate a job spec and add it to assets/jobs"))
    submit.add_argument("spec", type=Path, help="job spec YAML")
    submit.add_argument("--force", action="store_true", help="replace a spec of the same name")
    common(sub.add_parser("status", help="table of jobs: state, GPUs, batch, progress, ETA, restarts"))


# -- instance ---------------------------------------------------------------------------------------
def dagster_home(env: EnvConfig) -> Path:
    return env.state_dir / "dagster"


def instance_yaml(slot_ids, max_runs: int) -> str:
    """The Dagster instance config: queued runs, one run per GPU tag, run monitoring on."""
    import yaml

    from ones_pipeline.live import slot_tag

    config = {
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator",
                            "config": {"max_concurrent_runs": int(max_runs),
                                       "tag_concurrency_limits": [{"key": slot_tag(s), "limit": 1} for s in slot_ids]}},
        "run_monitoring": {"enabled": True, "start_timeout_seconds": 300, "cancel_timeout_seconds": 180,
                           "poll_interval_seconds": 30},
        "telemetry": {"enabled": False},
    }
    return "# Written by `ones init` from the cluster inventory; rewritten on every init.\n" + \
        yaml.safe_dump(config, sort_keys=False)


def init(env: EnvConfig, quiet: bool = False) -> dict:
    from ones_pipeline.adapters.gpus import discover
    from ones_pipeline.adapters.mlflow_tracker import ensure_store

    inventory = discover(cpu_slots=env.cluster.cpu_slots, gpus=env.cluster.gpus,
                         gpus_per_node=env.cluster.gpus_per_node)
    home = dagster_home(env)
    home.mkdir(parents=True, exist_ok=True)
    (env.state_dir / "jobs").mkdir(parents=True, exist_ok=True)
    env.jobs_dir.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(instance_yaml(inventory.slot_ids, inventory.num_slots + 4))
    tmp.replace(path)
    # Create the instance's sqlite storage now, once: the daemon, the webserver and `ones status`
    # opening a fresh instance at the same time race on its schema creation.
    with _instance(env) as instance:
        released = [] if running_dagster(env) else release_orphaned_runs(instance)
    if not running_dagster(env):
        pause_file(env).unlink(missing_ok=True)
    if released and not quiet:
        print(f"released {len(released)} run(s) left in flight by a stopped daemon: {', '.join(released)}")
    uri = env.tracking_uri()
    ensure_store(uri, env.mlflow.experiment)
    if not quiet:
        print(f"inventory: {inventory.reason}")
        print(f"Dagster instance: {path} (one run per slot tag, run monitoring on)")
        print(f"MLflow store: {uri} (experiment {env.mlflow.experiment})")
    return {"dagster_home": str(home), "tracking_uri": uri, "slots": list(inventory.slot_ids)}


def child_env(env: EnvConfig) -> dict:
    out = dict(os.environ)
    out.update({"DAGSTER_HOME": str(dagster_home(env)), "ONES_PROJECT_DIR": str(env.project_dir),
                "ONES_ENV": env.name})
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def _reset_signals() -> None:  # in the child, before exec: a background start may have SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class AlreadyRunning(RuntimeError):
    pass


def _pidfile(env: EnvConfig) -> Path:
    return env.state_dir / "dagster.pid"


def running_dagster(env: EnvConfig) -> int | None:
    """PID of a Dagster daemon/dev process this project started and that still runs, else None."""
    try:
        pid = int(_pidfile(env).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        import psutil

        proc = psutil.Process(pid)
        return pid if proc.is_running() and "dagster" in " ".join(proc.cmdline()) else None
    except Exception:  # noqa: BLE001 - gone, or psutil missing
        return None


def start_process(argv: list[str], env: EnvConfig, log_path: Path | None = None) -> subprocess.Popen:
    _refuse_if_running(env)
    # The child keeps writing to it after this function returns: no context manager.
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115
    proc = subprocess.Popen(argv, env=child_env(env), cwd=str(env.project_dir), start_new_session=True,
                            preexec_fn=_reset_signals, stdout=out, stderr=subprocess.STDOUT if out else None)
    _pidfile(env).write_text(f"{proc.pid}\n")
    return proc


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return []


def stop_process(proc: subprocess.Popen, timeout_s: float = 45.0) -> None:
    """SIGINT to the process group (the daemon, its code server, the run workers and their training
    steps, which checkpoint), wait up to ``timeout_s`` for all of them, then kill what is left."""
    if proc.poll() is not None:
        return
    children = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        import psutil

        alive = [psutil.Process(pid) for pid in children if psutil.pid_exists(pid)]
        _, alive = psutil.wait_procs(alive, timeout=max(deadline - time.monotonic(), 1.0))
        children = [p.pid for p in alive]
    except Exception:  # noqa: BLE001 - psutil missing or processes gone
        pass
    for pid in children:  # whatever outlived the grace period (e.g. a code server)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def pause_file(env: EnvConfig) -> Path:
    return env.state_dir / "scheduler.paused"


def drain(env: EnvConfig, instance, timeout_s: float | None = None) -> int:
    """Before Dagster stops: pause the sensor, cancel every in-flight training run (each step checkpoints
    and its run ends CANCELED rather than FAILED) and wait for them. Returns how many were cancelled."""
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus

    from ones_pipeline.live import TAG_MANAGED

    pause_file(env).touch()
    statuses = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    flt = dg.RunsFilter(statuses=statuses, tags={TAG_MANAGED: "true"})
    runs = instance.get_runs(flt)
    for run in runs:
        if run.status != DagsterRunStatus.CANCELING:
            try:
                instance.run_coordinator.cancel_run(run.run_id)
            except Exception as exc:  # noqa: BLE001 - its worker is already gone
                print(f"could not cancel run {run.run_id}: {exc}", file=sys.stderr)
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else env.launcher.grace_period_s + 20)
    while instance.get_runs(flt) and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(runs)


def release_orphaned_runs(instance) -> list[str]:
    """Mark in-flight training runs whose run worker no longer exists as canceled.

    Dagster's default run launcher cannot check a run worker's health, so a run whose daemon was
    killed stays STARTED forever, holding its job and its GPU tags. Called before a daemon starts
    (nothing of ours runs then); a run is orphaned when no process mentions its id.
    """
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus

    from ones_pipeline.live import TAG_MANAGED

    statuses = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    runs = instance.get_runs(dg.RunsFilter(statuses=statuses, tags={TAG_MANAGED: "true"}))
    if not runs:
        return []
    try:
        import psutil

        cmdlines = " ".join(" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    except Exception:  # noqa: BLE001 - without psutil, assume the workers are gone
        cmdlines = ""
    released = []
    for run in runs:
        if run.run_id in cmdlines:
            continue
        instance.report_run_canceled(run, message="ones: the daemon that ran it stopped; the job resumes "
                                                  "from its checkpoint in a new generation")
        released.append(run.run_id)
    return released


def _dagster_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


# -- status -----------------------------------------------------------------------------------------
STATE_OF_RUN = {"QUEUED": "queued", "NOT_STARTED": "queued", "STARTING": "starting", "STARTED": "running",
                "CANCELING": "preempting", "CANCELED": "paused", "FAILURE": "retrying", "SUCCESS": "finished"}


def job_rows(env: EnvConfig, instance) -> list[dict]:
    """One row per job in assets/jobs (and finished ones): state, GPUs, batch, progress, ETA, restarts."""
    import dagster as dg

    from ones_pipeline.adapters.mlflow_tracker import read_progress
    from ones_pipeline.defs.assets import TRAINING_ASSET, job_run_infos

    specs, _ = load_job_specs(env.jobs_dir)
    finished = set(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET)))
    runs = job_run_infos(instance)
    try:
        progress = read_progress(env.tracking_uri(), env.mlflow.experiment, sorted(set(specs) | finished))
    except Exception:  # noqa: BLE001 - status must work without MLflow
        progress = {}
    failed_file = env.state_dir / "failed_jobs.json"
    cursor_failed = json.loads(failed_file.read_text() or "{}") if failed_file.exists() else {}
    rows = []
    for job in sorted(set(specs) | finished):
        rs = sorted((r for r in runs if r.job == job), key=lambda r: (r.generation, r.created_s))
        latest = rs[-1] if rs else None
        state = "finished" if job in finished else STATE_OF_RUN.get(latest.status, latest.status.lower()) \
            if latest else "pending"
        if job in cursor_failed:
            state = "failed"
        p = progress.get(job)
        spec = specs.get(job)
        total = spec.stopping.total_samples(spec.dataset_size) if spec else None
        epochs = p.epochs_done if p else 0.0
        if spec and total:
            prog = f"{epochs:.1f}/{total / spec.dataset_size:g} ep"
        elif p and p.accuracy_history:
            prog = f"{epochs:.1f} ep, acc {p.accuracy_history[-1][1]:.3f}"
        else:
            prog = f"{epochs:.1f} ep"
        eta = "-"
        rate = p.metrics.get("samples_per_s") if p else None
        if state == "running" and total and rate and p:
            eta = f"{max(total - p.samples_done, 0) / rate:.0f} s"
        in_flight = latest is not None and latest.in_flight
        rows.append({"job": job, "state": state,
                     "gpus": ",".join(map(str, latest.slot_ids)) if in_flight else "-",
                     "batch": str(latest.global_batch) if in_flight else "-", "progress": prog, "eta": eta,
                     "restarts": max((p.restarts if p else 0), len([r for r in rs if r.start_s is not None]) - 1, 0),
                     "generations": len(rs)})
    return rows


def format_table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(no jobs)"
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


STATUS_COLUMNS = ["job", "state", "gpus", "batch", "progress", "eta", "restarts"]


def _instance(env: EnvConfig):
    import dagster as dg

    home = dagster_home(env)
    if not (home / "dagster.yaml").exists():
        raise ConfigError(home / "dagster.yaml", None,
                          "no Dagster instance yet: run `ones init` (or `ones up`/`ones run`)")
    return dg.DagsterInstance.from_config(str(home))


def cmd_status(env: EnvConfig) -> int:
    with _instance(env) as instance:
        print(format_table(job_rows(env, instance), STATUS_COLUMNS))
    errors_file = env.state_dir / "spec_errors.json"
    if errors_file.exists():
        for err in json.loads(errors_file.read_text() or "[]"):
            print(f"skipped spec: {err['message']}")
    return 0


def cmd_submit(env: EnvConfig, spec_path: Path, force: bool) -> int:
    spec = _load_any_name(spec_path)
    target = env.jobs_dir / f"{spec.name}.yaml"
    other = env.jobs_dir / f"{spec.name}.yml"
    if other.exists():
        print(f"ones submit: {other} already defines job {spec.name!r}; remove it first", file=sys.stderr)
        return 2
    if target.exists() and not force:
        print(f"ones submit: {target} exists (job {spec.name!r}); pass --force to replace it", file=sys.stderr)
        return 2
    env.jobs_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".yaml.tmp")
    shutil.copyfile(spec_path, tmp)
    tmp.replace(target)
    print(f"submitted {spec.name}: {target} (the scheduler picks it up at its next tick, "
          f"every {env.scheduler.tick_interval_s} s)")
    return 0


def _load_any_name(path: Path):
    """A spec whose `name` differs from its file name: valid as long as the name is (it is copied to <name>.yaml)."""
    from ones_pipeline.config import _read_yaml, parse_job_spec

    return parse_job_spec(_read_yaml(path), path, default_name=path.stem)


def _refuse_if_running(env: EnvConfig) -> None:
    pid = running_dagster(env)
    if pid is not None:
        raise AlreadyRunning(f"Dagster is already running for this project (PID {pid}, {_pidfile(env)}); "
                             f"stop it first (Ctrl-C in its terminal, or kill -INT -{pid})")


def cmd_up(env: EnvConfig, host: str, port: int) -> int:
    _refuse_if_running(env)
    init(env)
    argv = [_dagster_bin("dagster"), "dev", "-m", "ones_pipeline.definitions", "-h", host, "-p", str(port)]
    print(f"starting Dagster (webserver http://{host}:{port}, daemon) with DAGSTER_HOME={dagster_home(env)}; "
          "Ctrl-C stops everything", flush=True)
    proc = start_process(argv, env)
    try:
        return _wait_foreground(proc, env)
    finally:
        pause_file(env).unlink(missing_ok=True)


def _wait_foreground(proc: subprocess.Popen, env: EnvConfig) -> int:
    stop = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while proc.poll() is None and not stop:
            time.sleep(0.2)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc.poll() is None:
            print("stopping Dagster: cancelling the running steps (they checkpoint) ...", file=sys.stderr, flush=True)
            try:
                with _instance(env) as instance:
                    drain(env, instance)
            except Exception as exc:  # noqa: BLE001 - stop anyway
                print(f"could not drain the runs: {exc}", file=sys.stderr)
            stop_process(proc)
    return 0 if stop else (proc.returncode or 0)


def cmd_run(env: EnvConfig, timeout_s: float, status_every_s: float, fresh: bool = False) -> int:
    _refuse_if_running(env)
    if fresh and env.state_dir.exists():
        if not (env.state_dir / "dagster").is_dir() and any(env.state_dir.iterdir()):
            print(f"ones run: --fresh refuses to delete {env.state_dir}: it does not look like a state directory "
                  "(no dagster/ inside)", file=sys.stderr)
            return 2
        shutil.rmtree(env.state_dir)
        print(f"--fresh: deleted {env.state_dir}")
    specs, errors = load_job_specs(env.jobs_dir)
    for err in errors:
        print(f"skipped spec: {err}", file=sys.stderr)
    if not specs:
        print(f"ones run: no valid job spec in {env.jobs_dir}", file=sys.stderr)
        return 2
    init(env)
    log_path = env.state_dir / "daemon.log"
    print(f"running the scheduler headless for {len(specs)} job(s) ({', '.join(sorted(specs))}); "
          f"daemon log: {log_path}", flush=True)
    proc = start_process([_dagster_bin("dagster-daemon"), "run", "-m", "ones_pipeline.definitions"], env, log_path)
    stop: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.monotonic()
    last_print = 0.0
    code = 1
    try:
        with _instance(env) as instance:
            report_before = _latest_report_ts(instance)
            if report_before and _all_ended(env, instance, specs):
                print("every job is already finished (`ones run --fresh` starts over)")
                _print_summary(env, instance, specs)
                return 0
            while not stop:
                if proc.poll() is not None:
                    print(f"ones run: the Dagster daemon exited ({proc.returncode}); see {log_path}", file=sys.stderr)
                    break
                if time.monotonic() - last_print > status_every_s:  # the full table (MLflow read) only then
                    last_print = time.monotonic()
                    rows = job_rows(env, instance)
                    print(f"\n[{time.monotonic() - t0:5.0f} s]\n" + format_table(rows, STATUS_COLUMNS), flush=True)
                if _all_ended(env, instance, specs) and _latest_report_ts(instance) > report_before:
                    code = 0
                    break
                if time.monotonic() - t0 > timeout_s:
                    print(f"ones run: not finished after {timeout_s:.0f} s; state is kept, `ones run` resumes",
                          file=sys.stderr)
                    break
                time.sleep(1.0)
            if code == 0:
                _print_summary(env, instance, specs)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc.poll() is None and code != 0:
            print("stopping: cancelling the running steps (they checkpoint) ...", file=sys.stderr, flush=True)
            with _instance(env) as instance:
                drain(env, instance)
        stop_process(proc)
        pause_file(env).unlink(missing_ok=True)
    if stop:
        print("interrupted: stopped the daemon; running steps checkpointed; `ones run` resumes", file=sys.stderr)
        return 130
    return code


def _all_ended(env: EnvConfig, instance, specs) -> bool:
    """Every job materialized or marked failed (two cheap reads, fit for a 1 s poll)."""
    import dagster as dg

    from ones_pipeline.defs.assets import TRAINING_ASSET

    failed_file = env.state_dir / "failed_jobs.json"
    failed = set(json.loads(failed_file.read_text() or "{}")) if failed_file.exists() else set()
    return set(specs) <= set(instance.get_materialized_partitions(dg.AssetKey(TRAINING_ASSET))) | failed


def _latest_report_ts(instance) -> float:
    import dagster as dg

    from ones_pipeline.defs.assets import REPORT_ASSET

    event = instance.get_latest_materialization_event(dg.AssetKey(REPORT_ASSET))
    return event.timestamp if event else 0.0


def _print_summary(env: EnvConfig, instance, specs) -> None:
    report_dir = env.state_dir / "report"
    csv = report_dir / "jobs.csv"
    if csv.exists():
        import pandas as pd

        table = pd.read_csv(csv)
        cols = [c for c in ("job", "model", "jct_s", "wait_s", "run_s", "restarts", "generations", "gpu_s", "accuracy")
                if c in table.columns]
        formatters = {c: (lambda v: f"{v:.3f}") if c == "accuracy" else (lambda v: f"{v:.1f}")
                      for c in cols if table[c].dtype.kind == "f"}
        print("\n" + table[cols].to_string(index=False, formatters=formatters))
    summary = report_dir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text()).get("summary", {})
        print(f"\nmean JCT {s.get('mean_jct_s', float('nan')):.1f} s, "
              f"makespan {s.get('makespan_s', float('nan')):.1f} s, "
              f"utilisation {100 * s.get('utilisation', float('nan')):.0f}%")
    print(f"\nMLflow runs: {env.tracking_uri()} (experiment {env.mlflow.experiment}); "
          f"browse with: mlflow ui --backend-store-uri {env.tracking_uri()}")
    print(f"plots and tables: {report_dir} (jct_cdf.png, allocation.png, jobs.csv)")
    print(f"decisions: {env.state_dir / 'decisions.jsonl'}")


def run_command(args: argparse.Namespace) -> int:
    try:
        env = load_env(args.project, args.env)
        if args.command == "init":
            init(env)
            return 0
        if args.command == "status":
            return cmd_status(env)
        if args.command == "submit":
            return cmd_submit(env, args.spec, args.force)
        if args.command == "up":
            return cmd_up(env, args.host, args.port)
        if args.command == "run":
            return cmd_run(env, args.timeout, args.status_every, args.fresh)
    except (ConfigError, AlreadyRunning) as exc:
        print(f"ones {args.command}: {exc}", file=sys.stderr)
        return 2
    raise ValueError(f"unknown command {args.command}")
