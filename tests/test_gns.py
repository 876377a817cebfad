"""The gradient noise scale of the training step: the estimator against a closed form, the torch probe
(one process and DDP), checkpoint continuity, and a real built-in workload logging it to MLflow.

The synthetic problem: linear regression ``y = x . w* + eps`` with ``x ~ N(0, I_d)``, ``eps ~ N(0, s^2)``,
loss ``(x . w - y)^2 / 2`` at a fixed ``w = w* + delta``. A sample's gradient is ``x (x . delta - eps)``; its
mean is ``G = delta`` and (Isserlis: ``E[x x^T (x . delta)^2] = |delta|^2 I + 2 delta delta^T``) its covariance
``Sigma = (|delta|^2 + s^2) I + delta delta^T``, so ``|G|^2 = |delta|^2``, ``tr(Sigma) = d (|delta|^2 + s^2) +
|delta|^2`` and the noise scale is their ratio (21 samples for ``d = 10``, ``|delta| = 1``, ``s = 1``).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ones_pipeline.train.noise_scale import (
    GradientStats,
    NoiseScaleSmoother,
    default_memory_samples,
    estimate_gradient_stats,
    pair_of_steps,
    replica_harmonic_batch,
)

ROOT = Path(__file__).resolve().parents[1]
DIM = 10
STEPS = 1000
TOLERANCE = 0.2


def truth(sigma: float, delta_sqr: float = 1.0) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) of the synthetic problem."""
    return delta_sqr, DIM * (delta_sqr + sigma**2) + delta_sqr


def sample_grads(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    """Per-sample gradients (n, DIM) at ``delta = (1, ..., 1) / sqrt(DIM)``."""
    delta = np.ones(DIM) / np.sqrt(DIM)
    x = rng.standard_normal((n, DIM))
    return x * (x @ delta - sigma * rng.standard_normal(n))[:, None]


def assert_close_to_truth(smoother: NoiseScaleSmoother, sigma: float) -> None:
    sqr, var = truth(sigma)
    assert smoother.grad_sqr == pytest.approx(sqr, rel=TOLERANCE)
    assert smoother.grad_var == pytest.approx(var, rel=TOLERANCE)
    assert smoother.noise_scale() == pytest.approx(var / sqr, rel=TOLERANCE)


# ------------------------------------------------------------------ the estimator, no torch


@pytest.mark.parametrize("sigma", [1.0, 2.0])
@pytest.mark.parametrize("shares", [(8, 8, 8, 8), (9, 8, 8, 7), (8, 7)], ids=["even", "uneven", "two"])
def test_replica_estimate_matches_the_closed_form(shares, sigma):
    rng = np.random.default_rng(0)
    smoother = NoiseScaleSmoother(memory_samples=1e12)  # a plain mean of the steps' estimates
    replicas, harmonic = replica_harmonic_batch(shares)
    assert replicas == len(shares)
    for _ in range(STEPS):
        local = [sample_grads(rng, n, sigma).mean(0) for n in shares]
        big = sum(shares)
        averaged = sum(n * g for n, g in zip(shares, local, strict=True)) / big
        stats = estimate_gradient_stats(float(np.mean([g @ g for g in local])), float(averaged @ averaged),
                                        harmonic, big)
        smoother.update(stats, big)
    assert_close_to_truth(smoother, sigma)


def test_very_uneven_shares_need_the_harmonic_mean():
    shares, sigma = (12, 4), 1.0
    rng = np.random.default_rng(1)
    harmonic_mean, arithmetic_mean = NoiseScaleSmoother(1e12), NoiseScaleSmoother(1e12)
    for _ in range(STEPS):
        local = [sample_grads(rng, n, sigma).mean(0) for n in shares]
        averaged = (12 * local[0] + 4 * local[1]) / 16
        args = float(np.mean([g @ g for g in local])), float(averaged @ averaged)
        harmonic_mean.update(estimate_gradient_stats(*args, replica_harmonic_batch(shares)[1], 16), 16)
        arithmetic_mean.update(estimate_gradient_stats(*args, 8, 16), 16)
    assert_close_to_truth(harmonic_mean, sigma)
    assert arithmetic_mean.grad_var > 1.3 * truth(sigma)[1]  # an average share (8 instead of 6) is wrong


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_pairs_of_consecutive_steps_match_the_closed_form(sigma):
    rng = np.random.default_rng(2)
    smoother, prev = NoiseScaleSmoother(1e12), None
    for t in range(STEPS):
        n = 20 if t % 3 == 0 else 32  # short steps too (an epoch's last batch)
        g = sample_grads(rng, n, sigma).mean(0)
        if prev is not None:
            smoother.update(pair_of_steps(float(prev[0] @ prev[0]), float(g @ g), float(g @ prev[0]), prev[1], n), n)
        prev = (g, n)
    assert_close_to_truth(smoother, sigma)


def test_the_estimator_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="local_batch < global_batch"):
        estimate_gradient_stats(1.0, 1.0, 32, 32)
    assert replica_harmonic_batch([0, 0]) == (0, 0.0)
    assert replica_harmonic_batch([4, 0, 4]) == (2, 4.0)  # an empty share is no replica


