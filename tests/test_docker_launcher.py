"""The Docker launcher: container spec, Pipes round trip, cleanup, start failures and stops.

Most tests fake the engine at the docker SDK boundary (``docker.client.from_env``, which
``PipesDockerClient`` calls, and ``docker.from_env``): ``containers.create`` turns its kwargs into the
request body the real SDK would send, and a container's ``start()`` runs the command as a real local
process with the environment Pipes built, so the training step, its Pipes messages (read from the log
stream, as ``PipesDockerLogsMessageReader`` does) and its materialization are all real. The tests marked
``docker`` run one job in a real container, and ``training_job`` on 2 CPU slots shrunk and grown in place in
one (``scripts/dockerd.sh`` and ``scripts/docker_shim_image.sh`` provide the engine and image); they skip
when there is none.
"""

import builtins
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
pytest.importorskip("docker")
pytest.importorskip("dagster_docker")
pytest.importorskip("torch")
pytest.importorskip("mlflow")

import docker.errors  # noqa: E402
import docker.models.containers  # noqa: E402
from dagster._core.errors import DagsterExecutionInterruptedError  # noqa: E402
from dagster_pipes import decode_param  # noqa: E402

from ones_pipeline.adapters.docker_containers import (  # noqa: E402
    LABEL_GENERATION,
    LABEL_JOB,
    LABEL_MANAGED,
    cleanup_containers,
    container_kwargs,
    docker_available,
)
from ones_pipeline.cli.status import slots_text  # noqa: E402
from ones_pipeline.config import DockerConfig, load_env, load_job_spec  # noqa: E402
from ones_pipeline.config.layout import PROGRESS_FILE, preempt_request_file  # noqa: E402
from ones_pipeline.core.types import JobSpec, StopKind, StoppingRule  # noqa: E402
from ones_pipeline.definitions import build_definitions  # noqa: E402
from ones_pipeline.defs.assets import training_job  # noqa: E402
from ones_pipeline.defs.docker_step import run_docker_step  # noqa: E402
from ones_pipeline.defs.instance import job_run_infos  # noqa: E402
from ones_pipeline.defs.slot_owner import allocation_now, claim, read_ledger  # noqa: E402
from ones_pipeline.scheduler import Launch, RunAllocation  # noqa: E402
from ones_pipeline.scheduler.runs import Resize, held_periods  # noqa: E402
from ones_pipeline.train.checkpoint import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "ones-shim:local"
JOBS = dg.DynamicPartitionsDefinition(name="jobs")
API_VERSION = "1.41"  # what the host's docker.io 20.10 speaks


# -- a fake engine at the docker SDK boundary -------------------------------------------------------------
class _RequestRecorder(docker.api.APIClient):
    """Builds the JSON body of POST /containers/create exactly as the SDK does, and sends nothing."""

    def __init__(self):
        super().__init__(base_url="unix:///nonexistent.sock", version=API_VERSION)
        self.body = None

    def create_container_from_config(self, config, name=None, platform=None):
        self.body = config
        return {"Id": "unused"}


