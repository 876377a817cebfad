#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (two worker processes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Lint first (rules in pyproject.toml [tool.ruff.lint]); a finding fails the run like a failing test.
.venv/bin/ruff check ones_pipeline tests benchmarks
exec .venv/bin/python -m pytest -n 2 -q -rs "$@"
