#!/usr/bin/env bash
# Set up, then run the live pipeline headless on the embedded default (subprocess launcher, CPU slots
# or the machine's GPUs, sqlite everywhere): the ONES sensor schedules the example jobs in assets/jobs
# until all are trained, then prints the JCT table and where the MLflow runs and plots are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/ones run --fresh "$@"
