"""In-place resize of a running generation (``train.resize_control``, ``train.membership``) end to end: real
launchers, real rank processes (gloo on CPU slots), resizes requested through ``request_resize``, stops through
the scheduler's preemption file, kill -9 and SIGSTOP from outside. Every rank logs each step it trains
(``benchmarks/step_log.py`` as the job's command), and the checks read those logs and the checkpoint: every
step trained exactly its rank's share of the epoch order at its position, every member of the step's group
took part once, and the steps chain without a gap or a repeat from the first sample to the checkpoint's
sample count."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ones_pipeline.config.layout import PROGRESS_FILE, preempt_request_file  # noqa: E402
from ones_pipeline.train.__main__ import build_parser, progress_line, request_from  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint  # noqa: E402
from ones_pipeline.train.resize_control import in_place_reason, request_resize  # noqa: E402
from ones_pipeline.train.sampler import EpochOrder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N = 1437  # digits' training set
SPEC = {"name": "inplace", "model": "mlp-digits", "dataset_size": N, "per_gpu_batch": 16, "base_lr": 0.05,
        "max_lr": 0.2, "requested_gpus": 1, "stopping": {"kind": "epochs", "epochs": 100000},
        "command": ["python", str(ROOT / "benchmarks" / "step_log.py")]}


class Job:
    """One job's launchers, one generation at a time, as the scheduler would run them."""

    def __init__(self, root: Path, resize_timeout: float = 60.0, tracking_uri: str | None = None, spec: dict = SPEC):
        self.state, self.timeout, self.uri = root / "job", resize_timeout, tracking_uri
        self.state.mkdir(parents=True)
        (root / "spec.json").write_text(json.dumps(spec))
        self.spec_file, self.gen, self.size, self.proc = root / "spec.json", -1, 0, None

    def start(self, slots: int, logs_steps: bool = True) -> None:
        self.gen, self.size = self.gen + 1, slots
        env = {**os.environ, "STEP_LOG_INDICES": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ones_pipeline.train", "--spec", str(self.spec_file), "--slots", str(slots),
             "--generation", str(self.gen), "--state-dir", str(self.state), "--grace-period", "30",
             "--resize-timeout", str(self.timeout), *(["--tracking-uri", self.uri] if self.uri else [])],
            cwd=ROOT, env=env)
        if logs_steps:
            self.trains(slots)

    def rows(self) -> list[dict]:
        out = []
        for f in self.state.glob("steps-*.jsonl"):
            pid = int(f.stem.split("-")[1])
            out += [{**json.loads(line), "pid": pid} for line in f.read_text().splitlines() if line.endswith("}")]
        return out

    def events(self, name: str) -> list[dict]:
        path = self.state / PROGRESS_FILE
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        return [r for r in rows if r.get("event") == name]

    def trains(self, world: int, steps: int = 10, timeout: float = 120.0) -> None:
        """Wait until ``steps`` steps at ``world`` processes in the current generation started from now on."""
        since, deadline = time.time(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(r["world"] == world and r["gen"] == self.gen and r["t0"] >= since for r in self.rows()) >= steps:
                return
            assert self.proc.poll() is None, f"launcher exited with {self.proc.returncode}"
            time.sleep(0.1)
        pytest.fail(f"no training at {world} process(es) within {timeout:.0f} s")

    def resize(self, slots: int) -> None:
        request_resize(self.state, self.gen, list(range(slots)))
        self.size = slots
        self.trains(slots)

    def restart(self, slots: int) -> None:
        """The checkpoint path: the scheduler's preemption, then a new generation."""
        preempt_request_file(self.state, self.gen).write_text(json.dumps({"reason": "test"}))
        assert self.proc.wait(timeout=120) == 0
        self.start(slots)

    def ranks(self) -> list[psutil.Process]:
        """The launcher's rank processes, by rank (its children: it starts them)."""
        procs = psutil.Process(self.proc.pid).children()
        return sorted(procs, key=lambda p: int(p.environ().get("ONES_RANK", 0)))

    def kill_rank(self) -> None:
        """kill -9 one rank: the launcher fails, and the job's next generation resumes from the checkpoint."""
        os.kill(self.ranks()[-1].pid, signal.SIGKILL)
        assert self.proc.wait(timeout=120) != 0
        self.start(self.size)

    def stop(self) -> dict:
        preempt_request_file(self.state, self.gen).write_text(json.dumps({"reason": "test"}))
        assert self.proc.wait(timeout=120) == 0
        return load_checkpoint(self.state)["progress"]


def check_exact(job: Job, progress: dict, lossless: bool = False) -> None:
    """Every step trained its rank's share of the epoch order; the committed steps chain to the checkpoint;
    ``lossless``: and no step was trained and then lost (redone from an older checkpoint)."""
    order = EpochOrder(N, seed=0)
    instances: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    params: dict[tuple, list[float]] = defaultdict(list)
    for r in job.rows():
        share = order.batch_indices(r["epoch"], r["pos"], r["batch"], r["rank"], r["world"]).tolist()
        assert r["idx"] == share, f"rank {r['rank']}/{r['world']} at {r['epoch']}:{r['pos']} trained other samples"
        instances[(r["epoch"], r["pos"], r["batch"], r["world"], r["gen"])][r["rank"]].append(r["t0"])
        params[(r["epoch"], r["pos"], r["batch"], r["world"], r["gen"])].append(r["params"])
    latest: dict[tuple[int, int], tuple[float, tuple]] = {}  # the last instance of a step at each position
    for key, by_rank in instances.items():
        t = max(max(ts) for ts in by_rank.values())
        if key[:2] not in latest or t > latest[key[:2]][0]:
            latest[key[:2]] = (t, key)
    epoch, pos, samples, chain = 0, 0, 0, set()
    while samples < progress["samples_done"]:  # the steps the checkpoint descends from
        assert (epoch, pos) in latest, f"no step at epoch {epoch} position {pos} ({samples} samples)"
        key = latest[(epoch, pos)][1]
        by_rank, world = instances[key], key[3]
        chain.add(key)
        # every member of the group, each once: no share missing, none trained by two processes
        assert set(by_rank) == set(range(world)) and {len(ts) for ts in by_rank.values()} == {1}, (key, by_rank)
        # the replicas agree after the step (model and optimizer state were handed over, DDP synchronised)
        assert max(params[key]) - min(params[key]) <= 1e-6 * max(1.0, abs(params[key][0])), (key, params[key])
        took = min(key[2], N - pos)
        samples, pos = samples + took, pos + took
        if pos == N:
            epoch, pos = epoch + 1, 0
    assert samples == progress["samples_done"] == progress["epoch"] * N + progress["position"]
    if lossless:
        assert not set(instances) - chain, f"steps trained, then lost: {sorted(set(instances) - chain)[:5]}"


OPS = st.lists(st.sampled_from(["resize", "restart", "kill"]), min_size=1, max_size=2)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, start=st.sampled_from([1, 2]))
@example(ops=["resize", "kill", "restart"], start=1)  # grow in place, kill -9 at 2, checkpoint path 2 -> 1
def test_any_mix_of_in_place_resizes_restarts_and_kills_keeps_the_data_exact(ops, start):
    with tempfile.TemporaryDirectory(prefix="inplace-") as tmp:
        job = Job(Path(tmp))
        job.start(start)
        resizes = 0
        for op in ops:
            if op == "resize":
                job.resize(3 - job.size)  # 1 <-> 2
                resizes += 1
            elif op == "restart":
                job.restart(3 - job.size)
            else:
                job.kill_rank()
        check_exact(job, job.stop(), lossless="kill" not in ops)
        assert len(job.events("resized")) == resizes and not job.events("resize_fallback")


