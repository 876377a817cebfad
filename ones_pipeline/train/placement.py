"""Where one training process runs, as its launcher tells it (``Placement``, the ``ONES_*`` environment),
and the process's system metrics. ``ones_pipeline.train.api`` re-exports all of it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ones_pipeline.core.types import JobSpec, spec_from_dict, spec_to_dict
from ones_pipeline.train.noise_budget import DEFAULT_BUDGET, budget_from_env, budget_to_env


def system_metrics(gpu: bool) -> dict[str, float]:
    """CPU and memory of this process (psutil), and GPU utilisation and memory (NVML), when present. Named as
    MLflow's own system metrics (``system/...``): its run page shows them in the System metrics tab, not
    among the model's charts."""
    out: dict[str, float] = {}
    try:
        import psutil

        out["system/cpu_utilization_percentage"] = float(psutil.cpu_percent(None))
        out["system/process_rss_megabytes"] = psutil.Process().memory_info().rss / 2**20
    except ImportError:
        pass
    if gpu:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                out[f"system/gpu_{i}_utilization_percentage"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"system/gpu_{i}_memory_usage_megabytes"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        except Exception:  # no NVML library or driver: CPU metrics only
            pass
    return out


def spec_to_json(spec: JobSpec) -> str:
    return json.dumps(spec_to_dict(spec))


def spec_from_json(text: str) -> JobSpec:
    return spec_from_dict(json.loads(text))


@dataclass(frozen=True)
class Placement:
    """What one training process is told by its launcher."""

    spec: JobSpec
    rank: int
    world_size: int
    global_batch: int
    lr: float
    generation: int
    state_dir: Path
    tracking_uri: str | None
    experiment: str
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    device: str = "cpu"  # "cpu" or "cuda"
    gpus: tuple[int, ...] = ()
    num_nodes: int = 1
    seed: int = 0
    stop_file: Path | None = None  # the launcher's stop request (polled at every step boundary)
    launcher_pid: int | None = None  # the launcher; ranks stop when it disappears
    dagster_run_id: str | None = None  # the Dagster run this generation belongs to (tagged on the MLflow run)
    noise_scale_budget: float = DEFAULT_BUDGET  # the GNS probe's share of the step time (ONES_GNS_BUDGET); 0: off
    tune_batch: bool = False  # the job re-tunes its own global batch in-process (``batch_tuning``)
    # In-place resizing (``resize_control``, ``membership``): the launcher's plans for this process (None: the
    # launcher cannot resize in place), the membership change this process belongs to (0: the first), and
    # whether it joins a running group (it waits for plan ``membership``).
    resize_dir: Path | None = None
    membership: int = 0
    joining: bool = False

    ENV_PREFIX = "ONES_"

    def to_env(self, spec_json: str | None = None) -> dict[str, str]:
        """The ``ONES_*`` variables; ``spec_json``: the spec already serialised (a launcher does it once for
        all its ranks)."""
        return {
            "ONES_SPEC": spec_json if spec_json is not None else spec_to_json(self.spec), "ONES_RANK": str(self.rank),
            "ONES_WORLD_SIZE": str(self.world_size), "ONES_GLOBAL_BATCH": str(self.global_batch),
            "ONES_LR": repr(self.lr), "ONES_GENERATION": str(self.generation),
            "ONES_STATE_DIR": str(self.state_dir), "ONES_TRACKING_URI": self.tracking_uri or "",
            "ONES_EXPERIMENT": self.experiment, "ONES_MASTER_ADDR": self.master_addr,
            "ONES_MASTER_PORT": str(self.master_port), "ONES_DEVICE": self.device,
            "ONES_GPUS": ",".join(str(g) for g in self.gpus), "ONES_NUM_NODES": str(self.num_nodes),
            "ONES_SEED": str(self.seed), "ONES_STOP_FILE": str(self.stop_file or ""),
            "ONES_LAUNCHER_PID": str(self.launcher_pid or ""), "ONES_DAGSTER_RUN_ID": self.dagster_run_id or "",
            "ONES_TUNE_BATCH": "1" if self.tune_batch else "0", **budget_to_env(self.noise_scale_budget),
            "ONES_RESIZE_DIR": str(self.resize_dir or ""), "ONES_MEMBERSHIP": str(self.membership),
            "ONES_JOINING": "1" if self.joining else "0",
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Placement:
        env = os.environ if env is None else env
        missing = [k for k in ("ONES_SPEC", "ONES_STATE_DIR") if not env.get(k)]
        if missing:
            raise RuntimeError(
                f"training process started without {', '.join(missing)}: run it through "
                "`python -m ones_pipeline.train` (the launcher sets the allocation)")
        gpus = tuple(int(g) for g in env.get("ONES_GPUS", "").split(",") if g.strip())
        return cls(
            spec=spec_from_json(env["ONES_SPEC"]), rank=int(env.get("ONES_RANK", 0)),
            world_size=int(env.get("ONES_WORLD_SIZE", 1)), global_batch=int(env["ONES_GLOBAL_BATCH"]),
            lr=float(env["ONES_LR"]), generation=int(env.get("ONES_GENERATION", 0)),
            state_dir=Path(env["ONES_STATE_DIR"]), tracking_uri=env.get("ONES_TRACKING_URI") or None,
            experiment=env.get("ONES_EXPERIMENT", "ones"), master_addr=env.get("ONES_MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("ONES_MASTER_PORT", 29500)), device=env.get("ONES_DEVICE", "cpu"),
            gpus=gpus, num_nodes=int(env.get("ONES_NUM_NODES", 1)), seed=int(env.get("ONES_SEED", 0)),
            stop_file=Path(env["ONES_STOP_FILE"]) if env.get("ONES_STOP_FILE") else None,
            launcher_pid=int(env.get("ONES_LAUNCHER_PID") or 0) or None,
            dagster_run_id=env.get("ONES_DAGSTER_RUN_ID") or None, noise_scale_budget=budget_from_env(env),
            tune_batch=env.get("ONES_TUNE_BATCH", "0") == "1",
            resize_dir=Path(env["ONES_RESIZE_DIR"]) if env.get("ONES_RESIZE_DIR") else None,
            membership=int(env.get("ONES_MEMBERSHIP") or 0), joining=env.get("ONES_JOINING", "0") == "1",
        )
