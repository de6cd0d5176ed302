"""The runtime (corral/gateway/runtime.py) and the pipeline's two rules (issue 36 items 2
and 4): every job enters through the Intake with its allow record, and every change of
a job's state goes through Progress, whose writes the event stream's triggers see.

Real parts throughout: the gateway as ``build_service`` assembles it, on the local
backend, its database, its audit log and its fast lane."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient

import corral
from corral.control.intake import SERVICE_RULE
from corral.core.config import Settings
from corral.core.jobs import JobSpec, JobState
from corral.core.principals import PILOT_PRINCIPAL
from corral.gateway.runtime import build_service
from corral.edges.http.app import create_app
from corral.lanes.fast.launcher import JOURNALS
from corral.lanes.fast.model import PoolKey, Shape
from corral.lanes.fast.pilots import Pilots

ROOT = Path(corral.__file__).parent


def _service(tmp_path: Path, **settings: Any) -> Any:
    svc = build_service(Settings(home=tmp_path / "home", local_cpus=2, **settings))
    svc.accounts.bootstrap_admin()
    return svc, svc.authenticate((tmp_path / "home" / "admin.token").read_text().strip(), "s1")


def _states(svc: Any) -> dict[int, list[str]]:
    """Each job's state changes as the event stream has them (its triggers' rows)."""
    out: dict[int, list[str]] = {}
    for _, job_id, _, state, _, _ in svc.db.events(0, None, 1000):
        out.setdefault(job_id, []).append(state)
    return out


def _allowed(svc: Any) -> dict[int, tuple[str, str]]:
    """job id -> (principal, rule) of its submit allow record in the audit log."""
    return {r["job_id"]: (r["principal"], r["rule"]) for r in svc.audit.log.records()
            if r.get("action") == "submit" and r.get("decision") == "allow" and "job_id" in r}


# -- the runtime ------------------------------------------------------------------------------

def test_every_loop_is_declared_once_with_where_it_runs(tmp_path) -> None:
    svc, _ = _service(tmp_path)
    loops = svc.runtime.loops()
    names = [loop.name for loop in loops]
    assert len(names) == len(set(names))
    assert {"reconciler", "facts", "note-index", "storage-gc", "housekeeping", "notify", "approvals", "loop-lag",
            "lane-local", "lane-fast"} == set(names)
    scope = {loop.name: loop.scope for loop in loops}
    # Once per facility: what acts on the jobs, the scheduler and the pools' allocations.
    assert scope["reconciler"] == scope["lane-fast"] == "facility"
    assert [n for n, s in scope.items() if s == "replica"] == ["loop-lag"]


def test_a_replica_runs_only_its_own_loops_and_the_leader_all(tmp_path) -> None:
    svc, _ = _service(tmp_path)

    async def scenario() -> tuple[set[str], set[str], dict[str, Any]]:
        svc.runtime.start(leader=False)
        replica = set(svc.runtime.tasks)
        await svc.runtime.stop()
        svc.runtime.tasks.clear()
        async with svc.runtime.running() as rt:
            await asyncio.sleep(0.3)
            return replica, set(rt.tasks), svc.health()

    replica, leader, health = asyncio.run(scenario())
    assert replica == {"loop-lag"}
    assert leader == {loop.name for loop in svc.runtime.loops()}
    assert health["stalled"] == [] and health["loops"]["reconciler"] == "running", health
    assert health["loops"]["lane-local"] == "done"  # the batch lane has no loop: the reconciler polls it


def test_shutdown_goes_in_its_documented_order(tmp_path) -> None:
    """Loops first (no tick sends or polls any more), then the gate, then the lanes (the
    fast lane's allocations released), the egress proxy last."""
    svc, _ = _service(tmp_path)
    order: list[str] = []
    close_gate = svc.gate.close
    # When the gate closes, every loop has ended: none can act on a closed gate.
    svc.gate.close = lambda: (order.append("gate after loops " + ",".join(sorted(
        {_state(t) for t in svc.runtime.tasks.values()}))), close_gate())[1]
    for lane in svc.lanes:
        async def close(lane: Any = lane, real: Any = lane.close) -> None:
            order.append(f"lane-{lane.name}")
            await real()
        lane.close = close

    egress = SimpleNamespace(close=lambda: order.append("egress"))
    svc.egress = egress

    async def scenario() -> None:
        async with svc.runtime.running():
            await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert order[0] == "gate after loops cancelled,done", order  # the batch lane's loop had returned at once
    assert set(order[1:3]) == {"lane-local", "lane-fast"} and order[3:] == ["egress"], order


def _state(task: "asyncio.Task[Any]") -> str:
    return "running" if not task.done() else "cancelled" if task.cancelled() else "done"


def test_the_http_lifespan_is_the_runtime(tmp_path) -> None:
    svc, _ = _service(tmp_path)
    with TestClient(create_app(svc)) as client:
        body = client.get("/healthz").json()
        assert set(body["loops"]) == {loop.name for loop in svc.runtime.loops()}, body
    assert all(t.done() for t in svc.runtime.tasks.values())


# -- one way in, one writer -------------------------------------------------------------------

def _modules_matching(pattern: str, allowed: set[str]) -> list[str]:
    rx = re.compile(pattern, re.S)
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                  if rx.search(p.read_text()) and str(p.relative_to(ROOT)) not in allowed
                  and not str(p.relative_to(ROOT)).startswith(("core/db", "core/store/")))