def test_a_new_member_killed_while_warming_up_falls_back_to_the_checkpoint(tmp_path):
    job = Job(tmp_path)
    job.start(1)
    before = {p.pid for p in job.ranks()}
    request_resize(job.state, job.gen, [0, 1])
    deadline = time.monotonic() + 30
    while not (new := [p for p in job.ranks() if p.pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(new[0].pid, signal.SIGKILL)
    job.trains(2)  # the same launcher, restarted on both slots from the checkpoint
    assert job.proc.poll() is None
    [fallback] = job.events("resize_fallback")
    assert fallback["to"] == 2 and "warming up" in fallback["reason"]
    # the old member had not paused: it stopped with a checkpoint, and nothing it trained is redone
    assert [e["samples"] for e in job.events("stopped")]
    check_exact(job, job.stop(), lossless=True)


def test_rank_0_killed_during_a_shrink_falls_back_to_the_checkpoint(tmp_path):
    job = Job(tmp_path)
    job.start(2)
    rank0 = job.ranks()[0]
    os.kill(rank0.pid, signal.SIGSTOP)  # it cannot complete the change: the kill lands during it
    request_resize(job.state, job.gen, [0])
    time.sleep(1.5)  # the launcher polls its request file every 50 ms
    os.kill(rank0.pid, signal.SIGKILL)
    job.trains(1)
    [fallback] = job.events("resize_fallback")
    assert fallback["from"] == 2 and fallback["to"] == 1 and "during the change" in fallback["reason"]
    check_exact(job, job.stop())


def test_a_member_that_hangs_during_a_change_cannot_hold_the_group_forever(tmp_path):
    """SIGSTOP a member as the shrink is asked for: the others wait for it in a collective (their own timeout is
    minutes); the launcher gives the change ``--resize-timeout`` seconds, then restarts from the checkpoint."""
    job = Job(tmp_path, resize_timeout=6.0)
    job.start(2)
    os.kill(job.ranks()[1].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    request_resize(job.state, job.gen, [0])
    job.trains(1, steps=1, timeout=60)
    assert 6.0 <= time.monotonic() - t0 < 40
    [fallback] = job.events("resize_fallback")
    assert "within 6 s" in fallback["reason"]
    check_exact(job, job.stop())


def test_bad_resize_requests_are_refused_with_the_reason(tmp_path):
    for slots in ([], [0, 0], [-1]):
        with pytest.raises(ValueError, match="slots must be distinct ids >= 0"):
            request_resize(tmp_path, 0, slots)
    with pytest.raises(ValueError, match="global_batch must be >= 1"):
        request_resize(tmp_path, 0, [0], global_batch=0)
    assert not list(tmp_path.iterdir())


def test_the_run_log_says_which_path_a_resize_took(tmp_path):
    args = build_parser().parse_args(["--name", "j", "--epochs", "1", "--state-dir", str(tmp_path), "--slots", "2"])
    req = request_from(args)
    grew = progress_line(req, {"event": "resized", "from": 1, "to": 2, "paused_s": 0.37, "samples": 640,
                               "global_batch": 64, "generation": 3})
    assert grew == "j generation 3: grew 1 -> 2 CPU slots in place at 640 samples, 0.4 s without training; " \
                   "global batch 64"
    shrank = progress_line(req, {"event": "resized", "from": 2, "to": 1, "paused_s": 0.05, "samples": 9,
                                 "global_batch": 32, "generation": 3})
    assert shrank.startswith("j generation 3: shrank 2 -> 1 CPU slot in place")
    fell = progress_line(req, {"event": "resize_fallback", "from": 1, "to": 2, "generation": 3,
                               "reason": "a new process exited with -9 while warming up"})
    assert fell == ("j generation 3: in-place resize 1 -> 2 failed (a new process exited with -9 while warming "
                    "up): restarted from the checkpoint")


def test_the_mlflow_run_shows_an_in_place_change(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = Job(tmp_path, tracking_uri=uri)
    job.start(1)
    job.resize(2)
    check_exact(job, job.stop(), lossless=True)
    from ones_pipeline.adapters.mlflow import read_progress

    run = mlflow.tracking.MlflowClient(uri).get_run(read_progress(uri, "ones", ["inplace"])["inplace"].run_id)
    assert run.data.tags["ones.last_resize"].startswith("grew 1 -> 2 processes in place at ")
    assert run.data.tags["ones.restarts"] == "0" and run.info.status == "KILLED"


def test_a_user_script_on_the_session_loop_is_resized_in_place_unchanged(tmp_path):
    """examples/train_user_script.py as it is: grown and shrunk in place, then stopped with a checkpoint."""
    spec = {**json.loads((ROOT / "examples" / "user_job.json").read_text()),
            "stopping": {"kind": "epochs", "epochs": 100000}}
    job = Job(tmp_path, spec=spec)
    job.start(1, logs_steps=False)

    def event(name: str, n: int) -> None:
        deadline = time.monotonic() + 120
        while len(job.events(name)) < n:
            assert job.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)

    event("training", 1)
    request_resize(job.state, 0, [0, 1])
    event("resized", 1)
    request_resize(job.state, 0, [0])
    event("resized", 2)
    progress = job.stop()
    assert [(e["from"], e["to"]) for e in job.events("resized")] == [(1, 2), (2, 1)]
    assert not job.events("resize_fallback") and progress["restarts"] == 0
    assert progress["samples_done"] == progress["epoch"] * 1500 + progress["position"] > 0


def test_which_changes_can_be_made_in_place():
    assert in_place_reason("cpu", [3, 4], [0]) is None  # CPU slots are interchangeable
    assert in_place_reason("gpu", [2, 3], [2, 5]) is None  # rank 0 keeps its GPU
    assert "rank 0's GPU 2" in in_place_reason("gpu", [2, 3], [3])


def test_a_newcomer_whose_launcher_dies_as_it_joins_exits_at_once(tmp_path):
    """benchmarks/chaos.py: a launcher killed while its newcomer joined a grow (the plan written, the old member
    not coming) left the newcomer waiting in the group's rendezvous for a minute beside the job's next generation.
    A rank inside a membership change now exits as soon as its launcher is gone."""
    job = Job(tmp_path)
    job.start(1)
    [old] = job.ranks()
    request_resize(job.state, job.gen, [0, 1])
    deadline = time.monotonic() + 60
    while not (newcomers := [p for p in job.ranks() if p.pid != old.pid]):
        assert time.monotonic() < deadline, "no newcomer within 60 s"
        time.sleep(0.01)
    [new] = newcomers
    os.kill(old.pid, signal.SIGSTOP)  # the old member never comes to the rendezvous
    while not list(job.state.glob(".resize-*/plan-*.json")):  # the newcomer ready: the launcher wrote the plan
        assert time.monotonic() < deadline, "no plan for the grow within 60 s"
        time.sleep(0.01)
    time.sleep(1.0)  # the newcomer reads the plan and waits in the rendezvous for the old member
    os.kill(job.proc.pid, signal.SIGKILL)  # the launcher
    job.proc.wait(timeout=30)
    try:
        gone_by = time.monotonic() + 15
        while new.is_running() and new.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < gone_by, "the newcomer outlived its launcher by 15 s"
            time.sleep(0.1)
    finally:
        for p in (old, new):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
