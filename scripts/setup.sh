#!/usr/bin/env bash
# Create .venv (if missing) and install ones-pipeline with its training, live-pipeline and test extras from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[train,live,test]'
