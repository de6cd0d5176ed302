"""The decision is recorded before the act (issue 39): the gateway is killed at each step
of the submit path (fault points, corral/core/faults.py: an os._exit as sudden as kill -9),
started again, and every job that exists must have its allow record, the chain must
verify, and a retry with the same key must make no second job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from corral.core.faults import EXIT_STATUS
from tests.conftest import Gateway, drop_scratch, free_port

POINTS = ["before_insert", "after_insert", "after_audit", "after_commit", "after_send"]


def allowed(home: Path) -> set[tuple[int, float]]:
    """(job id, submit time) of every job the audit log says was allowed."""
    out: set[tuple[int, float]] = set()
    log = home / "audit.jsonl"
    for line in log.read_text().splitlines() if log.exists() else []:
        r = json.loads(line.partition(" ")[2])
        if r["action"] == "submit" and r["decision"] == "allow" and "job_id" in r:
            out.add((r["job_id"], r["submitted"]))
    return out


@pytest.mark.parametrize("point", POINTS)
def test_every_job_that_exists_has_its_decision_on_record(tmp_path: Path, point: str) -> None:
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_FAULT": point})
    gw.home.mkdir()
    gw.start()
    try:
        with gw.http() as h:
            with pytest.raises(httpx.TransportError):  # the gateway dies under the request
                h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}, headers={"Idempotency-Key": "k1"})
        assert gw.proc is not None and gw.proc.wait(10) == EXIT_STATUS
        gw.extra_env = {}
        gw.start()
        with gw.http() as h:
            jobs = h.get("/v1/jobs", params={"full": True}).json()["jobs"]
            # Before the commit nothing was made; after it, the one job.
            assert len(jobs) == (1 if point in ("after_commit", "after_send") else 0), jobs
            on_record = allowed(gw.home)
            for j in jobs:
                assert (j["id"], j["submit_time"]) in on_record, (point, j, on_record)
            # The retry of the request the client never had an answer to: one job in all.
            r = h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}, headers={"Idempotency-Key": "k1"})
            assert r.status_code in (200, 201), r.text
            assert len(h.get("/v1/jobs").json()["jobs"]) == 1
            job = r.json()["id"]
            deadline = time.monotonic() + 60  # a job recorded but never sent is sent after the restart
            while h.get(f"/v1/jobs/{job}").json()["state"] != "COMPLETED" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert h.get(f"/v1/jobs/{job}").json()["state"] == "COMPLETED"
        cp = gw.cli("audit", "verify")
        assert cp.returncode == 0, cp.stderr
    finally:
        gw.kill()
        drop_scratch(gw.home)
