"""The code location: every definition under ``defs/`` (the dataset and evaluation assets, and the ONES
component of ``defs/ones/defs.yaml``), as ``dg dev`` loads it."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