def test_smoother_is_unbiased_from_the_start_and_forgets_with_samples():
    s = NoiseScaleSmoother(memory_samples=100.0)
    assert s.noise_scale() is None and s.metrics(base_batch=8) == {}
    s.update(GradientStats(sqr=2.0, var=50.0), samples=10)
    assert (s.grad_sqr, s.grad_var, s.noise_scale()) == pytest.approx((2.0, 50.0, 25.0))  # no pull towards 0
    for _ in range(200):  # 2000 samples = 20 memories: the old value is forgotten
        s.update(GradientStats(sqr=1.0, var=100.0), samples=10)
    assert s.noise_scale() == pytest.approx(100.0, rel=1e-6)
    assert s.metrics(base_batch=8) == pytest.approx(
        {"grad_noise_scale": 100.0, "gns_grad_sqr": 1.0, "gns_grad_var": 12.5})  # Pollux: tr(Sigma) / M0
    s.update(GradientStats(sqr=float("nan"), var=1.0), samples=10)  # skipped
    assert s.observations == 201


def test_observations_far_apart_are_still_averaged_over_several():
    s = NoiseScaleSmoother(memory_samples=1.0, min_observations=10)  # 100-sample gaps: the memory is 1000
    s.update(GradientStats(sqr=1.0, var=10.0), samples=100)
    s.update(GradientStats(sqr=1.0, var=20.0), samples=100)
    d = math.exp(-0.1)
    assert s.grad_var == pytest.approx((d * 10.0 + 20.0) / (d + 1.0))


def test_noise_dominated_average_reports_components_but_no_scale():
    s = NoiseScaleSmoother(memory_samples=100.0)
    s.update(GradientStats(sqr=-0.5, var=30.0), samples=10)
    assert s.noise_scale() is None
    assert set(s.metrics(base_batch=4)) == {"gns_grad_sqr", "gns_grad_var"}


def test_smoother_state_continues_exactly():
    rng = np.random.default_rng(3)
    obs = [GradientStats(float(a), float(b)) for a, b in rng.uniform(0.1, 2.0, (40, 2))]
    straight, first = NoiseScaleSmoother(300.0), NoiseScaleSmoother(300.0)
    for o in obs:
        straight.update(o, 16)
    for o in obs[:25]:
        first.update(o, 16)
    resumed = NoiseScaleSmoother(300.0)
    resumed.load_state_dict(first.state_dict())
    for o in obs[25:]:
        resumed.update(o, 16)
    assert resumed.state_dict() == pytest.approx(straight.state_dict())
    fresh = NoiseScaleSmoother(300.0)
    fresh.load_state_dict(None)  # a checkpoint from before GNS
    assert fresh.grad_sqr is None


def test_memory_is_adaptdls_but_at_most_an_epoch():
    assert default_memory_samples(base_batch=32, dataset_size=10**9) == pytest.approx(32 * 999.5, rel=1e-3)
    assert default_memory_samples(base_batch=32, dataset_size=1437) == 1437


# ------------------------------------------------------------------ the torch probe

torch = pytest.importorskip("torch")

from ones_pipeline.train.noise_probe import DEFAULT_BUDGET, MAX_INTERVAL, NoiseScaleProbe  # noqa: E402


