"""The fast lane on the embedded default: a real gateway whose pool runs a real Dask
worker as a local pilot job. A fast-lane task must be a job like any other over
HTTP, the CLI and MCP; routing, accounting, isolation and failure are checked here
(the Slurm side is in test_gateway_slurm.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from .conftest import Gateway, running


@pytest.fixture
def fast(tmp_path):
    with running(tmp_path, cpus=8, CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MEMORY_MB="4096") as gw:
        yield gw


def people(gw: Gateway) -> dict[str, str]:
    """alice (human, unix user alice/proj-a) with agent bot; carol (unix user carol)."""
    with gw.http() as h:
        for body in ({"name": "alice", "kind": "human", "unix_user": "alice", "account": "proj-a"},
                     {"name": "carol", "kind": "human", "unix_user": "carol", "account": "proj-c"},
                     {"name": "bot", "kind": "agent", "sponsor": "alice"}):
            r = h.post("/v1/principals", json=body)
            assert r.status_code == 201, r.text
        return {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("alice", "carol", "bot")}


def wait(gw: Gateway, token: str, job_id: int, until: str | None = None, timeout: float = 60) -> dict[str, Any]:
    with gw.http(token) as h:
        params: dict[str, Any] = {"timeout": timeout}
        if until:
            params["until"] = until
        return h.get(f"/v1/jobs/{job_id}/wait", params=params).json()


def test_a_fast_task_is_a_job_over_http_and_cli(fast: Gateway, tmp_path) -> None:
    t = people(fast)
    # bot runs as its sponsor's Unix user where alice exists, else as a dynamic identity,
    # which may not enter pytest's 0700 /tmp/pytest-of-root: a directory it can use either way
    work = Path(tempfile.mkdtemp(prefix="corral-fast-", dir="/var/tmp"))
    work.chmod(0o777)
    with fast.http(t["bot"], session="s-1") as h:
        r = h.post("/v1/jobs", json={"command": "echo hello; echo oops >&2", "lane": "fast", "workdir": str(work)})
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["backend"] == "fast" and job["spec"]["lane"] == "fast" and job["spec"]["walltime"] == 600
        done = wait(fast, t["bot"], job["id"])
        assert done["state"] == "COMPLETED" and done["exit_code"] == 0 and done["start_time"] >= done["submit_time"]
        assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "hello\n"
        assert h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"] == "oops\n"
        listed = h.get("/v1/jobs", params={"session": "s-1"}).json()["jobs"]
        assert [j["id"] for j in listed] == [job["id"]]
    # the CLI, unchanged: submit, wait, logs
    sub = fast.cli_json("submit", "--lane", "fast", "-t", "1m", "--", "echo from-cli", token=t["bot"])
    assert fast.cli_json("wait", str(sub["id"]), token=t["bot"])["state"] == "COMPLETED"
    assert fast.cli("logs", str(sub["id"]), token=t["bot"]).stdout == "from-cli\n"
    # failures and limits read as they do in the batch lane
    with fast.http(t["bot"]) as h:
        fail = h.post("/v1/jobs", json={"command": "exit 3", "lane": "fast"}).json()
        slow = h.post("/v1/jobs", json={"command": "sleep 30", "lane": "fast", "walltime": "2s"}).json()
        script = h.post("/v1/jobs", json={"script": "#!/bin/bash\necho from-script $CORRAL_LANE", "lane": "fast"}).json()
    assert wait(fast, t["bot"], fail["id"])["exit_code"] == 3
    assert wait(fast, t["bot"], slow["id"])["state"] == "TIMEOUT"
    assert wait(fast, t["bot"], script["id"])["state"] == "COMPLETED"
    with fast.http(t["bot"]) as h:
        assert h.get(f"/v1/jobs/{script['id']}/output").json()["data"] == "from-script fast\n"


def test_cancel_waiting_and_running_tasks(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"]) as h:
        # four 1-CPU sleeps fill the 4-CPU allocation; the fifth waits for a slot
        ids = [h.post("/v1/jobs", json={"command": "sleep 30", "lane": "fast", "walltime": "1m"}).json()["id"]
               for _ in range(5)]
        running = wait(fast, t["bot"], ids[0], until="RUNNING")
        assert running["state"] == "RUNNING"
        r = h.post("/v1/jobs/cancel", json={"ids": ids})
        assert r.status_code == 200
        done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 30}).json()
    assert done["reached"] and {j["state"] for j in done["jobs"]} == {"CANCELLED"}, done


def test_routing(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"]) as h:
        auto_short = h.post("/v1/jobs", json={"command": "true", "lane": "auto", "walltime": "30s"}).json()
        auto_vague = h.post("/v1/jobs", json={"command": "true", "lane": "auto"}).json()  # no walltime: not known short
        auto_big = h.post("/v1/jobs", json={"command": "true", "lane": "auto", "walltime": "30s", "cpus": 6}).json()
        default = h.post("/v1/jobs", json={"command": "true", "walltime": "30s"}).json()
        refused = h.post("/v1/jobs", json={"command": "true", "lane": "fast", "walltime": "2h"})
        too_wide = h.post("/v1/jobs", json={"command": "true", "lane": "fast", "cpus": 6})
    assert auto_short["backend"] == "fast"
    assert auto_vague["backend"] == auto_big["backend"] == default["backend"] == "local"
    assert refused.status_code == 400 and "walltime" in refused.json()["error"]["message"]
    assert "lane 'batch'" in refused.json()["error"]["hint"]
    assert too_wide.status_code == 400 and "cpus 6" in too_wide.json()["error"]["message"]


def test_accounting_and_provenance(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"], session="acct-1") as h:
        burn = h.post("/v1/jobs", json={"command": "python3 -c 'sum(range(30_000_000))'", "lane": "fast",
                                        "walltime": "1m", "cpus": 2}).json()
        assert wait(fast, t["bot"], burn["id"])["state"] == "COMPLETED"
        usage = h.get("/v1/facility").json()["you"]["usage"]
    assert usage["by_lane"]["fast"]["jobs"] == 1 and usage["by_lane"]["fast"]["cpu_hours"] > 0
    assert usage["by_session"]["acct-1"]["cpu_hours"] == usage["cpu_hours"]
    assert usage["measured_cpu_hours"] > 0  # the task's own rusage
    with fast.http() as h:
        pilots = h.get("/v1/jobs", params={"principal": "fastlane"}).json()["jobs"]
        info = h.get("/v1/facility").json()["fast_lane"]
    assert pilots and pilots[0]["session"] == "pool:alice-proj+2Da-_"  # the allocation says whose it is
    assert [p["pool"] for p in info["pools"]] == ["alice-proj+2Da-_"]


def test_pools_are_per_user_and_account(fast: Gateway) -> None:
    t = people(fast)
    ids = {}
    for who in ("alice", "bot", "carol"):
        with fast.http(t[who]) as h:
            ids[who] = h.post("/v1/jobs", json={"command": "echo $CORRAL_PRINCIPAL", "lane": "fast"}).json()
    for who, job in ids.items():
        assert wait(fast, t[who], job["id"])["state"] == "COMPLETED"
    # the agent shares its sponsor's user and account, hence its pool; carol has her own
    assert ids["alice"]["backend_id"].split(":")[1] == ids["bot"]["backend_id"].split(":")[1] == "alice-proj+2Da-_"
    assert ids["carol"]["backend_id"].split(":")[1] == "carol-proj+2Dc-_"
    with fast.http() as h:
        pools = {p["pool"]: p for p in h.get("/v1/facility").json()["fast_lane"]["pools"]}
        pilots = h.get("/v1/jobs", params={"principal": "fastlane"}).json()["jobs"]
    assert set(pools) == {"alice-proj+2Da-_", "carol-proj+2Dc-_"}
    assert {p["session"] for p in pilots} == {"pool:alice-proj+2Da-_", "pool:carol-proj+2Dc-_"}


def _kill_workers(gw: Gateway) -> None:
    """Kill the fast-lane workers of this gateway, as a node failure would."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"corral.lanes.fast.worker" in cmd and str(gw.home).encode() in b" ".join(cmd):
                os.kill(int(pid), signal.SIGKILL)


