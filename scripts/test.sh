#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (two worker processes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Lint first (rules in pyproject.toml [tool.ruff.lint]); a finding fails the run like a failing test.
.venv/bin/ruff check ones_pipeline tests benchmarks
# --dist loadgroup: the tests sharing one Slurm cluster (xdist_group "slurm") run in one worker, in turn.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup -q -rs --durations=25 "$@"