def linear_problem(seed: int, sigma: float):
    """A bias-free linear model at ``w* + delta`` and a sampler of (x, y) batches of the synthetic problem."""
    gen = torch.Generator().manual_seed(seed)
    w_star = torch.randn(DIM, generator=gen, dtype=torch.float64)
    model = torch.nn.Linear(DIM, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_((w_star + torch.ones(DIM, dtype=torch.float64) / DIM**0.5)[None])

    def batch(n: int):
        x = torch.randn(n, DIM, generator=gen, dtype=torch.float64)
        return x, x @ w_star + sigma * torch.randn(n, generator=gen, dtype=torch.float64)

    return model, batch


def test_one_process_probe_pairs_steps_and_matches_the_closed_form():
    sigma = 1.0
    model, batch = linear_problem(0, sigma)
    probe = NoiseScaleProbe(world_size=1, rank=0, base_batch=32, dataset_size=10**9, budget=math.inf)  # every pair
    probe.smoother = NoiseScaleSmoother(1e12)
    probe.attach(model)
    for t in range(STEPS):
        n = 20 if t % 5 == 0 else 32
        x, y = batch(n)
        model.zero_grad(set_to_none=True)
        (0.5 * (model(x)[:, 0] - y).pow(2).sum() / n).backward()  # the session's loss scale: 1 / n
        probe.observe(probe.local_statistic(n), n)
    assert probe.interval == 1 and probe.smoother.observations == STEPS // 2  # pairs (1, 2), (3, 4), ...
    assert_close_to_truth(probe.smoother, sigma)
    assert probe.metrics()["gns_grad_var"] == pytest.approx(probe.smoother.grad_var / 32)


def test_the_probe_measures_less_often_when_its_share_of_the_step_is_too_big():
    model, batch = linear_problem(1, 1.0)
    probe = NoiseScaleProbe(world_size=1, rank=0, base_batch=32, dataset_size=10**9, budget=1e-9)
    probe.attach(model)
    for _ in range(400):
        x, y = batch(32)
        model.zero_grad(set_to_none=True)
        (0.5 * (model(x)[:, 0] - y).pow(2).sum() / 32).backward()
        probe.observe(probe.local_statistic(32), 32)
    assert probe.interval == MAX_INTERVAL
    # Three pairs at the start (the first is warm-up for the timing), then one in MAX_INTERVAL steps.
    assert probe.smoother.observations == 3 + len(range(6 + MAX_INTERVAL - 2, 400 - 1, MAX_INTERVAL))
    assert probe.smoother.noise_scale() > 0


def test_with_several_processes_only_the_measured_steps_are_hooked():
    """Two ranks with identical shares, simulated in one process: the summed statistics are twice one's."""
    model, batch = linear_problem(2, 1.0)
    probe = NoiseScaleProbe(world_size=2, rank=0, base_batch=16, dataset_size=10**9, budget=1e-9)
    probe.attach(model)
    hooked = []
    for _ in range(300):
        hooked.append(bool(probe._handles))
        x, y = batch(16)
        model.zero_grad(set_to_none=True)
        (0.5 * (model(x[:8])[:, 0] - y[:8]).pow(2).sum() * (2 / 16)).backward()
        probe.observe([2 * v for v in probe.local_statistic(16)], 16)
    assert probe.interval == MAX_INTERVAL
    # The first three steps (the first is warm-up for the timing, the ranks' wanted interval is agreed on
    # before the second is timed), then one in MAX_INTERVAL.
    assert [i for i, h in enumerate(hooked) if h] == [0, 1] + list(range(2, 300, MAX_INTERVAL))
    assert probe.smoother.observations == sum(hooked)
    # Unhooked for real: torch would otherwise still enter Python for every parameter at every backward.
    assert not probe._handles and all(p._backward_hooks is None for p in model.parameters())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DDP_SCRIPT = """
import math, sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from test_gns import STEPS, linear_problem
from ones_pipeline.train.noise_probe import NoiseScaleProbe
from ones_pipeline.train.noise_scale import NoiseScaleSmoother
from ones_pipeline.train.sampler import shard_bounds
rank, world, batch_size, sigma = int(sys.argv[1]), 2, 15, 1.0
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=world)
model, batch = linear_problem(0, sigma)  # every rank draws the same global batch and takes its share
probe = NoiseScaleProbe(world, rank, base_batch=8, dataset_size=10**9, budget=math.inf)  # every step
probe.smoother = NoiseScaleSmoother(1e12)
ddp = torch.nn.parallel.DistributedDataParallel(model)
probe.attach(ddp)
start, stop = shard_bounds(batch_size, rank, world)  # shares 8 and 7
for _ in range(STEPS // 2):
    x, y = batch(batch_size)
    ddp.zero_grad(set_to_none=True)
    loss = 0.5 * (ddp(x[start:stop])[:, 0] - y[start:stop]).pow(2).sum() * (world / batch_size)
    loss.backward()
    sums = torch.tensor(probe.local_statistic(batch_size), dtype=torch.float64)
    dist.all_reduce(sums)
    probe.observe(sums.tolist(), batch_size)
s = probe.smoother
print("RESULT", s.grad_sqr, s.grad_var, s.noise_scale(), s.observations, probe.interval)
probe.budget = 1e-9  # now one step in MAX_INTERVAL: the ranks must hook and skip the same steps
for _ in range(200):
    x, y = batch(batch_size)
    ddp.zero_grad(set_to_none=True)
    (0.5 * (ddp(x[start:stop])[:, 0] - y[start:stop]).pow(2).sum() * (world / batch_size)).backward()
    sums = torch.tensor(probe.local_statistic(batch_size), dtype=torch.float64)
    dist.all_reduce(sums)
    probe.observe(sums.tolist(), batch_size)
print("SPARSE", s.observations, probe.interval, s.grad_sqr)
# The same steps as the first loop, each in two micro-batches of the rank's share (the session's split), the
# first under no_sync: the probe must see the step's whole local gradient, at the step's sample count.
model, batch = linear_problem(0, sigma)
probe = NoiseScaleProbe(world, rank, base_batch=8, dataset_size=10**9, budget=math.inf)
probe.smoother = NoiseScaleSmoother(1e12)
ddp = torch.nn.parallel.DistributedDataParallel(model)
probe.attach(ddp)
cut = start + shard_bounds(stop - start, 0, 2)[1]
for _ in range(STEPS // 2):
    x, y = batch(batch_size)
    ddp.zero_grad(set_to_none=True)
    with ddp.no_sync():
        (0.5 * (ddp(x[start:cut])[:, 0] - y[start:cut]).pow(2).sum() * (world / batch_size)).backward()
    (0.5 * (ddp(x[cut:stop])[:, 0] - y[cut:stop]).pow(2).sum() * (world / batch_size)).backward()
    sums = torch.tensor(probe.local_statistic(batch_size), dtype=torch.float64)
    dist.all_reduce(sums)
    probe.observe(sums.tolist(), batch_size)
s = probe.smoother
print("ACCUM", s.grad_sqr, s.grad_var, s.noise_scale(), s.observations, probe.interval)
dist.destroy_process_group()
"""


def test_ddp_probe_sees_local_and_averaged_gradients_and_matches_the_closed_form(tmp_path):
    script = tmp_path / "ddp_gns.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests"), port=_free_port()))
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [tuple(float(v) for v in line.split()[1:]) for out in outs for line in out.splitlines()
               if line.startswith("RESULT")]
    assert len(results) == 2 and results[0] == results[1]  # every rank ends with the same estimate
    sqr, var, gns, observations, interval = results[0]
    assert interval == 1 and observations == STEPS // 2
    sparse = [line.split()[1:] for out in outs for line in out.splitlines() if line.startswith("SPARSE")]
    assert len(sparse) == 2 and sparse[0] == sparse[1]
    assert int(sparse[0][1]) == MAX_INTERVAL and 2 <= int(sparse[0][0]) - observations <= 5
    true_sqr, true_var = truth(1.0)
    assert sqr == pytest.approx(true_sqr, rel=TOLERANCE)
    assert var == pytest.approx(true_var, rel=TOLERANCE)
    assert gns == pytest.approx(true_var / true_sqr, rel=TOLERANCE)
    # With accumulation (two micro-batches, the first under no_sync) the same estimate, to rounding.
    accum = [tuple(float(v) for v in line.split()[1:]) for out in outs for line in out.splitlines()
             if line.startswith("ACCUM")]
    assert len(accum) == 2 and accum[0] == accum[1]
    assert accum[0][3:] == (observations, interval)
    assert accum[0][:3] == pytest.approx(results[0][:3], rel=1e-9)