def test_an_allocation_that_dies_fails_or_reruns_its_tasks(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"]) as h:
        once = h.post("/v1/jobs", json={"command": "sleep 20", "lane": "fast", "walltime": "1m"}).json()
        again = h.post("/v1/jobs", json={"command": "sleep 3; echo rerun-ok", "lane": "fast", "walltime": "1m",
                                         "idempotent": True}).json()
    wait(fast, t["bot"], once["id"], until="RUNNING")
    wait(fast, t["bot"], again["id"], until="RUNNING")
    _kill_workers(fast)
    failed = wait(fast, t["bot"], once["id"])
    assert failed["state"] == "FAILED" and "allocation was lost" in failed["reason"] and "idempotent" in failed["reason"]
    rerun = wait(fast, t["bot"], again["id"], timeout=120)  # a new allocation starts and runs it again
    assert rerun["state"] == "COMPLETED", rerun
    with fast.http(t["bot"]) as h:
        assert h.get(f"/v1/jobs/{again['id']}/output").json()["data"] == "rerun-ok\n"


def test_breaker_opens_when_allocations_cannot_start(tmp_path) -> None:
    with running(tmp_path, cpus=4, CORRAL_FASTLANE_PYTHON="/bin/false", CORRAL_FASTLANE_BREAKER_FAILURES="2",
                 CORRAL_FASTLANE_CPUS="2") as gw:
        with gw.http() as h:
            job = h.post("/v1/jobs", json={"command": "true", "lane": "fast"}).json()
            failed = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
            assert failed["state"] == "FAILED" and "failed to start" in failed["reason"]
            assert "lane=batch" in failed["reason"]
            refused = h.post("/v1/jobs", json={"command": "true", "lane": "fast"})
            assert refused.status_code == 400 and "off after failed allocations" in refused.json()["error"]["message"]
            auto = h.post("/v1/jobs", json={"command": "true", "lane": "auto", "walltime": "30s"}).json()
            assert auto["backend"] == "local"  # auto falls back to the batch lane
            pool = h.get("/v1/facility").json()["fast_lane"]["pools"][0]
            assert pool["breaker"]["open"] and pool["breaker"]["failures"] == 2


def test_restart_loses_nothing(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"]) as h:
        done = h.post("/v1/jobs", json={"command": "echo before", "lane": "fast"}).json()
        assert wait(fast, t["bot"], done["id"])["state"] == "COMPLETED"
        rerun = h.post("/v1/jobs", json={"command": "sleep 2; echo after", "lane": "fast", "idempotent": True}).json()
    wait(fast, t["bot"], rerun["id"], until="RUNNING")
    fast.kill(signal.SIGKILL)
    fast.start()
    assert wait(fast, t["bot"], done["id"])["state"] == "COMPLETED"
    final = wait(fast, t["bot"], rerun["id"], timeout=120)
    assert final["state"] == "COMPLETED", final
    with fast.http(t["bot"]) as h:
        assert h.get(f"/v1/jobs/{done['id']}/output").json()["data"] == "before\n"
        assert h.get(f"/v1/jobs/{rerun['id']}/output").json()["data"] == "after\n"
        new = h.post("/v1/jobs", json={"command": "echo new", "lane": "fast"}).json()
    assert wait(fast, t["bot"], new["id"])["state"] == "COMPLETED"


def test_batch_submission_and_mcp(fast: Gateway) -> None:
    t = people(fast)
    with fast.http(t["bot"]) as h:
        r = h.post("/v1/jobs/batch", json={"jobs": [{"command": f"echo {i}", "lane": "fast"} for i in range(20)]})
        assert r.status_code == 201
        ids = [j["id"] for j in r.json()["jobs"]]
        done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 60}).json()
        assert done["reached"] and all(j["state"] == "COMPLETED" for j in done["jobs"])
        assert h.get(f"/v1/jobs/{ids[7]}/output").json()["data"] == "7\n"
        bad = h.post("/v1/jobs/batch", json={"jobs": [{"command": "true"}, {"command": "true", "cpus": 999}]})
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("job 1:")
        assert h.get("/v1/jobs", params={"limit": 1000}).json()["jobs"].__len__() == 20  # nothing of the bad batch

    async def over_mcp() -> None:
        params = StdioServerParameters(command=sys.executable, args=["-m", "corral.edges.cli.main", "mcp"],
                                       env=fast.env(t["bot"], CORRAL_SESSION="mcp-fast"))
        async with Client(params) as client:
            sub = await client.call_tool("submit_job", {"command": "echo via-mcp", "lane": "fast"})
            job_id = json.loads(sub.content[0].text)["job_id"] if sub.structured_content is None \
                else sub.structured_content["job_id"]
            res = await client.call_tool("wait_for_job", {"job_id": job_id, "timeout_s": 60})
            state = (res.structured_content or json.loads(res.content[0].text))["state"]
            assert state == "COMPLETED"
            out = await client.call_tool("job_output", {"job_id": job_id})
            data = out.content[0].text  # the page is the text
            # always delimited (a page says its lines around the delimiters: decision 0048)
            assert "<untrusted-data" in data and "\nvia-mcp\n" in data.split("<untrusted-data", 1)[1], data
            long = await client.call_tool("submit_job", {"command": "sleep 30", "lane": "fast", "walltime": "1m"})
            lid = (long.structured_content or json.loads(long.content[0].text))["job_id"]
            await client.call_tool("wait_for_job", {"job_id": lid, "until": "RUNNING", "timeout_s": 30})
            await client.call_tool("cancel_job", {"job_id": lid})
            end = await client.call_tool("wait_for_job", {"job_id": lid, "timeout_s": 30})
            assert (end.structured_content or json.loads(end.content[0].text))["state"] == "CANCELLED"


    asyncio.run(over_mcp())


