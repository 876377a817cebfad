"""Is a scheduler running for this project? The Dagster daemon that evaluates the ONES sensor writes a
heartbeat into the project's instance every few seconds; none within ``STALE_S`` means no tick will
come, so `ones status` and `ones submit` say so (not "the policy ranks other jobs first") and how to
start one."""

import time

import dagster as dg

STALE_S = 60.0  # the daemon beats every ~20 s
HOW_TO_START = "start one with `ones up` (webserver and daemon) or `ones run` (headless)"


def no_scheduler_line(instance: dg.DagsterInstance, now: float | None = None) -> str | None:
    """None when the sensor daemon beat within ``STALE_S``; else one line saying none runs and how to start one."""
    beat = instance.get_daemon_heartbeats().get("SENSOR")
    now = time.time() if now is None else now
    if beat is not None and now - beat.timestamp <= STALE_S:
        return None
    since = f" (its last heartbeat {now - beat.timestamp:.0f} s ago)" if beat is not None else ""
    return f"no scheduler is running for this project{since}: nothing is scheduled until one does; {HOW_TO_START}"
