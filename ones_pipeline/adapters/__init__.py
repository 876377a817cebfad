"""Adapters from the scheduling core to outside systems (MLflow tracking, launchers, GPU inventory)."""
