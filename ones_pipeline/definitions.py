"""The Dagster code location (``workspace.yaml``: python_module ``ones_pipeline.definitions``).

The one place the environment is chosen: ``$ONES_PROJECT_DIR`` (default: the working directory) and
``$ONES_ENV`` (default ``local``) select ``<project>/resources/<env>.yaml`` (read by ``config``). The
definitions are those of the ``OnesComponent`` (``ones_pipeline.defs.component``) built from that file:
the standalone ``ones up`` / ``ones run`` and a user's own Dagster project run the same component.
"""

from collections.abc import Callable

import dagster as dg

from ones_pipeline.defs.component import OnesComponent
from ones_pipeline.defs.launchers import StepLauncher


def build_definitions(project_dir: str | None = None, env_name: str | None = None,
                      launcher: Callable[..., StepLauncher] | None = None) -> dg.Definitions:
    """``launcher``: a launcher class (or partial) used instead of the one the environment names, called
    with the ``ones_env`` and ``mlflow`` resources (tests pass ``InMemoryLauncher``)."""
    return OnesComponent.from_env(project_dir, env_name).definitions(launcher=launcher)


defs = build_definitions()
