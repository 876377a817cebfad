"""The training step as one Slurm job across nodes, with Dagster Pipes through the shared filesystem.

For one allocation: the slots are mapped onto the partition's nodes (``SlurmInventory.place``), and the
generation's directory under the job's state directory (shared by every node) gets the request file
(``train/slurm_ranks.py``) and the batch script, ``exec srun <python> -m ones_pipeline.train --slurm-request
FILE``. ``sbatch`` asks for exactly those nodes, one task and one GPU (``--gpus-per-task=1``) per rank (a
heterogeneous job when the nodes' counts differ). The Pipes context goes into a file there and the step's
messages come back through another (``dg.PipesFileContextInjector``/``pipes_lines.WholeLineMessageReader``);
the job's output file is relayed into the run log while it runs.

Cancelling the Dagster run (a preemption or resize) interrupts the wait; then, in a ``finally``:
``scancel --signal=TERM`` (every rank checkpoints; not ``--full``, which would make srun kill the ranks),
up to the grace period plus a margin for the job to leave the queue, then ``scancel`` outright. A job
pending beyond ``launcher.slurm.pending_timeout_s`` (its resources are taken outside this product, or a
node was drained) is cancelled and fails the run with Slurm's reason; so does a job that ends in any
state but COMPLETED with exit code 0 (NODE_FAIL when a node goes down), unless rank 0's task had ended
cleanly before (``rank-0.exit``: its checkpoint is final; a warning says what Slurm reported): the
scheduler plans it again and it resumes from its checkpoint.

No ``from __future__ import annotations``: Dagster resolves annotations at runtime.
"""

import json
import shlex
import time
from pathlib import Path

import dagster as dg

from ones_pipeline.adapters.slurm import (
    JobState,
    SlurmError,
    SlurmInventory,
    SlurmUnreachable,
    cancel_job,
    job_state,
    jobs_named,
    rendezvous_port,
    signal_job,
    submit,
)
from ones_pipeline.config import EnvConfig
from ones_pipeline.defs.pipes_lines import WholeLineMessageReader
from ones_pipeline.scheduler.allocation import RunAllocation
from ones_pipeline.train.slurm_ranks import LEADER_EXIT_FILE, devices_text, read_leader_exit, read_rank_records

POLL_S = 0.5
STOP_MARGIN_S = 15.0  # beyond the grace period, for Slurm to reap the job after its ranks exit
UNREACHABLE_LIMIT_S = 600.0  # a run waits this long for slurmctld to come back before it fails
TAG_SLURM_JOB = "ones/slurm-job"
TAG_SLURM_DEVICES = "ones/slurm-devices"


def job_name(job: str, generation: int) -> str:
    return f"ones-{job}-g{generation}"


def _failure(alloc: RunAllocation, what: str, **metadata) -> dg.Failure:
    return dg.Failure(description=f"job {alloc.job} generation {alloc.generation}: {what}",
                      metadata={k: v for k, v in metadata.items() if v is not None})


def _patient(context, call, what: str):
    """``call()``, retried while slurmctld does not answer (up to ``UNREACHABLE_LIMIT_S``): a controller
    restart must not fail the runs that are starting."""
    deadline = time.monotonic() + UNREACHABLE_LIMIT_S
    warned = False
    while True:
        try:
            return call()
        except SlurmUnreachable as exc:
            if time.monotonic() > deadline:
                raise
            if not warned:
                context.log.warning(f"{what}: {exc}; retrying until slurmctld answers")
                warned = True
            time.sleep(POLL_S * 4)


def _prepare(context, env: EnvConfig, alloc: RunAllocation, extras: dict,
             run_id: str) -> tuple[Path, list[str], dict, list]:
    """Write the generation's request and batch script; return the script, sbatch's arguments, the
    variables the job gets and the placement (node, ranks on it)."""
    cluster, cfg = env.cluster.slurm, env.launcher.slurm
    inventory = SlurmInventory(cluster.partition, cluster.nodes, cluster.slurm_conf)
    try:
        placement = _patient(context, lambda: inventory.place(alloc.gpus), "sinfo")
    except SlurmError as exc:
        raise _failure(alloc, f"cannot place slots {list(alloc.gpus)} on Slurm: {exc}") from exc
    step_dir = Path(extras["state_dir"]) / "slurm" / f"g{alloc.generation}-{run_id[:8]}"
    step_dir.mkdir(parents=True, exist_ok=True)
    for old in step_dir.glob("rank-*.json"):
        old.unlink()
    request = {"extras": extras, "master_addr": placement[0][0].address,
               "master_port": rendezvous_port(alloc.job, alloc.generation, run_id),
               "device": "cpu" if cfg.rank_device == "cpu" or not alloc.gpus else "cuda"}
    (step_dir / "request.json").write_text(json.dumps(request, indent=1))
    script = step_dir / "job.sh"
    command = [*shlex.split(cfg.python), "-m", "ones_pipeline.train", "--slurm-request", str(step_dir / "request.json")]
    args, het = _sbatch_args(env, alloc, placement, step_dir)
    script.write_text("#!/bin/bash\n"
                      f"# ones: job {alloc.job} generation {alloc.generation}, Dagster run {run_id}\n"
                      f"exec srun --kill-on-bad-exit=1 {het}{shlex.join(command)}\n")
    script.chmod(0o755)
    return script, args, {"OMP_NUM_THREADS": "1"}, placement


