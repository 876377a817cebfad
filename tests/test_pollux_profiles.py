"""Ground truth of the six Pollux models, checked against the real profile files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from ones_pipeline.sim.pollux_profiles import (
    POLLUX_MODELS,
    PolluxModelProfile,
    consolidated_placement,
    ideal_run_time_s,
    load_pollux_profile,
)
from ones_pipeline.sim.truth import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACES = SHARED / "pollux" / "traces"

if not TRACES.is_dir():
    pytest.skip(f"Pollux traces not found at {TRACES}", allow_module_level=True)

EPOCHS = {"bert": 2, "ncf": 10, "yolov3": 50, "deepspeech2": 80, "imagenet": 90, "cifar10": 100}
BASE = {"cifar10": 128, "ncf": 256, "deepspeech2": 20, "bert": 12, "yolov3": 8, "imagenet": 200}


@pytest.fixture(scope="module", params=POLLUX_MODELS)
def prof(request) -> PolluxModelProfile:
    return load_pollux_profile(TRACES, request.param)


def _placements(model: str) -> pd.DataFrame:
    df = pd.read_csv(TRACES / model / "placements.csv")
    df["key"] = [tuple(sorted((int(c) for c in str(p)), reverse=True)) for p in df["placement"]]
    return df


def _validation(model: str, batch: int) -> pd.DataFrame:
    return pd.read_csv(TRACES / model / f"validation-{batch}.csv")


def test_sizes_and_epochs(prof):
    m0 = BASE[prof.model]
    val = _validation(prof.model, m0)
    assert prof.base_batch == m0
    assert prof.epochs == EPOCHS[prof.model] == len(val)
    assert prof.total_progress == pytest.approx(m0 * val["progress"].iloc[-1], rel=1e-12)
    assert prof.dataset_size == round(m0 * val["progress"].iloc[0])
    assert prof.total_progress / prof.dataset_size == pytest.approx(EPOCHS[prof.model], rel=2e-3)
    assert prof.max_local_batch == _placements(prof.model)["local_bsz"].max()
    assert prof.max_batch == max(prof.validation_batches)
    assert prof.restart_cost_s == 30.0


def test_profiles_are_cached():
    assert load_pollux_profile(TRACES, "cifar10") is load_pollux_profile(str(TRACES), "cifar10", 30)
    other = load_pollux_profile(TRACES, "cifar10", restart_cost_s=10.0)
    assert other.restart_cost_s == 10.0 and other is not load_pollux_profile(TRACES, "cifar10")


def test_exact_placement_returns_csv_values(prof):
    df = _placements(prof.model)
    single = df.groupby("key")["placement"].nunique()
    keys = [k for k in single.index if single[k] == 1][:6]
    assert keys
    for key in keys:
        for _, row in df[df["key"] == key].iterrows():
            step, sync = prof.step_time(key, int(row["local_bsz"]))
            assert step == pytest.approx(row["step_time"], rel=1e-12)
            assert sync == pytest.approx(min(row["sync_time"], row["step_time"]), rel=1e-12)


def test_orderings_of_a_placement_are_averaged():
    p = load_pollux_profile(TRACES, "cifar10")
    df = _placements("cifar10")
    rows = df[(df["key"] == (4, 3, 2, 1)) & (df["local_bsz"] == 64)]
    assert len(rows) > 1  # 1234, 1243, 1324, ... were all measured
    step, _ = p.step_time((4, 3, 2, 1), 64)
    assert step == pytest.approx(rows["step_time"].mean(), rel=1e-12)
    assert p.step_time((1, 2, 3, 4), 64) == p.step_time((4, 3, 2, 1), 64)


def test_local_batch_interpolation_between_neighbours(prof):
    df = _placements(prof.model)
    for key in [(1,), (4,), (2, 2), (4, 4, 4, 4)]:
        g = df[df["key"] == key].groupby("local_bsz")["step_time"].mean()
        bs = list(g.index)
        for lo, hi in zip(bs[:-1], bs[1:], strict=False):
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            step, sync = prof.step_time(key, mid)
            assert min(g[lo], g[hi]) - 1e-12 <= step <= max(g[lo], g[hi]) + 1e-12
            w = (mid - lo) / (hi - lo)
            assert step == pytest.approx(g[lo] + w * (g[hi] - g[lo]), rel=1e-9)
            assert 0 < sync <= step


def test_extrapolation_stays_positive(prof):
    for key in [(1,), (4,), (4, 4), (4,) * 5, (2,) * 7, (4,) * 16, (1,) * 20]:
        for b in (1, 2, prof.max_local_batch, 2 * prof.max_local_batch):
            step, sync = prof.step_time(key, b)
            assert step > 0 and 0 < sync <= step


def test_unmeasured_placement_uses_scalability_table(prof):
    sc = pd.read_csv(TRACES / prof.model / "scalability.csv")
    assert not prof.is_measured((4,) * 6)
    for _, row in sc[(sc["num_nodes"] == 6) & (sc["num_replicas"] == 24)].iterrows():
        step, sync = prof.step_time((4,) * 6, int(row["local_bsz"]))
        assert step == pytest.approx(row["step_time"], rel=1e-9)
        assert sync == pytest.approx(min(row["sync_time"], row["step_time"]), rel=1e-9)
    # 8 nodes x 2 GPUs = 16 replicas, measured in scalability.csv as (8, 16).
    row = sc[(sc["num_nodes"] == 8) & (sc["num_replicas"] == 16)].iloc[0]
    assert prof.step_time((2,) * 8, int(row["local_bsz"]))[0] == pytest.approx(row["step_time"], rel=1e-9)


def test_unmeasured_placement_lies_between_neighbours(prof):
    b = int(_placements(prof.model)["local_bsz"].min())
    # 5 nodes: between 4 nodes (16 GPUs, the most measured there) and 6 nodes (20 GPUs).
    five = prof.step_time((4,) * 5, b)[0]
    four = prof.step_time((4,) * 4, b)[0]
    six = prof.step_time((4, 4, 4, 4, 2, 2), b)[0]
    assert min(four, six) - 1e-12 <= five <= max(four, six) + 1e-12
    # 6 nodes, 9 replicas: between the measured 8 and 10 replicas on 6 nodes.
    nine = prof.step_time((4, 1, 1, 1, 1, 1), b)[0]
    eight = prof.step_time((3, 1, 1, 1, 1, 1), b)[0]
    ten = prof.step_time((3, 3, 1, 1, 1, 1), b)[0]
    assert nine == pytest.approx((eight + ten) / 2, rel=1e-9)


def test_efficiency_is_one_at_base_batch_and_drops_above(prof):
    m0 = prof.base_batch
    for frac in (0.0, 0.1, 0.5, 0.9, 1.0, 1.5):
        prog = frac * prof.total_progress
        assert prof.efficiency(prog, m0) == pytest.approx(1.0, abs=1e-12)
        for mult in (2, 4):
            assert prof.efficiency(prog, mult * m0) <= 1.0 + 1e-12
        assert 0 < prof.efficiency(prog, prof.max_batch) < 1.0


@pytest.mark.parametrize("model", ["cifar10", "imagenet", "yolov3"])
def test_efficiency_decreases_with_batch(model):
    """Strictly early in training; later the per-file gradient statistics are noisy (the measured runs
    differ), so efficiency may rise by a few tenths of a percent between neighbouring batches."""
    p = load_pollux_profile(TRACES, model)
    for frac, tol in ((0.05, 1e-12), (0.3, 1e-12), (0.7, 5e-3), (1.0, 5e-3)):
        effs = [p.efficiency(frac * p.total_progress, b) for b in range(p.base_batch, p.max_batch + 1, p.base_batch)]
        assert all(a >= b - tol for a, b in zip(effs, effs[1:], strict=False))
        assert effs[-1] < effs[0]


def test_efficiency_matches_readme_formula_at_a_measured_epoch(prof):
    batch = prof.validation_batches[2]
    m0_val = _validation(prof.model, prof.base_batch)
    val = _validation(prof.model, batch)
    steps = float(val["progress"].iloc[1])
    # Grad stats of the batch file at its own epoch progress (exact row).
    sqr, var = float(val["grad_sqr"].iloc[1]), float(val["grad_var"].iloc[1])
    s = batch / prof.base_batch
    expected = (var + sqr) / (var / s + sqr) / s
    assert prof.efficiency(steps * prof.base_batch, batch) == pytest.approx(expected, rel=1e-9)
    # Noise scale from the M0 file at an epoch row.
    row = m0_val.iloc[1]
    gns = row["grad_var"] / row["grad_sqr"] * prof.base_batch
    assert prof.grad_noise_scale(row["progress"] * prof.base_batch) == pytest.approx(gns, rel=1e-9)


def test_efficiency_interpolates_between_batch_files():
    p = load_pollux_profile(TRACES, "cifar10")
    prog = 0.5 * p.total_progress
    lo, hi = p.efficiency(prog, 256), p.efficiency(prog, 512)
    assert min(lo, hi) <= p.efficiency(prog, 384) <= max(lo, hi)


def test_grad_noise_scale_positive(prof):
    for frac in (0.0, 0.01, 0.25, 0.5, 0.75, 1.0, 2.0):
        assert prof.grad_noise_scale(frac * prof.total_progress) > 0


def test_metrics(prof):
    first = prof.metrics(0.0)
    last = prof.metrics(prof.total_progress)
    for frac in (0.0, 0.2, 0.5, 1.0):
        loss, acc = prof.metrics(frac * prof.total_progress)
        assert 0.0 <= acc <= 1.0 and loss > 0
    assert last[1] > first[1] and last[0] < first[0]


def test_ideal_run_time_is_plausible():
    p = load_pollux_profile(TRACES, "cifar10")
    assert consolidated_placement(6) == (4, 2)
    assert consolidated_placement(3) == (3,)
    one = ideal_run_time_s(p, 1, 128)
    eight = ideal_run_time_s(p, 8, 2048)
    assert 0 < eight < one
    bert = load_pollux_profile(TRACES, "bert")
    assert ideal_run_time_s(bert, 6, 384) > 0  # needs gradient accumulation (64 per GPU > 12)


def test_missing_profile_folder_and_file(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        PolluxModelProfile(tmp_path, "cifar10")
    shutil.copytree(TRACES / "bert", tmp_path / "bert")
    (tmp_path / "bert" / "scalability.csv").unlink()
    with pytest.raises(TraceError, match="scalability.csv"):
        PolluxModelProfile(tmp_path, "bert")
    shutil.copy(TRACES / "bert" / "scalability.csv", tmp_path / "bert" / "scalability.csv")
    (tmp_path / "bert" / "placements.csv").write_text("placement,local_bsz,step_time\n1,4,0.5\n")
    with pytest.raises(TraceError, match="sync_time"):
        PolluxModelProfile(tmp_path, "bert")
