"""The training step in a Docker container, with Dagster Pipes, through public APIs only.

``dagster_docker.PipesDockerClient`` cannot be used as it is: its ``finally: container.stop()`` passes
no timeout, so Docker would SIGKILL the step 10 s after SIGTERM, before a checkpoint of a large model is
written (and the SDK's ``containers.create`` cannot set the container's own StopTimeout). Overriding its
private ``_create_container`` would tie us to its internals, so this module owns the small loop
instead, from public pieces: ``dg.open_pipes_session`` with ``dg.PipesEnvContextInjector`` (the
bootstrap variables go into the container's environment) and ``dagster_docker.PipesDockerLogsMessageReader``
(the step's messages come back on the container's log stream). Create, start, consume the logs, wait;
in a ``finally`` (also when Dagster interrupts the step to cancel the run) ``stop(timeout=cfg.stop_timeout_s)``,
longer than the trainer's grace period.

Docker never removes what it ran and keeps a created container whose ``start()`` failed (a GPU request
without the NVIDIA runtime does): this module removes the job's leftovers before the start and this
generation's containers afterwards, whatever happened.

No ``from __future__ import annotations`` here: Dagster resolves annotations at runtime.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import docker
import docker.errors
import requests
from dagster_docker import PipesDockerLogsMessageReader
from dagster_pipes import DagsterPipesError

from ones_pipeline.adapters.docker_containers import (
    cleanup_containers,
    container_kwargs,
    image_present,
    stop_containers,
    stop_timeout,
)
from ones_pipeline.config import DockerConfig

STEP_MODULE = "ones_pipeline.train"
SQLITE_PREFIX = "sqlite:///"
# Host GPU ids mean nothing inside the container (the runtime renumbers the requested GPUs from 0).
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES",)


def step_command(cfg: DockerConfig) -> list:
    return [cfg.python, "-m", STEP_MODULE]


def _sqlite_dirs(uris: Sequence[Any]) -> list:
    """Directories of absolute ``sqlite:///`` tracking URIs: the container must see them read-write."""
    out = []
    for uri in uris:
        if isinstance(uri, str) and uri.startswith(SQLITE_PREFIX):
            path = Path(uri[len(SQLITE_PREFIX):])
            if not path.is_absolute():
                raise ValueError(f"tracking URI {uri!r}: a container needs an absolute sqlite path "
                                 "(sqlite:////abs/path/mlflow.db)")
            out.append(path.parent)
    return out


def _failure(job: str, generation: int, what: str, **metadata: Any) -> dg.Failure:
    return dg.Failure(description=f"job {job} generation {generation}: {what}",
                      metadata={k: v for k, v in metadata.items() if v is not None})


def _start_error_hint(exc: docker.errors.APIError, gpus: Sequence[int]) -> str:
    text = str(exc)
    if gpus and ("device driver" in text or "nvidia" in text.lower()):
        return ("; the engine cannot give containers GPUs: install the NVIDIA Container Toolkit on the "
                "Docker host (nvidia-ctk runtime configure --runtime=docker) and restart dockerd")
    if "docker-init" in text:
        return "; the engine has no docker-init (tini): install it or set launcher.docker.init: false"
    return ""


def _engine(job: str, generation: int):
    """A docker SDK client whose engine answers, or ``dagster.Failure`` saying how to get one."""
    client = None
    try:
        client = docker.from_env()
        client.ping()
        return client
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if client is not None:
            client.close()
        raise _failure(job, generation, f"no Docker engine answers (DOCKER_HOST or /var/run/docker.sock): {exc}; "
                       "start one (scripts/dockerd.sh start) or use launcher.kind: subprocess") from exc


