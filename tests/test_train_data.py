"""Built-in models and datasets, and the elastic sampler's exactly-once guarantee."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ones_pipeline.train.data import DATASET_NAMES, DatasetInfo, load_dataset
from ones_pipeline.train.models import MODEL_NAMES, build_model
from ones_pipeline.train.sampler import EpochOrder, batch_size_at, shard_bounds, steps_in_epoch_from


@pytest.fixture(scope="module")
def datasets():
    return {
        "digits": load_dataset("digits", seed=0),
        "cifar-synthetic": load_dataset("cifar-synthetic", seed=0, train_size=64, test_size=16),
    }


# -- models -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", DATASET_NAMES)
@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_models_forward_shapes(datasets, dataset, model_name):
    train, _, info = datasets[dataset]
    torch.manual_seed(0)
    model = build_model(model_name, info.num_classes, info.input_shape)
    x, y = train.tensors[0][:4], train.tensors[1][:4]
    out = model(x)
    assert out.shape == (4, info.num_classes)
    torch.nn.functional.cross_entropy(out, y).backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert model(x[:1]).shape == (1, info.num_classes)


def test_same_seed_same_initial_model():
    torch.manual_seed(3)
    a = build_model("cnn", 10, (1, 8, 8))
    torch.manual_seed(3)
    b = build_model("cnn", 10, (1, 8, 8))
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=False))


def test_resnet18_structure():
    model = build_model("resnet18", 10, (3, 32, 32))
    n_params = sum(p.numel() for p in model.parameters())
    assert 11.0e6 < n_params < 11.3e6  # CIFAR ResNet-18 has about 11.17M parameters
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) == 17  # 3x3 stem + 8 basic blocks x 2
    assert convs[0].stride == (1, 1)


def test_unknown_model_and_bad_shapes():
    with pytest.raises(ValueError, match=r"'vgg'.*mlp, cnn, resnet18"):
        build_model("vgg", 10, (3, 32, 32))
    with pytest.raises(ValueError, match="input shape"):
        build_model("cnn", 10, (64,))
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", 0, (64,))
    assert build_model("mlp", 3, (64,))(torch.zeros(2, 64)).shape == (2, 3)


# -- datasets -----------------------------------------------------------------------------------------
def test_unknown_dataset():
    with pytest.raises(ValueError, match=r"'mnist'.*digits, cifar-synthetic"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="fixed size"):
        load_dataset("digits", train_size=10)


def test_digits_offline_and_deterministic(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("digits must load without network access")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    train, test, info = load_dataset("digits", seed=0)
    assert info == DatasetInfo(num_classes=10, input_shape=(1, 8, 8), name="digits")
    assert len(train) == 1437 and len(test) == 360
    x, y = train.tensors
    assert x.shape == (len(train), 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert set(y.tolist()) == set(range(10))
    assert abs(float(x.mean())) < 0.05  # standardised with the train split's statistics
    again = load_dataset("digits", seed=0)
    for a, b in zip(train.tensors + test.tensors, again[0].tensors + again[1].tensors, strict=False):
        assert torch.equal(a, b)
    other = load_dataset("digits", seed=1)
    assert not torch.equal(other[1].tensors[1], test.tensors[1])


def test_digits_read_from_the_shipped_file_equal_scikit_learns_loader_without_importing_it():
    """The digits are read straight from the file scikit-learn ships (its import cost a rank ~5 s of CPU):
    the same arrays as ``load_digits``, and a rank that loads them does not import scikit-learn."""
    from sklearn.datasets import load_digits

    from ones_pipeline.train import data as data_mod

    assert data_mod._digits_file() is not None
    x, y = data_mod._digits_raw()
    bunch = load_digits()
    assert np.array_equal(x, bunch.data) and np.array_equal(y, bunch.target) and x.dtype == np.float64
    code = ("import sys; from ones_pipeline.train.data import load_dataset; load_dataset('digits', seed=0); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", (out.stdout, out.stderr[-2000:])


def test_cifar_synthetic_deterministic_and_sized():
    train, test, info = load_dataset("cifar-synthetic", seed=5, train_size=200, test_size=50)
    assert info == DatasetInfo(num_classes=10, input_shape=(3, 32, 32), name="cifar-synthetic")
    assert train.tensors[0].shape == (200, 3, 32, 32) and len(test) == 50
    train2, test2, _ = load_dataset("cifar-synthetic", seed=5, train_size=300, test_size=50)
    assert torch.equal(test.tensors[0], test2.tensors[0])  # the test set does not depend on train_size
    assert torch.equal(train.tensors[0], train2.tensors[0][:200])
    assert not torch.equal(load_dataset("cifar-synthetic", seed=6, train_size=200, test_size=50)[0].tensors[0],
                           train.tensors[0])
    with pytest.raises(ValueError, match="train_size"):
        load_dataset("cifar-synthetic", train_size=0)


def _train_and_score(name: str, model_name: str, epochs: int, lr: float, **sizes) -> tuple[float, float]:
    torch.manual_seed(0)
    train, test, info = load_dataset(name, seed=0, **sizes)
    model = build_model(model_name, info.num_classes, info.input_shape)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    (x, y), (xt, yt) = train.tensors, test.tensors

    def score() -> float:
        with torch.no_grad():
            return float((model(xt).argmax(1) == yt).float().mean())

    before = score()
    order = EpochOrder(len(x), seed=0)
    for epoch in range(epochs):
        for pos in range(0, len(x), 32):
            idx = torch.as_tensor(order.batch_indices(epoch, pos, 32, 0, 1))
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return before, score()


def test_mlp_learns_digits():
    before, after = _train_and_score("digits", "mlp", epochs=3, lr=0.05)
    assert before < 0.3 and after > 0.9


def test_cifar_synthetic_is_learnable():
    before, after = _train_and_score("cifar-synthetic", "mlp", epochs=3, lr=0.005, train_size=1000, test_size=500)
    assert before < 0.2 and after > 0.4


# -- sampler ------------------------------------------------------------------------------------------
def test_permutation_deterministic_per_seed_and_epoch():
    order = EpochOrder(100, seed=7)
    p0 = order.permutation(0)
    assert sorted(p0.tolist()) == list(range(100))
    assert np.array_equal(p0, EpochOrder(100, seed=7).permutation(0))
    assert not np.array_equal(p0, order.permutation(1))
    assert not np.array_equal(p0, EpochOrder(100, seed=8).permutation(0))
    p0[:] = 0  # callers get a copy
    assert np.array_equal(order.permutation(0), EpochOrder(100, seed=7).permutation(0))


def test_shard_bounds_and_helpers():
    assert [shard_bounds(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [shard_bounds(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]  # ranks 2, 3 idle
    assert steps_in_epoch_from(0, 32, 100) == 4
    assert steps_in_epoch_from(96, 32, 100) == 1
    assert steps_in_epoch_from(100, 32, 100) == 0
    assert batch_size_at(96, 32, 100) == 4
    order = EpochOrder(10, seed=0)
    with pytest.raises(ValueError, match="position"):
        order.batch_indices(0, 10, 4, 0, 1)
    with pytest.raises(ValueError, match="rank"):
        order.batch_indices(0, 0, 4, 2, 2)
    with pytest.raises(ValueError, match="global_batch"):
        order.batch_indices(0, 0, 0, 0, 1)
    assert order.batch_indices(0, 8, 4, 0, 1).tolist() == order.permutation(0)[8:].tolist()
    assert order.batch_indices(0, 0, 1, 1, 2).size == 0


segment = st.tuples(st.integers(1, 4), st.integers(1, 64), st.integers(1, 6))  # (world_size, global_batch, steps)


@settings(max_examples=150, deadline=None)
@given(dataset_size=st.integers(1, 400), seed=st.integers(0, 2**31), epoch=st.integers(0, 5),
       segments=st.lists(segment, min_size=1, max_size=12))
def test_elastic_resume_sees_every_sample_exactly_once(dataset_size, seed, epoch, segments):
    """A job stopped and resumed under any sequence of (world size, global batch) covers the epoch once."""
    seen: list[int] = []
    position = 0
    k = 0
    while position < dataset_size:
        world_size, global_batch, steps = segments[min(k, len(segments) - 1)]
        k += 1
        order = EpochOrder(dataset_size, seed)  # a fresh process after every resize
        for _ in range(steps):
            if position >= dataset_size:
                break
            shares = [order.batch_indices(epoch, position, global_batch, r, world_size) for r in range(world_size)]
            sizes = [len(s) for s in shares]
            assert max(sizes) - min(sizes) <= 1
            step = np.concatenate(shares)
            assert len(step) == batch_size_at(position, global_batch, dataset_size)
            seen.extend(step.tolist())
            position += len(step)
    assert position == dataset_size
    assert sorted(seen) == list(range(dataset_size))
    assert seen == EpochOrder(dataset_size, seed).permutation(epoch).tolist()  # the same order throughout


@settings(max_examples=100, deadline=None)
@given(dataset_size=st.integers(1, 300), seed=st.integers(0, 1000), global_batch=st.integers(1, 64),
       data=st.data())
def test_global_batch_content_independent_of_world_size(dataset_size, seed, global_batch, data):
    position = data.draw(st.integers(0, dataset_size - 1))
    order = EpochOrder(dataset_size, seed)
    expected = order.permutation(2)[position:position + global_batch]
    for world_size in range(1, 5):
        shares = [order.batch_indices(2, position, global_batch, r, world_size) for r in range(world_size)]
        assert np.array_equal(np.concatenate(shares), expected)


def test_catalogue_sizes_match_the_data():
    """config.py reads the samples per epoch from the torch-free catalogue; they must be what data.py makes."""
    from ones_pipeline.train.catalogue import TRAIN_SIZES

    for name, size in TRAIN_SIZES.items():
        train, _, _ = load_dataset(name)
        assert len(train) == size, name
