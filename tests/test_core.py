"""The core built in-process, without HTTP: the one submit path, the lane registry, the
audit's one writer, and the parts each built alone (accounts, memory, Sender, Progress)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from corral.lanes.backend import SubmitContext
from corral.lanes.slurm.backend import SlurmBackend
from corral.core.config import Settings
from corral.control.progress import Progress
from corral.control.watchers import Watchers
from corral.control.metrics import Metrics
from corral.control.sender import Sender
from corral.core.db import Database
from corral.core.errors import Conflict, InvalidRequest
from corral.core.jobs import JobSpec, JobState
from corral.lanes.registry import BackendLane, Lanes
from corral.core.principals import Kind, Principal
from corral.safety.audit import AuditLog
from corral.edges.http.serve import build_service


def _service(tmp_path: Path, **settings: Any) -> Any:
    svc = build_service(Settings(home=tmp_path / "home", local_cpus=2, **settings))
    svc.accounts.bootstrap_admin()
    return svc, svc.authenticate((tmp_path / "home" / "admin.token").read_text().strip(), "s1")


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    home = tmp_path / "home"
    return list(AuditLog(home / "audit.jsonl", home / "audit.key").records())


def test_a_batch_and_a_single_submission_take_one_path(tmp_path) -> None:
    svc, admin = _service(tmp_path, fastlane=False)

    async def scenario() -> None:
        specs = [JobSpec(command="true", workdir=str(tmp_path)) for _ in range(3)]
        jobs, created = await svc.submit(admin, specs, "sweep-1")
        assert created and len({j.id for j in jobs}) == 3 and all(j.backend_id for j in jobs)
        again, created = await svc.submit(admin, specs, "sweep-1")  # idempotency keys work for batches
        assert not created and [j.id for j in again] == [j.id for j in jobs]
        with pytest.raises(Conflict, match="different request"):  # not a silent replay of the first
            await svc.submit(admin, [JobSpec(command="false")], "sweep-1")
        with pytest.raises(InvalidRequest, match="job 1: workdir"):  # a batch names the job at fault
            await svc.submit(admin, [JobSpec(command="true"), JobSpec(command="true", workdir="/no/such")])
        with pytest.raises(InvalidRequest, match="lane 'fast' is not offered"):
            await svc.submit(admin, [JobSpec(command="true", lane="fast")])

    asyncio.run(scenario())
    decisions = [(r["action"], r["decision"], r["rule"]) for r in _audit(tmp_path) if r["action"] == "submit"]
    # Each refusal once (no second record by another layer), each replay once per job.
    assert decisions.count(("submit", "deny", "conflict")) == 1
    assert decisions.count(("submit", "deny", "invalid_request")) == 2
    assert decisions.count(("submit", "allow", "idempotent-replay")) == 3


def test_a_policy_refusal_is_recorded_once_with_its_rule(tmp_path) -> None:
    svc, admin = _service(tmp_path, fastlane=False)
    svc.accounts.add_principal(admin, "alice", "human")
    svc.accounts.add_principal(admin, "bot", "agent", sponsor="alice")
    bot = svc.authenticate(svc.accounts.mint_token(admin, "bot", "1h")["token"], "s2")

    async def scenario() -> None:
        with pytest.raises(Exception, match="rule"):
            await svc.submit(bot, [JobSpec(command="rm -rf ~")])

    asyncio.run(scenario())
    denials = [r for r in _audit(tmp_path) if r["decision"] == "deny"]
    assert len(denials) == 1 and denials[0]["principal"] == "bot" and denials[0]["risk_tags"]
    assert denials[0]["rule"] not in ("forbidden", "policy")  # the rule's own id, from the policy


class _Recording:
    name = "rec"
    reports_itself = False

    def __init__(self) -> None:
        self.sent: list[int] = []

    def claim(self, principal: Principal, spec: JobSpec) -> JobSpec | None:
        return spec

    async def submit(self, jobs: Any) -> list[Any]:
        from corral.lanes.registry import Sent

        self.sent += [ctx.job_id for ctx, _ in jobs]
        return [Sent(f"r{ctx.job_id}") for ctx, _ in jobs]

    def dispatch(self) -> None:
        pass


def test_the_sender_sends_what_was_recorded_once(tmp_path) -> None:
    """Built alone: a database, a registry with one lane, a Sender."""
    db = Database(tmp_path / "c.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    lane = _Recording()
    lanes = Lanes(BackendLane(_NoBackend()))  # type: ignore[arg-type]
    lanes.add(lane)  # type: ignore[arg-type]
    sender = Sender(db, lanes, Progress(db, Watchers(Metrics())))
    with db.transaction():
        jobs = db.insert_jobs("a", None, [("rec", JobSpec(command="x")), ("rec", JobSpec(command="y"))])
    asyncio.run(sender.send_unsent())
    asyncio.run(sender.send_unsent())  # sent, so not again
    assert lane.sent == [j.id for j in jobs]
    assert [db.get_job(j.id).backend_id for j in jobs] == [f"r{j.id}" for j in jobs]  # type: ignore[union-attr]


class _NoBackend:
    name = "none"
    dependencies = False


def test_progress_wakes_waiters_and_keeps_outcomes(tmp_path) -> None:
    db = Database(tmp_path / "c.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    job = db.insert_job("a", None, "x", JobSpec(command="x"))
    progress = Progress(db, Watchers(Metrics()))

    async def scenario() -> bool:
        waiter = asyncio.create_task(progress.watchers.wait(job.id, 5))
        await asyncio.sleep(0)
        progress.started({job.id: 1.0})
        return await waiter

    assert asyncio.run(scenario())
    progress.ended([{"job_id": job.id, "state": "COMPLETED", "exit_code": 0, "start": 1.0, "end": 2.0}])
    assert db.get_job(job.id).state is JobState.COMPLETED  # type: ignore[union-attr]


def test_slurm_backend_forgets_what_the_core_recorded(tmp_path) -> None:
    """What it held of a job grew with every job the gateway ever saw; the output is still found."""
    answers = {"sbatch": "77\n", "squeue": "", "sacct": "77|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:00:01|None\n"}
    b = SlurmBackend(tmp_path / "jobs", None, poll_s=3600, clock=lambda: 5.0, run=lambda *argv: answers[argv[0]],
                     partitions=[])  # no preflight against a cluster
    b.preflight = lambda spec: None  # type: ignore[method-assign]
    bid = b.submit(SubmitContext(3, "a", "human"), JobSpec(command="true", name="t"))
    assert b.status([bid])[bid].state is JobState.COMPLETED  # polled at once, though the clock says 5 s
    assert bid in b.remembered()
    b.forget([bid])
    assert bid not in b.remembered()
    assert b.output_paths(bid).stdout == tmp_path / "jobs" / "3" / "out" / "stdout"


def test_background_tasks_are_kept_until_they_end(tmp_path) -> None:
    from corral.lanes.fast.pool import Pool, PoolConfig, PoolKey, Shape

    pool = Pool(PoolKey(None, None, None), Shape(1, 64, 0, 60), tmp_path, PoolConfig(), None, None)  # type: ignore[arg-type]

    async def scenario() -> tuple[int, int]:
        gate = asyncio.Event()

        async def work() -> None:
            await gate.wait()

        pool.keep(asyncio.ensure_future(work()))
        held = len(pool.background)  # a strong reference: asyncio keeps only weak ones
        gate.set()
        await asyncio.sleep(0.01)
        return held, len(pool.background)

    assert asyncio.run(scenario()) == (1, 0)


def test_bad_durations_are_the_callers_mistake_in_its_own_words(tmp_path) -> None:
    """A note's expires 'none' and a walltime of 1e400 answered 500; --expires said 'walltime'."""
    svc, admin = _service(tmp_path, fastlane=False)
    with pytest.raises(InvalidRequest, match="expiry 'none' is not a duration"):
        svc.memory.remember(admin, "a note", "user", "none")
    with pytest.raises(InvalidRequest, match=r"^expiry 'soon' is not a duration.*'never'"):
        svc.accounts.mint_token(admin, "admin", "soon")
    for bad in (1e400, "1e400", 10**400):
        with pytest.raises(ValueError, match="walltime"):
            JobSpec(command="true", walltime=bad)


