"""Built-in models, written here (no torchvision): ``mlp``, ``cnn`` and a CIFAR-style ``resnet18``.

``build_model(name, num_classes, input_shape)`` builds one for inputs of shape ``input_shape``
(without the batch dimension, e.g. ``(1, 8, 8)`` for digits, ``(3, 32, 32)`` for CIFAR-shaped data).
Every model works on both built-in datasets; ``resnet18`` is meant for 3x32x32 inputs.

Initial weights come from torch's global RNG: seed it (``torch.manual_seed``) identically on every
rank before building, so all data-parallel replicas start from the same model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch
from torch import nn

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "resnet18")


def _check_image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ValueError(f"model {name!r} needs an image input shape (channels, height, width), got {input_shape!r}")
    c, h, w = (int(v) for v in input_shape)
    return c, h, w


class MLP(nn.Module):
    """Flatten -> Linear(hidden) -> ReLU -> Linear(num_classes)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two 3x3 conv layers, a 2x2 max-pool, then a two-layer head. No batch norm, so it trains the same
    whatever the per-rank batch (even one sample per rank).

    The pooled feature map is brought to at most 4x4 (adaptive average pooling), so the head has the
    same size for 8x8 digits and 32x32 images.
    """

    def __init__(self, in_channels: int, num_classes: int, height: int, width: int):
        super().__init__()
        ph, pw = max(height // 2, 1), max(width // 2, 1)
        self.pool_to = (min(ph, 4), min(pw, 4))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2) if height >= 2 and width >= 2 else nn.Identity(),
            nn.AdaptiveAvgPool2d(self.pool_to),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * self.pool_to[0] * self.pool_to[1], 128), nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv/BN layers plus an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or in_planes != planes:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet for small images (the CIFAR variant of He et al. 2016): a 3x3 stride-1 stem without
    max-pool, four stages of 64/128/256/512 channels (strides 1, 2, 2, 2), global average pool, linear.

    ``zero_init_residual`` starts every block as the identity (last BN's scale = 0), which makes the
    large global batches of elastic scaling train more stably (Goyal et al. 2017).
    """

    def __init__(self, blocks: tuple[int, int, int, int], in_channels: int, num_classes: int,
                 zero_init_residual: bool = True):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        )
        stages = []
        in_planes = 64
        for planes, n, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2), strict=False):
            layers = []
            for i in range(n):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def _mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    if not input_shape or min(input_shape) < 1:
        raise ValueError(f"model 'mlp' needs a non-empty input shape, got {input_shape!r}")
    return MLP(math.prod(int(v) for v in input_shape), num_classes)


def _cnn(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    c, h, w = _check_image_shape("cnn", input_shape)
    return SmallCNN(c, num_classes, h, w)


def _resnet18(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    c, _, _ = _check_image_shape("resnet18", input_shape)
    return ResNet((2, 2, 2, 2), c, num_classes)


_BUILDERS: dict[str, Callable[[int, tuple[int, ...]], nn.Module]] = {
    "mlp": _mlp, "cnn": _cnn, "resnet18": _resnet18,
}


def build_model(name: str, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """A fresh model ``name`` (one of ``MODEL_NAMES``) mapping ``(B, *input_shape)`` to ``(B, num_classes)`` logits."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    try:
        n = operator.index(num_classes)
    except TypeError:
        n = 0
    if n < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    return _BUILDERS[name](n, tuple(int(v) for v in input_shape))
