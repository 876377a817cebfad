#!/usr/bin/env bash
# Set up, then replay the first 50 jobs of the ONES SC'21 trace on 64 GPUs under every policy:
# prints the comparison table and writes CSVs, summary.json and PNG plots to out/ones-trace-50/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
TRACES="${ONES_TRACES:-../shared/traces}"
exec .venv/bin/ones simulate --workload "$TRACES/ones_sc21/trace_1.csv" --jobs 50 --gpus 64 --gpus-per-node 4 \
  --out out/ones-trace-50 "$@"