def test_allocations_are_sized_to_their_demand_not_the_whole_node(tmp_path) -> None:
    """A pool's allocation asked for the whole node (32 CPUs, all its memory) for one task."""
    import time

    from corral.lanes.fast import scaling
    from corral.lanes.fast.pool import Allocation, Pool, PoolConfig, PoolKey, Shape, Task

    pool = Pool(PoolKey(None, None, None), Shape(32, 64000, 4, 3600), tmp_path, PoolConfig(min_cpus=4),
                None, None)  # type: ignore[arg-type]

    def task(i: int, cpus: int = 1, memory_mb: int = 1024, gpus: int = 0) -> Task:
        return Task(i, {"cpus": cpus, "memory_mb": memory_mb, "gpus": gpus})

    pool.queue.extend(task(i) for i in range(3))
    assert scaling.size(pool) == Shape(4, 8000, 0, 3600)  # the floor, memory in proportion
    pool.queue.extend(task(i) for i in range(3, 23))
    assert scaling.size(pool).cpus == 23  # the burst's demand
    pool.allocations[1] = Allocation(1, "alloc-1", time.time(), Shape(23, 46000, 0, 3600), up_since=time.time())
    pool.queue.clear()
    pool.queue.put(task(99, cpus=2, memory_mb=50000, gpus=1))
    assert scaling.backlogged(pool, time.time())  # no allocation can ever run it: another that can
    assert scaling.size(pool) == Shape(4, 50000, 1, 3600)
    # a burst 19 CPUs short where one node has 12 CPUs free: an allocation that starts now,
    # not one that would queue behind the pool's own
    pool.queue.extend(task(i) for i in range(100, 140))
    assert scaling.size(pool, (12, 64000)) == Shape(12, 50000, 1, 3600)
    assert scaling.size(pool, (2, 64000)).cpus == 19  # too little free to bother: ask, and queue


