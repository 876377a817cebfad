"""``mlflow ui --app-name ones`` (``adapters/mlflow/ui_app.py``): a model-registry request still works when the auth
tables' classes are half-defined at that moment (the race that broke every registry request of `mlflow ui` 3.17)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

pytest.importorskip("mlflow")

# In a fresh process: (optionally) load the app as the server worker would, then what the run page's GraphQL request
# does halfway through importing mlflow.server.auth (a class whose relationship names one not defined yet), then the
# registry store as a registry request of the same page uses it for the first time. The "plain" case is
# the control: once MLflow fixes the race it fails, and ui_app.py can go.
RACE = textwrap.dedent("""
    import sys
    if sys.argv[1] == "app":
        import ones_pipeline.adapters.mlflow.ui_app  # noqa: F401
    from sqlalchemy import Column, Integer
    from sqlalchemy.orm import declarative_base, relationship
    Half = declarative_base()
    class SqlUser(Half):
        __tablename__ = "users"
        id = Column(Integer, primary_key=True)
        assignments = relationship("SqlUserRoleAssignment")
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore
    store = SqlAlchemyStore("sqlite:///" + sys.argv[2])
    print("registered models:", len(store.search_registered_models()))
""")


def test_the_entry_point_names_the_app():
    (ep,) = [e for e in entry_points(group="mlflow.app") if e.name == "ones"]
    assert ep.value == "ones_pipeline.adapters.mlflow.ui_app:app"


@pytest.mark.parametrize("first", ["app", "plain"])
def test_a_registry_request_survives_half_defined_auth_classes_only_with_the_app(first, tmp_path):
    out = subprocess.run([sys.executable, "-c", RACE, first, str(tmp_path / "mlflow.db")], capture_output=True,
                         text=True, timeout=300)
    if first == "app":
        assert out.returncode == 0 and "registered models: 0" in out.stdout, out.stderr[-2000:]
    else:  # what `mlflow ui` does: the registry store's import configures the half-defined class and fails
        assert out.returncode != 0 and "SqlUserRoleAssignment" in out.stderr, out.stderr[-2000:]
