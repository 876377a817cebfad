"""Our ONES-trace model against the ONES (SC'21) artifact's published runs of the first 50 jobs of trace_1.

Prints the numbers of docs/ones_catalogue.md ("Calibration to the artifact" and "Held-out checks"):

    .venv/bin/python -m ones_pipeline.calibration.ones_artifact            # everything (~1 min, 1 core)
    .venv/bin/python -m ones_pipeline.calibration.ones_artifact --only tiresias

* ``tiresias``: our ``tiresias`` on the 50 jobs (64 GPUs, 4 per node, 60 s rounds, 30 s per start) vs the
  artifact's ``TIRESIAS_profile.csv``: mean JCT / execution / wait, Spearman rank correlation of per-job
  execution times (our ``run_s`` vs their ``execution_time``, matched by trace row), per (type, epoch
  size) medians. Wait is ``JCT - execution`` for both (the artifact's definition).
* ``oracle``: a diagnostic of the *scheduler* side only: the same simulation with every job's speed set so
  that alone it takes exactly the artifact's execution time (per-job factors: never used by the catalogue).
* ``heldout``: checks on data the calibration did not use (throughput and epochs of the extra GoogLeNet
  run of job_history.csv at 2, 3 and 4 GPUs; leave-one-epoch-size-out on the artifact's durations).
* ``policies``: mean JCT of ones-paper, fifo, tiresias, optimus (one process each) vs the artifact's.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ones_pipeline.config import traces_dir_from_environment
from ones_pipeline.core.policies import make_policy
from ones_pipeline.core.types import Cluster
from ones_pipeline.sim.change_costs import PRESETS
from ones_pipeline.sim.engine import SimConfig, SimResult, simulate
from ones_pipeline.sim.ones_catalogue import Catalogue, catalogue
from ones_pipeline.sim.ones_history import ARTIFACT_PROFILE, read_artifact_rows, read_job_history
from ones_pipeline.sim.ones_trace import load_ones_trace
from ones_pipeline.sim.ones_trace_reader import read_ones_trace
from ones_pipeline.sim.ones_truth import OnesJobTruth, make_spec, standalone_time_s
from ones_pipeline.sim.pollux_profiles import consolidated_placement
from ones_pipeline.sim.truth import SimJob

ROOT = Path(__file__).resolve().parents[2]
TRACES = traces_dir_from_environment(ROOT.parent / "shared" / "traces")
ONES_DIR = TRACES / "ones_sc21"
ARTIFACT_MEANS = {"ones": 214.0, "drl": 354.0, "optimus": 453.0, "tiresias": 501.7}  # out/*_profile.csv means


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    ra, rb = (pd.Series(np.asarray(x, dtype=float)).rank().to_numpy() for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class Comparison:
    mean_jct: tuple[float, float]  # (ours, artifact)
    mean_exec: tuple[float, float]
    mean_wait: tuple[float, float]
    median_jct: tuple[float, float]
    median_exec: tuple[float, float]
    spearman_exec: float
    spearman_type_medians: float  # over (type, epoch size) groups: our median run_s vs theirs
    table: pd.DataFrame  # per job


def artifact_table(ones_dir: Path = ONES_DIR, name: str = "TIRESIAS") -> pd.DataFrame:
    """The artifact's ``<name>_profile.csv`` (validated) with each job's ``key``: model/task/epoch size."""
    path = ones_dir / ARTIFACT_PROFILE if name == "TIRESIAS" else ones_dir / "results-published" / f"{name}_profile.csv"
    art = pd.DataFrame([r.values for r in read_artifact_rows(path)])
    rows = read_ones_trace(ones_dir / "trace_1.csv")
    art["key"] = [f"{rows[i].model}/{rows[i].task}/{rows[i].epoch_size}" for i in art["id"]]
    return art


def compare(result: SimResult, ones_dir: Path = ONES_DIR) -> Comparison:
    art = artifact_table(ones_dir)
    ours = pd.DataFrame({"id": [int(j.name.rsplit("-", 1)[1]) for j in result.jobs],
                         "jct_s": [j.jct_s for j in result.jobs], "run_s": [j.run_s for j in result.jobs]})
    m = art.merge(ours, on="id", validate="one_to_one")
    if len(m) != len(art):
        raise ValueError(f"{len(art) - len(m)} artifact jobs missing from the simulation")
    m["wait_s"] = m["jct_s"] - m["run_s"]
    g = m.groupby("key").agg(ours=("run_s", "median"), art=("execution_time", "median"))
    return Comparison((m.jct_s.mean(), m.completion_time.mean()), (m.run_s.mean(), m.execution_time.mean()),
                      (m.wait_s.mean(), m.waiting_time.mean()), (m.jct_s.median(), m.completion_time.median()),
                      (m.run_s.median(), m.execution_time.median()), spearman(m.run_s, m.execution_time),
                      spearman(g.ours, g.art), m)


def run(jobs: Sequence[SimJob], policy: str = "tiresias", interval_s: float = 60.0, seed: int = 0,
        **params) -> SimResult:
    return simulate(list(jobs), make_policy(policy, seed=seed, **params), Cluster.uniform(16, 4),
                    SimConfig(interval_s=interval_s, change_costs=PRESETS["pollux"]))  # as calibrated


def load_50(ones_dir: Path = ONES_DIR, artifact: bool = True) -> list[SimJob]:
    """The first 50 jobs; ``artifact=False``: the history-only catalogue (before this calibration)."""
    jobs = load_ones_trace(ones_dir / "trace_1.csv", max_jobs=50)
    if artifact:
        return jobs
    cat = catalogue(ones_dir)
    base = Catalogue(cat.pollux_traces_dir, ones_dir / "job_history.csv", ones_dir / "trace_dev.csv",
                     cat.restart_cost_s, artifact=False)
    rows = read_ones_trace(ones_dir / "trace_1.csv")[:50]
    return [SimJob(j.spec, OnesJobTruth(r, base[(r.model, r.task)], base.restart_cost_s))
            for j, r in zip(jobs, rows, strict=False)]


def oracle_jobs(jobs: Sequence[SimJob], ones_dir: Path = ONES_DIR) -> list[SimJob]:
    """Diagnostic only: each job's speed set so that alone on its requested GPUs it takes the artifact's
    execution time (isolates the scheduler model from the job model)."""
    art = artifact_table(ones_dir).set_index("id")["execution_time"]
    out = []
    for j in jobs:
        t = j.truth
        i = int(j.spec.name.rsplit("-", 1)[1])
        s = t.restart_cost_s
        alone = standalone_time_s(j)
        t2 = OnesJobTruth.__new__(OnesJobTruth)
        t2.__dict__.update(t.__dict__)
        t2.speed = t.speed * (alone - s) / max(float(art[i]) - s, 1.0)
        out.append(SimJob(j.spec, t2))
    return out


def _fmt(c: Comparison) -> str:
    return (f"| mean JCT | {c.mean_jct[0]:.0f} | {c.mean_jct[1]:.1f} | "
            f"{100 * (c.mean_jct[0] / c.mean_jct[1] - 1):+.0f} % |\n"
            f"| mean execution | {c.mean_exec[0]:.0f} | {c.mean_exec[1]:.1f} | "
            f"{100 * (c.mean_exec[0] / c.mean_exec[1] - 1):+.0f} % |\n"
            f"| mean wait (JCT - execution) | {c.mean_wait[0]:.0f} | {c.mean_wait[1]:.1f} | |\n"
            f"| median JCT | {c.median_jct[0]:.0f} | {c.median_jct[1]:.0f} | "
            f"{100 * (c.median_jct[0] / c.median_jct[1] - 1):+.0f} % |\n"
            f"| median execution | {c.median_exec[0]:.0f} | {c.median_exec[1]:.0f} | "
            f"{100 * (c.median_exec[0] / c.median_exec[1] - 1):+.0f} % |\n"
            f"| Spearman, per-job execution | {c.spearman_exec:.2f} | (target >= 0.8) | |\n"
            f"| Spearman, (type, epoch size) medians | {c.spearman_type_medians:.2f} | | |")


def report_tiresias(ones_dir: Path = ONES_DIR) -> None:
    art = artifact_table(ones_dir)
    med = art.groupby("key").execution_time.transform("median")
    print("## Upper bound of any per-type model: each job's (type, epoch size) median of the artifact itself")
    print(f"Spearman(artifact median of its group, artifact) = {spearman(med, art.execution_time):.2f}; "
          f"mean of those medians {med.mean():.0f} s vs mean execution {art.execution_time.mean():.1f} s\n")
    for label, artifact, interval in (("history only (before), 60 s rounds", False, 60.0),
                                      ("calibrated (after), 60 s rounds", True, 60.0),
                                      ("history only (before), 10 s rounds", False, 10.0),
                                      ("calibrated (after), 10 s rounds (the artifact's loop)", True, 10.0)):
        c = compare(run(load_50(ones_dir, artifact), interval_s=interval), ones_dir)
        print(f"## tiresias, {label}: ours | artifact | diff\n{_fmt(c)}\n")
        if artifact and interval == 10.0:
            g = c.table.groupby("key").agg(jobs=("id", "count"), artifact=("execution_time", "median"),
                                           ours=("run_s", "median"))
            print("| type / epoch size | jobs | artifact median exec (s) | ours |\n|---|---|---|---|")
            for k, r in g.iterrows():
                print(f"| {k} | {int(r.jobs)} | {r.artifact:.0f} | {r.ours:.0f} |")
            print()


def report_oracle(ones_dir: Path = ONES_DIR) -> None:
    jobs = oracle_jobs(load_50(ones_dir), ones_dir)
    for interval in (60.0, 10.0):
        c = compare(run(jobs, interval_s=interval), ones_dir)
        print(f"## oracle durations (scheduler check), {interval:.0f} s rounds\n{_fmt(c)}\n")


def report_heldout(ones_dir: Path = ONES_DIR) -> None:
    """Checks on data the calibration did not use: the extra GoogLeNet run of job_history.csv (throughput and
    epochs against the batch), then leave-one-epoch-size-out on the artifact's durations."""
    cat = catalogue(ones_dir)
    _heldout_googlenet_run(ones_dir, cat)
    _heldout_epoch_sizes(ones_dir, cat)


