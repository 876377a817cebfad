"""``ones init | up | run | submit | status``: the live pipeline from the command line.

Every command works on a project directory (``--project``, default ``$ONES_PROJECT_DIR`` or the working
directory) holding ``resources/<env>.yaml`` and ``assets/jobs/*.yaml``. The Dagster instance lives in
``<state_dir>/dagster`` (its ``dagster.yaml`` is written by ``ones init``), so several projects never
share one. Dagster itself is reached only through ``defs.instance``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from ones_pipeline.cli.status import STATUS_COLUMNS, cmd_status, decision_lines, format_table, job_rows
from ones_pipeline.cli.supervise import (
    AlreadyRunning,
    dagster_bin,
    died_of_the_loader_race,
    process_cmdlines,
    refuse_if_running,
    running_dagster,
    start_process,
    stop_process,
    wait_foreground,
)
from ones_pipeline.config import ConfigError, EnvConfig, load_env, load_job_specs, parse_job_spec, read_yaml

LIVE_COMMANDS = ("init", "up", "run", "submit", "status")
DAEMON_STARTS = 3  # starts of the daemon `ones run` tries when it dies of the loader's start-up abort


class SubcommandAdder(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_commands(sub: SubcommandAdder) -> None:
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


def init(env: EnvConfig, quiet: bool = False) -> dict:
    """Write ``dagster.yaml`` from the inventory, create the instance's storage and the MLflow store (once,
    here: the daemon, the webserver and `ones status` opening a fresh store at the same time race on its
    schema creation), release runs a stopped daemon left in flight."""
    from ones_pipeline.adapters.inventory import inventory_source
    from ones_pipeline.adapters.mlflow import ensure_store
    from ones_pipeline.defs.instance import open_instance, release_orphaned_runs, write_instance_yaml

    inventory = inventory_source(env.cluster).discover()
    env.layout.jobs_dir.mkdir(parents=True, exist_ok=True)
    env.jobs_dir.mkdir(parents=True, exist_ok=True)
    path = write_instance_yaml(env, inventory.slot_ids, inventory.num_slots + 4, inventory.kind)
    daemon_running = running_dagster(env) is not None
    with open_instance(env) as instance:
        released = [] if daemon_running else release_orphaned_runs(instance, process_cmdlines())
    if not daemon_running:
        env.layout.paused.unlink(missing_ok=True)
    if released and not quiet:
        print(f"released {len(released)} run(s) left in flight by a stopped daemon: {', '.join(released)}")
    uri = env.tracking_uri()
    ensure_store(uri, env.mlflow.experiment)
    if not quiet:
        print(f"inventory: {inventory.reason}")
        print(f"Dagster instance: {path} (one run per slot tag, run monitoring on)")
        print(f"MLflow store: {uri} (experiment {env.mlflow.experiment})")
    return {"dagster_home": str(env.layout.dagster_home), "tracking_uri": uri, "slots": list(inventory.slot_ids)}


def _drain(env: EnvConfig) -> None:
    from ones_pipeline.defs.instance import drain, open_instance

    with open_instance(env) as instance:
        drain(env, instance, log=lambda line: print(line, file=sys.stderr))


def cmd_submit(env: EnvConfig, spec_path: Path, force: bool) -> int:
    # A spec whose `name` differs from its file name is valid as long as the name is: it is copied to <name>.yaml.
    spec = parse_job_spec(read_yaml(spec_path), spec_path, default_name=spec_path.stem)
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
    stopped = _no_scheduler(env)
    print(f"submitted {spec.name}: {target} " + (f"({stopped})" if stopped else
          "(the scheduler's sensor sees the new spec file within seconds and decides at once)"))
    return 0


def _no_scheduler(env: EnvConfig) -> str | None:
    """``defs.liveness.no_scheduler_line`` for the project's instance; a project never started has none."""
    if not env.layout.instance_yaml.exists():
        from ones_pipeline.defs.liveness import HOW_TO_START

        return f"no scheduler is running for this project yet; {HOW_TO_START}"
    from ones_pipeline.defs.instance import open_instance
    from ones_pipeline.defs.liveness import no_scheduler_line

    with open_instance(env) as instance:
        return no_scheduler_line(instance)


def cmd_up(env: EnvConfig, host: str, port: int) -> int:
    refuse_if_running(env)
    init(env)
    argv = [dagster_bin("dagster"), "dev", "-m", "ones_pipeline.definitions", "-h", host, "-p", str(port)]
    print(f"starting Dagster (webserver http://{host}:{port}, daemon) with DAGSTER_HOME={env.layout.dagster_home}; "
          "Ctrl-C stops everything", flush=True)
    proc = start_process(argv, env)
    try:
        return wait_foreground(proc, lambda: _drain(env))
    finally:
        env.layout.paused.unlink(missing_ok=True)


def _start_fresh(env: EnvConfig) -> bool:
    """``--fresh``: delete what the product created in the state directory (``StateLayout.known_entries``),
    nothing else; refuse a state directory that is, or holds, the project, its specs or its resources."""
    state = env.state_dir.resolve()
    if not state.exists():
        return True
    keep = [env.project_dir.resolve(), env.jobs_dir.resolve(), env.path.parent.resolve()]
    clash = next((p for p in keep if p == state or state in p.parents), None)
    if clash is not None:
        print(f"ones run: --fresh refuses to clear {env.state_dir}: it holds the project's {clash} "
              "(set state_dir to a folder of its own, e.g. .ones/state)", file=sys.stderr)
        return False
    removed = []
    for path in env.layout.known_entries():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(path.name)
    left = sorted(p.name for p in state.iterdir())
    if not left:
        state.rmdir()
    print(f"--fresh: deleted {', '.join(removed) or 'nothing'} in {env.state_dir}"
          + (f" (kept what ones did not create: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''})"
             if left else ""))
    return True


