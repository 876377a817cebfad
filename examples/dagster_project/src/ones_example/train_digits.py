"""The jobs' training script on the ones-pipeline session API: reads the dataset asset's file, trains the
model the job spec names (``model: linear`` or ``mlp``). Started by ONES once per slot it allocates."""

import sys

import torch

from ones_example.data import load_split
from ones_example.model import build
from ones_pipeline.train.api import Placement, TrainingSession


def main() -> int:
    placement = Placement.from_env()
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = (torch.as_tensor(a) for a in load_split())
    torch.manual_seed(placement.seed)
    model = build(placement.spec.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=placement.lr, momentum=0.9)
    with TrainingSession(placement, dataset_size=len(x_train)) as session:
        # The session resumes from the checkpoint, logs to MLflow, and logs the final model there.
        model = session.prepare(model, optimizer, params={"script": "ones_example.train_digits"})
        for idx in session.batches():
            idx = torch.as_tensor(idx, dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx], reduction="sum")
            optimizer.zero_grad()
            (loss * session.loss_scale()).backward()
            optimizer.step()
            session.step_done(loss=float(loss) / max(len(idx), 1))
            if session.epoch_ended and not session.stopped:
                with torch.no_grad():
                    accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
                session.end_epoch(accuracy=accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
