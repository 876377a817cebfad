"""End to end: `ones up` (real Dagster webserver + daemon) on a temp project, 3 small jobs on 2 CPU
slots, checked through GraphQL and MLflow: all materialized, a running job changed in place (the same run,
its slot tags claimed and freed) and one resumed from its checkpoint (one MLflow run, one continuous sample
count over >= 2 generations), and no slot was ever held by two runs at once."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("dagster")
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

pytestmark = pytest.mark.e2e

JOBS = {
    # The long job is submitted first and takes both slots; the short ones arrive once it has trained a
    # while, so ONES shrinks or preempts it (it resumes from its checkpoint) and regrows it later.
    # 120 epochs: the short jobs arrive once it has trained 3, when it is predicted to need minutes more, so ones
    # preempts or shrinks it for them (an earlier version submitted them at a fixed time, when a 150-epoch job
    # that had re-tuned to a 4x batch was all but done and rightly kept its slots). 200 since a generation
    # starts ~10 s sooner (digits without scikit-learn, a torch-free launcher): with 120 the sensor first saw
    # the short jobs when the long one had a quarter left, about as long as quick-mlp, and kept it. Not much
    # more: on a 2-core machine two ranks train this model little faster than one, and 400 took over 10 min.
    "long-cnn": ("model: cnn-digits\nper_gpu_batch: 16\nbase_lr: 0.02\nmax_lr: 0.08\nmax_gpus: 2\n"
                 "stopping: {epochs: 200}\n"),
    "quick-mlp": ("model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\n"
                  "stopping: {epochs: 10}\n"),
    "mid-mlp": ("model: mlp-digits\nper_gpu_batch: 32\nbase_lr: 0.05\nmax_lr: 0.2\nmax_gpus: 2\n"
                "stopping: {epochs: 40}\n"),
}
TIMEOUT_S = 900  # a guard for slow machines; the whole test took 248-345 s alone, 438 s in the suite, on 2 cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        body = json.loads(resp.read())
    assert "errors" not in body, body
    return body["data"]


LOGS_FOR_RUN = """{ logsForRun(runId: "%s") { ... on EventConnection { events { __typename
  ... on MessageEvent { message level } ... on ErrorEvent { error { message } } } } } }"""


def failure_messages(port: int, runs: list[dict]) -> dict[str, list[str]]:
    """Failed run id -> its error-level log lines and step errors (what a failing assertion should show)."""
    out = {}
    for r in runs:
        if r["status"] != "FAILURE":
            continue
        events = graphql(port, LOGS_FOR_RUN % r["runId"])["logsForRun"].get("events", [])
        out[r["runId"]] = [(e.get("error") or {}).get("message") or e.get("message", "") for e in events
                           if e.get("level") == "ERROR" or e.get("error")][-6:]
    return out


def failures_text(failures: dict[str, list[str]]) -> str:
    """``failure_messages`` as plain text for an assertion message (not a dict: pytest would shorten its repr)."""
    return "\n".join(f"run {run_id}:\n  " + "\n  ".join(lines) for run_id, lines in failures.items())


def wait_for_webserver(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    """Until the webserver `ones up` started answers GraphQL (fail with its log if it died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            graphql(port, "{ version }")
            return
        except OSError:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"webserver not up in {timeout_s:g} s"
            time.sleep(1)


def stop_ones_up(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Ctrl-C for `ones up` (it drains its runs and stops Dagster), SIGKILL to its group if that hangs."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


MATERIALIZATIONS = """{ assetOrError(assetKey: {path: ["training_job"]}) { ... on Asset {
  assetMaterializations(limit: 50) { partition runId metadataEntries { label
    ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } \
... on TextMetadataEntry { text } } } } } }"""
OBSERVATIONS = """{ assetOrError(assetKey: {path: ["training_job"]}) { ... on Asset {
  assetObservations(limit: 500) { partition metadataEntries { label ... on TextMetadataEntry { text } } } } } }"""
RUNS = """{ runsOrError(filter: {pipelineName: "train_job"}, limit: 200) { ... on Runs {
  results { runId status startTime endTime runConfigYaml tags { key value } } } } }"""


def launched_allocation(run: dict) -> dict:
    """The allocation a training run (a ``RUNS`` result) was launched with: its run config's (the generation, the
    slots, the batch: not tags, each tag is a line of the run's row in the runs list)."""
    import yaml

    return json.loads(yaml.safe_load(run["runConfigYaml"])["ops"]["training_job"]["config"]["allocation"])


def ones_tags(run: dict) -> dict:
    """The tags of a ``RUNS`` result but Dagster's own: what ones put on its row in the runs list."""
    return {t["key"]: t["value"] for t in run["tags"] if not t["key"].startswith(("dagster/", ".dagster/"))}


@pytest.fixture
def project(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "assets" / "jobs").mkdir(parents=True)
    (tmp_path / "resources" / "local.yaml").write_text(
        "cluster: {gpus: none, cpu_slots: 2}\nlauncher: {grace_period_s: 15}\n"
        "scheduler: {tick_interval_s: 5, decision_budget_s: 0.5}\n"
        "policy: {name: ones}\n")
    return tmp_path


def test_three_jobs_on_two_slots_through_the_real_daemon(project):
    port = free_port()
    ones = str(Path(sys.executable).parent / "ones")
    log = open(project / "up.log", "wb")  # noqa: SIM115 (the daemon writes to it until the test stops it)
    proc = subprocess.Popen([ones, "up", "--project", str(project), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_webserver(port, proc, project / "up.log")
        deadline = time.monotonic() + 90
        # Submit the jobs the way users do; the sensor picks them up.
        from ones_pipeline.adapters.mlflow import read_progress

        uri = f"sqlite:///{project / '.ones/state/mlflow.db'}"
        decisions_file = project / ".ones/state/decisions.jsonl"
        for name, text in JOBS.items():
            if name == "quick-mlp":  # once the long job has trained a few epochs
                while not (p := read_progress(uri, "ones", ["long-cnn"]).get("long-cnn")) or p.epochs_done < 3:
                    assert time.monotonic() < deadline + TIMEOUT_S, "long-cnn made no progress"
                    time.sleep(1)
            elif name == "mid-mlp":
                # Once the sensor has placed quick-mlp: one job arrives at a tick, so ones shrinks the long job
                # for it (in place) rather than stopping it for two (a tick that saw both at once preempted it).
                while not (decisions_file.exists() and '"job": "quick-mlp"' in decisions_file.read_text()):
                    assert time.monotonic() < deadline + TIMEOUT_S, "quick-mlp never decided on"
                    time.sleep(1)
            spec = project / f"{name}.yaml"
            spec.write_text(text)
            out = subprocess.run([ones, "submit", str(spec), "--project", str(project)], capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + TIMEOUT_S
        respecced = False
        while True:
            if not respecced and (ledger := project / ".ones/state/jobs/long-cnn/slots.jsonl").exists() and any(
                    not json.loads(line).get("first") for line in ledger.read_text().splitlines()):
                # Once the long job has been changed in place, a change only the checkpoint path makes: its spec
                # changes (its budget), so it restarts from its checkpoint in a new generation, and the same
                # scenario shows both paths.
                (project / "assets/jobs/long-cnn.yaml").write_text(JOBS["long-cnn"].replace("200", "190"))
                respecced = True
            mats = graphql(port, MATERIALIZATIONS)["assetOrError"]["assetMaterializations"]
            if {m["partition"] for m in mats} >= set(JOBS):
                break
            assert proc.poll() is None, (project / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"not all materialized in {TIMEOUT_S} s: {[m['partition'] for m in mats]}")
            time.sleep(3)
        # Once nothing is left, the sensor requests the cluster report (markdown with inlined PNGs).
        report_query = """{ assetOrError(assetKey: {path: ["cluster_report"]}) { ... on Asset {
          assetMaterializations(limit: 1) { metadataEntries { label ... on MarkdownMetadataEntry { mdStr }
            ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } } } } }"""
        deadline = time.monotonic() + 120
        while not (report := graphql(port, report_query)["assetOrError"]["assetMaterializations"]):
            assert time.monotonic() < deadline, "cluster_report not materialized within 120 s of the last job"
            time.sleep(3)
        runs = graphql(port, RUNS)["runsOrError"]["results"]
        observations = graphql(port, OBSERVATIONS)["assetOrError"]["assetObservations"]
        failures = failure_messages(port, runs)
        status = subprocess.run([ones, "status", "--project", str(project)], capture_output=True, text=True, timeout=60)
    finally:
        stop_ones_up(proc)
    assert proc.returncode == 0, (project / "up.log").read_text()[-3000:]

    # Every job materialized once, with its metadata.
    meta = {m["partition"]: {e["label"]: e.get("floatValue", e.get("intValue", e.get("text")))
                             for e in m["metadataEntries"]}
            for m in mats}
    for job in JOBS:
        assert meta[job]["accuracy"] > 0.5 and meta[job]["jct_s"] > 0 and meta[job]["slot_hours"] > 0

    entries = {e["label"]: e for e in report[0]["metadataEntries"]}
    assert (entries["jobs"].get("intValue", entries["jobs"].get("floatValue")) == len(JOBS)
            and entries["mean_jct_s"]["floatValue"] > 0)
    assert "job_table" in entries and 0 < entries["utilisation_percent"]["floatValue"] <= 100
    assert entries["report"]["mdStr"].count("data:image/png;base64,") == 2
    assert all(job in entries["report"]["mdStr"] for job in JOBS)
    assert (project / ".ones/state/report/allocation.png").stat().st_size > 1000

    # No slot held by two runs at once, in-place changes included. A run holds each slot of its first generation
    # from its start; one it claimed in place (a grow) from the claim; until it freed it in place (a shrink) or
    # ended. Claims and frees come from the jobs' slot ledgers (``defs.slot_owner``), which must agree with
    # the run's final tags ("held" for every slot it still had, "free" for each it gave back).
    ledger: dict[str, list[dict]] = {}
    for path in (project / ".ones/state/jobs").glob("*/slots.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            ledger.setdefault(row["run_id"], []).append(row)
    spans: dict[str, list[tuple[float, float, str]]] = {}
    in_place = 0
    for r in runs:
        if r["startTime"] is None:
            continue
        end = r["endTime"] or time.time()
        tags = {t["key"]: t["value"] for t in r["tags"]}
        rows = [x for x in ledger.get(r["runId"], []) if not x.get("first")]
        claimed = {s: x["time_s"] for x in rows for s in x["claimed"]}
        freed = {s: x["time_s"] for x in rows for s in x["freed"]}
        in_place += bool(rows)
        for key, value in tags.items():
            if key.startswith("ones/cpu-"):  # CPU slots here (cluster: {gpus: none})
                slot = int(key.rsplit("-", 1)[1])
                assert value == ("free" if slot in freed and freed[slot] >= claimed.get(slot, 0) else "held"), \
                    (r["runId"], key, value, rows)
                spans.setdefault(key, []).append((claimed.get(slot, r["startTime"]), freed.get(slot, end), r["runId"]))
    assert spans, runs
    for slot, intervals in spans.items():
        intervals.sort()
        for (_s1, e1, r1), (s2, _e2, r2) in zip(intervals, intervals[1:], strict=False):
            assert s2 >= e1 - 1e-6, f"{slot} held by {r1} and {r2} at once"
    # The scheduler changed a running job in place (the subprocess launcher makes both kinds), said so in its
    # decision record, and the run log, the partition and the MLflow run show it.
    decisions = [json.loads(line) for line in (project / ".ones/state/decisions.jsonl").read_text().splitlines()]
    assert in_place and any(d.get("path") == "in place" and "in place" in d["reason"] for d in decisions), decisions
    # Every training run's row shows its job and its slots, nothing else ones keeps (a preempted one also says so),
    # the runs changed in place included: their allocation is in their change request, not in tags.
    for r in runs:
        extra = {k for k in ones_tags(r) if k != "ones/job" and not k.startswith("ones/cpu-")}
        assert extra <= {"ones/outcome"}, (r["runId"], ones_tags(r))
    changes = [e["text"] for m in observations for e in m["metadataEntries"] if e["label"] == "change"]
    assert any(" in place in " in text for text in changes), observations  # "grew 1 -> 2 CPU slots in place in 1.8 s"
    mlflow_client = mlflow.tracking.MlflowClient(f"sqlite:///{project / '.ones/state/mlflow.db'}")
    resized_runs = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("ones").experiment_id],
                                             filter_string="tags.`ones.resizes_in_place` != '0'")
    assert resized_runs and all("in place" in x.data.tags["ones.last_resize"] for x in resized_runs)

    # At least one job resumed from its checkpoint (the long one, after its spec changed): >= 2 generations that
    # ran, one MLflow run whose sample count only grows and does not restart from 0.
    generations = {}
    for r in runs:
        tags = {t["key"]: t["value"] for t in r["tags"]}
        if r["startTime"] is not None:
            generations.setdefault(tags["ones/job"], set()).add(launched_allocation(r)["generation"])
    changed = [job for job, gens in generations.items() if len(gens) >= 2]
    assert changed, f"no job was preempted or resized: {generations}"
    client = mlflow.tracking.MlflowClient(f"sqlite:///{project / '.ones/state/mlflow.db'}")
    resumed = []
    for job in changed:
        (run,) = client.search_runs([client.get_experiment_by_name("ones").experiment_id],
                                    filter_string=f"tags.`ones.job` = '{job}'")
        history = sorted((m.timestamp, m.step, m.value) for m in client.get_metric_history(run.info.run_id, "samples"))
        samples = [v for _, _, v in history]
        assert samples == sorted(samples) and samples[0] > 0, samples  # one count, never back to 0
        if int(run.data.tags["ones.restarts"]) >= 1:  # a generation that had trained, then resumed
            resumed.append(job)
            assert meta[job]["restarts"] >= 1 and int(run.data.tags["ones.generation"]) >= 1
    assert resumed, f"no job resumed from a checkpoint in a later generation: {generations}"
    # A generation the scheduler stopped after it had trained says so: the outcome tag (and a log line),
    # and the run ends green (asked to stop, it checkpointed and ended normally), never FAILURE.
    planned = [r for r in runs if {t["key"]: t["value"] for t in r["tags"]}.get("ones/outcome")]
    assert planned and all(r["status"] == "SUCCESS" for r in planned), [(r["runId"], r["status"]) for r in runs]
    assert not failures, failures_text(failures)

    # The report ran once everything ended and `ones status` shows every job finished.
    assert all(line.split()[1] == "finished" for line in status.stdout.splitlines()[1:]
               if line.split() and line.split()[0] in JOBS), status.stdout
    assert (project / ".ones/state/decisions.jsonl").exists()