def _sbatch_args(env: EnvConfig, alloc: RunAllocation, placement, step_dir: Path) -> tuple[list[str], str]:
    """sbatch's arguments and srun's het-group option. The same GPU count on every node: one job with
    ``--nodes`` and ``--ntasks-per-node``. Different counts (3 on n1, 1 on n2): a heterogeneous job, one
    component per node, so that each node holds exactly its GPUs (with ``--distribution=arbitrary`` Slurm
    allocates block-wise and the step then lacks GRES on one node); ``srun --het-group`` runs one step
    over all components with global ranks."""
    cluster, cfg = env.cluster.slurm, env.launcher.slurm
    common = [f"--job-name={job_name(alloc.job, alloc.generation)}", f"--output={step_dir / 'slurm-%j.out'}",
              f"--chdir={step_dir}", "--export=ALL", *cfg.sbatch_args]
    per_task = ["--cpus-per-task=1", *(["--gpus-per-task=1"] if alloc.gpus else [])]
    counts = {count for _, count in placement}
    if len(counts) == 1:
        nodes = ",".join(node.name for node, _ in placement)
        return [*common, f"--partition={cluster.partition}", f"--nodelist={nodes}", f"--nodes={len(placement)}",
                f"--ntasks-per-node={counts.pop()}", *per_task], ""
    args = list(common)
    for i, (node, count) in enumerate(placement):
        if i:
            args.append(":")
        args += [f"--partition={cluster.partition}", f"--nodelist={node.name}", "--nodes=1", f"--ntasks={count}",
                 *per_task]
    return args, f"--het-group=0-{len(placement) - 1} "


class _Output:
    """New lines of the job's output file, relayed into the run log."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def relay(self, context) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.strip():
                context.log.info(f"slurm: {line}")


def _output_tail(path: Path, lines: int = 8) -> str:
    """The last non-empty lines of the job's output file (why it failed, for the run's error), or ""."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 8192))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def _wait(context, alloc: RunAllocation, env: EnvConfig, job_id: str, step_dir: Path) -> JobState:
    """Poll the job until it leaves the queue; relay its output; tag the run with the ranks' devices once
    all ranks are up; fail it when it stays pending too long."""
    cfg, conf = env.launcher.slurm, env.cluster.slurm.slurm_conf
    output = _Output(step_dir / f"slurm-{job_id}.out")
    submitted, tagged, last, unreachable_since = time.monotonic(), False, None, None
    while True:
        try:
            state = job_state(job_id, conf)
        except SlurmUnreachable as exc:  # the job runs on without slurmctld; keep waiting for it
            if unreachable_since is None:
                unreachable_since = time.monotonic()
                context.log.warning(f"Slurm job {job_id}: {exc}; still waiting for the job")
            elif time.monotonic() - unreachable_since > UNREACHABLE_LIMIT_S:
                raise _failure(alloc, f"slurmctld unreachable for {UNREACHABLE_LIMIT_S:g} s while waiting for "
                               f"Slurm job {job_id}: {exc}") from exc
            time.sleep(POLL_S * 4)
            continue
        if unreachable_since is not None:
            context.log.info(f"Slurm job {job_id}: slurmctld answers again")
            unreachable_since = None
        output.relay(context)
        if state is None or not state.active:
            return state or JobState(job_id, "GONE", "no longer known to Slurm", "", "")
        if state.pending and time.monotonic() - submitted > cfg.pending_timeout_s:
            cancel_job(job_id, conf)
            raise _failure(alloc, f"Slurm job {job_id} still pending after {cfg.pending_timeout_s:g} s (reason: "
                           f"{state.reason}): its nodes are busy or unavailable outside this product; it is "
                           "cancelled and the job will be planned again", slurm_job=job_id, reason=state.reason)
        if state.state != last:
            context.log.info(f"Slurm job {job_id}: {state.state}" + (f" on {state.nodes}" if state.nodes else "")
                             + (f" ({state.reason})" if state.reason not in ("", "None") else ""))
            last = state.state
        if not tagged:
            records = read_rank_records(step_dir)
            if len(records) == alloc.world_size:
                devices = devices_text(records)
                context.log.info(f"ranks on devices: {devices}")
                context.instance.add_run_tags(context.run.run_id, {TAG_SLURM_DEVICES: devices})
                tagged = True
        time.sleep(POLL_S)