def test_an_outcome_does_not_wait_for_the_rest_of_its_batch(fast: Gateway) -> None:
    """Tasks of one batch travel together, but each one's start and end reach corral as
    they happen (pushed by the worker), not when the batch's slowest task is done."""
    t = people(fast)
    with fast.http(t["bot"]) as h:
        wait(fast, t["bot"], h.post("/v1/jobs", json={"command": "true", "lane": "fast"}).json()["id"])  # warm
        r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "sleep 40", "lane": "fast", "walltime": "1m"},
                                                    {"command": "echo quick", "lane": "fast"}]})
        slow, quick = (j["id"] for j in r.json()["jobs"])
        done = wait(fast, t["bot"], quick, timeout=20)
        assert done["state"] == "COMPLETED", done
        assert h.get(f"/v1/jobs/{slow}").json()["state"] == "RUNNING"  # its batch is still out
        h.post(f"/v1/jobs/{slow}/cancel")
        assert wait(fast, t["bot"], slow, timeout=30)["state"] == "CANCELLED"


def test_pool_scales_with_backlog_and_releases_idle_allocations(tmp_path) -> None:
    with running(tmp_path, cpus=8, CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MEMORY_MB="2048",
                 CORRAL_FASTLANE_MAX_ALLOCATIONS="2", CORRAL_FASTLANE_IDLE_S="3") as gw:
        with gw.http() as h:
            r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "sleep 4", "lane": "fast", "walltime": "1m"}] * 12})
            ids = [j["id"] for j in r.json()["jobs"]]
            # 12 one-CPU tasks on 4 CPUs: a backlog, so a second allocation joins (and no third: max 2)
            done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 120}).json()
            assert done["reached"] and {j["state"] for j in done["jobs"]} == {"COMPLETED"}
            pilots = h.get("/v1/jobs", params={"principal": "fastlane"}).json()["jobs"]
            assert len(pilots) == 2
            for _ in range(100):  # idle for 3 s: both are released
                pool = h.get("/v1/facility").json()["fast_lane"]["pools"][0]
                if not pool["allocations"]:
                    break
                time.sleep(0.2)
            assert pool["allocations"] == []
            pilot_ids = [p["id"] for p in pilots]
            ended = h.post("/v1/jobs/wait", json={"ids": pilot_ids, "timeout": 30}).json()
            assert ended["reached"], ended  # the released allocations really end


