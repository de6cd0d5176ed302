"""Chains, arrays, job_control and job_usage through a real gateway on the local backend
(Slurm's side: tests/test_gateway_slurm.py)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import Gateway, running

END = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY")


def _wait(h, jid: int, timeout: float = 60) -> dict:
    r = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": timeout})
    assert r.status_code == 200, r.text
    return r.json()


def _until(h, jid: int, pred, within: float = 30) -> dict:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        job = h.get(f"/v1/jobs/{jid}").json()
        if pred(job):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {jid} never got there: {job}")


def test_a_chain_runs_in_order_and_a_failed_parent_cancels_after_ok(gateway: Gateway, tmp_path: Path) -> None:
    with gateway.http(session="chain") as h:
        a = h.post("/v1/jobs", json={"command": "sleep 1; echo a > a.txt", "workdir": str(tmp_path)}).json()
        b = h.post("/v1/jobs", json={"command": "cat a.txt", "workdir": str(tmp_path), "after_ok": [a["id"]]}).json()
        held = h.get(f"/v1/jobs/{b['id']}").json()
        assert held["state"] == "PENDING" and f"waiting for job {a['id']}" in held["reason"]
        bad = h.post("/v1/jobs", json={"command": "exit 3"}).json()
        ok_child = h.post("/v1/jobs", json={"command": "echo never", "after_ok": [bad["id"]]}).json()
        any_child = h.post("/v1/jobs", json={"command": "echo anyway", "after_any": [bad["id"], a["id"]]}).json()
        done_b = _wait(h, b["id"])
        done_a = h.get(f"/v1/jobs/{a['id']}").json()
        assert done_b["state"] == "COMPLETED" and done_b["start_time"] >= done_a["end_time"]
        assert h.get(f"/v1/jobs/{b['id']}/output").json()["data"] == "a\n"
        never = _wait(h, ok_child["id"])
        assert never["state"] == "CANCELLED" and "dependency never satisfied" in never["reason"] \
            and f"job {bad['id']} ended FAILED" in never["reason"]
        assert _wait(h, any_child["id"])["state"] == "COMPLETED"
        # Known at submit time: refused at once, saying what to use instead.
        r = h.post("/v1/jobs", json={"command": "true", "after_ok": [bad["id"]]})
        assert r.status_code == 400 and "ended FAILED" in r.json()["error"]["message"] \
            and "after_any" in r.json()["error"]["hint"]
        r = h.post("/v1/jobs", json={"command": "true", "after_ok": [10**9]})
        assert r.status_code == 400 and "not visible to you" in r.json()["error"]["message"]
        r = h.post("/v1/jobs", json={"command": "true", "after_ok": ["x"]})
        assert r.status_code == 400 and "after_ok" in r.json()["error"]["message"]


def test_a_dependency_is_private_to_who_may_see_the_parent(gateway: Gateway, people: dict[str, str]) -> None:
    with gateway.http(people["carol"]) as carol, gateway.http(people["bot1"]) as bot:
        theirs = carol.post("/v1/jobs", json={"command": "sleep 5"}).json()
        r = bot.post("/v1/jobs", json={"command": "true", "after_any": [theirs["id"]]})
        assert r.status_code == 400 and "not visible to you" in r.json()["error"]["message"]
        carol.post("/v1/jobs/cancel", json={"ids": [theirs["id"]]})


def test_an_array_is_a_batch_with_each_index_in_its_environment(gateway: Gateway) -> None:
    with gateway.http() as h:
        r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "echo task $SLURM_ARRAY_TASK_ID $CORRAL_ARRAY_TASK_ID"}],
                                           "array": "0-6:3,10"})
        assert r.status_code == 201, r.text
        ids = [j["id"] for j in r.json()["jobs"]]
        assert len(ids) == 4
        outs = []
        for jid in ids:
            assert _wait(h, jid)["state"] == "COMPLETED"
            outs.append(h.get(f"/v1/jobs/{jid}/output").json()["data"])
        assert outs == ["task 0 0\n", "task 3 3\n", "task 6 6\n", "task 10 10\n"]
        for array, words in (("0-9%2", "throttle"), ("9-1", "low-high"), ("0-5000", "more than 1000"), ("a", "syntax")):
            r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "true"}], "array": array})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (array, r.text)
        r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "true"}, {"command": "true"}], "array": "0-1"})
        assert r.status_code == 400 and "exactly one" in r.json()["error"]["message"]


def test_hold_release_and_signal_on_the_local_backend(tmp_path: Path) -> None:
    with running(tmp_path, cpus=1) as gw, gw.http() as h:
        blocker = h.post("/v1/jobs", json={"command": "sleep 2"}).json()
        # Queued by the local backend behind the blocker (1 slot): held in its queue.
        queued = h.post("/v1/jobs", json={"command": "echo queued"}).json()
        r = h.post(f"/v1/jobs/{queued['id']}/control", json={"action": "hold"})
        assert r.status_code == 200, r.text
        # Held by corral itself: not sent yet (it waits for the blocker).
        child = h.post("/v1/jobs", json={"command": "echo child", "after_any": [blocker["id"]]}).json()
        assert h.post(f"/v1/jobs/{child['id']}/control", json={"action": "hold"}).json()["reason"].startswith("held")
        _wait(h, blocker["id"])
        # several ticks of the reconciler after the blocker's end: neither held job may start
        ticks = {h.get("/healthz").json()["last_tick"]}
        deadline = time.monotonic() + 30
        while len(ticks) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
            ticks.add(h.get("/healthz").json()["last_tick"])
        assert len(ticks) >= 5, ticks
        for jid in (queued["id"], child["id"]):
            job = h.get(f"/v1/jobs/{jid}").json()
            assert job["state"] == "PENDING" and "held" in job["reason"], job
        for jid in (queued["id"], child["id"]):
            assert h.post(f"/v1/jobs/{jid}/control", json={"action": "release"}).status_code == 200
            assert _wait(h, jid)["state"] == "COMPLETED"
        # A running job's signal reaches it (through its supervisor), and it acts on it.
        trap = h.post("/v1/jobs", json={
            "command": "trap 'echo checkpointed; exit 0' USR1; echo ready; while true; do sleep 0.1; done"}).json()
        _until(h, trap["id"], lambda j: j["state"] == "RUNNING"
               and h.get(f"/v1/jobs/{trap['id']}/output").json()["data"] == "ready\n")
        r = h.post(f"/v1/jobs/{trap['id']}/control", json={"action": "signal", "signal": "USR1"})
        assert r.status_code == 200, r.text
        assert _wait(h, trap["id"])["state"] == "COMPLETED"
        assert "checkpointed" in h.get(f"/v1/jobs/{trap['id']}/output").json()["data"]
        # What it cannot do, it says, in the caller's terms.
        long = h.post("/v1/jobs", json={"command": "sleep 30"}).json()
        _until(h, long["id"], lambda j: j["state"] == "RUNNING")
        for body, words in (({"action": "requeue"}, "cannot requeue"), ({"action": "signal"}, "needs a signal"),
                            ({"action": "signal", "signal": "SEGV"}, "not one corral sends"),
                            ({"action": "hold", "signal": "USR1"}, "goes with action 'signal'")):
            r = h.post(f"/v1/jobs/{long['id']}/control", json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
        r = h.post(f"/v1/jobs/{long['id']}/control", json={"action": "pause"})
        assert r.status_code == 400 and "action" in r.json()["error"]["message"]
        r = h.post(f"/v1/jobs/{long['id']}/control", json={"action": "hold"})
        assert r.status_code == 400 and "has started" in r.json()["error"]["message"]
        h.post("/v1/jobs/cancel", json={"ids": [long["id"]]})
        r = h.post(f"/v1/jobs/{trap['id']}/control", json={"action": "signal", "signal": "USR1"})
        assert r.status_code == 400 and "has ended" in r.json()["error"]["message"]


def test_usage_reports_cpu_time_peak_memory_and_what_to_ask(gateway: Gateway, tmp_path: Path) -> None:
    burn = ("import time\nb = bytearray(150 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
            "t = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n")
    (tmp_path / "burn.py").write_text(burn)
    with gateway.http() as h:
        job = h.post("/v1/jobs", json={"command": f"python3 {tmp_path / 'burn.py'}", "cpus": 2, "memory": "2G",
                                       "walltime": "2h"}).json()
        running_usage = h.get(f"/v1/jobs/{job['id']}/usage").json()
        assert running_usage["final"] is False or running_usage["state"] in END
        assert _wait(h, job["id"])["state"] == "COMPLETED"
        u = h.get(f"/v1/jobs/{job['id']}/usage").json()
        assert u["final"] and u["cpu_s"] >= 0.9 and 140 <= u["max_rss_mb"] <= 400, u
        # What the job used, against what it asked; how busy its CPUs were depends on the
        # machine's load, so only what holds at any load: one thread fills at most one of two.
        assert u["efficiency"]["cpu"] <= 0.75 and u["efficiency"]["memory"] < 0.25
        advice = " ".join(u["advice"])
        assert "cpus=1" in advice and "memory=" in advice and "walltime=" in advice
        assert h.get("/v1/jobs/999999/usage").status_code == 404
    cp = gateway.cli("usage", str(job["id"]))
    assert cp.returncode == 0 and "peak mem" in cp.stdout and "advice:" in cp.stdout
    assert "MB, 2048 MB asked" in cp.stdout and "% of it used" in cp.stdout
    cp = gateway.cli("--json", "control", str(job["id"]), "hold")
    assert cp.returncode == 2 and "has ended" in cp.stdout


def test_the_cli_submits_arrays_and_chains(gateway: Gateway, tmp_path: Path) -> None:
    first = gateway.cli_json("submit", "--array", "1-3", "--", "echo $CORRAL_ARRAY_TASK_ID")
    ids = [j["id"] for j in first["jobs"]]
    last = gateway.cli_json("submit", "--after-ok", ",".join(map(str, ids)), "--", "echo after")
    with gateway.http() as h:
        done = _wait(h, last["id"])
        assert done["state"] == "COMPLETED"
        assert all(h.get(f"/v1/jobs/{i}").json()["end_time"] <= done["start_time"] for i in ids)
    cp = gateway.cli("--json", "submit", "--after-ok", "a,b", "--", "true")
    assert cp.returncode == 2 and "job ids" in cp.stdout


def test_an_agents_contained_job_is_signalled_and_measured_in_its_built_sandbox(
        gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    """An agent's job with a working directory starts inside its key's built sandbox
    (corral/sandbox/host.py): the signal and the usage travel through that host."""
    with gateway.http(people["bot1"]) as h:
        trap = h.post("/v1/jobs", json={
            "command": "trap 'echo got-usr1; exit 0' USR1; echo ready; while true; do sleep 0.1; done",
            "workdir": str(agent_dir)}).json()
        _until(h, trap["id"], lambda j: j["state"] == "RUNNING"
               and h.get(f"/v1/jobs/{trap['id']}/output").json()["data"] == "ready\n")
        assert h.post(f"/v1/jobs/{trap['id']}/control", json={"action": "signal", "signal": "USR1"}).status_code == 200
        assert _wait(h, trap["id"])["state"] == "COMPLETED"
        assert "got-usr1" in h.get(f"/v1/jobs/{trap['id']}/output").json()["data"]
        job = h.post("/v1/jobs", json={"command": "python3 -c \"b = bytearray(120 * 2**20); b[::4096] = b'x' * len(b[::4096])\"",
                                       "workdir": str(agent_dir)}).json()
        assert _wait(h, job["id"])["state"] == "COMPLETED"
        u = h.get(f"/v1/jobs/{job['id']}/usage").json()
        assert u["max_rss_mb"] >= 110 and u["cpu_s"] is not None, u
        assert h.get(f"/v1/jobs/{job['id']}/usage", headers={"Authorization": f"Bearer {people['carol']}"}).status_code == 404


def test_a_held_child_survives_a_gateway_crash(tmp_path: Path) -> None:
    """A job that waits for its parent is recorded, not sent: a kill -9 of the gateway
    loses neither, and the restarted gateway sends the child once the parent ends."""
    import signal

    with running(tmp_path) as gw:
        with gw.http() as h:
            parent = h.post("/v1/jobs", json={"command": "sleep 3; echo p > p.txt", "workdir": str(tmp_path)}).json()
            child = h.post("/v1/jobs", json={"command": "cat p.txt", "workdir": str(tmp_path),
                                             "after_ok": [parent["id"]]}).json()
            assert h.get(f"/v1/jobs/{child['id']}").json()["backend_id"] is None
        gw.kill(signal.SIGKILL)
        gw.start()
        with gw.http() as h:
            done = _wait(h, child["id"])
            assert done["state"] == "COMPLETED", done
            assert h.get(f"/v1/jobs/{child['id']}/output").json()["data"] == "p\n"
            assert len(h.get("/v1/jobs").json()["jobs"]) == 2


def test_usage_of_a_job_past_its_memory_reads_as_more_than_asked() -> None:
    """The words of `corral usage` (a formatting check: the real job is the test above)."""
    from corral.edges.cli.job_commands import usage_text

    text = usage_text({"job_id": 7, "state": "OUT_OF_MEMORY", "elapsed_s": 3, "cpu_s": 1.0, "max_rss_mb": 116.2,
                       "how": "cgroup", "advice": [], "asked": {"walltime_s": 3600, "cpus": 1, "memory_mb": 100},
                       "efficiency": {"time": 0.001, "cpu": 0.33, "memory": 1.162}})
    assert "peak mem  116.2 MB, 100 MB asked  (116%: more than asked)" in text
    assert "efficiency" not in text.split("peak mem")[1]
