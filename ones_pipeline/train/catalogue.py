"""The built-in workloads by name, without importing torch (the config loader validates specs with it).

``JobSpec.model`` names a workload ``<model>-<dataset>``; ``TRAIN_SIZES`` is each dataset's training-set
size (samples per epoch), which ``train.data`` produces and ``tests/test_train_data.py`` checks.
"""

WORKLOADS: dict[str, tuple[str, str]] = {
    "mlp-digits": ("mlp", "digits"),
    "cnn-digits": ("cnn", "digits"),
    "resnet18-cifar-synthetic": ("resnet18", "cifar-synthetic"),
}
TRAIN_SIZES: dict[str, int] = {"digits": 1437, "cifar-synthetic": 5000}


def train_size(model: str) -> int | None:
    """Samples per epoch of built-in workload ``model``, None for any other name."""
    workload = WORKLOADS.get(model)
    return TRAIN_SIZES[workload[1]] if workload else None


def resolve_workload(model: str) -> tuple[str, str]:
    """(model architecture, dataset) of built-in workload ``model``; ValueError naming the allowed ones."""
    if model not in WORKLOADS:
        raise ValueError(f"unknown built-in model {model!r}; allowed: {', '.join(WORKLOADS)} "
                         "(or give the job a command to run your own script)")
    return WORKLOADS[model]