def test_a_burst_on_a_small_warm_allocation_is_shared_with_the_next(tmp_path) -> None:
    """Allocations sized to demand: the warm-up made a 1-CPU allocation, and a burst sent
    to it whole queued in its launcher (12 s of `sleep 1`) while a 4-CPU allocation that
    joined later sat idle. A worker now holds a few tasks per slot; the rest wait for room."""
    with running(tmp_path, cpus=8, CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MIN_CPUS="1",
                 CORRAL_FASTLANE_MEMORY_MB="2048", CORRAL_FASTLANE_MAX_ALLOCATIONS="2") as gw:
        with gw.http() as h:
            warm = h.post("/v1/jobs", json={"command": "true", "lane": "fast"}).json()["id"]
            assert h.post("/v1/jobs/wait", json={"ids": [warm], "timeout": 60}).json()["reached"]
            pool = h.get("/v1/facility").json()["fast_lane"]["pools"][0]
            assert [a["shape"]["cpus"] for a in pool["allocations"]] == [1]
            # $PPID of the task's shell is the worker that ran it
            r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "sleep 1; echo $PPID", "lane": "fast",
                                                          "walltime": "1m"}] * 12})
            ids = [j["id"] for j in r.json()["jobs"]]
            done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 120}).json()
            assert done["reached"] and {j["state"] for j in done["jobs"]} == {"COMPLETED"}
            workers = {h.get(f"/v1/jobs/{i}/output").json()["data"].strip() for i in ids}
            assert len(workers) == 2, workers


def test_an_allocation_still_being_submitted_is_not_sent_twice(tmp_path) -> None:
    """The reconciler resends jobs recorded but never handed to the backend. An allocation
    whose submission is still on its way is not one of them: sent twice, two workers of
    one name met the pool's scheduler, Dask refused the second, and the allocation the
    gateway kept track of was the one that had exited (seen under load in CI)."""

    from corral.core.config import Settings
    from corral.core.jobs import JobSpec
    from corral.edges.http.serve import build_service

    service = build_service(Settings(home=tmp_path / "home", tick_s=0.05, local_cpus=4, fastlane_cpus=2,
                                     fastlane_memory_mb=512))
    service.accounts.bootstrap_admin()
    admin = service.authenticate((tmp_path / "home" / "admin.token").read_text().strip())
    backend = service.lanes.batch.backend
    real, sent = backend.submit, []

    def slow_submit(ctx: Any, spec: JobSpec) -> str:
        sent.append(ctx.job_id)
        time.sleep(0.6)  # a slow sbatch: several reconciler ticks pass meanwhile
        return real(ctx, spec)

    backend.submit = slow_submit  # type: ignore[method-assign]

    async def scenario() -> None:
        fast = service.lanes["fast"]
        loops = [asyncio.create_task(service.reconciler.run()), asyncio.create_task(fast.run())]
        try:
            (job,), _ = await service.submit(admin, [JobSpec(command="true", lane="fast", walltime="30s",
                                                             memory="256M")])
            for _ in range(100):
                await asyncio.sleep(0.1)
                if service.db.get_job(job.id).terminal:  # type: ignore[union-attr]
                    break
            assert service.db.get_job(job.id).state.value == "COMPLETED"  # type: ignore[union-attr]
        finally:
            for t in loops:
                t.cancel()
            await fast.close()

    asyncio.run(scenario())
    assert len(sent) == len(set(sent)) == 1, sent  # one allocation, sent once


def test_an_outcome_is_kept_when_memory_cannot_record_it(tmp_path) -> None:
    """A report's outcomes and their memory episodes share one commit; memory only
    advises, so its failure must not roll the outcomes back."""
    from corral.core.config import Settings
    from corral.core.jobs import JobSpec
    from corral.edges.http.serve import build_service

    service = build_service(Settings(home=tmp_path / "home", local_cpus=4, fastlane_cpus=2, fastlane_memory_mb=512))
    service.accounts.bootstrap_admin()
    admin = service.authenticate((tmp_path / "home" / "admin.token").read_text().strip())

    def broken(job_ids: list[int]) -> None:
        raise RuntimeError("the episodes table is unwritable")

    service.memory.remember_outcomes = broken  # type: ignore[method-assign]

    async def scenario() -> None:
        try:
            (job,), _ = await service.submit(admin, [JobSpec(command="true", lane="fast", walltime="30s",
                                                             memory="256M")])
            now = time.time()
            service.progress.ended([{"job_id": job.id, "state": "COMPLETED", "exit_code": 0, "start": now,
                                     "end": now, "cpu_s": 0.001, "reason": None}])
            stored = service.db.get_job(job.id)
            assert stored is not None and stored.state.value == "COMPLETED" and stored.exit_code == 0
        finally:
            await service.lanes["fast"].close()

    asyncio.run(scenario())


