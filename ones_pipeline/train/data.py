"""Built-in datasets, loaded fully into memory as ``TensorDataset``s: offline and deterministic.

* ``digits``: scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), shipped inside the
  scikit-learn package, so nothing is downloaded. Images are shaped ``(1, 8, 8)`` (an ``mlp`` flattens
  them, a ``cnn`` convolves them), standardised per pixel with the training split's mean/std, and split
  80/20 (1437/360) into train/test by a permutation drawn from ``seed``.
* ``cifar-synthetic``: generated CIFAR-shaped data, ``(3, 32, 32)`` float images in 10 classes. Each
  class has a smooth random template (a 3x8x8 pattern upsampled to 32x32); a sample is its class
  template times a random contrast, plus a random brightness shift and pixel noise. Learnable (accuracy
  rises well above chance within an epoch or two) but not trivially so. Everything is a function of
  ``seed``; train and test share the templates and come from independent streams, so the test set
  does not change with ``train_size``.

Labels are ``int64``, images ``float32``.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ones_pipeline.train.catalogue import TRAIN_SIZES

DATASET_NAMES: tuple[str, ...] = ("digits", "cifar-synthetic")

DIGITS_TEST_FRACTION = 0.2
CIFAR_SYNTHETIC_TRAIN = TRAIN_SIZES["cifar-synthetic"]
CIFAR_SYNTHETIC_TEST = 1000


@dataclass(frozen=True)
class DatasetInfo:
    num_classes: int
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    name: str


def _to_datasets(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray
                 ) -> tuple[TensorDataset, TensorDataset]:
    def ds(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                             torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)))

    return ds(x_tr, y_tr), ds(x_te, y_te)


def _digits_file() -> Path | None:
    """scikit-learn's digits file (``sklearn/datasets/data/digits.csv.gz``: 64 pixel columns, then the label),
    found without importing scikit-learn; None where this installation does not have it there."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """(1797, 64) pixel values 0..16 and the labels. Read straight from the file scikit-learn ships (the same
    arrays as ``sklearn.datasets.load_digits``): importing scikit-learn took ~5 s of CPU in every rank
    process on a small machine, most of a short generation's start."""
    path = _digits_file()
    if path is not None:
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        x, y = np.ascontiguousarray(data[:, :-1]), data[:, -1].astype(np.int64)
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = np.asarray(bunch.data, dtype=np.float64)
        y = np.asarray(bunch.target, dtype=np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def _digits(seed: int) -> tuple[TensorDataset, TensorDataset, DatasetInfo]:
    x, y = _digits_raw()
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0xD161])).permutation(len(x))
    n_train = int(len(x) * (1.0 - DIGITS_TEST_FRACTION))  # 1437 train, 360 test
    test_idx, train_idx = np.sort(perm[n_train:]), np.sort(perm[:n_train])
    mean = x[train_idx].mean(axis=0)
    std = x[train_idx].std(axis=0)
    std[std < 1e-8] = 1.0  # constant (always blank) corner pixels
    x = ((x - mean) / std).reshape(-1, 1, 8, 8)
    train, test = _to_datasets(x[train_idx], y[train_idx], x[test_idx], y[test_idx])
    return train, test, DatasetInfo(num_classes=10, input_shape=(1, 8, 8), name="digits")


def _cifar_synthetic(seed: int, train_size: int, test_size: int,
                     signal: float = 0.15, noise: float = 1.0) -> tuple[TensorDataset, TensorDataset, DatasetInfo]:
    num_classes, shape = 10, (3, 32, 32)
    templ_ss, train_ss, test_ss = np.random.SeedSequence([seed, 0xC1FA]).spawn(3)
    coarse = np.random.default_rng(templ_ss).standard_normal((num_classes, 3, 8, 8))
    templates = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3).astype(np.float32)  # (10, 3, 32, 32)

    def make(ss: np.random.SeedSequence, n: int) -> tuple[np.ndarray, np.ndarray]:
        # One stream per field, so the first k samples do not depend on n (a larger set extends a smaller).
        r_label, r_contrast, r_bright, r_noise = (np.random.default_rng(s) for s in ss.spawn(4))
        y = r_label.integers(0, num_classes, size=n)
        contrast = r_contrast.uniform(0.5, 1.5, size=(n, 1, 1, 1)).astype(np.float32)
        brightness = r_bright.normal(0.0, 0.5, size=(n, 1, 1, 1)).astype(np.float32)
        x = r_noise.standard_normal((n, *shape), dtype=np.float32)
        x *= noise
        x += signal * contrast * templates[y] + brightness
        return x, y

    x_tr, y_tr = make(train_ss, train_size)
    x_te, y_te = make(test_ss, test_size)
    train, test = _to_datasets(x_tr, y_tr, x_te, y_te)
    return train, test, DatasetInfo(num_classes=num_classes, input_shape=shape, name="cifar-synthetic")


def load_dataset(name: str, seed: int = 0, *, train_size: int | None = None, test_size: int | None = None
                 ) -> tuple[TensorDataset, TensorDataset, DatasetInfo]:
    """``(train, test, info)`` for a built-in dataset (one of ``DATASET_NAMES``).

    ``train_size``/``test_size`` set the size of ``cifar-synthetic`` (default 5000/1000); ``digits``
    has a fixed size and rejects them.
    """
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if name == "digits":
        if train_size is not None or test_size is not None:
            raise ValueError("dataset 'digits' has a fixed size; train_size/test_size apply to 'cifar-synthetic' only")
        return _digits(seed)
    n_train = CIFAR_SYNTHETIC_TRAIN if train_size is None else int(train_size)
    n_test = CIFAR_SYNTHETIC_TEST if test_size is None else int(test_size)
    if n_train < 1 or n_test < 1:
        raise ValueError(f"cifar-synthetic needs train_size >= 1 and test_size >= 1, got {n_train}, {n_test}")
    return _cifar_synthetic(seed, n_train, n_test)