def _heldout_googlenet_run(ones_dir: Path, cat: Catalogue) -> None:
    ct = cat[("googlenet", "cifar")]
    extra = read_job_history(ones_dir / "job_history.csv")[0]  # id 0 reused for a GoogLeNet run at 512 -> 1024
    row = next(r for r in read_ones_trace(ones_dir / "trace_1.csv") if (r.model, r.task, r.epoch_size) ==
               ("googlenet", "cifar", 40000))
    t = OnesJobTruth(row, ct, cat.restart_cost_s)
    print("## Held-out 1: throughput vs GPU count (extra GoogLeNet/CIFAR run, per-GPU batch 256, one node)")
    print("Model: history calibration only (the artifact speed factor is not applied: this run is history).")
    print("| GPUs | global batch | measured samples/s (median) | model | error |\n|---|---|---|---|---|")
    for bs in (512, 768, 1024):
        n = bs // 256
        step, _ = t.step_time(consolidated_placement(n), 256)
        pred = bs / (step * t.speed)
        obs = float(np.median(extra.throughputs[extra.batch_sizes == bs]))
        print(f"| {n} | {bs} | {obs:.0f} | {pred:.0f} | {100 * (pred / obs - 1):+.0f} % |")
    print("\n## Held-out 2: epochs vs global batch (same run; curve fitted on the 1024-only run)")
    print("| rule | accuracy RMSE over 21 epochs | reference-batch (1024) epochs after the 21 |\n|---|---|---|")
    curve = ct.curves[40000]
    p = t.profile
    for name, scale in (("Pollux noise scale x b0/M0 (kept)", t._gns_scale), ("Pollux noise scale, absolute", 1.0),
                        ("no batch effect (perfect linear scaling)", None)):
        r, preds = 0.0, []
        for bs in extra.batch_sizes:
            if scale is None:
                r += 1.0
            else:
                g = p.grad_noise_scale(min(r / curve.history_epochs, 1.0) * p.total_progress) * scale
                r += ((g + 256) / (g + bs)) / ((g + 256) / (g + 1024))
            preds.append(float(curve(r)))
        rmse = math.sqrt(float(np.mean((np.array(preds) - extra.accs) ** 2)))
        print(f"| {name} | {rmse:.4f} | {r:.2f} |")