def test_a_chain_of_fast_tasks_and_what_each_used(fast: Gateway, agent_dir) -> None:
    """A fast-lane task that waits for another is held by corral until it ends, then
    starts at once in the warm allocation; each task's CPU time and peak memory come
    with its outcome; control of a fast task is refused with what to do instead."""
    t = people(fast)
    with fast.http(t["bot"]) as h:
        a = h.post("/v1/jobs", json={"command": "sleep 1; echo a > fa.txt", "lane": "fast",
                                     "workdir": str(agent_dir)}).json()
        b = h.post("/v1/jobs", json={"command": "cat fa.txt; python3 -c \"b = bytearray(80 * 2**20); "
                                                "b[::4096] = b'x' * len(b[::4096])\"",
                                     "lane": "fast", "workdir": str(agent_dir), "after_ok": [a["id"]]}).json()
        assert b["backend"] == "fast"
        done = wait(fast, t["bot"], b["id"])
        first = h.get(f"/v1/jobs/{a['id']}").json()
        assert done["state"] == "COMPLETED" and done["start_time"] >= first["end_time"], (done, first)
        assert h.get(f"/v1/jobs/{b['id']}/output").json()["data"] == "a\n"
        u = h.get(f"/v1/jobs/{b['id']}/usage").json()
        assert u["cpu_s"] is not None and u["max_rss_mb"] >= 70, u
        r = h.post(f"/v1/jobs/{b['id']}/control", json={"action": "hold"})
        assert r.status_code == 400 and "has ended" in r.json()["error"]["message"]
        slow = h.post("/v1/jobs", json={"command": "sleep 20", "lane": "fast"}).json()
        deadline = time.monotonic() + 30
        while h.get(f"/v1/jobs/{slow['id']}").json()["state"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        r = h.post(f"/v1/jobs/{slow['id']}/control", json={"action": "signal", "signal": "USR1"})
        assert r.status_code == 400 and "fast-lane task" in r.json()["error"]["message"] \
            and "cancel" in r.json()["error"]["hint"]
        h.post("/v1/jobs/cancel", json={"ids": [slow["id"]]})


def _pool(tmp_path, **cfg: Any) -> Any:
    """A pool's scaling state alone (no engine, no allocations port): its rules read only it."""
    from corral.lanes.fast.pool import Pool, PoolConfig, PoolKey, Shape

    return Pool(PoolKey(None, None, None), Shape(32, 64000, 0, 3600), tmp_path, PoolConfig(**cfg), None, None)  # type: ignore[arg-type]


def _task(i: int, command: str = "true", cpus: int = 1) -> Any:
    from corral.lanes.fast.pool import Task

    return Task(i, {"command": command, "cpus": cpus, "memory_mb": 100, "gpus": 0})


def test_a_pool_grows_for_the_work_coming_not_for_the_number_of_tasks(tmp_path) -> None:
    """Issue 40: a burst first ran on a 4-CPU allocation until a larger one started, and a
    larger one was asked for only after the backlog had waited 2 s, whatever it held.
    Now the work a batch brings (what its kind of task took before, else a second each)
    is weighed against how long an allocation takes to join."""
    from corral.lanes.fast import scaling
    from corral.lanes.fast.pool import Allocation, Shape

    pool = _pool(tmp_path, min_cpus=4)
    now = time.time()
    pool.allocations[1] = Allocation(1, "alloc-1", now - 10, Shape(4, 8000, 0, 3600), up_since=now - 8)
    pool.demand.started(0.5)  # its allocations join half a second after they are asked for
    pool.enqueue(_task(0, "sleep 3"))  # one task that starts at once where it is: nothing to grow for
    assert not scaling.backlogged(pool, now)
    pool.queue.clear()
    pool.demand.started(3.8)  # averaged with the first: 1.5 s
    pool.demand.ran({"command": "true", "cpus": 1}, 0.003)
    for i in range(1000):  # 3 s of work: 0.75 s on 4 CPUs, over before another could join
        pool.enqueue(_task(i))
    assert not scaling.backlogged(pool, now)
    for i in range(1000, 1100):  # a sweep never run here: assumed a second each, 25 s on 4 CPUs
        pool.enqueue(_task(i, f"python check.py --seed {i}"))
    assert scaling.backlogged(pool, now)
    assert scaling.size(pool, (28, 56000)).cpus == 28  # asked at once, as big as the node has free
    assert scaling.size(pool, None).cpus == 32  # the pool's whole shape when the node's room is unknown
    # once its runs are known to be long, the same sweep is weighed as such
    pool.demand.ran({"command": "python check.py --seed 1", "cpus": 1}, 0.001)
    pool.queue.clear()
    for i in range(2000, 2100):
        pool.enqueue(_task(i, f"python check.py --seed {i}"))
    assert not scaling.backlogged(pool, now)
    # a full-size allocation already coming: no second ask
    pool.enqueue(_task(3000, "sleep 600"))
    pool.allocations[2] = Allocation(2, "alloc-2", now, Shape(32, 64000, 0, 3600))
    pool.allocations[1] = Allocation(1, "alloc-1", now - 10, Shape(32, 64000, 0, 3600), up_since=now - 8)
    assert not scaling.backlogged(pool, now)


def test_the_warm_allocation_follows_recent_demand(tmp_path) -> None:
    """An idle pool whose only allocation is smaller than its last burst asks for one of
    that burst's size, and keeps that one when idle; a pool with nothing asks for its
    recent peak, not the floor."""
    from corral.lanes.fast import scaling
    from corral.lanes.fast.pool import Allocation, Shape

    pool = _pool(tmp_path, min_cpus=4, max_allocations=2)
    now = time.time()
    assert scaling.size(pool, None).cpus == 4  # nothing known: the floor
    pool.demand.wanted(32)  # a burst wanted 32 CPUs at once
    assert scaling.size(pool, None).cpus == 32
    small = Allocation(1, "alloc-1", now - 10, Shape(4, 8000, 0, 3600), up_since=now - 8)
    pool.allocations[1] = small
    assert scaling.undersized(pool)
    assert scaling.size(pool, (28, 56000)).cpus == 28
    big = Allocation(2, "alloc-2", now - 5, Shape(28, 56000, 0, 3600), up_since=now - 2)
    pool.allocations[2] = big
    assert not scaling.undersized(pool)
    assert scaling.keeper(pool) is big  # the idle release takes the small one first
    pool.demand.wanted(2, now + 4000)  # an hour later, the old burst is forgotten
    assert pool.demand.recent_peak(now + 4000) == 2


def test_an_allocation_gives_way_only_to_a_batch_job_it_holds_back() -> None:
    """Cores (or memory) go back only to a job that cannot start beside the pool and
    could start without this allocation: not to one that fits already, nor to one too
    big for the node either way."""
    from corral.lanes.fast.model import Allocation, Shape, Waiting
    from corral.lanes.fast.scaling import blocked

    a = Allocation(1, "alloc-1", 0.0, Shape(24, 48000, 0, 3600), up_since=1.0)
    fits = Waiting(10, 4, 1000, 1.0, "Priority")
    by_cpus = Waiting(11, 16, 1000, 2.0, "Resources")
    by_memory = Waiting(12, 2, 40000, 3.0, "Resources")
    too_big = Waiting(13, 64, 1000, 0.5, "Resources")
    assert blocked([too_big, fits, by_cpus], (8, 16000), a) is by_cpus
    assert blocked([fits, by_memory], (8, 16000), a) is by_memory
    assert blocked([too_big, fits], (8, 16000), a) is None


@pytest.mark.usefixtures("slurm_turn")  # alone: its allocation and batch job fill the node
def test_a_batch_job_gets_the_cores_of_an_idle_pool_and_a_task_says_it_waits_for_it(tmp_path) -> None:
    """Issue 40 (2, 4), on the real Slurm: a warm allocation held cores a batch job waited
    for until the pool had been idle ``idle_s`` (120 s); now it is released once idle for
    ``give_back_s``, and a fast task that then waits for an allocation queued behind that
    job says so, naming the job."""
    from .slurm_env import slurm_conf

    conf = slurm_conf()
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.5",
                 CORRAL_FASTLANE_CPUS="24", CORRAL_FASTLANE_MIN_CPUS="24", CORRAL_FASTLANE_MEMORY_MB="2000",
                 CORRAL_FASTLANE_GIVE_BACK_S="2") as gw:
        with gw.http() as h:
            warm = h.post("/v1/jobs", json={"command": "true", "lane": "fast", "partition": "debug"}).json()
            assert wait(gw, gw.admin_token, warm["id"], timeout=120)["state"] == "COMPLETED"
            pool = h.get("/v1/facility").json()["fast_lane"]["pools"][0]
            (alloc,) = pool["allocations"]
            assert alloc["shape"]["cpus"] == 24
            # 16 CPUs: more than the node has beside the warm allocation
            batch = h.post("/v1/jobs", json={"command": "sleep 8", "lane": "batch", "cpus": 16,
                                             "partition": "debug", "walltime": "2m"}).json()
            started = wait(gw, gw.admin_token, batch["id"], until="RUNNING", timeout=50)
            assert started["state"] == "RUNNING", started
            pool = h.get("/v1/facility").json()["fast_lane"]["pools"][0]
            assert pool["allocations"] == [] and pool["gave_cores_to"]["job_id"] == batch["id"]
            pilot = h.get(f"/v1/jobs/{alloc['job_id']}").json()
            assert pilot["state"] in ("CANCELLED", "COMPLETED", "FAILED"), pilot
            # a fast task now waits for an allocation that cannot start beside the batch job
            task = h.post("/v1/jobs", json={"command": "echo after", "lane": "fast", "partition": "debug"}).json()
            reason = ""
            for _ in range(60):
                got = h.get(f"/v1/jobs/{task['id']}").json()
                reason = got["reason"] or ""
                if got["state"] != "PENDING" or f"batch job {batch['id']}" in reason:
                    break
                time.sleep(0.25)
            assert got["state"] == "PENDING" and f"batch job {batch['id']}" in reason, got
            assert "fast-lane allocation job" in reason and "queued" in reason
            # and it runs once the batch job has ended
            assert wait(gw, gw.admin_token, task["id"], timeout=120)["state"] == "COMPLETED"
            assert h.get(f"/v1/jobs/{batch['id']}").json()["state"] == "COMPLETED"


