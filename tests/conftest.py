from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


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
