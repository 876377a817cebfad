"""Step launchers: how a run of ``training_job`` runs the training step for its allocation.

One base resource, ``StepLauncher``, with ``run(context, allocation)``; the asset body calls it and knows
no launcher kind. ``definitions.py`` picks the launcher the environment names (``launcher.kind``):

* ``SubprocessLauncher``: ``python -m ones_pipeline.train`` as a local process (``dg.PipesSubprocessClient``);
  a planned preemption (the apply run's ``preempt-g<N>.json``) stops it with a checkpoint and the step ends
  normally; cancelling the run (the fallback) forwards the termination, the step checkpoints within the
  grace period.
* ``DockerLauncher``: the same step in a container with exactly its GPUs (``defs/docker_step.py``).
* ``SlurmLauncher``: the step as one Slurm job across the allocation's nodes, one rank per GPU
  (``defs/slurm_step.py``).
* ``InMemoryLauncher``: no process at all; it reports what a step would (finished, or stopped with a
  checkpoint) so that ``dg.materialize`` of a partition tests the asset and its metadata in milliseconds.

Every launcher hands the step the same Pipes extras (``step_extras``): the allocation exactly as the
run config carries it (``RunAllocation.to_json``), the job's state directory, the MLflow store, the grace
period and the seed. No ``from __future__ import annotations``: Dagster resolves annotations at runtime.
"""

import json
import os
import sys
import time
from pathlib import Path

import dagster as dg

from ones_pipeline.config import EnvConfig
from ones_pipeline.config.layout import PROGRESS_FILE, STEP_PID_ENV, preempt_request_file
from ones_pipeline.defs.pipes_lines import WholeLineMessageReader
from ones_pipeline.defs.resources import MlflowResource, OnesEnvResource
from ones_pipeline.scheduler.allocation import RunAllocation

STEP_MODULE = "ones_pipeline.train"


class StepLauncher(dg.ConfigurableResource):
    """Runs the training step of one allocation to its end; returns what the step reported."""

    ones_env: OnesEnvResource
    mlflow: MlflowResource

    def step_extras(self, allocation: RunAllocation) -> dict:
        env = self.ones_env.config()
        state_dir = env.job_state_dir(allocation.job)
        state_dir.mkdir(parents=True, exist_ok=True)
        return {"allocation": allocation.to_json(), "state_dir": str(state_dir),
                "tracking_uri": self.mlflow.tracking_uri, "experiment": self.mlflow.experiment,
                "grace_period_s": env.launcher.grace_period_s, "seed": env.policy.seed}

    def run(self, context: dg.AssetExecutionContext, allocation: RunAllocation) -> list:
        raise NotImplementedError(f"{type(self).__name__}.run")


class SubprocessLauncher(StepLauncher):
    """The step as a local process; its ranks are its children."""

    def run(self, context: dg.AssetExecutionContext, allocation: RunAllocation) -> list:
        grace = self.ones_env.config().launcher.grace_period_s
        client = dg.PipesSubprocessClient(forward_termination=True, termination_timeout_seconds=grace + 10,
                                          message_reader=WholeLineMessageReader())
        invocation = client.run(context=context, command=[sys.executable, "-m", STEP_MODULE],
                                extras=self.step_extras(allocation),
                                env={**self.mlflow.step_env(), STEP_PID_ENV: str(os.getpid())})
        return _reported(invocation)


class DockerLauncher(StepLauncher):
    """The step in a container of ``launcher.docker.image`` with exactly the allocation's GPUs."""

    def run(self, context: dg.AssetExecutionContext, allocation: RunAllocation) -> list:
        from ones_pipeline.defs.docker_step import run_docker_step

        env = self.ones_env.config()
        extras = self.step_extras(allocation)
        mounts = [p for p in (self.mlflow.sqlite_dir(),) if p is not None]
        invocation = run_docker_step(context, env.launcher.docker, allocation.job, allocation.generation,
                                     list(allocation.gpus), extras, self.mlflow.step_env(),
                                     env.job_state_dir(allocation.job), mounts)
        return _reported(invocation)