def test_a_persons_task_runs_as_its_identity_and_is_measured_only_once_it_runs(fast: Gateway) -> None:
    """A person without a Unix user, on a root worker: each fast task is forked and
    becomes the person's dynamic identity. The memory police sampled the fork before its
    exec (the worker's own RSS) and killed a `true` as OUT_OF_MEMORY at 10 MB once
    (docs/benchmarks.md, stop 42); its pid is now watched only after the exec."""
    if os.geteuid() != 0:
        pytest.skip("a root worker's case")
    with fast.http() as h:
        assert h.post("/v1/principals", json={"name": "dana", "kind": "human"}).status_code == 201
        token = h.post("/v1/tokens", json={"for": "dana", "expires": "1h"}).json()["token"]
    with fast.http(token) as h:
        who = h.post("/v1/jobs", json={"command": "id -u", "lane": "fast"}).json()
        r = h.post("/v1/jobs/batch", json={"jobs": [{"command": "true", "lane": "fast", "memory": "10M"}] * 60})
        ids = [j["id"] for j in r.json()["jobs"]]
        done = h.post("/v1/jobs/wait", json={"ids": [who["id"], *ids], "timeout": 60}).json()
        assert done["reached"] and {j["state"] for j in done["jobs"]} == {"COMPLETED"}, \
            [j["reason"] for j in done["jobs"] if j["state"] != "COMPLETED"][:3]
        uid = int(h.get(f"/v1/jobs/{who['id']}/output").json()["data"])
    assert uid != 0 and uid != os.getuid()  # the person's own identity, not the worker's root


