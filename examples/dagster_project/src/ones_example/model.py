"""The models the example's jobs train, in a module (not the script run as ``__main__``) so that the model
MLflow stores loads anywhere this package is installed."""

import torch


def build(kind: str) -> torch.nn.Module:
    if kind == "linear":
        return torch.nn.Linear(64, 10)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    raise ValueError(f"model {kind!r}; allowed: linear, mlp")
