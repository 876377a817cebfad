#!/usr/bin/env bash
# GPU check for the training step: run only on a machine with an NVIDIA GPU (the lent H200), as one
# script within ~10 minutes. Prints: the NVML inventory, ResNet-18 throughput on 1 GPU at per-GPU batch
# 64/128/256, the stop + resume time, whether MLflow received GPU system metrics, and the live A/B
# (benchmarks/live_ab.py --gpu: fifo then ones, 4 ResNet-18 jobs sized from the measured rate to about
# LIVE_AB_WORK_S seconds of training each policy, 100 by default). LIVE_AB_WORK_S=0 skips the A/B.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
URI="sqlite:///$OUT/mlflow.db"
"$PY" -m pip install --quiet nvidia-ml-py >/dev/null 2>&1 || true

echo "== ones inventory (ones_pipeline.adapters.inventory.discover)"
"$PY" -c "from ones_pipeline.adapters.inventory import discover
inv = discover()
print(inv.reason)
row = '{:>3}  {:<28} {:>10} {:>10} {:>6}  {}'
print(row.format('idx', 'name', 'used MiB', 'total MiB', 'util%', 'uuid'))
for g in inv.gpus:
    used = '?' if g.memory_used_mb is None else f'{g.memory_used_mb:.0f}'
    util = '?' if g.utilization_percent is None else f'{g.utilization_percent:.0f}'
    print(row.format(g.index, g.name, used, f'{g.memory_total_mb:.0f}', util, g.uuid or '?'))
total = sum(g.memory_total_mb for g in inv.gpus) / 1024
print(f'GPU count: {len(inv.gpus)}, memory {total:.0f} GiB; kind {inv.kind}, slots {list(inv.slot_ids)}')
" || echo "ones inventory failed"

echo "== NVML inventory"
"$PY" - <<'PY'
import pynvml
pynvml.nvmlInit()
print("driver", pynvml.nvmlSystemGetDriverVersion())
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    print(i, pynvml.nvmlDeviceGetName(h), f"{mem.total / 2**30:.0f} GiB", f"util {pynvml.nvmlDeviceGetUtilizationRates(h).gpu}%")
PY

echo "== ResNet-18 (synthetic CIFAR) throughput on GPU 0"
for B in 64 128 256; do
  "$PY" -m ones_pipeline.train --model resnet18-cifar-synthetic --name "gpu-r18-$B" --epochs 1 \
    --per-gpu-batch "$B" --base-lr 0.01 --gpus 0 --state-dir "$OUT/r18-$B" --tracking-uri "$URI" >/dev/null 2>&1
  "$PY" - "$URI" "gpu-r18-$B" "$B" <<'PY'
import sys
from ones_pipeline.adapters.mlflow import read_progress
p = read_progress(sys.argv[1], "ones", [sys.argv[2]])[sys.argv[2]]
gpu = {k: v for k, v in p.metrics.items() if k.startswith("system_gpu")}
print(f"batch {sys.argv[3]}: {p.metrics.get('samples_per_s', float('nan')):.0f} samples/s; GPU system metrics: {gpu or 'MISSING'}")
PY
done

echo "== stop + resume on GPU 0"
"$PY" benchmarks/train_throughput.py --gpu --models resnet18-cifar-synthetic --slots 1 --batches 128 --epochs 0.5 \
  2>&1 | tail -6 || echo "stop/resume benchmark failed"

echo "== live pipeline on the GPUs: ones run, 2 jobs, subprocess launcher (CUDA_VISIBLE_DEVICES per rank)"
PROJ="$OUT/live"
mkdir -p "$PROJ/resources" "$PROJ/assets/jobs"
printf 'cluster: {gpus: auto, cpu_slots: 1}\nscheduler: {tick_interval_s: 5, min_run_s: 10}\n' > "$PROJ/resources/local.yaml"
printf 'model: resnet18-cifar-synthetic\nper_gpu_batch: 128\nbase_lr: 0.05\nmax_lr: 0.2\nstopping: {epochs: 3}\n' \
  > "$PROJ/assets/jobs/r18.yaml"
printf 'model: cnn-digits\nper_gpu_batch: 64\nbase_lr: 0.02\nmax_lr: 0.08\nstopping: {epochs: 20}\n' \
  > "$PROJ/assets/jobs/cnn.yaml"
BIN="$(dirname "$(command -v "$PY")")"
timeout 240 "$BIN/ones" run --project "$PROJ" --status-every 30 2>&1 | tail -14 || echo "live pipeline run failed or timed out"
"$PY" - "$PROJ" <<'PY' || echo "live pipeline check failed"
import sys
import dagster as dg
from ones_pipeline.adapters.mlflow import read_progress
from ones_pipeline.config.layout import StateLayout
from ones_pipeline.defs.instance import job_run_infos
state = sys.argv[1] + "/.ones/state"
with dg.DagsterInstance.from_config(state + "/dagster") as inst:
    for r in job_run_infos(inst, StateLayout(state).job_dir):
        print(f"run {r.job} g{r.generation}: slots {r.slot_ids} {r.status} held {r.held_s(r.end_s or 0):.1f} s")
for job, p in read_progress(f"sqlite:///{state}/mlflow.db", "ones").items():
    gpu = sorted(k for k in p.metrics if k.startswith("system_gpu"))
    print(f"{job}: {p.samples_done:.0f} samples, {p.metrics.get('samples_per_s', float('nan')):.0f} samples/s, "
          f"GPU metrics {gpu or 'MISSING'}")
PY

echo "== live A/B on the GPU path (benchmarks/live_ab.py --gpu)"
WORK_S="${LIVE_AB_WORK_S:-100}"
if [ "$WORK_S" != "0" ]; then
  SCALE="$("$PY" - "$URI" "$WORK_S" <<'PY' || echo 0.3
import sys
from ones_pipeline.adapters.live_ab import GPU_TEMPLATES
from ones_pipeline.adapters.mlflow import read_progress
rate = read_progress(sys.argv[1], "ones", ["gpu-r18-128"])["gpu-r18-128"].metrics.get("samples_per_s") or 1000.0
samples = sum((lo + hi) / 2 for _, _, _, (lo, hi), _ in GPU_TEMPLATES[:4])  # the 4-job mix at --scale 1
print(f"{max(float(sys.argv[2]) * rate / samples, 0.05):.3f}")
PY
)"
  echo "scale $SCALE"
  timeout 420 "$PY" benchmarks/live_ab.py --gpu --policies fifo,ones --jobs 4 --scale "$SCALE" --timeout 200 \
    --json "$OUT/live_ab_gpu.json" 2>&1 | tail -40 || echo "live A/B failed or timed out"
fi

echo "== Docker device request for GPU 0 (only where an engine with the NVIDIA runtime answers)"
"$PY" - <<'PY' || echo "docker GPU check failed"
import docker
from ones_pipeline.adapters.docker_containers import docker_available
if not docker_available():
    print("no Docker engine: skipped")
    raise SystemExit(0)
client = docker.from_env()
runtimes = client.info().get("Runtimes", {})
print("runtimes:", sorted(runtimes))
req = docker.types.DeviceRequest(device_ids=["0"], capabilities=[["gpu"]])
images = [t for i in client.images.list() for t in i.tags]
image = next((t for t in images if "cuda" in t or "nvidia" in t), None) or (images[0] if images else None)
if image is None:
    print("no local image to run: skipped (no registry here)")
    raise SystemExit(0)
out = client.containers.run(image, ["nvidia-smi", "-L"], device_requests=[req], remove=True, network_mode="none")
print(out.decode().strip())
PY
