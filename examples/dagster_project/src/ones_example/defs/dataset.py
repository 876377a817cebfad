"""The project's own upstream asset: the digits, split and scaled, in one file the training jobs read."""

import dagster as dg
import numpy as np

from ones_example.data import dataset_path


@dg.asset(kinds={"numpy"}, description="scikit-learn's digits: 1,500 training and 297 test images")
def digits_dataset() -> dg.MaterializeResult:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    path = dataset_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=x[:1500], y_train=y[:1500], x_test=x[1500:], y_test=y[1500:])
    return dg.MaterializeResult(metadata={"path": dg.MetadataValue.path(str(path)), "train": 1500,
                                          "test": len(x) - 1500})