# ------------------------------------------------------------------ the session: switch, checkpoints, MLflow

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule  # noqa: E402
from ones_pipeline.train.api import Placement, TrainingSession  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402


def _placement(tmp_path: Path, **kw) -> Placement:
    spec = JobSpec(name="gns-job", model="mlp", dataset_size=64, per_gpu_batch=8,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=1))
    return Placement(spec=spec, rank=0, world_size=1, global_batch=8, lr=0.01, generation=0, state_dir=tmp_path,
                     tracking_uri=None, experiment="ones", **kw)


def test_the_budget_travels_in_the_environment(tmp_path):
    default = _placement(tmp_path)
    assert Placement.from_env(default.to_env()).noise_scale_budget == DEFAULT_BUDGET
    for budget in (0.0, 0.05, math.inf):
        assert Placement.from_env(replace(default, noise_scale_budget=budget).to_env()).noise_scale_budget == budget
    # A launcher builds its ranks' environment from its own plus the placement's: its setting passes through.
    assert Placement.from_env({"ONES_GNS_BUDGET": "0", **default.to_env()}).noise_scale_budget == 0.0
    with pytest.raises(ValueError, match="ONES_GNS_BUDGET='fast': must be a number >= 0"):
        Placement.from_env({**default.to_env(), "ONES_GNS_BUDGET": "fast"})
    with pytest.raises(ValueError, match="budget must be >= 0"):
        NoiseScaleProbe(world_size=1, rank=0, base_batch=8, dataset_size=64, budget=-1.0)