def _heldout_epoch_sizes(ones_dir: Path, cat: Catalogue) -> None:
    print("\n## Held-out 3: leave one epoch size out (type speed from the other epoch size's artifact jobs)")
    art = artifact_table(ones_dir)
    rows = read_ones_trace(ones_dir / "trace_1.csv")
    base = Catalogue(cat.pollux_traces_dir, ones_dir / "job_history.csv", ones_dir / "trace_dev.csv",
                     cat.restart_cost_s, artifact=False)
    s = cat.restart_cost_s
    med_model = {}
    for r in rows:
        tt = OnesJobTruth(r, base[(r.model, r.task)], s)
        med_model.setdefault((r.model, r.task, r.epoch_size), []).append(
            standalone_time_s(SimJob(make_spec(r, tt), tt)))
    med_model = {k: float(np.median(v)) for k, v in med_model.items()}
    print("| type | held-out epoch size | jobs | artifact median exec | predicted | error |\n|---|---|---|---|---|---|")
    errs = []
    for (m, tk) in sorted({(r.model, r.task) for r in rows}):
        mine = [(rows[i], e) for i, e in zip(art.id, art.execution_time, strict=False)
                if (rows[i].model, rows[i].task) == (m, tk)]
        sizes = sorted({r.epoch_size for r, _ in mine})
        if len(sizes) < 2:
            continue
        for es in sizes:
            fit = [((med_model[(r.model, r.task, r.epoch_size)] - s) / max(e - s, 0.2 * e)) for r, e in mine
                   if r.epoch_size != es]
            f = float(np.median(fit))
            pred = s + (med_model[(m, tk, es)] - s) / f
            obs = float(np.median([e for r, e in mine if r.epoch_size == es]))
            errs.append(math.log(pred / obs))
            print(f"| {m}/{tk} | {es} | {sum(r.epoch_size == es for r, _ in mine)} | {obs:.0f} | {pred:.0f} | "
                  f"{100 * (pred / obs - 1):+.0f} % |")
    print(f"\nGeometric mean absolute error {100 * (math.exp(float(np.mean(np.abs(errs)))) - 1):.0f} %, "
          f"median absolute error {100 * (math.exp(float(np.median(np.abs(errs)))) - 1):.0f} %\n")


