"""Chaos run of the live pipeline: kill -9 its pieces at random while it trains, then check nothing was lost.

A temporary project (``resources/local.yaml``: 2 CPU slots, 5 s ticks, 1,000 retries (the most a project may
set) without backoff, since every killed rank or run worker is a failed run; policy ``--policy``;
``assets/jobs``: ``--jobs`` cnn-digits jobs of ``--epochs`` epochs, a minute or two each on one slot here,
requesting ``--requested-gpus`` slots) is run by ``ones run`` while, at
random intervals (exponential, mean ``--mean-interval``), ``--kills`` times one of these is killed with
SIGKILL, the kind drawn uniformly:

* ``supervisor``: the ``ones run`` process; the user re-runs ``ones run``; if that is refused because
  the daemon it started still runs, the user does what the refusal says (``kill -INT <pid>``), waits for
  that process to end, and runs ``ones run`` again;
* ``daemon``: the ``dagster-daemon`` (``ones run`` then exits 1; the user re-runs it);
* ``run-worker``: the process running one Dagster run (a child of the code server);
* ``rank``: one training process of a job;
* ``rank-checkpoint``: rank 0 of a job while it writes a checkpoint (inotify sees the temporary file,
  rank 0 is frozen and killed only if the file is still there, so the write had not completed);
* ``resize``: rank 0, another rank or the launcher of a job while it changes its ranks in place, shrinking or
  growing (``chaos_resize``: the benchmark requests the change, within the slots the generation holds).

Nothing is restarted after the last four: the pipeline has to recover alone. When ``ones run`` exits
0 (every job trained, the report made), the run is checked, and each check printed:

1. every job finished (materialized; none marked failed);
2. per job, the final samples are exactly what the stopping rule requires (the materialization,
   ``result.json``, the last and the highest ``samples`` point in MLflow; one materialization);
3. MLflow's ``samples`` only ever drop back to the last checkpoint completed before the restart, never
   below it, with a restart in between, and by at most one checkpoint interval (an epoch: every
   evaluation checkpoints); the worst loss in samples and as a fraction of that interval;
4. no slot tag (``ones/cpu-<id>``) held by two Dagster runs at once (run records: start, end, tags);
5. no process of the project and no container of its jobs left, 90 s after ``ones run`` exited;
6. (sampled every 0.5 s while it ran) no job trained by two generations at once, never more ranks than
   slots.
7. no Python traceback in any log of the project (``ones run``'s, the daemon's, every run's compute logs with
   the launchers' and ranks' stderr).

Exit status 1 when a check fails or the run did not finish within ``--timeout``. All random draws
(job lengths, intervals, kinds, targets) come from ``numpy.random.default_rng(--seed)``; the timing of a
live system does not, so two runs with one seed kill the same kinds in the same order, not the same
processes. Linux only (``/proc``, inotify).

    .venv/bin/python benchmarks/chaos.py [--kills 50] [--seed 0] [--jobs 5] [--epochs 150,300]
                                         [--mean-interval 10] [--timeout 2400] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
from chaos_checks import (
    JobSamples,
    check_double_training,
    check_exact,
    check_finished,
    check_orphans,
    check_overlaps,
    check_rewinds,
    check_tracebacks,
    dagster_facts,
    generation_starts,
    live_containers,
    recoveries,
    result_samples,
    rewinds,
    samples_history,
    slot_overlaps,
    tracebacks,
)
from chaos_procs import CheckpointWatcher, Proc, project_processes, run_id_of_worker
from chaos_resize import ResizeKills

from ones_pipeline.config import load_env, load_job_specs

KINDS = ("supervisor", "daemon", "run-worker", "rank", "rank-checkpoint", "resize")
SLOTS = 2
ENV_YAML = """cluster: {{gpus: none, cpu_slots: {slots}}}
launcher: {{grace_period_s: 15}}
scheduler: {{tick_interval_s: 5, decision_budget_s: 0.5, max_retries: 1000, retry_backoff_s: 0, min_run_s: 30}}
policy: {{name: {policy}, seed: {seed}}}
"""
JOB_YAML = """model: cnn-digits
per_gpu_batch: 32
base_lr: 0.02
max_lr: 0.08
requested_gpus: {requested}
max_gpus: 2
stopping: {{epochs: {epochs}}}
"""
ONES = str(Path(sys.executable).parent / "ones")


def write_project(root: Path, args: argparse.Namespace, rng: np.random.Generator) -> list[str]:
    jobs, epochs = args.jobs, args.epochs
    (root / "resources").mkdir(parents=True)
    (root / "assets" / "jobs").mkdir(parents=True)
    (root / "resources" / "local.yaml").write_text(ENV_YAML.format(slots=SLOTS, seed=args.seed, policy=args.policy))
    names = []
    for i in range(jobs):
        name = f"chaos-{chr(ord('a') + i)}"
        n = int(rng.integers(epochs[0], epochs[1] + 1))
        (root / "assets" / "jobs" / f"{name}.yaml").write_text(JOB_YAML.format(epochs=n, requested=args.requested_gpus))
        names.append(name)
    return names


class Chaos:
    """The run: ``ones run`` as a user keeps it going, the process scan, the kills (one state machine,
    polled every 0.1 s, so that kills, restarts and samples interleave as they would)."""

    def __init__(self, args: argparse.Namespace, env, jobs: list[str], rng: np.random.Generator):
        self.args, self.env, self.jobs, self.rng = args, env, jobs, rng
        self.project = env.project_dir
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.timeout
        self.log_path = self.project / "chaos-ones-run.log"
        self.sup: subprocess.Popen | None = None
        self.sup_started = 0.0
        self.log_offset = 0
        self.launches, self.refusals = 0, 0
        self.restart_at: float | None = None
        self.draining: tuple[int, float] | None = None  # (daemon PID, when to give up waiting)
        self.kills: list[tuple[float, str, int, str]] = []  # (s since start, kind, PID, what)
        self.skipped: Counter[str] = Counter()
        self.pending: tuple[str, float, float] | None = None  # (kind, give up at, least age of the target in s)
        self.next_kill = self.t0 + self._interval()
        self.procs: list[Proc] = []
        self.rank0: dict[str, int] = {}
        self.next_scan = 0.0
        self.next_status = time.monotonic() + 60.0
        self.scans = 0
        self.double: list[str] = []
        self.watcher = CheckpointWatcher(env.layout.jobs_dir, jobs, lambda job: self.rank0.get(job))
        self.resizes = ResizeKills(env.layout.jobs_dir, rng, self.say)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    def _interval(self) -> float:
        mean = self.args.mean_interval
        return float(np.clip(self.rng.exponential(mean), 0.2 * mean, 4 * mean))

    def run(self) -> bool:
        """Until ``ones run`` exits 0 (True) or the timeout (False)."""
        self.watcher.start()
        self.launch()
        while time.monotonic() < self.deadline:
            self.scan()
            if self.user():
                return True
            self.chaos()
            time.sleep(0.1)
        return False

    # -- the user ----------------------------------------------------------------------------------
    def launch(self) -> None:
        self.launches += 1
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        remaining = max(self.deadline - time.monotonic(), 60.0)
        with open(self.log_path, "ab") as log:
            self.sup = subprocess.Popen(
                [ONES, "run", "--project", str(self.project), "--timeout", f"{remaining:.0f}", "--status-every", "60"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.project, start_new_session=True,
                env={**os.environ, "ONES_PROJECT_DIR": str(self.project)})
        self.sup_started = time.time()
        if self.launches > 1:
            self.say(f"user: `ones run` again (launch {self.launches}, PID {self.sup.pid})")

    def _output(self) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(self.log_offset)
            return fh.read().decode(errors="replace")

    def user(self) -> bool:
        """Keep ``ones run`` going as a user would; True once it exited 0."""
        now = time.monotonic()
        if self.draining is not None:
            pid, give_up = self.draining
            if _alive(pid) and now < give_up:
                return False
            if _alive(pid):
                self.say(f"user: PID {pid} still there after kill -INT; kill -KILL -{pid}")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            self.draining, self.restart_at = None, now
        if self.sup is not None:
            code = self.sup.poll()
            if code is None:
                return False
            self.sup, text = None, self._output()
            if code == 0:
                return True
            refused = re.search(r"already running for this project \(PID (\d+).*kill -INT (-?)(\d+)", text)
            if code == 2 and refused:
                self._follow_advice(int(refused.group(1)), refused.group(2) + refused.group(3))
                return False
            if code == 2:
                raise RuntimeError(f"`ones run` exited 2:\n{text[-2000:]}")
            last = [line for line in text.splitlines() if line.startswith("ones run:")]
            why = "killed" if code == -signal.SIGKILL else (last[-1] if last else f"exit {code}")
            delay = float(self.rng.uniform(1.0, 4.0))
            self.say(f"user: `ones run` ended ({why}); re-running it in {delay:.1f} s")
            self.restart_at = now + delay
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.launch()
        return False

    def _follow_advice(self, pid: int, target: str) -> None:
        """What the refusal says to do: ``kill -INT <pid>`` (``-<pid>``: its process group); then wait."""
        self.refusals += 1
        self.say(f"user: `ones run` refused: Dagster still running (PID {pid}); as it says: kill -INT {target}")
        with contextlib.suppress(ProcessLookupError):
            if target.startswith("-"):
                os.killpg(int(target[1:]), signal.SIGINT)
            else:
                os.kill(int(target), signal.SIGINT)
        self.draining = (pid, time.monotonic() + self.env.launcher.grace_period_s + 60)

    # -- watching ----------------------------------------------------------------------------------
    def scan(self) -> None:
        if time.monotonic() < self.next_scan:
            return
        self.next_scan = time.monotonic() + 0.5
        self.procs = project_processes(self.project)
        ranks = [p for p in self.procs if p.role == "rank"]
        self.rank0 = {p.job: p.pid for p in ranks if p.rank == 0}
        self.scans += 1
        generations: dict[str, set[int]] = {}
        for p in ranks:
            generations.setdefault(p.job, set()).add(p.generation)
        if time.monotonic() >= self.next_status:
            self.next_status = time.monotonic() + 60.0
            trained = sum((self.env.layout.job_dir(j) / "result.json").exists() for j in self.jobs)
            self.say(f"status: {trained}/{len(self.jobs)} jobs trained, {len(ranks)} rank(s) running, "
                     f"{len(self.kills)} kill(s) so far")
        twice = {j: sorted(g) for j, g in generations.items() if len(g) > 1}
        if twice or len(ranks) > SLOTS:
            now = time.monotonic() - self.t0
            self.double.append(f"at {now:.1f} s: {len(ranks)} ranks ({', '.join(p.describe() for p in ranks)})")

    # -- the kills ---------------------------------------------------------------------------------
    def chaos(self) -> None:
        now = time.monotonic()
        if len(self.kills) >= self.args.kills:
            return
        if self.pending is None:
            if now < self.next_kill:
                return
            # The target must have lived a while (drawn too), so that kills do not all land on processes
            # just started when the previous ones died.
            kind = str(self.rng.choice(self.args.kinds))
            self.pending = (kind, now + self.args.target_wait, float(self.rng.uniform(1.0, self.args.mean_interval)))
            if kind == "rank-checkpoint":
                self.watcher.armed.set()
        kind, give_up, min_age = self.pending
        if kind == "rank-checkpoint":
            done = self._kill_checkpoint()
        else:
            done = self._kill_resize(min_age) if kind == "resize" else self._kill(kind, min_age)
        if not done and now > give_up:
            self.watcher.armed.clear()
            self.resizes.abandon()
            done = kind == "rank-checkpoint" and self._kill_checkpoint()  # one may have landed meanwhile
            if not done:
                self.skipped[kind] += 1
                self.say(f"no {kind} to kill within {self.args.target_wait:.0f} s; drawing again")
        if done or now > give_up:
            self.pending = None
            self.next_kill = time.monotonic() + self._interval()

    def _record(self, kind: str, pid: int, what: str) -> None:
        self.kills.append((time.monotonic() - self.t0, kind, pid, what))
        self.say(f"kill {len(self.kills):2d}/{self.args.kills} {kind:<15} PID {pid:<7} {what}")

    def _kill_checkpoint(self) -> bool:
        try:
            k = self.watcher.kills.get_nowait()
        except queue.Empty:
            return False
        where = "between its renames" if k.between_renames else "before its rename"
        self._record("rank-checkpoint", k.pid, f"{k.job} rank 0 writing {k.tmp} ({where})")
        return True

    def _kill_resize(self, min_age_s: float) -> bool:
        target = self.resizes.step(self.procs, time.time() - min_age_s)
        if target is None:
            return False
        try:
            os.kill(target[0], signal.SIGKILL)
        except ProcessLookupError:
            return False
        self._record("resize", *target)
        return True

    def _kill(self, kind: str, min_age_s: float) -> bool:
        born_before = time.time() - min_age_s
        if kind == "supervisor":
            alive = self.sup is not None and self.sup.poll() is None and self.sup_started <= born_before
            targets = [(self.sup.pid, "ones run")] if alive else []
        else:
            targets = [(p.pid, self._what(p)) for p in self.procs if p.role == kind and p.started_s <= born_before]
        if not targets:
            return False
        pid, what = targets[int(self.rng.integers(len(targets)))]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self._record(kind, pid, what)
        return True

    def _what(self, p: Proc) -> str:
        if p.role == "run-worker":
            return f"run {run_id_of_worker(p.pid, self.procs)[:8] or '?'}"
        return p.describe() if p.role == "rank" else "dagster-daemon"

    # -- the end -----------------------------------------------------------------------------------
    def orphans(self, grace_s: float = 90.0) -> list[Proc]:
        """Processes of the project still there ``grace_s`` after ``ones run`` exited."""
        deadline = time.monotonic() + grace_s
        while (left := project_processes(self.project)) and time.monotonic() < deadline:
            time.sleep(1.0)
        return left

    def cleanup(self) -> None:
        """Stop what is left (the benchmark started all of it): ``ones run`` first (it drains), then by PID."""
        self.watcher.stop()
        if self.sup is not None and self.sup.poll() is None:
            os.kill(self.sup.pid, signal.SIGINT)
            try:
                self.sup.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.sup.kill()
        for p in project_processes(self.project):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def verify(chaos: Chaos, specs, orphans: list[Proc], containers: list[str] | None) -> tuple[list, list[dict], list]:
    """The seven checks, a row per job, and the training runs (run id, tags, start, end, status)."""
    env = chaos.env
    finished, mats, runs = dagster_facts(env, chaos.jobs)
    rows, all_rewinds, table = [], [], []
    for job in chaos.jobs:
        spec, job_dir = specs[job], env.layout.job_dir(job)
        history = samples_history(env.tracking_uri(), job_dir)
        found = rewinds(job, history, chaos.watcher.records[job], generation_starts(job_dir))
        all_rewinds += found
        values = [v for _, v in history]
        count, materialized = mats[job]
        row = JobSamples(job, int(spec.stopping.total_samples(spec.dataset_size)), spec.dataset_size, materialized,
                         result_samples(job_dir), values[-1] if values else None, max(values, default=None), count)
        rows.append(row)
        mine = [r for r in runs if r[1].get("ones/job") == job]
        table.append({"job": job, "epochs": f"{spec.stopping.epochs:g}", "required": row.required,
                      "final": row.materialized, "exact": "yes" if row.exact else "NO", "runs": len(mine),
                      "started": sum(r[2] is not None for r in mine), "failed": sum(r[4] == "FAILURE" for r in mine),
                      "drops": len(found), "worst_lost": max((r.lost for r in found), default=0),
                      "checkpoints_seen": len(chaos.watcher.records[job])})
    overlaps, spans = slot_overlaps([r[:4] for r in runs], time.time())
    rewind_check, _ = check_rewinds(all_rewinds, {r.job: r.interval for r in rows})
    checks = [check_finished(chaos.jobs, finished, env.layout.failed()), check_exact(rows), rewind_check,
              check_overlaps(overlaps, spans, SLOTS), check_orphans(orphans, containers),
              check_double_training(chaos.double, chaos.scans), check_tracebacks(tracebacks(chaos.project))]
    return checks, table, runs


def table_text(rows: list[dict]) -> str:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    return "\n".join(lines + ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows])


def report(chaos: Chaos, checks, table: list[dict], runs: list, wall_s: float) -> None:
    kinds = Counter(k[1] for k in chaos.kills)
    between = sum("between its renames" in k[3] for k in chaos.kills)
    print(f"\nkills: {len(chaos.kills)} of {chaos.args.kills} asked, in {wall_s:.0f} s: "
          + ", ".join(f"{k} {kinds.get(k, 0)}" for k in KINDS)
          + f" (mid-write: {kinds.get('rank-checkpoint', 0) - between} before the rename, {between} between the "
          f"renames; {chaos.watcher.misses} armed writes completed before the freeze and were let go)")
    if chaos.skipped:
        print(f"draws with no target within {chaos.args.target_wait:.0f} s: {dict(chaos.skipped)}")
    if chaos.resizes.requests:
        print(f"in-place resizes requested: {chaos.resizes.requests}; resize kills by change and stage: "
              f"{dict(sorted(chaos.resizes.stages.items()))}")
    print(f"the product's own time limits and changes: "
          f"{recoveries(chaos.project, chaos.env.layout.jobs_dir, chaos.jobs)}")
    print(f"`ones run` launched {chaos.launches} time(s); refused {chaos.refusals} time(s) while the daemon of a "
          "killed supervisor still ran (then what the refusal says: kill -INT)")
    statuses = Counter(r[4] for r in runs)
    print(f"training runs: {len(runs)} ({', '.join(f'{s} {n}' for s, n in sorted(statuses.items()))})\n")
    print(table_text(table))
    print()
    print(table_text([{"check": c.name, "result": "PASS" if c.ok else "FAIL", "detail": c.detail} for c in checks]))
    print(f"\nwall time {wall_s:.0f} s; {'all checks passed' if all(c.ok for c in checks) else 'FAILED'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50, help="kills to make (50)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=5, help="cnn-digits jobs (5)")
    ap.add_argument("--epochs", default="150,300", help="each job's epochs, drawn uniformly from LO,HI (150,300)")
    ap.add_argument("--mean-interval", type=float, default=10.0, help="mean seconds between kills (10)")
    ap.add_argument("--target-wait", type=float, default=60.0,
                    help="seconds to wait for something of the drawn kind to kill before drawing again (60)")
    ap.add_argument("--timeout", type=float, default=2400.0, help="give up after this many seconds (2400)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"what may be killed ({','.join(KINDS)})")
    ap.add_argument("--policy", default="ones", help="the scheduling policy (ones)")
    ap.add_argument("--requested-gpus", type=int, choices=(1, 2), default=1,
                    help="each job's requested slots (1); with --policy fifo, 2 makes every generation hold both "
                         "slots, which the resize kind needs (ones gives one slot each while two jobs wait)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary project (its path is printed)")
    args = ap.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or set(args.kinds) - set(KINDS):
        ap.error(f"--kinds {','.join(args.kinds)}: allowed: {','.join(KINDS)}")
    try:
        lo, hi = (int(x) for x in args.epochs.split(","))
    except ValueError:
        ap.error(f"--epochs {args.epochs!r}: give LO,HI, e.g. 250,450")
    if not 1 <= lo <= hi:
        ap.error(f"--epochs {args.epochs!r}: need 1 <= LO <= HI")
    if args.jobs < 5 or args.kills < 0:
        ap.error("--jobs must be >= 5 and --kills >= 0")
    args.epochs = (lo, hi)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    root = Path(tempfile.mkdtemp(prefix="ones-chaos-"))
    jobs = write_project(root / "project", args, rng)
    env = load_env(root / "project")
    specs, _ = load_job_specs(env.jobs_dir)
    print(f"chaos: {len(jobs)} jobs ({', '.join(f'{j} {specs[j].stopping.epochs:g} ep' for j in jobs)}) on "
          f"{SLOTS} CPU slots, {args.kills} kills (mean interval {args.mean_interval:g} s), seed {args.seed}; "
          f"project {env.project_dir}", flush=True)
    chaos = Chaos(args, env, jobs, rng)
    orphans: list[Proc] = []
    try:
        finished = chaos.run()
        wall_s = time.monotonic() - chaos.t0
        chaos.say("`ones run` exited 0" if finished else f"not finished within {args.timeout:.0f} s")
        chaos.watcher.stop()
        orphans = chaos.orphans() if finished else []
    finally:
        chaos.cleanup()
    checks, table, runs = verify(chaos, specs, orphans, live_containers(jobs))
    if not finished:
        checks[0] = type(checks[0])(checks[0].name, False, checks[0].detail + f"; timed out ({args.timeout:.0f} s)")
    report(chaos, checks, table, runs, wall_s)
    if args.keep:
        print(f"project kept: {env.project_dir} (`ones run` log: {chaos.log_path})")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
