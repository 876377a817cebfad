import fcntl
import os
import tempfile
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="tests/fuzz: many more (random) examples per property, and the simulator runs; minutes")


def pytest_configure(config):
    if config.getoption("--fuzz-long"):  # read by tests/fuzz/fuzz_values.py when it builds its settings
        os.environ["ONES_FUZZ_LONG"] = "1"


@pytest.fixture(scope="session")
def traces() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared traces not found at {SHARED}")
    return SHARED


# MLflow stores for the tests of adapters/mlflow: creating one takes seconds, so one template per module,
# copied for each test.
@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    from mlflow_helpers import make_template

    return make_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture
def uri(template_db, tmp_path) -> str:
    from mlflow_helpers import copy_store

    return copy_store(template_db, tmp_path)


@pytest.fixture(autouse=True)
def _one_slurm_test_at_a_time(request):
    """Tests marked ``slurm`` share one private cluster (its GPUs, its queue, its drained nodes): they hold
    an exclusive lock beside its config while they run. ``--dist loadgroup`` was meant to keep them on
    one worker, but pytest 9.2 broke that silently (pytest-dev/pytest-xdist#1386: tests of one
    ``xdist_group`` ran on both workers at once, and a test draining a node or cancelling its leftovers
    failed another's Slurm job); pyproject.toml keeps pytest below 9.2 and this lock holds either way."""
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    conf = os.environ.get("SLURM_CONF")
    where = Path(conf).parent if conf and Path(conf).parent.is_dir() else Path(tempfile.gettempdir())
    with open(where / "ones-slurm-tests.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture
def sensor_tick():
    """One evaluation of a project's scheduler sensor on ``instance`` from ``cursor``, through Dagster's sensor
    context (its resources built as the daemon builds them); the dynamic partitions it adds are added."""
    import dagster as dg

    from ones_pipeline.definitions import build_definitions

    def tick(project, instance, cursor):
        defs = build_definitions(str(project))
        sensor = defs.resolve_sensor_def("ones_scheduler_sensor")
        with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                     resources=defs.resources) as ctx:
            result = sensor(ctx)
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        return result

    return tick
