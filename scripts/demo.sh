#!/usr/bin/env bash
# Set up, then run the live pipeline headless on the embedded default (resources/local.yaml: subprocess
# launcher, CPU slots or the machine's GPUs, sqlite everywhere) on the demo's jobs (assets/demo/, see its
# README.md), in a project of its own (.ones/demo/, state in .ones/demo/.ones/state/): a long and a short
# job start together, the long one grows onto the slot the short one frees, and when a second short job
# arrives (this script submits it with `ones submit` 30 s after that grow) the long one shrinks again.
# At the end `ones run` prints the JCT table, where the MLflow runs and plots are, and every decision.
# Extra arguments go to `ones run` (e.g. --timeout 900). ONES_VENV=DIR uses an existing virtualenv with
# ones-pipeline installed instead of setting up .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${ONES_VENV:-}" ]; then
  scripts/setup.sh
fi
ONES="${ONES_VENV:-.venv}/bin/ones"
DEMO=.ones/demo
DECISIONS="$DEMO/.ones/state/decisions.jsonl"
LATE_AFTER_GROW_S=30  # short-b arrives this long after the long job's first grow ...
LATE_AT_MOST_S=180    # ... or this long after the start if it never grew

mkdir -p "$DEMO/resources" "$DEMO/assets/jobs"
cp resources/local.yaml "$DEMO/resources/local.yaml"
rm -f "$DEMO"/assets/jobs/*.yaml
cp assets/demo/long.yaml assets/demo/short-a.yaml "$DEMO/assets/jobs/"
started="$(mktemp)"  # decisions.jsonl newer than this file are this run's (`--fresh` deletes the old one)

submit_late() {
  local waited=0
  until { [ "$DECISIONS" -nt "$started" ] && grep -qs '"reason": "grow' "$DECISIONS"; } \
      || [ "$waited" -ge "$LATE_AT_MOST_S" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  sleep "$LATE_AFTER_GROW_S"
  "$ONES" submit --project "$DEMO" assets/demo/short-b.yaml
}
submit_late &
late=$!
trap 'kill "$late" 2>/dev/null || true; pkill -P "$late" 2>/dev/null || true; rm -f "$started"' EXIT

"$ONES" run --fresh --project "$DEMO" "$@"
