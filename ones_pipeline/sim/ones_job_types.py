"""The ten (model, task) job types of the ONES (SC'21) trace and the Pollux profile each one derives from.

How a type's step time follows from its source profile (``sigma``: compute per sample, ``rho``: all-reduce
volume, both relative to the source model) is stated in :mod:`ones_pipeline.sim.ones_truth` and
``docs/ones_catalogue.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobType:
    """How one (model, task) of the ONES trace derives from a Pollux profile (see docs/ones_catalogue.md)."""

    model: str
    task: str
    source: str  # Pollux profile folder
    gmacs: float  # multiply-accumulates per training sample of this model at the ONES input size (G)
    source_gmacs: float
    params_m: float  # parameters (millions): all-reduce volume
    source_params_m: float
    note: str

    @property
    def key(self) -> str:
        return f"{self.model}-{self.task}"

    @property
    def sigma(self) -> float:
        return self.gmacs / self.source_gmacs

    @property
    def rho(self) -> float:
        return self.params_m / self.source_params_m


# Per-sample compute (G multiply-accumulates) and parameters (M) of the torchvision models at 224x224
# (Inception-v3 at 299x299) as counted by ptflops/thop: alexnet 0.71 / 61.10, googlenet 1.51 / 6.62
# (13.0 M with the two auxiliary heads torchvision builds by default), inception_v3 5.73 / 27.16,
# resnet18 1.82 / 11.69, resnet50 4.12 / 25.56, vgg16 15.47 / 138.36. The ONES CIFAR example feeds
# 32x32 images to these 1000-class torchvision models: convolutions scale with the image area
# (x 1/49); VGG-16's classifier (0.124 G, after the adaptive 7x7 pool) does not. The Pollux cifar10
# model is the CIFAR ResNet-18 (3x3 stem, no max-pool): 0.56 G, 11.17 M. Pollux bert is BERT-base
# (110 M) fine-tuned on SQuAD at sequence length 384; the ONES GLUE tasks use length 128 (x 1/3).
_CIFAR_AREA = (32.0 / 224.0) ** 2
JOB_TYPES: dict[tuple[str, str], JobType] = {
    (t.model, t.task): t
    for t in (
        JobType("resnet18", "cifar", "cifar10", 1.82 * _CIFAR_AREA, 0.56, 11.69, 11.17,
                "torchvision ResNet-18 (ImageNet stem) on 32x32 CIFAR-10"),
        JobType("googlenet", "cifar", "cifar10", 1.51 * _CIFAR_AREA, 0.56, 13.0, 11.17,
                "torchvision GoogLeNet with auxiliary heads on 32x32 CIFAR-10"),
        JobType("vgg16", "cifar", "cifar10", (15.47 - 0.124) * _CIFAR_AREA + 0.124, 0.56, 138.36, 11.17,
                "torchvision VGG-16 on 32x32 CIFAR-10; the 124 M-parameter classifier dominates all-reduce"),
        JobType("resnet50", "imagenet", "imagenet", 4.12, 4.12, 25.56, 25.56,
                "same model as the Pollux profile (ImageNet subset, 224x224)"),
        JobType("inception_v3", "imagenet", "imagenet", 5.73, 4.12, 27.16, 25.56,
                "torchvision Inception-v3 at 299x299"),
        JobType("vgg16", "imagenet", "imagenet", 15.47, 4.12, 138.36, 25.56, "torchvision VGG-16 at 224x224"),
        JobType("alexnet", "imagenet", "imagenet", 0.71, 4.12, 61.10, 25.56, "torchvision AlexNet at 224x224"),
        JobType("bert", "cola", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE CoLA, sequence length 128"),
        JobType("bert", "mrpc", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE MRPC, sequence length 128"),
        JobType("bert", "sst2", "bert", 1.0 / 3.0, 1.0, 110.0, 110.0,
                "BERT-base fine-tuning, GLUE SST-2, sequence length 128"),
    )
}

# Types that run the same network on the same inputs (so the same compute factor): used only to fit
# the interconnect factor.
COMPUTE_GROUPS: dict[tuple[str, str], str] = {
    ("bert", "cola"): "bert-base-seq128", ("bert", "mrpc"): "bert-base-seq128", ("bert", "sst2"): "bert-base-seq128",
}


def allowed_pairs() -> list[str]:
    """Every ``model/task`` of :data:`JOB_TYPES`, sorted (for error messages)."""
    return sorted(f"{m}/{t}" for m, t in JOB_TYPES)