def run_docker_step(context, cfg: DockerConfig, job: str, generation: int, gpus: Sequence[int],
                    extras: dict, env: dict, state_dir: Path, mounts: Sequence[Path] = ()):
    """Run ``python -m ones_pipeline.train`` for one allocation in a container; return the
    ``PipesClientCompletedInvocation`` (call ``.get_materialize_result()`` or inspect its results).

    ``gpus`` are host GPU ids (one device request); inside they are numbered from 0, so the step is
    told ``in_container`` and ``CUDA_VISIBLE_DEVICES`` is not passed. ``state_dir``, ``mounts`` and the
    directory of a sqlite tracking URI in ``extras`` / ``env`` are mounted read-write at the same path.
    ``env`` overrides ``cfg.environment``. Docker problems (engine unreachable, image missing, start
    refused) raise ``dagster.Failure`` naming the job, the generation and the fix; a non-zero exit of
    the step raises ``DagsterPipesError`` from the Pipes client.
    """
    state_dir = Path(state_dir).resolve()
    given = extras.get("state_dir")
    if given is not None and Path(given).resolve() != state_dir:
        raise ValueError(f"job {job}: extras state_dir {given!r} differs from the mounted state_dir {state_dir}")
    extras = {**extras, "state_dir": str(state_dir), "in_container": True}
    environment = {str(k): str(v) for k, v in {**cfg.environment, **env}.items() if k not in DROPPED_ENV}
    mounts = [*mounts, *_sqlite_dirs([extras.get("tracking_uri"), environment.get("MLFLOW_TRACKING_URI")])]
    state_dir.mkdir(parents=True, exist_ok=True)
    for m in mounts:  # a missing source would be created by the engine, as root
        Path(m).mkdir(parents=True, exist_ok=True)
    kwargs = container_kwargs(cfg, job, generation, gpus, state_dir, mounts)
    grace = extras.get("grace_period_s")
    if grace is not None and float(grace) >= cfg.stop_timeout_s:
        context.log.warning(f"job {job}: launcher.docker.stop_timeout_s {cfg.stop_timeout_s} is not above the "
                            f"grace period {grace} s: a stopped container may be killed before its checkpoint")

    client = _engine(job, generation)
    try:
        stopped = stop_containers(client, job, cfg.stop_timeout_s)
        removed = cleanup_containers(client, job)
        if stopped or removed:
            context.log.info(f"job {job}: stopped {stopped} and removed {removed} leftover container(s)")
        if not image_present(client, cfg.image):
            try:
                client.images.pull(cfg.image)
            except docker.errors.DockerException as exc:
                raise _failure(job, generation, f"image {cfg.image!r} is not on the Docker host and could not be "
                               f"pulled ({exc}); build it (scripts/docker_shim_image.sh builds ones-shim:local) or "
                               "fix launcher.docker.image", image=cfg.image) from exc
        context.log.info(f"job {job} generation {generation}: container from {cfg.image} on GPUs "
                         f"{list(gpus) or 'none (CPU)'}")
        try:
            return _run_with_pipes(context, client, cfg, extras, environment, kwargs)
        except docker.errors.APIError as exc:
            raise _failure(job, generation, f"Docker refused the container from {cfg.image!r} "
                           f"({exc}){_start_error_hint(exc, gpus)}", image=cfg.image,
                           gpus=",".join(str(g) for g in gpus) or None) from exc
    finally:
        try:
            cleanup_containers(client, job, generation)
        except docker.errors.DockerException as exc:  # never hide the step's own error behind this one
            context.log.warning(f"job {job} generation {generation}: could not remove its container(s): {exc}")
        client.close()


def _run_with_pipes(context, client, cfg: DockerConfig, extras: dict, environment: dict, kwargs: dict):
    """Create and start the container inside a Pipes session, read its messages from its logs, wait for
    it; stop it (with the configured timeout) whatever happens. Returns the completed invocation."""
    reader = PipesDockerLogsMessageReader()
    with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                               message_reader=reader, extras=extras) as session:
        container = client.containers.create(
            image=cfg.image, command=step_command(cfg), detach=True,
            environment={**session.get_bootstrap_env_vars(), **environment}, **kwargs)
        container.start()
        try:
            reader.consume_docker_logs(container)
            status = container.wait()
            if status["StatusCode"] != 0:
                raise DagsterPipesError(f"Container exited with non-zero status code: {status}")
        finally:
            container.stop(timeout=stop_timeout(cfg.stop_timeout_s))
    return dg.PipesClientCompletedInvocation(session)