class SlurmLauncher(StepLauncher):
    """The step as one Slurm job on the nodes and GPUs of the allocation (``cluster.slurm`` partition)."""

    def run(self, context: dg.AssetExecutionContext, allocation: RunAllocation) -> list:
        from ones_pipeline.defs.slurm_step import run_slurm_step

        invocation = run_slurm_step(context, self.ones_env.config(), allocation, self.step_extras(allocation),
                                    self.mlflow.step_env())
        return _reported(invocation)


class InMemoryLauncher(StepLauncher):
    """For tests: no step runs. ``outcome="finish"`` reports the materialization a finished step reports
    (``accuracy``, the samples of its stopping rule) after its last epoch event; ``"stop"`` reports
    nothing, as a step stopped with a checkpoint does; ``"fail"`` raises as a crashed step does;
    ``"preempt"`` is a planned preemption (the apply run's request, rank 0's "stopped" event, then the
    step ends normally with nothing reported); ``"cancel"`` a run cancelled through Dagster whose step
    checkpointed (the stop event, then Dagster's interrupt); ``"interrupt"`` a cancelled run whose step
    did not."""

    outcome: str = "finish"
    accuracy: float = 0.9

    def run(self, context: dg.AssetExecutionContext, allocation: RunAllocation) -> list:
        extras = self.step_extras(allocation)  # the same checks and directories as a real step's
        context.log.info(f"in-memory launcher: {allocation.describe()} ({self.outcome}); state in "
                         f"{extras['state_dir']}")
        if self.outcome == "fail":
            raise dg.Failure(f"{allocation.job} generation {allocation.generation}: in-memory step failed")
        if self.outcome == "stop":
            return []
        if self.outcome in ("preempt", "cancel", "interrupt"):
            if self.outcome != "interrupt":
                with open(Path(extras["state_dir"]) / PROGRESS_FILE, "a") as fh:
                    fh.write(json.dumps({"event": "stopped", "samples": 100, "epoch": 0.1, "time_s": time.time(),
                                         "generation": allocation.generation}) + "\n")
            if self.outcome == "preempt":  # as if the apply run had asked (it writes the request)
                preempt_request_file(extras["state_dir"], allocation.generation).write_text('{"reason": "test"}')
                return []
            raise dg.DagsterExecutionInterruptedError("run terminated (in-memory launcher)")
        spec = allocation.spec
        samples = spec.stopping.total_samples(spec.dataset_size) or spec.dataset_size
        with open(Path(extras["state_dir"]) / PROGRESS_FILE, "a") as fh:  # the last epoch, as rank 0 reports it
            fh.write(json.dumps({"event": "epoch", "epoch": samples / spec.dataset_size, "samples": samples,
                                 "accuracy": self.accuracy, "loss": 0.5, "samples_per_s": 100.0,
                                 "global_batch": allocation.global_batch, "processes": allocation.world_size,
                                 "generation": allocation.generation, "time_s": time.time()}) + "\n")
        return [dg.MaterializeResult(metadata={
            "accuracy": self.accuracy, "samples": samples, "epochs": samples / spec.dataset_size, "restarts": 0,
            "generation": allocation.generation, "mlflow_run_id": ""})]


def _reported(invocation: dg.PipesClientCompletedInvocation) -> list:
    """What the step reported, nothing implied: a step stopped with a checkpoint (a planned preemption)
    reports no materialization, and Dagster must not make one up for it."""
    return list(invocation.get_results(implicit_materializations=False))


def launcher_for(env: EnvConfig, ones_env: OnesEnvResource, mlflow: MlflowResource) -> StepLauncher:
    """The launcher ``launcher.kind`` names."""
    kinds = {"subprocess": SubprocessLauncher, "docker": DockerLauncher, "slurm": SlurmLauncher}
    return kinds[env.launcher.kind](ones_env=ones_env, mlflow=mlflow)
