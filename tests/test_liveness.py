"""Without a scheduler running, `ones status` and `ones submit` say so and how to start one (issue 39: they
said "the policy ranks other jobs first" and "picks it up at its next tick" with nothing ticking)."""

import time

import pytest
import yaml

dg = pytest.importorskip("dagster")

from dagster._daemon.types import DaemonHeartbeat  # noqa: E402

from ones_pipeline.cli import main  # noqa: E402
from ones_pipeline.config import load_env  # noqa: E402
from ones_pipeline.defs.instance import open_instance  # noqa: E402
from ones_pipeline.defs.liveness import STALE_S, no_scheduler_line  # noqa: E402

SPEC = {"model": "mlp-digits", "per_gpu_batch": 32, "stopping": {"epochs": 1}}


def test_the_sensor_daemon_heartbeat_tells_whether_a_scheduler_runs():
    with dg.instance_for_test() as instance:
        assert "no scheduler is running for this project" in no_scheduler_line(instance)
        now = time.time()
        instance.add_daemon_heartbeat(DaemonHeartbeat(now, "SENSOR", "d1"))
        assert no_scheduler_line(instance, now + 5) is None
        stale = no_scheduler_line(instance, now + STALE_S + 30)
        assert f"its last heartbeat {STALE_S + 30:.0f} s ago" in stale and "`ones up`" in stale


@pytest.fixture
def project(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "local.yaml").write_text("cluster: {gpus: none, cpu_slots: 2}\n")
    return tmp_path


def test_submit_and_status_without_a_scheduler_say_how_to_start_one(project, tmp_path, capsys):
    src = tmp_path / "job-a.yaml"
    src.write_text(yaml.safe_dump(SPEC))
    assert main(["submit", str(src), "--project", str(project)]) == 0
    out = capsys.readouterr().out
    assert "no scheduler is running for this project yet" in out and "`ones up`" in out and "sensor sees" not in out
    assert main(["init", "--project", str(project)]) == 0
    env = load_env(project)
    capsys.readouterr()
    assert main(["status", "--project", str(project)]) == 0
    out = capsys.readouterr().out
    assert "no scheduler is running for this project" in out and "ranks other jobs first" not in out
    with open_instance(env) as instance:  # a daemon beating: the usual lines
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "SENSOR", "d1"))
    assert main(["submit", str(src), "--project", str(project), "--force"]) == 0
    assert "sensor sees the new spec file within seconds" in capsys.readouterr().out