class FakeContainer:
    _ids = itertools.count(1)

    def __init__(self, engine, kwargs, body, labels=None, status="created"):
        self.engine, self.kwargs, self.body = engine, kwargs, body
        self.id = f"fake{next(self._ids):08d}"
        self.short_id = self.id[:10]
        self.labels = dict(labels if labels is not None else kwargs.get("labels") or {})
        self.status = status
        self.proc = None
        self.calls = []  # ("start",), ("logs", kwargs), ("wait",), ("stop", timeout, exit code), ("remove", force)

    def start(self):
        self.calls.append(("start",))
        if self.engine.start_error is not None:
            raise self.engine.start_error
        command = list(self.kwargs["command"])
        if command[0] == self.engine.python:  # the image's interpreter: this test's own
            command[0] = sys.executable
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **self.kwargs["environment"]}
        # Working directory / as in the shim image; in pytest's process group, so a CI kill reaches it too.
        self.proc = subprocess.Popen(command, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.status = "running"

    def logs(self, **kwargs):
        self.calls.append(("logs", kwargs))
        assert kwargs.get("stream") and kwargs.get("follow") and kwargs.get("stderr"), kwargs
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                line = b""
            if line is None:
                return
            if line:
                self.engine.log_lines.append(line)
                yield line
            if self.engine.interrupt_when is not None and self.engine.interrupt_when():
                # What Dagster raises in the step when the run is terminated.
                raise DagsterExecutionInterruptedError("run terminated (test)")

    def wait(self, **kwargs):
        self.calls.append(("wait",))
        rc = self.proc.wait()
        self.status = "exited"
        return {"StatusCode": rc if rc >= 0 else 128 - rc, "Error": None}

    def stop(self, timeout=None):
        rc = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout if timeout is not None else 10)  # Docker's default
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        self.calls.append(("stop", timeout, rc))
        self.status = "exited"

    def remove(self, force=False):
        self.calls.append(("remove", force))
        if self.status == "running" and not force:
            raise docker.errors.APIError("cannot remove a running container")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.engine.containers.items.remove(self)
        self.engine.removed.append(self)

    def reload(self):
        pass


class FakeContainers:
    def __init__(self, engine):
        self.engine = engine
        self.items = []

    def create(self, image, command=None, **kwargs):
        if image not in self.engine.images.tags:
            raise docker.errors.ImageNotFound(f"No such image: {image}")
        # The SDK's own translation (private helper; test only): unknown or badly typed kwargs fail here
        # as they would against a real engine, and the body shows what the engine would receive.
        sdk_kwargs = docker.models.containers._create_container_args(
            {**kwargs, "image": image, "command": command, "version": API_VERSION})
        recorder = _RequestRecorder()
        recorder.create_container(**sdk_kwargs)
        container = FakeContainer(self.engine, {**kwargs, "image": image, "command": command}, recorder.body)
        self.items.append(container)
        self.engine.created.append(container)
        return container

    def list(self, all=False, filters=None):
        filters = dict(filters or {})
        labels = filters.pop("label", [])
        labels = [labels] if isinstance(labels, str) else labels
        states = filters.pop("status", None)
        states = [states] if isinstance(states, str) else states
        assert not filters, f"fake engine: unsupported filters {filters}"

        def label_ok(c, f):
            key, _, value = f.partition("=")
            return key in c.labels and (not _ or c.labels[key] == value)

        return [c for c in self.items
                if (all or c.status == "running") and builtins.all(label_ok(c, f) for f in labels)
                and (states is None or c.status in states)]


class FakeImages:
    def __init__(self, tags):
        self.tags = set(tags)
        self.pulls = []

    def get(self, name):
        if name not in self.tags:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return name

    def pull(self, name, **kwargs):
        self.pulls.append(name)
        raise docker.errors.APIError(f"pull access denied for {name}: no registry reachable (fake)")


class FakeDocker:
    def __init__(self, python="python", images=(IMAGE,)):
        self.python = python
        self.images = FakeImages(images)
        self.containers = FakeContainers(self)
        self.created, self.removed, self.log_lines = [], [], []
        self.start_error = None
        self.interrupt_when = None

    def ping(self):
        return True

    def close(self):
        pass

    def add_leftover(self, labels, status):
        c = FakeContainer(self, {}, None, labels=labels, status=status)
        self.containers.items.append(c)
        return c


@pytest.fixture
def fake_docker(monkeypatch):
    engine = FakeDocker()
    monkeypatch.setattr(docker.client, "from_env", lambda *a, **k: engine)
    monkeypatch.setattr(docker, "from_env", lambda *a, **k: engine)
    yield engine
    for c in engine.created:  # never leave a training process behind a failed test
        if c.proc is not None and c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