def _train_steps(session: TrainingSession, model, opt, x, y, steps: int) -> None:
    for i, idx in enumerate(session.batches()):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx], reduction="sum") * session.loss_scale()
        loss.backward()
        opt.step()
        session.step_done(loss=float(loss.detach()))
        if i + 1 == steps:
            break


def test_a_resumed_session_continues_the_average_and_old_checkpoints_still_load(tmp_path):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=gen), torch.randn(64, 1, generator=gen)

    def fresh_session():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        session = TrainingSession(_placement(tmp_path), 64)
        return session, session.prepare(model, opt), opt

    session, model, opt = fresh_session()
    _train_steps(session, model, opt, x, y, steps=5)
    assert session.metrics()["grad_noise_scale"] > 0  # the pairs (1, 2) and (3, 4)
    session.checkpoint()
    saved = session._gns.state_dict()
    assert load_checkpoint(tmp_path)["noise_scale"] == saved

    resumed, model, opt = fresh_session()
    assert resumed._gns.state_dict() == saved
    _train_steps(resumed, model, opt, x, y, steps=3)  # the pair (6, 7), then 8 waits for its partner
    assert resumed._gns.state_dict()["observations"] == saved["observations"] + 1
    resumed.checkpoint()

    old = load_checkpoint(tmp_path)
    del old["noise_scale"]  # as written before the noise scale was measured
    save_checkpoint(tmp_path, old)
    from_old, _, _ = fresh_session()
    assert from_old.progress.steps_done == 8 and "grad_noise_scale" not in from_old.metrics()


def test_switched_off_nothing_is_measured(tmp_path):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=gen), torch.randn(64, 1, generator=gen)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    session = TrainingSession(_placement(tmp_path, noise_scale_budget=0.0), 64)
    model = session.prepare(model, opt)
    _train_steps(session, model, opt, x, y, steps=5)
    assert not {"grad_noise_scale", "gns_grad_sqr", "gns_grad_var"} & set(session.metrics())


def test_builtin_workload_logs_a_growing_noise_scale_to_mlflow(tmp_path):
    """mlp-digits on 2 processes for 15 epochs: the loss falls steeply, |G|^2 with it, so the scale grows. (A point is
    logged at each epoch's end and every few seconds between: ``LOG_EVERY_S``.)"""
    mlflow = pytest.importorskip("mlflow")
    from ones_pipeline.adapters.mlflow import read_progress

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "ones_pipeline.train", "--model", "mlp-digits", "--name", "gns", "--epochs", "15",
           "--per-gpu-batch", "16", "--base-lr", "0.01", "--slots", "2", "--state-dir", str(tmp_path / "gns"),
           "--tracking-uri", uri]
    # Every step measured: on this tiny model the default budget allows one in many, and a noisier curve.
    env = {**os.environ, "ONES_GNS_BUDGET": "inf"}
    assert subprocess.run(cmd, cwd=ROOT, env=env, timeout=300).returncode == 0
    progress = read_progress(uri, "ones", ["gns"])["gns"]
    client = mlflow.tracking.MlflowClient(uri)

    def history(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(progress.run_id, key))

    gns, samples = history("grad_noise_scale"), [s for s, _ in history("samples")]
    # Logged with the other metrics; the scale is left out where the averaged |G|^2 is not positive (possible
    # while the first, noisy measurements dominate the average), the components never are.
    assert [s for s, _ in history("gns_grad_sqr")] == [s for s, _ in history("gns_grad_var")] == samples
    assert {s for s, _ in gns} <= set(samples) and len(gns) >= 0.8 * len(samples), (gns, samples)
    values = np.array([v for _, v in gns])
    assert len(values) >= 12 and (values > 0).all()
    quarter = len(values) // 4
    assert values[-quarter:].mean() > 2 * values[:quarter].mean(), gns
    assert progress.grad_noise_scale == pytest.approx(values[-1])  # what the scheduler reads
