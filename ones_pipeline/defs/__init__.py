"""The only package that imports Dagster: resources, the ``training_job`` and ``cluster_report`` assets,
the ONES scheduling sensor, and the launchers' Dagster side. ``ones_pipeline.definitions`` assembles them."""