# -- the job and the Dagster side ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_template(tmp_path_factory):
    """An MLflow sqlite store with its schema and experiment, copied per test (creating one takes seconds)."""
    from ones_pipeline.adapters.mlflow import ensure_store

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    ensure_store(f"sqlite:///{path}", "ones")
    return path


@pytest.fixture
def workdir(tmp_path, mlflow_template):
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return tmp_path


def tiny_extras(workdir: Path, job: str, epochs: float = 1) -> dict:
    spec = JobSpec(name=job, model="mlp-digits", dataset_size=1437, per_gpu_batch=32, base_lr=0.05,
                   stopping=StoppingRule(StopKind.EPOCHS, epochs=epochs))
    return {"allocation": RunAllocation.make(spec, (0,), "cpu", 32, 0).to_json(), "state_dir": str(workdir / "state"),
            "tracking_uri": f"sqlite:///{workdir}/mlflow.db", "experiment": "ones"}


def materialize_job(cfg, job, extras, workdir, gpus=(), env=None, raise_on_error=True, generation=None):
    state_dir = Path(extras["state_dir"])
    if generation is None:
        generation = RunAllocation.from_json(extras["allocation"]).generation

    @dg.asset(partitions_def=JOBS, name="training_job")
    def training_job(context: dg.AssetExecutionContext):
        invocation = run_docker_step(context, cfg, context.partition_key, generation, list(gpus),
                                     extras, dict(env or {}), state_dir, [workdir])
        return invocation.get_materialize_result()

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("jobs", [job])
        result = dg.materialize([training_job], partition_key=job, instance=instance, raise_on_error=raise_on_error)
        materialization = instance.get_latest_materialization_event(dg.AssetKey("training_job"))
    return result, materialization