def report_policies(ones_dir: Path = ONES_DIR) -> None:
    jobs = load_50(ones_dir)
    print("## Policies after calibration (50 jobs, 64 GPUs, 30 s per start; seed 0; one process, in turn)")
    print("| policy | mean JCT, 60 s rounds | mean execution, 60 s | mean JCT, 10 s rounds | mean execution, 10 s "
          "| artifact mean JCT | artifact mean execution |\n|---|---|---|---|---|---|---|")
    art_exec = {"ones": 127.7, "drl": 208.4, "optimus": 260.0, "tiresias": 395.1}
    for pol in ("ones-paper", "fifo", "tiresias", "optimus"):
        cells = []
        for interval in (60.0, 10.0):
            res = run(jobs, pol, interval_s=interval)
            cells += [float(np.mean([j.jct_s for j in res.jobs])), float(np.mean([j.run_s for j in res.jobs]))]
        name = pol.replace("-paper", "")
        print(f"| {pol} | " + " | ".join(f"{x:.0f}" for x in cells) +
              f" | {ARTIFACT_MEANS.get(name, float('nan')):.0f} | {art_exec.get(name, float('nan')):.0f} |")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ones-dir", type=Path, default=ONES_DIR)
    ap.add_argument("--only", choices=("tiresias", "oracle", "heldout", "policies"), default=None)
    args = ap.parse_args(argv)
    steps = {"tiresias": report_tiresias, "oracle": report_oracle, "heldout": report_heldout,
             "policies": report_policies}
    for name, fn in steps.items():
        if args.only in (None, name):
            fn(args.ones_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