def test_fast_tasks_reach_the_egress_through_their_workers_relay(tmp_path, agent_dir) -> None:
    """With [sandbox] egress_listen, a fast-lane worker (which on a cluster runs on a node,
    where the gateway's Unix socket connects nowhere) starts a relay to the proxy's TCP
    address, and its contained tasks fetch from the allow-list through it, not through
    the gateway's socket; the relay ends with the worker."""
    from .conftest import add_people, file_server, free_port

    before = set(Path("/tmp").glob("corral-egress.*"))
    with file_server(tmp_path / "mirror", "127.0.0.1", "from-the-mirror") as mport:
        with running(tmp_path, cpus=8, CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MEMORY_MB="2048",
                     CORRAL_SANDBOX__ALLOW_HOSTS=f'["127.0.0.1:{mport}"]',
                     CORRAL_SANDBOX__EGRESS_LISTEN=f"127.0.0.1:{free_port()}") as gw:
            bot = add_people(gw)["bot1"]
            with gw.http(bot) as h:
                job = h.post("/v1/jobs", json={"command": f"stat -L -c %i /tmp/corral-egress.sock; curl -s -m 20 "
                                                          f"http://127.0.0.1:{mport}/ok.txt", "lane": "fast",
                                               "workdir": str(agent_dir)}).json()
                assert job["backend"] == "fast", job
                done = wait(gw, bot, job["id"])
                assert done["state"] == "COMPLETED", done
                inode, got = h.get(f"/v1/jobs/{job['id']}/output").json()["data"].split("\n")[:2]
            assert got == "from-the-mirror"
            assert int(inode) != os.stat(gw.home / "egress" / "proxy.sock").st_ino  # the worker's relay
            # Its directory, by the socket the task reached (a Slurm job of another test may
            # have a relay directory of its own in /tmp meanwhile: seen in a CI run).
            relay = [d for d in set(Path("/tmp").glob("corral-egress.*")) - before
                     if (d / "proxy.sock").exists() and (d / "proxy.sock").stat().st_ino == int(inode)]
            assert relay, "the worker's relay is there while the worker is"
    deadline = time.monotonic() + 30
    while relay[0].exists():  # gone with the worker
        assert time.monotonic() < deadline, relay
        time.sleep(0.2)


def test_one_task_holding_its_workers_relay_leaves_another_principal_a_way_out(tmp_path, agent_dir) -> None:
    """A worker runs many principals' tasks, all reaching the proxy through its one relay.
    The relay was socat with 64 children in all: one task holding 80 connections (each a
    request begun, never finished) left every other principal's task on that worker with
    no way out (its fetch timed out). Each identity now holds at most its share
    (corral/sandbox/relay.py, by the kernel's word for who connected)."""
    from .conftest import add_people, file_server, free_port

    hog = textwrap.dedent("""\
        import os, socket, time
        host, port = os.environ["http_proxy"].rsplit("/", 1)[-1].rsplit(":", 1)  # the sandbox's way out
        held = []
        for _ in range(80):  # each a request begun, never finished
            try:
                s = socket.create_connection((host, int(port)), 2)
                s.sendall(b"GET http://x/ HTTP/1.1\\r\\n")
            except OSError:
                continue
            held.append(s)
        open("holding", "w").write(str(len(held)))
        for _ in range(15):
            time.sleep(1)
            for s in held:
                try:
                    s.sendall(b"X-a: b\\r\\n")
                except OSError:
                    pass
        """)
    (agent_dir / "hog.py").write_text(hog)
    with file_server(tmp_path / "mirror", "127.0.0.1", "from-the-mirror") as mport:
        with running(tmp_path, cpus=8, CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MEMORY_MB="2048",
                     CORRAL_SANDBOX__ALLOW_HOSTS=f'["127.0.0.1:{mport}"]',
                     CORRAL_SANDBOX__EGRESS_LISTEN=f"127.0.0.1:{free_port()}") as gw:
            t = add_people(gw)
            with gw.http(t["bot1"]) as h1, gw.http(t["bot2"]) as h2:
                held = h1.post("/v1/jobs", json={"command": f"python3 {agent_dir / 'hog.py'}", "lane": "fast",
                                                 "workdir": str(agent_dir), "walltime": "2m"}).json()
                deadline = time.monotonic() + 60
                while not (agent_dir / "holding").exists():
                    assert time.monotonic() < deadline, (h1.get(f"/v1/jobs/{held['id']}").json(),
                                                         h1.get(f"/v1/jobs/{held['id']}/output",
                                                                params={"stream": "stderr"}).text)
                    time.sleep(0.2)
                job = h2.post("/v1/jobs", json={"command": f"curl -s -m 8 http://127.0.0.1:{mport}/ok.txt",
                                                "lane": "fast", "workdir": str(agent_dir)}).json()
                done = wait(gw, t["bot2"], job["id"])
                out = h2.get(f"/v1/jobs/{job['id']}/output").json()["data"]
                assert done["state"] == "COMPLETED" and out == "from-the-mirror", (done, out)
                assert wait(gw, t["bot1"], held["id"])["state"] == "COMPLETED"


def test_a_workers_relay_carries_as_its_user_and_ends_with_the_worker(tmp_path) -> None:
    """The relay binds as root and becomes its user before it carries a byte; that change
    of identity cleared the parent-death signal it had set (prctl(2)), so a worker killed
    -9 would have left its relay running. It sets it again as the user."""
    from corral.sandbox.relay import READY

    from .conftest import ended

    if os.geteuid() != 0:
        pytest.skip("the relay changes identity only when root starts it")
    sock = tmp_path / "relay.sock"
    worker = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-m', 'corral.sandbox.relay', sys.argv[1], '127.0.0.1:9', "
         "'--uid', '65534', '--gid', '65534'])\nprint(p.pid, flush=True)\ntime.sleep(120)", str(sock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        relay = int(worker.stdout.readline())
        assert worker.stdout.readline() == READY  # said once it is its user (it shares the worker's stdout)
        assert _uid_of(relay) == 65534
        assert oct(sock.stat().st_mode & 0o777) == "0o666"  # every task's to connect to
    finally:
        worker.kill()
        worker.wait()
    assert ended(relay), "the relay outlived its worker"


def _uid_of(pid: int) -> int:
    """A process's real uid, from /proc."""
    return int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])


