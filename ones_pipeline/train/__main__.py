"""``python -m ones_pipeline.train``: train one job on one allocation until it finishes or is stopped.

Standalone (no Dagster needed)::

    python -m ones_pipeline.train --model mlp-digits --name demo --epochs 5 --slots 2 \\
        --state-dir state/demo --tracking-uri sqlite:///state/mlflow.db

or ``--spec job.json`` (JobSpec fields; ``stopping`` as an object). Under Dagster Pipes (the
``DAGSTER_PIPES_CONTEXT`` variable is set, e.g. by ``PipesSubprocessClient``) the allocation comes from
the Pipes extras instead (``allocation``: the scheduler's ``RunAllocation`` as JSON; ``state_dir``,
``tracking_uri``, ``experiment``, ``grace_period_s``, ``seed``, ``in_container``; missing ones fall back
to the command line), and a finished job reports an asset materialization with its final accuracy,
samples, epochs, restarts and MLflow run id. Exit 0 when the job finished or was stopped cleanly with a
checkpoint; 2 on bad input (nothing started, nothing written); 1 on a failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule, batch_and_lr
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.train import exit_without_final_gc
from ones_pipeline.train.catalogue import resolve_workload, train_size
from ones_pipeline.train.launcher import LaunchError, LaunchRequest, launch
from ones_pipeline.train.placement import spec_from_json
from ones_pipeline.train.resize_control import DEFAULT_RESIZE_TIMEOUT_S
from ones_pipeline.train.slurm_ranks import LEADER_EXIT_FILE, RANK_FILE, STEP_DIR_ENV, env_int, rank_record


def build_parser(state_dir_required: bool = True) -> argparse.ArgumentParser:
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
    run.add_argument("--state-dir", type=Path, required=state_dir_required, help="checkpoints and the MLflow run id")
    run.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (sqlite:///... or http://...)")
    run.add_argument("--experiment", default="ones")
    run.add_argument("--grace-period", type=float, default=20.0, help="seconds to checkpoint after a stop")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--resize-timeout", type=float, default=DEFAULT_RESIZE_TIMEOUT_S,
                     help="seconds an in-place resize may take (new processes' warm-up, then the change) before "
                          "the launcher restarts the new slot set from the checkpoint")
    run.add_argument("--slurm-request", type=Path, default=None,
                     help="one Slurm task of a multi-node step: the request file the Slurm launcher wrote")
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
    try:
        resolve_workload(args.model)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    return JobSpec(name=args.name, model=args.model, dataset_size=train_size(args.model),
                   per_gpu_batch=args.per_gpu_batch, base_lr=args.base_lr, max_lr=args.max_lr,
                   requested_gpus=max(args.slots, 1), stopping=stopping)


PIPES_KEYS = {"allocation", "state_dir", "tracking_uri", "experiment", "grace_period_s", "seed", "in_container"}


def allocation_from_args(args: argparse.Namespace) -> RunAllocation:
    """The allocation the command line describes (batch: per-GPU batch x processes, capped; LR: the core rule)."""
    spec = spec_from_args(args)
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    slot_ids = gpus or list(range(max(int(args.slots), 0)))
    if not slot_ids:
        raise LaunchError(f"job {spec.name}: slots must be >= 1, got {args.slots}")
    batch = args.global_batch if args.global_batch is not None else batch_and_lr(spec, len(slot_ids))[0]
    try:
        return RunAllocation.make(spec, slot_ids, "gpu" if gpus else "cpu", batch, args.generation, lr=args.lr)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def request_from(args: argparse.Namespace, extras: Mapping[str, Any] | None = None) -> LaunchRequest:
    """The launch request from the Pipes extras when given (the allocation exactly as the scheduler made
    it), else from the command line."""
    extras = dict(extras or {})
    unknown = set(extras) - PIPES_KEYS
    if unknown:
        raise LaunchError(f"Pipes extras: unknown keys {sorted(unknown)}; allowed: {sorted(PIPES_KEYS)}")
    if "allocation" in extras:
        try:
            allocation = RunAllocation.from_json(extras["allocation"])
        except (ValueError, TypeError) as exc:
            raise LaunchError(f"Pipes extras: field 'allocation': {exc}") from None
    else:
        allocation = allocation_from_args(args)
    state_dir = extras.get("state_dir", args.state_dir)
    if state_dir is None:
        raise LaunchError("no state directory: give --state-dir or the Pipes extra 'state_dir'")
    return LaunchRequest(
        allocation=allocation, state_dir=Path(state_dir), tracking_uri=extras.get("tracking_uri", args.tracking_uri),
        experiment=extras.get("experiment", args.experiment),
        grace_period_s=float(extras.get("grace_period_s", args.grace_period)),
        seed=int(extras.get("seed", args.seed)), in_container=bool(extras.get("in_container", args.in_container)),
        resize_timeout_s=float(args.resize_timeout))


def _slots(req: LaunchRequest, processes: Any) -> str:
    """``2 CPU slots`` / ``1 GPU``: one process per slot, named as the scheduler names its slots."""
    n = int(processes) if processes is not None else req.world_size
    word = "GPU" if req.allocation.device == "gpu" else "CPU slot"
    return f"{n} {word}{'' if n == 1 else 's'}"


def _epoch(req: LaunchRequest, epoch: Any) -> str:
    """``3/12`` for a job that stops after 12 epochs, else ``3``; two decimals for a fraction of an epoch."""
    if epoch is None:
        return "-"
    text = f"{int(epoch)}" if float(epoch).is_integer() else f"{float(epoch):.2f}"
    total = req.spec.stopping.epochs if req.spec.stopping.kind is StopKind.EPOCHS else None
    return f"{text}/{float(total):g}" if total else text


def progress_line(req: LaunchRequest, row: Mapping[str, Any]) -> str | None:
    """One run-log line for a progress event of rank 0; None for the ``progress`` beats of every few seconds
    (the partition shows them, as observations; the run log keeps the epochs)."""
    if row.get("event") == "progress":
        return None
    if row.get("event") == "mlflow_run":
        from ones_pipeline.adapters.mlflow import run_link

        where = run_link(req.tracking_uri, row["run_id"], row.get("experiment_id")) if req.tracking_uri else "-"
        if where.startswith(("http://", "https://")):
            return f"{req.spec.name}: MLflow run {row['run_id']}: {where}"
        return f"{req.spec.name}: MLflow {where}"  # "run <id> in <uri> (mlflow ui ...)": the id once
    if row.get("event") == "epoch":
        def num(key: str, fmt: str) -> str:
            return format(row[key], fmt) if row.get(key) is not None else "-"

        return (f"{req.spec.name} generation {row.get('generation')}: epoch {_epoch(req, row.get('epoch'))}, "
                f"{int(row.get('samples') or 0)} samples, accuracy {num('accuracy', '.4f')}, "
                f"loss {num('loss', '.4f')}, {num('samples_per_s', '.1f')} samples/s, global batch "
                f"{row.get('global_batch')} on {_slots(req, row.get('processes'))}")
    if row.get("event") == "batch":  # the step re-tuned its own batch (train.batch_tuning)
        gns, gain = row.get("grad_noise_scale"), row.get("predicted_gain")
        why = f"noise scale {gns:.0f} samples" if gns else "no noise scale measured yet"
        gain_text = f", predicted goodput x{gain:.2f}" if gain else ""
        micro, accum = row.get("micro_batch"), row.get("accum_steps") or 0
        split = f" ({accum + 1} x {micro} per process, accumulated over {accum + 1} micro-batches)" \
            if accum and micro else ""
        return (f"{req.spec.name} generation {row.get('generation')}: global batch {row.get('from')} -> "
                f"{row.get('to')}{split} on {_slots(req, row.get('processes'))} without a restart: goodput-optimal "
                f"at {why}{gain_text}")
    if row.get("event") == "training":  # rank 0's first step of this generation: its start-up is over
        samples = int(row.get("samples") or 0)
        return (f"{req.spec.name} generation {row.get('generation')}: training on {_slots(req, None)} from "
                f"{samples} samples (epoch {_epoch(req, round(samples / max(req.spec.dataset_size, 1), 2))})")
    if row.get("event") == "resized":  # rank 0 after an in-place change (train.membership)
        old, new = int(row.get("from") or 0), int(row.get("to") or 0)
        verb = "grew" if new > old else "shrank" if new < old else "re-formed"
        return (f"{req.spec.name} generation {row.get('generation')}: {verb} {old} -> {new} "
                f"{_slots(req, new).split(' ', 1)[1]} in place at {int(row.get('samples') or 0)} samples, "
                f"{float(row.get('paused_s') or 0):.1f} s without training; global batch {row.get('global_batch')}")
    if row.get("event") == "resize_fallback":  # the launcher: the in-place change failed (train.resize_control)
        return (f"{req.spec.name} generation {row.get('generation')}: in-place resize {row.get('from')} -> "
                f"{row.get('to')} failed ({row.get('reason')}): restarted from the checkpoint")
    if row.get("event") == "stopped" and row.get("before_training"):  # the launcher stopped it while starting
        return (f"{req.spec.name} generation {row.get('generation')}: stopped while starting up, before it "
                "trained (its last checkpoint stands)")
    if row.get("event") == "stopped":  # rank 0 checkpointed on a stop request (a preemption or resize)
        return (f"{req.spec.name} generation {row.get('generation')}: stopped with a checkpoint at "
                f"{int(row.get('samples') or 0)} samples (epoch {_epoch(req, row.get('epoch'))})")
    return f"{req.spec.name}: {json.dumps(dict(row))}"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("ones_pipeline").setLevel(logging.INFO)
    from dagster_pipes import PipesEnvVarParamsLoader

    under_pipes = PipesEnvVarParamsLoader().is_dagster_pipes_process()
    parser = build_parser(state_dir_required=False)
    args = parser.parse_args(argv)
    if args.slurm_request is not None:
        return _main_slurm_task(args.slurm_request, under_pipes)
    if not under_pipes and args.state_dir is None:
        parser.error("the following arguments are required: --state-dir")
    if under_pipes:
        return _main_under_pipes(args)
    try:
        return launch(request_from(args))
    except (LaunchError, ValueError) as exc:
        print(f"ones train: {exc}", file=sys.stderr)
        return 2


def _main_under_pipes(args: argparse.Namespace, adjust: Callable[[LaunchRequest], LaunchRequest] | None = None) -> int:
    """The step as a Pipes process; ``adjust``: what a Slurm task changes in the request (its one rank)."""
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        try:
            req = dataclasses.replace(request_from(args, pipes.extras), dagster_run_id=pipes.run_id)
            req = adjust(req) if adjust is not None else req
        except (LaunchError, ValueError) as exc:
            pipes.log.error(f"ones train: {exc}")
            print(f"ones train: {exc}", file=sys.stderr)
            return 2
        pipes.log.info(f"training {req.allocation.describe()}")
        def relay(row: Mapping[str, Any]) -> None:
            if (line := progress_line(req, row)) is not None:
                pipes.log.info(line)

        code = launch(req, on_event=relay)
        result_file = req.state_dir / "result.json"
        if code == 0 and result_file.exists():
            result = json.loads(result_file.read_text())
            pipes.report_asset_materialization(metadata={
                "accuracy": result.get("accuracy"), "samples": result.get("samples"),
                "epochs": result.get("epochs"), "restarts": result.get("restarts"),
                "global_batch": result.get("global_batch"),
                "generation": req.allocation.generation, "mlflow_run_id": result.get("mlflow_run_id") or ""})
        elif code == 0:
            pipes.log.info(f"{req.spec.name}: stopped with a checkpoint; it resumes on its next allocation")
        return code


def _main_slurm_task(request_file: Path, under_pipes: bool) -> int:
    """One Slurm task of a multi-node step (``srun ... --slurm-request FILE``, written by ``defs/slurm_step.py``):
    its rank from ``SLURM_PROCID``, the others met at the request's address and port; rank 0's task is the
    Pipes process. Its rank record (node, GPUs Slurm gave it) goes beside the request. Exit code as
    ``python -m ones_pipeline.train`` (0, 1, or 2 on bad input)."""
    try:
        data = json.loads(Path(request_file).read_text())
        rank, ntasks = env_int("SLURM_PROCID"), env_int("SLURM_NTASKS")
        record = rank_record()
        Path(request_file).with_name(RANK_FILE.format(rank=rank)).write_text(json.dumps(record))
        os.environ[STEP_DIR_ENV] = str(Path(request_file).parent)
        args = build_parser(state_dir_required=False).parse_args([])

        def adjust(req):
            if ntasks != req.world_size:
                raise LaunchError(f"job {req.spec.name}: Slurm started {ntasks} task(s) for an allocation of "
                                  f"{req.world_size} rank(s)")
            return dataclasses.replace(req, ranks=(rank,), master_addr=data["master_addr"],
                                       master_port=int(data["master_port"]), in_container=True,
                                       device=data.get("device") or None,
                                       num_nodes=int(os.environ.get("SLURM_NNODES") or 1),
                                       leader_exit_file=None if rank == 0 else leader_exit)

        leader_exit = Path(request_file).with_name(LEADER_EXIT_FILE)
        if rank != 0:
            return launch(adjust(request_from(args, data["extras"])))
        leader_exit.unlink(missing_ok=True)
        code = _main_under_pipes(args, adjust) if under_pipes else launch(adjust(request_from(args, data["extras"])))
        leader_exit.write_text(str(code))  # the other ranks' tasks stop waiting on a peer stuck in teardown
        return code
    except (LaunchError, ValueError, KeyError, OSError) as exc:
        print(f"ones train (Slurm task): {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    exit_without_final_gc(main())