def cmd_run(env: EnvConfig, timeout_s: float, status_every_s: float, fresh: bool = False) -> int:
    refuse_if_running(env)
    if fresh and not _start_fresh(env):
        return 2
    specs, errors = load_job_specs(env.jobs_dir)
    for err in errors:
        print(f"skipped spec: {err}", file=sys.stderr)
    if not specs:
        print(f"ones run: no valid job spec in {env.jobs_dir}", file=sys.stderr)
        return 2
    init(env)
    log_path = env.layout.daemon_log
    print(f"running the scheduler headless for {len(specs)} job(s) ({', '.join(sorted(specs))}); "
          f"daemon log: {log_path}", flush=True)
    stop: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    code, proc = 1, None
    try:
        for attempt in range(1, DAEMON_STARTS + 1):
            offset = log_path.stat().st_size if log_path.exists() else 0
            proc = start_process([dagster_bin("dagster-daemon"), "run", "-m", "ones_pipeline.definitions"], env,
                                 log_path)
            code = _watch(env, specs, proc, stop, timeout_s, status_every_s)
            if stop or attempt == DAEMON_STARTS or not died_of_the_loader_race(proc, log_path, offset):
                break
            print(f"ones run: the Dagster daemon died at start-up (ld.so: RT_CONSISTENT, exit {proc.returncode}; "
                  f"{log_path}); starting it again ({attempt + 1} of {DAEMON_STARTS})", file=sys.stderr, flush=True)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc is not None and proc.poll() is None and code != 0:
            print("stopping: cancelling the running steps (they checkpoint) ...", file=sys.stderr, flush=True)
            _drain(env)
        if proc is not None:
            stop_process(proc)
        env.layout.paused.unlink(missing_ok=True)
    if stop:
        print("interrupted: stopped the daemon; running steps checkpointed; `ones run` resumes", file=sys.stderr)
        return 130
    return code


def _watch(env: EnvConfig, specs, proc, stop: list[int], timeout_s: float, status_every_s: float) -> int:
    """Poll until every job has ended and the report is new (0), or the daemon dies, a signal comes, or
    the timeout passes (1). Prints the status table every ``status_every_s``."""
    from ones_pipeline.defs.instance import latest_report_ts, open_instance

    t0 = time.monotonic()
    last_print = 0.0
    with open_instance(env) as instance:
        report_before = latest_report_ts(instance)
        if report_before and _all_ended(env, instance, specs):
            print("every job is already finished (`ones run --fresh` starts over)")
            _print_summary(env)
            return 0
        while not stop:
            if proc.poll() is not None:
                print(f"ones run: the Dagster daemon exited ({proc.returncode}); see {env.layout.daemon_log}",
                      file=sys.stderr)
                return 1
            if time.monotonic() - last_print > status_every_s:  # the full table (MLflow read) only then
                last_print = time.monotonic()
                rows = job_rows(env, instance)
                print(f"\n[{time.monotonic() - t0:5.0f} s]\n" + format_table(rows, STATUS_COLUMNS), flush=True)
            if _all_ended(env, instance, specs) and latest_report_ts(instance) > report_before:
                _print_summary(env)
                return 0
            if time.monotonic() - t0 > timeout_s:
                print(f"ones run: not finished after {timeout_s:.0f} s; state is kept, `ones run` resumes",
                      file=sys.stderr)
                return 1
            time.sleep(1.0)
    return 1


def _all_ended(env: EnvConfig, instance, specs) -> bool:
    """Every job materialized or marked failed (two cheap reads, fit for a 1 s poll)."""
    from ones_pipeline.defs.instance import finished_jobs

    return set(specs) <= finished_jobs(instance) | set(env.layout.failed())


def _print_summary(env: EnvConfig) -> None:
    from ones_pipeline.adapters.mlflow.store import UI_COMMAND

    report_dir = env.layout.report_dir
    csv = report_dir / "jobs.csv"
    if csv.exists():
        import pandas as pd

        table = pd.read_csv(csv)
        cols = [c for c in ("job", "model", "jct_s", "wait_s", "run_s", "restarts", "generations", "gpu_s", "accuracy")
                if c in table.columns]
        formatters = {c: (lambda v: f"{v:.3f}") if c == "accuracy" else (lambda v: f"{v:.1f}")
                      for c in cols if table[c].dtype.kind == "f"}
        print("\n" + table[cols].to_string(index=False, formatters=formatters))
    s = env.layout.read_json(report_dir / "summary.json", {}).get("summary", {})
    if s:
        print(f"\nmean JCT {s.get('mean_jct_s', float('nan')):.1f} s, "
              f"makespan {s.get('makespan_s', float('nan')):.1f} s, "
              f"utilisation {100 * s.get('utilisation', float('nan')):.0f}%")
    print(f"\nMLflow runs: {env.tracking_uri()} (experiment {env.mlflow.experiment}); "
          f"browse with: {UI_COMMAND} {env.tracking_uri()}")
    print(f"plots and tables: {report_dir} (jct_cdf.png, allocation.png, jobs.csv)")
    lines = decision_lines(env)
    print(f"decisions: {env.layout.decisions}" + (":" if lines else " (none)"))
    for line in lines:
        print(f"  {line}")


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
    except ValueError as exc:  # MLflow's store unusable (unreachable within 5 s, unwritable): one line
        from ones_pipeline.adapters.mlflow import TrackerError

        if not isinstance(exc, TrackerError):
            raise
        print(f"ones {args.command}: MLflow: {exc}", file=sys.stderr)
        return 2
    raise ValueError(f"unknown command {args.command}")


__all__ = ["LIVE_COMMANDS", "add_commands", "init", "run_command"]
