"""A user's own training script on the ones-pipeline session API (logistic regression on digits).

Run it through the launcher, which starts one process per slot and passes the allocation::

    python -m ones_pipeline.train --spec examples/user_job.json --slots 2 --state-dir state/user-job

The session restores the latest checkpoint, hands out this rank's share of each global batch (by
samples, so resizes keep the epoch), handles stop requests and logs to MLflow. The script only trains.
"""

import sys

import torch
from sklearn.datasets import load_digits

from ones_pipeline.train.api import Placement, TrainingSession


def main() -> int:
    placement = Placement.from_env()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    torch.manual_seed(placement.seed)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=placement.lr)
    with TrainingSession(placement, dataset_size=len(x_train)) as session:
        model = session.prepare(model, optimizer, params={"script": "examples/train_user_script.py"})
        for idx in session.batches():
            idx = torch.as_tensor(idx, dtype=torch.long)
            # Also on an empty share (zero samples, a zero loss): DDP all-reduces only after a forward.
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