def test_only_progress_writes_a_jobs_state() -> None:
    """Neither a call of the store's state writers nor SQL that sets a job's state,
    outside control/progress.py (and the store itself, core/store/)."""
    calls = _modules_matching(r"\.(update_job|update_jobs|mark_running)\(", {"control/progress.py"})
    sql = _modules_matching(r"UPDATE\s+jobs\s+SET[^\"']*?\bstate\s*=", set())
    assert calls == [] and sql == [], f"these write a job's state themselves: {calls + sql}; call Progress"


def test_only_the_intake_records_a_job() -> None:
    """Every job is recorded by the pipeline (control/intake.py), with its allow record,
    corral's own included: no other module inserts a job."""
    found = _modules_matching(r"\.insert_jobs?\(|INSERT\s+(OR\s+\w+\s+)?INTO\s+jobs\b", {"control/intake.py"})
    assert found == [], f"these insert jobs outside the pipeline: {found}; call Intake.record"


def test_a_pilot_allocation_is_recorded_audited_and_stopped_through_the_pipeline(tmp_path) -> None:
    """Pilots.start records the allocation as the fastlane service principal, with an allow
    record, and sends it; Pilots.stop of a sent one cancels it in the scheduler (the next
    poll records it), of an unsent one ends it through Progress. The events say so."""
    svc, admin = _service(tmp_path)
    pilots = Pilots(svc.settings.fastlane, svc.db, svc.lanes.batch, svc.intake, svc.progress)
    pool = SimpleNamespace(key=PoolKey(None, None, None), address="tcp://127.0.0.1:9", dir=tmp_path / "pool")
    (tmp_path / "pool").mkdir()

    async def scenario() -> tuple[int, int, int]:
        # Both CPUs taken: the allocation waits in the queue, sent (a backend id) but not started.
        (busy,), _ = await svc.submit(admin, [JobSpec(command="sleep 60", cpus=2)])
        sent = await pilots.start(pool, Shape(2, 256, 0, 600))
        me = svc.intake.service(PILOT_PRINCIPAL, "pool:held")
        unsent = svc.intake.record(me, [(svc.lanes.batch.name, JobSpec(command="true"))], SERVICE_RULE,
                                   hold=True)[0].id
        job = svc.db.get_job(sent)
        assert job.principal == PILOT_PRINCIPAL and job.session == "pool:_-_-_" and job.backend_id
        await pilots.stop(sent)
        await pilots.stop(unsent)
        await svc.reconciler.tick()
        await svc.cancel(admin, [busy.id])
        # Seen RUNNING by that tick (a loaded machine starts it in time), its cancel is
        # recorded by a later poll, as the sent pilot's is.
        for _ in range(100):
            if svc.db.get_job(busy.id).state.terminal:
                break
            await svc.reconciler.tick()
            await asyncio.sleep(0.05)
        return busy.id, sent, unsent

    busy, sent, unsent = asyncio.run(scenario())
    states = _states(svc)
    assert states[sent] == ["PENDING", "CANCELLED"] and states[unsent] == ["PENDING", "CANCELLED"], states
    assert states[busy][-1] == "CANCELLED"
    assert svc.db.get_job(unsent).reason == "released by the fast lane"
    allowed = _allowed(svc)
    assert allowed[sent] == allowed[unsent] == (PILOT_PRINCIPAL, SERVICE_RULE), allowed
    assert allowed[busy] == ("admin", allowed[busy][1])


