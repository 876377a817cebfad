"""Containers for the training step, through the docker SDK only (no Dagster here).

``container_kwargs`` builds what ``dagster_docker.PipesDockerClient.run(container_kwargs=...)`` forwards
to ``client.containers.create``: GPU device requests, labels, bind mounts, shared memory, network, init
and user. Image, command and environment are not in it: the Pipes client passes those. (The SDK's
``containers.create`` cannot set a stop timeout; the launcher passes ``cfg.stop_timeout_s`` to
``stop()`` instead.)

Every container we create carries three labels, so that what Docker leaves behind can be found and
removed (``PipesDockerClient`` never removes a container, and leaks the created one when ``start()``
fails)::

    ones.managed=true   ones.job=<job name>   ones.generation=<allocation generation>
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.types

if TYPE_CHECKING:
    from ones_pipeline.config import DockerConfig

log = logging.getLogger("ones_pipeline.docker")

LABEL_JOB = "ones.job"
LABEL_GENERATION = "ones.generation"
LABEL_MANAGED = "ones.managed"
# States of a container that holds nothing any more: safe to remove without stopping anything.
FINISHED_STATES = ("created", "exited", "dead")
VOLUME_MODES = ("ro", "rw")


def stop_timeout(seconds: float) -> int:
    """Seconds between SIGTERM and SIGKILL for ``container.stop(timeout=...)`` (the API takes whole seconds)."""
    return max(0, math.ceil(seconds))


def container_labels(job: str, generation: int) -> dict[str, str]:
    return {LABEL_MANAGED: "true", LABEL_JOB: job, LABEL_GENERATION: str(int(generation))}


def label_filters(job: str | None = None, generation: int | None = None) -> list[str]:
    """Docker ``label`` filter values (ANDed by the engine) for our containers of a job / generation."""
    out = [f"{LABEL_MANAGED}=true"]
    if job is not None:
        out.append(f"{LABEL_JOB}={job}")
    if generation is not None:
        out.append(f"{LABEL_GENERATION}={int(generation)}")
    return out


def container_kwargs(cfg: DockerConfig, job: str, generation: int, gpus: Sequence[int], state_dir: Path,
                     mounts: Sequence[Path] = ()) -> dict[str, Any]:
    """Keyword arguments for ``containers.create`` (via ``PipesDockerClient.run(container_kwargs=...)``).

    ``gpus`` are host GPU ids; they become one device request (the NVIDIA runtime then numbers them
    from 0 inside). ``state_dir`` and each of ``mounts`` (e.g. the MLflow sqlite file's directory) are
    bind-mounted read-write at the same absolute path, so paths in the Pipes extras mean the same
    thing inside and out; ``cfg.volumes`` are added as given. Raises ValueError naming the bad value.
    """
    volumes: dict[str, dict[str, str]] = {}

    def add(host: str, target: str, mode: str, what: str) -> None:
        if mode not in VOLUME_MODES:
            raise ValueError(f"docker {what}: mode {mode!r} for {host}; allowed: {', '.join(VOLUME_MODES)}")
        if not Path(host).is_absolute() or not Path(target).is_absolute():
            raise ValueError(f"docker {what}: {host}:{target} must be absolute paths")
        previous = volumes.get(host)
        if previous is not None and previous["bind"] != target:
            raise ValueError(f"docker {what}: {host} is already mounted at {previous['bind']}, "
                             f"cannot also mount it at {target}")
        if previous is None or mode == "rw":  # the same directory twice: the writable mount wins
            volumes[host] = {"bind": target, "mode": mode}

    for host, target, mode in cfg.volumes:
        add(str(host), str(target), mode, "launcher.docker.volumes")
    for path in (state_dir, *mounts):
        absolute = str(Path(path).resolve())
        add(absolute, absolute, "rw", "state/tracking mount")

    kwargs: dict[str, Any] = {
        "labels": container_labels(job, generation),
        "volumes": volumes,
        "shm_size": cfg.shm_size,
        "network_mode": cfg.network,
        "init": cfg.init,
    }
    if cfg.user is not None:
        kwargs["user"] = cfg.user
    if gpus:
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(device_ids=[str(int(g)) for g in gpus], capabilities=[["gpu"]])]
    return kwargs


def _labels_match(labels: dict[str, str] | None, filters: Sequence[str]) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in (f.split("=", 1) for f in filters))


def list_containers(client: Any, job: str | None = None, generation: int | None = None,
                    states: Sequence[str] | None = None) -> list[Any]:
    """Our containers (label ``ones.managed=true``), optionally of one job / generation / in ``states``."""
    filters: dict[str, Any] = {"label": label_filters(job, generation)}
    if states is not None:
        filters["status"] = list(states)
    found = client.containers.list(all=True, filters=filters)
    # Belt and braces: never touch a container without our labels, whatever the engine's filter did.
    return [c for c in found if _labels_match(getattr(c, "labels", None), filters["label"])]


def cleanup_containers(client: Any, job: str | None = None, generation: int | None = None) -> int:
    """Force-remove our containers that are created, exited or dead (of ``job`` / ``generation`` when
    given); running ones are left alone. Returns how many were removed."""
    removed = 0
    for container in list_containers(client, job, generation, FINISHED_STATES):
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.NotFound:  # removed concurrently (another cleanup, --rm)
            pass
        except docker.errors.APIError as exc:  # e.g. "removal already in progress": retried next time
            log.warning("could not remove container %s: %s", getattr(container, "short_id", "?"), exc)
    return removed


def stop_containers(client: Any, job: str, timeout_s: float) -> int:
    """Stop the job's still-running containers (an earlier generation whose orchestrator died without
    stopping it, so it still holds its GPUs and writes the state directory). Returns how many."""
    stopped = 0
    for container in list_containers(client, job, states=("running", "restarting", "paused")):
        log.warning("job %s: container %s (generation %s) is still running: stopping it", job,
                    getattr(container, "short_id", "?"), (container.labels or {}).get(LABEL_GENERATION))
        try:
            container.stop(timeout=stop_timeout(timeout_s))
            stopped += 1
        except docker.errors.NotFound:
            pass
    return stopped


def image_present(client: Any, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


def docker_available(timeout_s: float = 3.0) -> bool:
    """True when a Docker engine answers (``DOCKER_HOST`` or the default socket) within ``timeout_s``."""
    try:
        client = docker.from_env(timeout=timeout_s)
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except Exception:  # connection refused, timeout, bad response: no usable engine
        return False
    finally:
        client.close()
