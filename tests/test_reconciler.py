"""The control plane in-process, against a scripted backend: one status call per
tick for all jobs, long-polls woken by events, back-off and recovery when the
backend fails."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Sequence

from corral.lanes.backend import BackendStatus, OutputPaths, Partition, SubmitContext
from corral.core.config import Settings
from corral.core.db import Database
from corral.core.errors import BackendError
from corral.core.jobs import JobSpec, JobState
from corral.gateway.service import Service
from corral.gateway.runtime import assemble


class ScriptedBackend:
    """Jobs finish when the test says so; status can be made to fail."""

    name = "scripted"
    dependencies = False

    def __init__(self) -> None:
        self.states: dict[str, JobState] = {}
        self.status_calls: list[int] = []
        self.failing = False
        self.submits = 0
        self.forgotten: set[str] = set()

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        self.submits += 1
        if self.failing:
            raise BackendError("scheduler down")
        self.states.setdefault(str(ctx.job_id), JobState.RUNNING)
        return str(ctx.job_id)

    def status(self, ids: Sequence[str]) -> dict[str, BackendStatus]:
        self.status_calls.append(len(ids))
        if self.failing:
            raise BackendError("slurmctld not responding")
        return {i: BackendStatus(i, self.states[i], 0 if self.states[i] is JobState.COMPLETED else None)
                for i in ids if i in self.states}

    def cancel(self, ids: Sequence[str]) -> None:
        for i in ids:
            self.states[i] = JobState.CANCELLED

    def output_paths(self, bid: str) -> OutputPaths:
        return OutputPaths(Path("/dev/null"), Path("/dev/null"))

    def preflight(self, spec: JobSpec) -> None:
        pass

    def partitions(self) -> list[Partition]:
        return [Partition("p", 1, 1, 0, 60, default=True)]

    def forget(self, ids: Sequence[str]) -> None:
        self.forgotten.update(ids)

    def close(self) -> None:
        pass


def make(tmp_path, tick: float = 0.05) -> tuple[Service, ScriptedBackend]:
    backend = ScriptedBackend()
    settings = Settings(home=tmp_path, tick_s=tick, max_backoff_s=0.4)
    svc = assemble(settings, Database(tmp_path / "db"), backend)
    svc.accounts.bootstrap_admin()
    return svc, backend


def admin(svc: Service):
    return svc.authenticate((svc.settings.admin_token_path).read_text().strip(), "sess")


def test_one_status_call_per_tick_for_many_waiters(tmp_path) -> None:
    svc, backend = make(tmp_path)

    async def scenario() -> list[JobState]:
        caller = admin(svc)
        jobs = [(await svc.submit(caller, [JobSpec(command="x")]))[0][0] for _ in range(50)]
        runner = asyncio.create_task(svc.reconciler.run())
        waits = [asyncio.create_task(svc.wait(caller, j.id, timeout=10)) for j in jobs]
        await asyncio.sleep(0.3)
        for j in jobs:
            backend.states[str(j.id)] = JobState.COMPLETED
        done = await asyncio.gather(*waits)
        runner.cancel()
        return [j.state for j, reached in done if reached]

    states = asyncio.run(scenario())
    assert states == [JobState.COMPLETED] * 50
    assert all(n == 50 for n in backend.status_calls)  # every call asked about every active job
    # Their ends recorded, the backend is told to let go of them (through the metering wrapper).
    assert backend.forgotten == set(backend.states)
    assert svc.metrics.backend_count("status") == len(backend.status_calls) < 30


def test_backoff_degraded_and_recovery(tmp_path) -> None:
    svc, backend = make(tmp_path)

    async def scenario() -> tuple[str | None, int, bool, JobState]:
        caller = admin(svc)
        job = (await svc.submit(caller, [JobSpec(command="x")]))[0][0]
        backend.failing = True
        runner = asyncio.create_task(svc.reconciler.run())
        await asyncio.sleep(1.0)
        degraded = svc.reconciler.degraded
        calls_while_down = len(backend.status_calls)
        # The gateway keeps answering from its own state while the backend is down,
        # without asking the backend.
        before = len(backend.status_calls)
        answered = svc.get_job(caller, job.id).id == job.id and len(backend.status_calls) == before
        (queued,), _ = await svc.submit(caller, [JobSpec(command="y")])
        backend.failing = False
        backend.states[str(job.id)] = JobState.COMPLETED
        final, _ = await svc.wait(caller, job.id, timeout=5)
        late, _ = await svc.wait(caller, queued.id, timeout=5, until="RUNNING")
        runner.cancel()
        assert late.backend_id is not None  # the deferred submission was sent once the backend recovered
        return degraded, calls_while_down, answered and svc.health()["ok"], final.state

    degraded, calls, healthy_after, final = asyncio.run(scenario())
    assert degraded is not None and "not responding" in degraded
    # 1 s at a 0.05 s tick would be 20 calls without back-off; backing off to 0.4 s makes far fewer.
    assert calls <= 8
    assert healthy_after and final is JobState.COMPLETED
