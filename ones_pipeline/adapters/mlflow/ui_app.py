"""``mlflow ui --app-name ones``: MLflow's own server app, its database mappers configured before any request.

``mlflow ui`` 3.17 (and 3.18) failed every model-registry request of a worker once a run page had been opened
(the run page: "Can't load run details"; the registry-version page: blank), with ``NameError:
SqlUserRoleAssignment``. The cause is a race inside each server worker: the run page's GraphQL request imports
``mlflow.server.auth`` (``handlers._get_graphql_auth_middleware``, on every request, basic-auth or not), which
defines the auth tables' SQLAlchemy classes one by one, while a model-registry request of the same page imports the
registry store for the first time, whose module runs ``sqlalchemy.orm.configure_mappers()``: that configures every
mapper of the process, the auth ``SqlUser`` included, whose relationship names ``SqlUserRoleAssignment``, not yet
defined. The failed mapper stays failed, so every later first-import of the store fails the same way. Seen on this
machine under load (a worker's log: the GraphQL request in flight while ``model-versions/get`` failed).

This app imports the tracking, registry and jobs stores first (each configures the mappers as it is imported), then
serves MLflow's app unchanged: the stores are no longer imported during a request, and the auth classes, imported
later by the GraphQL request, are never configured (no auth store is used). Registered by this package as the
``mlflow.app`` entry point ``ones``.
"""

import mlflow.store.jobs.sqlalchemy_store  # noqa: F401  (each of these runs configure_mappers() on import)
import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401
import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
from mlflow.server.fastapi_app import app  # noqa: E402

__all__ = ["app"]
