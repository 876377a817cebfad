"""The Docker launcher: the training step in a container, through ``dagster_docker.PipesDockerClient``.

No ``from __future__ import annotations`` here: Dagster resolves annotations at runtime.

``PipesDockerClient`` passes the Pipes bootstrap variables in the container's environment and reads the
step's messages from the container's log stream (stderr). It stops the container in a ``finally`` but
never removes it, and leaks the created container when ``start()`` fails (a GPU request without the
NVIDIA runtime does): this module removes the job's leftovers before the start and this generation's
containers afterwards, whatever happened. Its ``stop()`` carries no timeout, so Docker would SIGKILL
10 s after SIGTERM, and the SDK's ``containers.create`` cannot set the container's own StopTimeout:
``OnesPipesDockerClient`` hands it a container whose ``stop()`` waits ``cfg.stop_timeout_s`` (longer
than the trainer's grace period, so the checkpoint gets written).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import docker
import docker.errors
import requests
from dagster_docker import PipesDockerClient

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


class StopTimeoutContainer:
    """A docker SDK container whose bare ``stop()`` waits ``timeout_s`` before SIGKILL."""

    def __init__(self, container, timeout_s: float):
        self._container = container
        self._timeout = stop_timeout(timeout_s)

    def stop(self, timeout=None, **kwargs):
        return self._container.stop(timeout=self._timeout if timeout is None else timeout, **kwargs)

    def __getattr__(self, name):
        return getattr(self._container, name)


class OnesPipesDockerClient(PipesDockerClient):
    """``PipesDockerClient`` whose ``finally: container.stop()`` gives the step ``stop_timeout_s``.

    Hooks ``_create_container``, which ``PipesDockerClient.run`` calls with keyword arguments
    (dagster-docker 0.29.27; the Dagster family is pinned and a test checks the timeout arrives)."""

    def __init__(self, stop_timeout_s: float, **kwargs):
        super().__init__(**kwargs)
        self.stop_timeout_s = stop_timeout_s

    def _create_container(self, **kwargs):
        return StopTimeoutContainer(super()._create_container(**kwargs), self.stop_timeout_s)


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

    client = None
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if client is not None:
            client.close()
        raise _failure(job, generation, f"no Docker engine answers (DOCKER_HOST or /var/run/docker.sock): {exc}; "
                       "start one (scripts/dockerd.sh start) or use launcher.kind: subprocess") from exc
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
            return OnesPipesDockerClient(cfg.stop_timeout_s).run(
                context=context, image=cfg.image, command=step_command(cfg), extras=extras,
                env=environment, container_kwargs=kwargs)
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
