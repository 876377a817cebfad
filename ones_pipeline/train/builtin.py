"""Built-in workloads: one training process of a built-in model, written on the public session API.

``JobSpec.model`` names a workload ``<model>-<dataset>``: ``mlp-digits``, ``cnn-digits`` (scikit-learn's
digits, shipped with the package, so they train offline) and ``resnet18-cifar-synthetic`` (generated
CIFAR-shaped tensors, for throughput runs on a GPU). Started by the launcher once per slot:
``python -m ones_pipeline.train.builtin`` with the ``ONES_*`` environment. It takes its steps in
micro-batches (``TrainingSession.steps``), so the job can accumulate gradients when its batch tuner picks a
per-GPU batch above ``max_per_gpu_batch``.
"""

from __future__ import annotations

import logging

import torch

from ones_pipeline.train import exit_without_final_gc
from ones_pipeline.train.api import Placement, TrainingSession
from ones_pipeline.train.catalogue import resolve_workload
from ones_pipeline.train.data import load_dataset
from ones_pipeline.train.models import build_model


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
             batch: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on a test set."""
    model.eval()
    correct, total_loss = 0, 0.0
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch].to(device), y[i:i + batch].to(device)
        out = model(xb)
        total_loss += float(torch.nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    model.train()
    return correct / len(x), total_loss / len(x)


def main() -> int:
    placement = Placement.from_env()
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s {placement.spec.name} rank {placement.rank}: %(message)s")
    logging.getLogger("ones_pipeline").setLevel(logging.INFO)
    torch.set_num_threads(1)  # one process per slot: a slot is one core
    model_name, dataset_name = resolve_workload(placement.spec.model)
    train, test, info = load_dataset(dataset_name, seed=placement.seed)
    x_train, y_train = train.tensors
    x_test, y_test = test.tensors
    torch.manual_seed(placement.seed)  # every rank builds the same initial model
    model = build_model(model_name, info.num_classes, info.input_shape)
    optimizer = torch.optim.SGD(model.parameters(), lr=placement.lr, momentum=0.9)
    with TrainingSession(placement, len(x_train)) as session:
        model = session.prepare(model, optimizer, params={"dataset": dataset_name})
        device = session.device
        for step in session.steps():
            optimizer.zero_grad(set_to_none=True)
            loss_sum, samples = 0.0, 0
            for idx in step:  # micro-batches: all but the last accumulate without an all-reduce
                idx_t = torch.as_tensor(idx, dtype=torch.long)
                # Also on an empty share (zero samples, a zero loss): DDP all-reduces only after a forward.
                out = model(x_train[idx_t].to(device))
                loss = torch.nn.functional.cross_entropy(out, y_train[idx_t].to(device), reduction="sum")
                (loss * session.loss_scale()).backward()
                loss_sum, samples = loss_sum + float(loss.detach()), samples + len(idx_t)
            optimizer.step()
            session.step_done(loss=loss_sum / samples if samples else None)
            session.log_step_metrics()  # a point every few seconds (``LOG_EVERY_S``)
            if session.epoch_ended and not session.stopped:
                # The bare module, not the DDP wrapper: a forward on rank 0 alone must not enter a collective.
                bare = model.module if hasattr(model, "module") else model
                acc, test_loss = evaluate(bare, x_test, y_test, device) if session.is_main else (0.0, 0.0)
                acc_t = torch.tensor([acc, test_loss], device=device)  # NCCL broadcasts GPU tensors
                if session.p.world_size > 1:  # every rank applies the stopping rule to the same numbers
                    torch.distributed.broadcast(acc_t, src=0)
                session.end_epoch(accuracy=float(acc_t[0]), loss=float(acc_t[1]))
    return 0


if __name__ == "__main__":
    exit_without_final_gc(main())
