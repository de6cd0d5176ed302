"""kill -9 the gateway while jobs run, restart it: nothing lost, nothing duplicated."""

from __future__ import annotations

import signal
import time

from .conftest import Gateway


def test_kill_9_while_jobs_run_and_queue(gateway: Gateway, tmp_path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    ids = []
    with gateway.http() as h:
        # More jobs than the 2 default slots: some run, some queue, when the gateway dies.
        for i in range(8):
            body = {"command": f"echo start >> {ledger}/{i}; sleep 2; echo end >> {ledger}/{i}",
                    "workdir": str(tmp_path)}
            r = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"job-{i}"})
            assert r.status_code == 201
            ids.append(r.json()["id"])
        h.get(f"/v1/jobs/{ids[0]}/wait", params={"timeout": 20, "until": "RUNNING"})
    gateway.kill(signal.SIGKILL)
    time.sleep(1)
    gateway.start()
    with gateway.http() as h:
        # A client retrying its submissions after the crash gets the same jobs back.
        for i in range(8):
            body = {"command": f"echo start >> {ledger}/{i}; sleep 2; echo end >> {ledger}/{i}",
                    "workdir": str(tmp_path)}
            r = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"job-{i}"})
            assert r.status_code == 200 and r.json()["id"] == ids[i]
        final = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 60}).json() for j in ids]
        assert [j["state"] for j in final] == ["COMPLETED"] * 8
        assert len(h.get("/v1/jobs", params={"limit": 100}).json()["jobs"]) == 8
    for i in range(8):
        assert (ledger / str(i)).read_text() == "start\nend\n", f"job {i} ran other than once"