def _stop(context, alloc: RunAllocation, env: EnvConfig, job_id: str) -> None:
    """TERM every rank (they checkpoint), wait for the job to leave the queue, then cancel outright."""
    conf = env.cluster.slurm.slurm_conf
    state = job_state(job_id, conf)
    if state is None or not state.active:
        return
    if state.pending:
        cancel_job(job_id, conf)
        return
    context.log.info(f"Slurm job {job_id}: scancel --signal=TERM (ranks checkpoint within "
                     f"{env.launcher.grace_period_s:g} s)")
    signal_job(job_id, "TERM", conf)
    deadline = time.monotonic() + env.launcher.grace_period_s + STOP_MARGIN_S
    while time.monotonic() < deadline:
        state = job_state(job_id, conf)
        if state is None or not state.active:
            return
        time.sleep(POLL_S)
    context.log.warning(f"Slurm job {job_id} still running after the grace period: scancel")
    cancel_job(job_id, conf)


def _cancel_leftovers(context, env: EnvConfig, alloc: RunAllocation) -> None:
    """Slurm jobs of this job's earlier generations still in the queue (their Dagster run was killed
    without its ``finally``, e.g. kill -9 of the run worker) hold GPUs the new generation needs: TERM them
    (they checkpoint), then cancel them."""
    conf = env.cluster.slurm.slurm_conf
    prefix = f"ones-{alloc.job}-g"
    old = [j for j in jobs_named(prefix, conf) if j["name"] != job_name(alloc.job, alloc.generation)
           and j["name"][len(prefix):].isdigit()]
    for j in old:
        context.log.warning(f"Slurm job {j['job_id']} ({j['name']}) of an earlier generation is still "
                            f"{j['state'].lower()}: stopping it before generation {alloc.generation} starts")
        _stop(context, alloc, env, j["job_id"])


def run_slurm_step(context, env: EnvConfig, alloc: RunAllocation, extras: dict, step_env: dict):
    """Run the allocation as one Slurm job; the completed Pipes invocation (its results are the step's
    materialization). Raises ``dagster.Failure`` naming the job, generation, Slurm job id and reason."""
    _patient(context, lambda: _cancel_leftovers(context, env, alloc), "squeue")
    script, args, job_env, placement = _prepare(context, env, alloc, extras, context.run.run_id)
    step_dir, conf = script.parent, env.cluster.slurm.slurm_conf
    with dg.open_pipes_session(context=context, extras=extras,
                               context_injector=dg.PipesFileContextInjector(str(step_dir / "pipes-context.json")),
                               message_reader=WholeLineMessageReader(str(step_dir / "pipes-messages.jsonl"))
                               ) as session:
        try:
            variables = {**step_env, **session.get_bootstrap_env_vars(), **job_env}
            job_id = _patient(context, lambda: submit(str(script), args, variables, conf), "sbatch")
        except SlurmError as exc:
            raise _failure(alloc, f"sbatch refused the job: {exc}") from exc
        context.instance.add_run_tags(context.run.run_id, {TAG_SLURM_JOB: job_id})
        where = ", ".join(f"{count} on {node.name}" for node, count in placement)
        context.log.info(f"Slurm job {job_id} submitted: {alloc.describe()}; ranks {where}")
        try:
            final = _wait(context, alloc, env, job_id, step_dir)
        finally:
            _stop(context, alloc, env, job_id)
        clean = final.state == "COMPLETED" and final.exit_code in ("0:0", "")
        if not clean and read_leader_exit(step_dir / LEADER_EXIT_FILE) == "0":
            # Rank 0's task (the Pipes process) ended cleanly: the job's checkpoint or result and its MLflow
            # run are final, whatever Slurm made of the other tasks afterwards.
            context.log.warning(f"Slurm job {job_id} ended {final.state} (exit {final.exit_code}, reason "
                                f"{final.reason}) after rank 0 had ended cleanly: its checkpoint is final; "
                                f"output in {step_dir}")
            clean = True
        if not clean:
            tail = _output_tail(step_dir / f"slurm-{job_id}.out")
            raise _failure(alloc, f"Slurm job {job_id} ended {final.state} (exit {final.exit_code}, "
                           f"reason {final.reason}); output in {step_dir}"
                           + (f"; its last lines:\n{tail}" if tail else ""), slurm_job=job_id, state=final.state)
    return dg.PipesClientCompletedInvocation(session)
