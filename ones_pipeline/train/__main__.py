"""``python -m ones_pipeline.train``: train one job on one allocation until it finishes or is stopped.

Standalone (no Dagster needed)::

    python -m ones_pipeline.train --model mlp-digits --name demo --epochs 5 --slots 2 \\
        --state-dir state/demo --tracking-uri sqlite:///state/mlflow.db

or ``--spec job.json`` (JobSpec fields; ``stopping`` as an object). Exit 0 when the job finished or was
stopped cleanly with a checkpoint; 2 on bad input (nothing started, nothing written); 1 on a failure.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule
from ones_pipeline.train.api import spec_from_json
from ones_pipeline.train.launcher import LaunchError, LaunchRequest, launch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ones_pipeline.train", description=__doc__.splitlines()[0])
    src = p.add_argument_group("job (either --spec or the fields below)")
    src.add_argument("--spec", type=Path, help="JSON file with the JobSpec fields")
    src.add_argument("--name", help="job name (slug)")
    src.add_argument("--model", default="mlp-digits", help="built-in workload: mlp-digits, cnn-digits, "
                     "resnet18-cifar-synthetic")
    src.add_argument("--epochs", type=float, help="stop after this many epochs")
    src.add_argument("--target-accuracy", type=float, help="stop when accuracy holds for --patience epochs")
    src.add_argument("--patience", type=int, default=3)
    src.add_argument("--per-gpu-batch", type=int, default=32)
    src.add_argument("--base-lr", type=float, default=0.05)
    src.add_argument("--max-lr", type=float, default=None)
    alloc = p.add_argument_group("allocation")
    alloc.add_argument("--slots", type=int, default=1, help="CPU processes (ignored with --gpus)")
    alloc.add_argument("--gpus", default="", help="comma-separated GPU ids, one process each")
    alloc.add_argument("--global-batch", type=int, default=None, help="default: per-GPU batch x processes, capped")
    alloc.add_argument("--lr", type=float, default=None, help="default: linear scaling rule")
    alloc.add_argument("--generation", type=int, default=0)
    alloc.add_argument("--in-container", action="store_true", help="GPUs are renumbered from 0 (Docker)")
    run = p.add_argument_group("run")
    run.add_argument("--state-dir", type=Path, required=True, help="checkpoints and the MLflow run id")
    run.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (sqlite:///... or http://...)")
    run.add_argument("--experiment", default="ones")
    run.add_argument("--grace-period", type=float, default=20.0, help="seconds to checkpoint after a stop")
    run.add_argument("--seed", type=int, default=0)
    return p


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    if args.spec is not None:
        try:
            return spec_from_json(args.spec.read_text())
        except OSError as exc:
            raise LaunchError(f"{args.spec}: cannot read: {exc.strerror}") from exc
        except (ValueError, TypeError, KeyError) as exc:
            raise LaunchError(f"{args.spec}: not a valid job spec: {exc}") from exc
    if not args.name:
        raise LaunchError("give --spec FILE or --name NAME (and --epochs or --target-accuracy)")
    if args.target_accuracy is not None:
        stopping = StoppingRule(StopKind.ACCURACY, target_accuracy=args.target_accuracy, patience=args.patience)
    else:
        stopping = StoppingRule(StopKind.EPOCHS, epochs=args.epochs or 1.0)
    from ones_pipeline.train.data import load_dataset
    from ones_pipeline.train.builtin import resolve_workload

    try:
        _, dataset = resolve_workload(args.model)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    train, _, _ = load_dataset(dataset)
    return JobSpec(name=args.name, model=args.model, dataset_size=len(train), per_gpu_batch=args.per_gpu_batch,
                   base_lr=args.base_lr, max_lr=args.max_lr, requested_gpus=max(args.slots, 1), stopping=stopping)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("ones_pipeline").setLevel(logging.INFO)
    args = build_parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
        gpus = tuple(int(g) for g in args.gpus.split(",") if g.strip())
        req = LaunchRequest(spec=spec, state_dir=args.state_dir, slots=args.slots, gpus=gpus,
                            global_batch=args.global_batch, lr=args.lr, generation=args.generation,
                            tracking_uri=args.tracking_uri, experiment=args.experiment,
                            grace_period_s=args.grace_period, seed=args.seed, in_container=args.in_container)
        return launch(req)
    except (LaunchError, ValueError) as exc:
        print(f"ones train: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
