"""kill -9 the gateway while jobs run, restart it: nothing lost, nothing duplicated."""

from __future__ import annotations

import signal
import time

import httpx

from .conftest import Gateway, ended


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


def test_a_long_poll_in_flight_at_shutdown_gets_call_again_not_500(tmp_path) -> None:
    import concurrent.futures

    from .conftest import running

    with running(tmp_path) as gw:
        with gw.http() as h:
            job = h.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(tmp_path)}).json()

        def long_poll() -> httpx.Response:
            with gw.http() as h2:
                return h2.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120})

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(long_poll)
            deadline = time.monotonic() + 10
            while gw.metric("corral_waiters") < 1 and time.monotonic() < deadline:  # the poll is parked
                time.sleep(0.05)
            gw.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            r = pending.result(timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "restarting", r.text
        assert "call again" in r.json()["error"]["message"] and int(r.headers["Retry-After"]) >= 1
        gw.proc.wait(15)  # type: ignore[union-attr]
        gw.start()  # nothing lost: the job is there, still running under its supervisor
        with gw.http() as h:
            assert h.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING"
            h.post(f"/v1/jobs/{job['id']}/cancel")


def test_the_risk_parser_dies_with_a_killed_gateway(gateway: Gateway) -> None:
    """Long texts are parsed in a process of the gateway's. Killed with SIGKILL, the
    gateway left it running, using CPU an hour later."""
    import os
    from pathlib import Path

    with gateway.http() as h:  # a text of 4 KiB or more starts the parser process
        assert h.post("/v1/advice", json={"command": "echo " + "a" * 5000}).status_code == 200
    assert gateway.proc is not None
    gw_pid = gateway.proc.pid
    parsers = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            if d.name.isdigit() and int(stat[stat.rfind(")") + 2:].split()[1]) == gw_pid \
                    and b"spawn_main" in (d / "cmdline").read_bytes():
                parsers.append(int(d.name))
        except OSError:
            continue
    assert len(parsers) == 1, parsers
    gateway.kill(signal.SIGKILL)
    if not ended(parsers[0]):
        os.kill(parsers[0], signal.SIGKILL)
        raise AssertionError("the parser process outlived its gateway")