def test_cancel_ends_sent_and_unsent_jobs_with_one_event_each(tmp_path) -> None:
    svc, admin = _service(tmp_path)

    async def scenario() -> list[Any]:
        running, _ = await svc.submit(admin, [JobSpec(command="sleep 60")])
        held, _ = await svc.submit(admin, [JobSpec(command="true")], hold=True)
        for _ in range(100):
            if svc.db.get_job(running[0].id).state is JobState.RUNNING:
                break
            await svc.reconciler.tick()
            await asyncio.sleep(0.05)
        await svc.cancel(admin, [running[0].id, held[0].id])
        for _ in range(100):  # a running job's end is the lane's news, at the next poll
            if svc.db.get_job(running[0].id).terminal:
                break
            await svc.reconciler.tick()
            await asyncio.sleep(0.05)
        return [svc.db.get_job(running[0].id), svc.db.get_job(held[0].id)]

    running, held = asyncio.run(scenario())
    states = _states(svc)
    assert states[running.id] == ["PENDING", "RUNNING", "CANCELLED"], states
    assert states[held.id] == ["PENDING", "CANCELLED"], states
    assert running.state is held.state is JobState.CANCELLED
    assert _allowed(svc)[held.id][0] == "admin"


def test_recovery_after_a_restart_ends_tasks_through_progress(tmp_path) -> None:
    """FastLane.recover: a task its journal says ended takes that outcome, one that was
    running fails (not idempotent), one never started goes back to be sent, and an
    allocation of the last run is released: each change an event, none written aside."""
    svc, admin = _service(tmp_path)
    fast = svc.lanes.by_name["fast"]
    slug = PoolKey(None, None, None).slug
    jobs = svc.intake.record(admin, [("fast", JobSpec(command=c)) for c in ("a", "b", "c")], "policy")
    svc.db.set_backend_ids([(j.id, f"fast:{slug}:{j.id}") for j in jobs])
    me = svc.intake.service(PILOT_PRINCIPAL, f"pool:{slug}")
    pilot = svc.intake.record(me, [(svc.lanes.batch.name, JobSpec(command="true"))], SERVICE_RULE, hold=True)[0]
    journals = fast.dir / slug / JOURNALS
    journals.mkdir(parents=True)
    now = time.time()
    (journals / "w1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"job_id": jobs[0].id, "event": "ended", "state": "COMPLETED", "exit_code": 0, "start": now - 2, "end": now},
        {"job_id": jobs[1].id, "event": "started", "start": now - 1})))
    asyncio.run(fast.recover())
    states = _states(svc)
    assert states[jobs[0].id] == ["PENDING", "COMPLETED"], states
    assert states[jobs[1].id] == ["PENDING", "FAILED"], states
    assert states[jobs[2].id] == ["PENDING"] and svc.db.get_job(jobs[2].id).backend_id is None
    assert states[pilot.id] == ["PENDING", "CANCELLED"], states