def step_error(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "the step did not fail"
    error = failures[0].step_failure_data.error
    messages = []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    return "\n".join(messages)


# -- container spec --------------------------------------------------------------------------------------
def test_container_kwargs_gpus_mounts_labels(tmp_path):
    cfg = DockerConfig(image=IMAGE, shm_size="2g", volumes=(("/data/sets", "/data", "ro"),), user="1000:1000",
                       stop_timeout_s=44.5)
    state = tmp_path / "state"
    kw = container_kwargs(cfg, "mlp-a", 3, [0, 3], state, [tmp_path / "mlflow", state])

    assert not {"image", "command", "environment"} & set(kw)  # PipesDockerClient passes those
    assert kw["labels"] == {LABEL_MANAGED: "true", LABEL_JOB: "mlp-a", LABEL_GENERATION: "3"}
    assert kw["volumes"] == {"/data/sets": {"bind": "/data", "mode": "ro"},
                             str(state): {"bind": str(state), "mode": "rw"},
                             str(tmp_path / "mlflow"): {"bind": str(tmp_path / "mlflow"), "mode": "rw"}}
    assert (kw["shm_size"], kw["network_mode"], kw["init"], kw["user"]) == ("2g", "none", True, "1000:1000")
    (request,) = kw["device_requests"]
    assert request == {"Driver": "", "Count": 0, "DeviceIDs": ["0", "3"], "Capabilities": [["gpu"]], "Options": {}}

    cpu = container_kwargs(DockerConfig(image=IMAGE), "mlp-a", 0, [], state)
    assert "device_requests" not in cpu and "user" not in cpu
    with pytest.raises(ValueError, match="mode 'rx'"):
        container_kwargs(DockerConfig(image=IMAGE, volumes=(("/a", "/b", "rx"),)), "mlp-a", 0, [], state)
    with pytest.raises(ValueError, match="already mounted at /b"):
        container_kwargs(DockerConfig(image=IMAGE, volumes=((str(state), "/b", "ro"),)), "mlp-a", 0, [], state)


def test_cleanup_removes_only_finished_containers_of_ours(fake_docker):
    def labels(job, gen, managed="true"):
        return {LABEL_MANAGED: managed, LABEL_JOB: job, LABEL_GENERATION: str(gen)}

    a0 = fake_docker.add_leftover(labels("a", 0), "exited")
    a1 = fake_docker.add_leftover(labels("a", 1), "created")
    a2_running = fake_docker.add_leftover(labels("a", 2), "running")
    b0 = fake_docker.add_leftover(labels("b", 0), "dead")
    foreign = fake_docker.add_leftover(labels("a", 0, managed="false"), "exited")
    unlabelled = fake_docker.add_leftover({}, "exited")

    assert cleanup_containers(fake_docker, job="a", generation=1) == 1
    assert fake_docker.removed == [a1]
    assert cleanup_containers(fake_docker, job="a") == 1
    assert fake_docker.removed == [a1, a0]
    assert cleanup_containers(fake_docker) == 1
    assert fake_docker.removed == [a1, a0, b0]
    assert set(fake_docker.containers.items) == {a2_running, foreign, unlabelled}
    assert all(("remove", True) in c.calls for c in fake_docker.removed)


def test_docker_available_false_without_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    t0 = time.monotonic()
    assert docker_available(timeout_s=2) is False
    assert time.monotonic() - t0 < 5


def test_no_engine_fails_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")  # the real SDK, nothing listening
    job = "no-engine"
    extras = {"state_dir": str(tmp_path / "state")}
    result, _ = materialize_job(DockerConfig(image=IMAGE), job, extras, tmp_path, raise_on_error=False, generation=2)

    assert not result.success
    message = step_error(result)
    assert f"job {job} generation 2: no Docker engine answers" in message and "scripts/dockerd.sh" in message


# -- the Pipes round trip through the fake engine -----------------------------------------------------
def test_trains_in_fake_container_and_removes_it(fake_docker, workdir):
    job = "mlp-docker"
    leftover = fake_docker.add_leftover({LABEL_MANAGED: "true", LABEL_JOB: job, LABEL_GENERATION: "7"}, "exited")
    other_job = fake_docker.add_leftover({LABEL_MANAGED: "true", LABEL_JOB: "other", LABEL_GENERATION: "0"}, "exited")
    cfg = DockerConfig(image=IMAGE, environment={"ONES_TEST_MARK": "from-config", "CUDA_VISIBLE_DEVICES": "5"})
    extras = tiny_extras(workdir, job)

    result, materialization = materialize_job(cfg, job, extras, workdir, env={"ONES_STEP_ENV": "1"})

    assert result.success
    (container,) = fake_docker.created
    kw, body = container.kwargs, container.body
    assert kw["image"] == IMAGE and kw["command"] == ["python", "-m", "ones_pipeline.train"]
    assert kw["labels"] == {LABEL_MANAGED: "true", LABEL_JOB: job, LABEL_GENERATION: "0"}
    state = str(workdir / "state")
    assert kw["volumes"][state] == {"bind": state, "mode": "rw"}
    assert kw["volumes"][str(workdir)] == {"bind": str(workdir), "mode": "rw"}  # the MLflow sqlite file
    assert (kw["shm_size"], kw["network_mode"], kw["init"]) == ("1g", "none", True)
    assert "device_requests" not in kw
    env = kw["environment"]
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= set(env)
    assert env["ONES_TEST_MARK"] == "from-config" and env["ONES_STEP_ENV"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env  # host GPU ids are wrong inside a container
    pipes_extras = decode_param(env["DAGSTER_PIPES_CONTEXT"])["data"]["extras"]
    assert pipes_extras == {**extras, "in_container": True}  # GPUs are renumbered from 0 inside
    assert decode_param(env["DAGSTER_PIPES_MESSAGES"]) == {"stdio": "stderr"}  # read back from the logs
    # What the engine would have received.
    host = body["HostConfig"]
    assert sorted(host["Binds"]) == sorted([f"{state}:{state}:rw", f"{workdir}:{workdir}:rw"])
    assert (host["NetworkMode"], host["Init"], host["ShmSize"]) == ("none", True, 2**30)
    assert body["Labels"][LABEL_JOB] == job and "ONES_TEST_MARK=from-config" in body["Env"]

    # The step's own materialization came back through the log stream.
    metadata = materialization.asset_materialization.metadata
    assert metadata["accuracy"].value > 0.5
    assert metadata["samples"].value == 1437 and metadata["generation"].value == 0
    assert materialization.asset_materialization.partition == job
    assert any(b"__dagster_pipes_version" in line for line in fake_docker.log_lines)  # messages came via logs
    assert json.loads((workdir / "state" / "result.json").read_text())["samples"] == 1437

    # Pipes stopped it, we removed it; the job's leftover went before the start, the other job's stays.
    assert [c[0] for c in container.calls] == ["start", "logs", "wait", "stop", "remove"]
    assert container.calls[3][1:] == (30, None)  # cfg.stop_timeout_s; it had already exited
    assert fake_docker.removed == [leftover, container]
    assert fake_docker.containers.items == [other_job]


def test_gpu_start_failure_is_clear_and_removes_the_container(fake_docker, workdir):
    fake_docker.start_error = docker.errors.APIError(
        'could not select device driver "" with capabilities: [[gpu]]')
    job = "gpu-job"
    result, materialization = materialize_job(DockerConfig(image=IMAGE), job, tiny_extras(workdir, job), workdir,
                                              gpus=[0, 3], raise_on_error=False)

    assert not result.success and materialization is None
    message = step_error(result)
    assert f"job {job} generation 0" in message and "could not select device driver" in message
    assert "NVIDIA Container Toolkit" in message
    (container,) = fake_docker.created
    (request,) = container.body["HostConfig"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["0", "3"] and request["Capabilities"] == [["gpu"]]
    # PipesDockerClient leaves a container whose start failed; the launcher removes it.
    assert container.calls == [("start",), ("remove", True)]
    assert fake_docker.containers.items == []


def test_missing_image_fails_before_creating_anything(fake_docker, workdir):
    job = "no-image"
    cfg = DockerConfig(image="ones-missing:local")
    result, _ = materialize_job(cfg, job, tiny_extras(workdir, job), workdir, raise_on_error=False)

    assert not result.success
    message = step_error(result)
    assert "ones-missing:local" in message and "docker_shim_image.sh" in message
    assert fake_docker.images.pulls == ["ones-missing:local"] and fake_docker.created == []


def test_interrupt_stops_container_which_checkpoints_then_is_removed(fake_docker, workdir):
    """A run termination inside the step: PipesDockerClient's finally stops the container (SIGTERM to
    its main process), the trainer checkpoints and exits 0, and the launcher removes the container."""
    job = "stopped-job"
    extras = tiny_extras(workdir, job, epochs=50)
    run_id_file = workdir / "state" / "mlflow_run_id"
    fake_docker.interrupt_when = run_id_file.exists  # the trainer is up and training

    cfg = DockerConfig(image=IMAGE, stop_timeout_s=11.2)
    result, materialization = materialize_job(cfg, job, extras, workdir, raise_on_error=False)

    assert not result.success and materialization is None
    (container,) = fake_docker.created
    names = [c[0] for c in container.calls]
    assert names == ["start", "logs", "stop", "remove"]  # no wait(): interrupted while streaming logs
    _, timeout, exit_code = container.calls[2]
    assert timeout == 12  # cfg.stop_timeout_s rather than Docker's 10 s
    assert exit_code == 0  # stopped cleanly within the grace period
    assert (workdir / "state" / "checkpoint-latest.pt").exists()
    assert not (workdir / "state" / "result.json").exists()
    assert fake_docker.containers.items == []


# -- a real engine ----------------------------------------------------------------------------------------
def _engine_with_image():
    if not docker_available():
        return None
    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        return None
    return client


def _real_engine():
    client = _engine_with_image()
    if client is None:
        pytest.skip(f"no Docker engine with image {IMAGE} (scripts/dockerd.sh start; scripts/docker_shim_image.sh)")
    return client


def _shim_config(workdir: Path) -> DockerConfig:
    """The host-shim image with this machine's /usr, /etc, Python and project mounted read-only."""
    prefix = Path(sys.base_prefix).resolve()
    volumes = [("/usr", "/usr", "ro"), ("/etc", "/etc", "ro"), (str(ROOT), str(ROOT), "ro")]
    if not prefix.is_relative_to("/usr"):
        volumes.append((str(prefix), str(prefix), "ro"))
    venv = Path(sys.prefix)
    if not venv.is_relative_to(ROOT) and not venv.is_relative_to(prefix):
        volumes.append((str(venv), str(venv), "ro"))
    return DockerConfig(image=IMAGE, python=sys.executable, volumes=tuple(volumes),
                        environment={"HOME": str(workdir), "MLFLOW_DISABLE_TELEMETRY": "true"})


@pytest.mark.docker
def test_trains_in_real_container(workdir):
    client = _real_engine()
    job = "mlp-real-docker"
    cfg = _shim_config(workdir)
    try:
        result, materialization = materialize_job(cfg, job, tiny_extras(workdir, job), workdir)
        assert result.success
        metadata = materialization.asset_materialization.metadata
        assert metadata["accuracy"].value > 0.5 and metadata["samples"].value == 1437
        assert json.loads((workdir / "state" / "result.json").read_text())["samples"] == 1437
        left = client.containers.list(all=True, filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_JOB}={job}"]})
        assert left == []
    finally:
        cleanup_containers(client, job)
        client.close()


def _events(state: Path, name: str) -> list[dict]:
    path = state / PROGRESS_FILE
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [r for r in rows if r.get("event") == name]


def _wait(what: str, ready, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := ready()):
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


@pytest.mark.docker
def test_a_cpu_job_in_a_real_container_shrinks_and_grows_in_place(tmp_path):
    """``training_job`` through the docker launcher on 2 CPU slots in a real container, changed as the apply run
    changes it (``slot_owner.claim``, which writes the request): shrink 2 -> 1 and grow 1 -> 2 in place (the
    newcomer starts in the same container, beside the launcher), then the scheduler's stop. After each change
    the run's tags, what ``ones status`` shows and the slot ledger agree; one container throughout; the
    checkpoint's sample count is exact."""
    client = _real_engine()
    job = "mlp-docker-resize"
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    cfg = _shim_config(tmp_path)
    (tmp_path / "resources" / "local.yaml").write_text(json.dumps({
        "cluster": {"gpus": "none", "cpu_slots": 2}, "scheduler": {"min_run_s": 0},
        "launcher": {"kind": "docker", "grace_period_s": 20, "docker": {
            "image": IMAGE, "python": cfg.python, "volumes": [":".join(v) for v in cfg.volumes],
            "environment": dict(cfg.environment)}}}))
    (tmp_path / "assets" / "jobs" / f"{job}.yaml").write_text(
        "model: mlp-digits\nper_gpu_batch: 16\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\nstopping: {epochs: 100000}\n")
    defs = build_definitions(str(tmp_path))
    env = load_env(tmp_path)
    state = env.job_state_dir(job)
    allocation = RunAllocation.make(load_job_spec(tmp_path / "assets" / "jobs" / f"{job}.yaml"), (0, 1), "cpu", 32, 0)
    labels = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_JOB}={job}"]}
    seen: dict = {"ranks": [], "status": [], "ledger": []}

    def ranks(container) -> int:  # training processes in the container (the launcher's children)
        return sum("ones_pipeline.train.builtin" in p[-1] for p in container.top()["Processes"])

    def change(instance, run_id: str, before: list, after: list) -> None:
        """What the apply run does for an in-place change; then wait until the step has seen it done."""
        batch = 16 * len(after)
        resize = Resize(run_id, job, 0, tuple(before), tuple(after), batch, 0.05 * len(after), "cpu", "test")
        assert claim(instance, resize.to_dict(), state, wait_s=30, log=pytest.fail)  # and asks the launcher
        _wait(f"resized to {len(after)}", lambda: [r for r in _events(state, "resized") if r["to"] == len(after)])
        _wait("the step frees what the run gave up",
              lambda: allocation_now(instance, run_id, state).held_ids == tuple(sorted(after)))

    def drive(instance) -> None:
        try:
            (container,) = _wait("the container", lambda: client.containers.list(filters=labels))
            _wait("training at 2 slots", lambda: _events(state, "training"))
            (run,) = instance.get_runs(dg.RunsFilter(tags={"ones/job": job}))
            seen["ranks"].append(ranks(container))
            for before, after in (([0, 1], [0]), ([0], [0, 1])):
                change(instance, run.run_id, before, after)
                _wait(f"{len(after)} rank process(es)", lambda after=after: ranks(container) == len(after))
                seen["ranks"].append(ranks(container))
                info = allocation_now(instance, run.run_id, state)
                seen["status"].append((info.slot_ids, info.held_ids, slots_text("cpu", info)))
                seen["ledger"].append([(r["claimed"], r["freed"]) for r in read_ledger(state)])
            container.reload()
            seen["host_config"] = container.attrs["HostConfig"]
            seen["containers"] = {c.id for c in client.containers.list(all=True, filters=labels)} | {container.id}
        except Exception as exc:  # noqa: BLE001 (raised by the test)
            seen["error"] = exc
        finally:
            preempt_request_file(state, 0).write_text(json.dumps({"reason": "test over"}))

    try:
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("training_jobs", [job])
            driver = threading.Thread(target=drive, args=(instance,), daemon=True)
            driver.start()
            result = dg.materialize(
                [training_job], partition_key=job, instance=instance,
                run_config={"ops": {"training_job": {"config": {"allocation": allocation.to_json()}}}},
                tags=Launch(allocation, "test").tags(),
                resources={k: v for k, v in defs.resources.items() if k in ("launcher", "mlflow")})
            driver.join(timeout=30)
            (run,) = job_run_infos(instance, env.job_state_dir, job)
            periods = held_periods(run, read_ledger(state), time.time())
        if "error" in seen:
            raise seen["error"]
        assert result.success
        assert seen["ranks"] == [2, 1, 2]  # the grow's newcomer started inside the same container
        assert len(seen["containers"]) == 1  # one container throughout: nothing went through a checkpoint
        # the tags (allocation, held slots), `ones status` and the ledger agree after each change
        assert seen["status"] == [((0,), (0,), "cpu 0"), ((0, 1), (0, 1), "cpu 0,1")]
        assert seen["ledger"] == [[([0, 1], []), ([], [1])], [([0, 1], []), ([], [1]), ([1], [])]]
        assert [slots for _, _, slots in periods] == [(0, 1), (0,), (0, 1)]
        # CPU slots are training processes, not cores: the container is neither pinned nor limited at any size
        assert seen["host_config"]["CpusetCpus"] == "" and seen["host_config"]["NanoCpus"] == 0
        assert [(r["from"], r["to"]) for r in _events(state, "resized")] == [(2, 1), (1, 2)]
        assert not _events(state, "resize_fallback")
        progress = load_checkpoint(state)["progress"]
        assert progress["samples_done"] == progress["epoch"] * 1437 + progress["position"] > 0
        assert client.containers.list(all=True, filters=labels) == []
    finally:
        state.mkdir(parents=True, exist_ok=True)
        preempt_request_file(state, 0).write_text(json.dumps({"reason": "test over"}))
        for c in client.containers.list(all=True, filters=labels):
            c.remove(force=True)
        client.close()
