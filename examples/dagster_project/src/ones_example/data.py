"""Where the dataset asset writes the digits, and how a training script reads them."""

import os
from pathlib import Path

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # src/ones_example/data.py -> the project folder


def dataset_path() -> Path:
    """``$ONES_EXAMPLE_DATA``, else ``<project>/data/digits.npz``."""
    return Path(os.environ.get("ONES_EXAMPLE_DATA") or PROJECT_ROOT / "data" / "digits.npz")


def load_split(path: Path | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test), pixels scaled to [0, 1]."""
    with np.load(path or dataset_path()) as data:
        return data["x_train"], data["y_train"], data["x_test"], data["y_test"]
