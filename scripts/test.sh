#!/usr/bin/env bash
# Set up, then run the whole test suite (two worker processes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 -q -rs "$@"