def test_a_note_expires_on_the_clock(tmp_path) -> None:
    from corral.core.clock import ManualClock

    clock = ManualClock()
    svc = build_service(Settings(home=tmp_path / "home", local_cpus=2, fastlane=False), clock)
    svc.accounts.bootstrap_admin()
    admin = svc.authenticate((tmp_path / "home" / "admin.token").read_text().strip(), "s1")
    svc.memory.remember(admin, "old torch note", "user", "30s")
    assert [n["text"] for n in asyncio.run(svc.memory.recall(admin, "torch"))] == ["old torch note"]
    clock.advance(31)
    assert asyncio.run(svc.memory.recall(admin, "torch")) == []


def test_the_event_loop_lag_is_measured() -> None:
    """What one request's work on the loop costs every other agent, in /metrics."""
    import asyncio
    import time

    from corral.control.metrics import Metrics

    m = Metrics()

    async def run() -> None:
        watch = asyncio.create_task(m.watch_loop(every_s=0.01))
        await asyncio.sleep(0.02)
        time.sleep(0.06)  # the loop blocked, as by a long parse
        await asyncio.sleep(0.03)
        watch.cancel()

    asyncio.run(run())
    text = m.render().decode()
    late = [ln for ln in text.splitlines() if ln.startswith('corral_event_loop_lag_seconds_bucket{le="0.05"}')]
    count = [ln for ln in text.splitlines() if ln.startswith("corral_event_loop_lag_seconds_count")]
    assert float(late[0].split()[-1]) < float(count[0].split()[-1])  # one sample was over 50 ms


def test_one_writer_of_job_state() -> None:
    """Every change of a job's state goes through control/progress.py (the event
    stream's triggers, the long-polls and memory all hear of it there): no other module
    of corral calls the database's state writers."""
    import re
    from pathlib import Path

    import corral

    root = Path(corral.__file__).parent
    writers = re.compile(r"\.(update_job|update_jobs|mark_running)\(")
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if writers.search(p.read_text()) and p.name not in ("progress.py", "db.py"))
    assert found == [], f"these modules write a job's state themselves: {found}; call Progress instead"


def test_usage_asks_slurms_accounting_again_until_both_figures_are_in(tmp_path) -> None:
    """sacct fills in a job's figures over a few seconds: its MaxRSS came first once, its
    CPU time reading 0 until then. The partial answer is not kept as the job's usage; the
    complete one is, and is then served without asking again (seen in a CI run: a usage
    read as 0 CPU seconds, then as 'recorded' with no word of sacct)."""
    from corral.gateway.job_control import JobControl

    sacct = ["77|00:00:00|\n77.batch|00:00:00|216300K\n",
             "77|00:02.685|\n77.batch|00:02.685|221491K\n"]
    calls: list[str] = []

    def run(*argv: str) -> str:
        calls.append(argv[0])
        if argv[0] == "sbatch":
            return "77\n"
        if argv[0] == "sacct" and "JobID,TotalCPU,MaxRSS" in argv:  # the usage, filled in by its second reading
            return sacct[min(calls.count("sacct"), 2) - 1]
        return ""

    db = Database(tmp_path / "c.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    b = SlurmBackend(tmp_path / "jobs", None, poll_s=3600, clock=lambda: 5.0, run=run, partitions=[])
    b.preflight = lambda spec: None  # type: ignore[method-assign]
    lanes = Lanes(BackendLane(b))
    with db.transaction():
        job = db.insert_jobs("a", None, [("slurm", JobSpec(command="true"))])[0]
    asyncio.run(Sender(db, lanes, Progress(db, Watchers(Metrics()))).send_unsent())
    progress = Progress(db, Watchers(Metrics()))
    progress.ended([{"job_id": job.id, "state": "COMPLETED", "exit_code": 0, "start": 1.0, "end": 4.0}])
    ctl = JobControl(db, lanes, None, None, None)  # type: ignore[arg-type]  # usage needs no gate, audit or reconciler
    ended = db.get_job(job.id)
    assert ended is not None and ended.backend_id == "77"
    calls.clear()
    first = asyncio.run(ctl.usage(None, ended))  # type: ignore[arg-type]
    assert first["cpu_s"] == 0 and first["max_rss_mb"] == 211.2 and "sacct" in first["how"]
    second = asyncio.run(ctl.usage(None, ended))  # type: ignore[arg-type]
    assert second["cpu_s"] == 2.685 and second["max_rss_mb"] == 216.3 and "sacct" in second["how"]
    assert calls == ["sacct", "sacct"]
    third = asyncio.run(ctl.usage(None, ended))  # type: ignore[arg-type]
    assert (third["cpu_s"], third["max_rss_mb"]) == (2.685, 216.3) and calls == ["sacct", "sacct"]
    assert third["how"] == "recorded with its outcome"
