"""Chains, job_control and job_usage on the real Slurm of scripts/slurm-up: a dependency
is Slurm's own (--dependency, --kill-on-invalid-dep), control is scontrol/scancel, and
usage is what Slurm's accounting measured."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .conftest import SHARED_TURN, Gateway
from .test_gateway_slurm import slurm_gateway  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.usefixtures("slurm_turn"), SHARED_TURN]  # its own few jobs


def _wait(h, jid: int, until: str | None = None) -> dict:
    params = {"timeout": 90, **({"until": until} if until else {})}
    return h.get(f"/v1/jobs/{jid}/wait", params=params).json()


def test_a_chain_is_slurms_own_dependency(slurm_gateway: Gateway, tmp_path: Path) -> None:  # noqa: F811
    with slurm_gateway.http() as h:
        a = h.post("/v1/jobs", json={"command": "sleep 2; echo a > a.txt", "workdir": str(tmp_path)}).json()
        _wait(h, a["id"], "RUNNING")
        b = h.post("/v1/jobs", json={"command": "cat a.txt", "workdir": str(tmp_path), "after_ok": [a["id"]]}).json()
        assert b["backend_id"], "sent at once: Slurm holds it"
        script = (slurm_gateway.home / "slurm" / "jobs" / str(b["id"]) / "job.sh").read_text()
        assert f"--dependency=afterok:{a['backend_id']}" in script and "--kill-on-invalid-dep=yes" in script
        bad = h.post("/v1/jobs", json={"command": "sleep 1; exit 3", "workdir": str(tmp_path)}).json()
        never = h.post("/v1/jobs", json={"command": "echo never", "workdir": str(tmp_path),
                                         "after_ok": [bad["id"]]}).json()
        done = _wait(h, b["id"])
        assert done["state"] == "COMPLETED" and done["start_time"] >= h.get(f"/v1/jobs/{a['id']}").json()["end_time"] - 1
        assert h.get(f"/v1/jobs/{b['id']}/output").json()["data"] == "a\n"
        gone = _wait(h, never["id"])
        assert gone["state"] == "CANCELLED" and "dependency never satisfied" in gone["reason"], gone


def test_hold_release_signal_requeue_and_usage_on_slurm(slurm_gateway: Gateway, tmp_path: Path) -> None:  # noqa: F811
    with slurm_gateway.http() as h:
        # Pending in Slurm behind its parent, then held: it stays pending after the parent ends.
        parent = h.post("/v1/jobs", json={"command": "sleep 2", "workdir": str(tmp_path)}).json()
        job = h.post("/v1/jobs", json={"command": "echo held-then-ran", "workdir": str(tmp_path),
                                       "after_any": [parent["id"]]}).json()
        held = h.post(f"/v1/jobs/{job['id']}/control", json={"action": "hold"})
        # shown at once, not one poll of Slurm later (issue 50): the control's own answer and a read
        assert held.status_code == 200 and held.json()["reason"] == "JobHeldUser", held.text
        assert h.get(f"/v1/jobs/{job['id']}").json()["reason"] == "JobHeldUser"
        assert _wait(h, parent["id"])["state"] == "COMPLETED"
        time.sleep(3)
        assert h.get(f"/v1/jobs/{job['id']}").json()["state"] == "PENDING"
        assert h.post(f"/v1/jobs/{job['id']}/control", json={"action": "release"}).status_code == 200
        assert _wait(h, job["id"])["state"] == "COMPLETED"
        r = h.post(f"/v1/jobs/{job['id']}/control", json={"action": "hold"})
        assert r.status_code == 400 and "has ended" in r.json()["error"]["message"]
        trap = h.post("/v1/jobs", json={
            "command": "trap 'echo got-usr1; exit 0' USR1; touch ready; while true; do sleep 0.1; done",
            "workdir": str(tmp_path)}).json()
        _wait(h, trap["id"], "RUNNING")
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert h.post(f"/v1/jobs/{trap['id']}/control", json={"action": "signal", "signal": "USR1"}).status_code == 200
        assert _wait(h, trap["id"])["state"] == "COMPLETED"
        assert "got-usr1" in h.get(f"/v1/jobs/{trap['id']}/output").json()["data"]
        # What accounting measured: CPU time and MaxRSS (jobacct_gather samples each second).
        (tmp_path / "burn.py").write_text(
            "import time\nb = bytearray(200 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
            "t = time.process_time()\nwhile time.process_time() - t < 2.5: pass\n")
        burn = h.post("/v1/jobs", json={"command": f"python3 {tmp_path / 'burn.py'}", "workdir": str(tmp_path),
                                        "memory": "2G"}).json()
        assert _wait(h, burn["id"])["state"] == "COMPLETED"
        deadline = time.monotonic() + 30
        while True:  # accounting lags the job's end by a few seconds (its CPU time came after its MaxRSS once)
            u = h.get(f"/v1/jobs/{burn['id']}/usage").json()
            if (u["max_rss_mb"] and u["cpu_s"]) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert u["cpu_s"] and u["cpu_s"] >= 2.0 and u["max_rss_mb"] >= 150 and "sacct" in u["how"], u
        # A running job requeued goes back to pending (Slurm starts it again after its
        # BeginTime, about two minutes later); its markers of the first run no longer count.
        again = h.post("/v1/jobs", json={"command": "echo run >> runs.txt; sleep 3", "workdir": str(tmp_path)}).json()
        _wait(h, again["id"], "RUNNING")
        deadline = time.monotonic() + 30  # its first run under way
        while not (tmp_path / "runs.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = h.post(f"/v1/jobs/{again['id']}/control", json={"action": "requeue"})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "PENDING" and r.json()["requeues"] == 1, r.text  # at once (issue 50)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job = h.get(f"/v1/jobs/{again['id']}").json()
            if job["state"] == "PENDING":
                break
            time.sleep(0.5)
        assert job["state"] == "PENDING" and job["start_time"] is not None, job
        time.sleep(5)  # the first run's end (killed by the requeue) must not end it
        assert h.get(f"/v1/jobs/{again['id']}").json()["state"] == "PENDING"
        h.post("/v1/jobs/cancel", json={"ids": [again["id"]]})
        assert _wait(h, again["id"])["state"] == "CANCELLED"