def test_a_workers_relay_leaves_nothing_its_user_can_swap() -> None:
    """The relay runs as run_as (never root), but the directory of its socket is root's
    again before any bwrap, as root, binds the socket: a link swapped in by anything
    running as that user would be followed; the socket itself stays one all may use."""
    import stat
    import socket

    from corral.sandbox.egress import Relay

    if os.geteuid() != 0:
        pytest.skip("the relay changes users only under root")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    relay = Relay(f"127.0.0.1:{listener.getsockname()[1]}", "nobody")
    try:
        st = os.stat(relay.dir)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        sock = os.lstat(relay.socket)
        assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o666
        assert _uid_of(relay.pid) != 0  # its user already when Relay returns (it waits for READY)
    finally:
        relay.close()
        listener.close()
    assert not relay.dir.exists()


def test_a_workers_relay_directory_is_never_its_users_to_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the relay started, its directory was run_as's own, in /tmp, where an entry's
    owner may move it: anything running as that user (the relay itself, whose bytes are
    the tasks') could put a link to any directory in its place, and root then chmod'ed
    that directory 0700 and bound the socket named proxy.sock there into every task's
    sandbox. The directory is root's throughout now: run_as writes its socket there by
    group (attack46). Here the relay's program is run_as's move, then the real socat."""
    import contextlib
    import shutil
    import socket
    import stat

    from corral.core.errors import BackendError
    from corral.sandbox.egress import Relay

    if os.geteuid() != 0:
        pytest.skip("the relay changes users only under root")
    top = Path(tempfile.mkdtemp(prefix="corral-relay-move-", dir="/var/tmp"))
    top.chmod(0o755)
    canary = top / "service"  # a directory of root's with a socket of the same name in it
    canary.mkdir(mode=0o755)
    theirs = socket.socket(socket.AF_UNIX)
    theirs.bind(str(canary / "proxy.sock"))
    (top / "socat").write_text(
        f'#!/bin/bash\na=${{1#UNIX-LISTEN:}}; d=${{a%%,*}}; d=${{d%/proxy.sock}}\n'
        f'if mv "$d" "$d.moved" 2>/dev/null; then ln -s {canary} "$d"; exec sleep 30; fi\n'
        f'exec {shutil.which("socat")} "$@"\n')
    (top / "socat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{top}:{os.environ['PATH']}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    relay = None
    try:
        with contextlib.suppress(BackendError):
            relay = Relay(f"127.0.0.1:{listener.getsockname()[1]}", "nobody")
        assert stat.S_IMODE(os.stat(canary).st_mode) == 0o755  # root changed nothing through a link
        assert relay is not None and not relay.dir.is_symlink() and stat.S_ISSOCK(os.lstat(relay.socket).st_mode)
        assert os.stat(relay.socket).st_ino != os.stat(canary / "proxy.sock").st_ino
    finally:
        if relay is not None:
            for moved in (Path(f"{relay.dir}.moved"), relay.dir):
                if moved.is_symlink():
                    moved.unlink()
                shutil.rmtree(moved, ignore_errors=True)
            relay.close()
        theirs.close()
        listener.close()
        shutil.rmtree(top, ignore_errors=True)


class _Slurm:
    """The allocations port as a pool at its cap uses it: what it started and stopped."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.stopped: list[int] = []

    async def start(self, pool: Any, shape: Any) -> int:
        self.started.append(shape)
        return 100 + len(self.started)

    async def stop(self, job_id: int) -> None:
        self.stopped.append(job_id)

    def waiting(self, partition: str | None) -> list[Any]:
        return []

    async def free(self, partition: str | None) -> tuple[int, int] | None:
        return (32, 64000)

    def state(self, job_id: int) -> Any:
        from corral.core.jobs import JobState

        return JobState.RUNNING, None


def test_a_busy_pool_at_its_cap_replaces_a_small_allocation_and_drains_it_once_the_new_one_is_up(tmp_path: Path) -> None:
    """Issue 50 item 4: the pool acts on scaling.replaceable. The small allocation takes
    tasks until its replacement's worker joins (the pool is one over its cap meanwhile),
    then none, whatever the give-back rule says when no batch job waits, and is released
    once its tasks end."""
    from corral.lanes.fast.pool import Allocation, Shape

    pool = _pool(tmp_path, min_cpus=4, max_allocations=2)
    pool.allocations_port = port = _Slurm()
    now = time.time()
    small = Allocation(1, "alloc-1", now - 100, Shape(4, 8000, 0, 3600), up_since=now - 92)
    pool.allocations = {1: small, 2: Allocation(2, "alloc-2", now - 90, Shape(8, 16000, 0, 3600), up_since=now - 83)}
    up = {"alloc-1": "tcp://a", "alloc-2": "tcp://b"}
    pool.workers_up = lambda: dict(up)
    pool._by_name = {"tcp://a": small, "tcp://b": pool.allocations[2]}
    for i in range(20):
        pool.queue.put(_task(i, "sleep 2"))
    pool.load = {"tcp://a": 8.0, "tcp://b": 16.0}
    asyncio.run(pool.maintain())
    assert [s.cpus for s in port.started] == [32] and pool.allocations[101].replaces == 1
    assert not small.draining and len(pool.allocations) == 3  # it still takes tasks while the new one starts
    asyncio.run(pool.maintain())
    assert len(port.started) == 1  # one replacement at a time
    up["alloc-101"] = "tcp://c"
    asyncio.run(pool.maintain())  # the replacement joined: the small one takes no new tasks
    assert small.draining and small.retired and 1 in pool.allocations and port.stopped == []
    asyncio.run(pool.maintain())  # no batch job waits: give-back's reset does not revive it
    assert small.draining and port.stopped == []
    pool.load.pop("tcp://a")
    asyncio.run(pool.maintain())  # its tasks ended: released; the cap holds again
    assert port.stopped == [1] and sorted(pool.allocations) == [2, 101]
