"""The example project of docs/extension.md: ONES added to a Dagster project as a component."""
