"""One fast-lane pool: warm allocations of one Unix user and account on one partition,
with one listener (in the gateway) that only that pool's workers join.

    tasks ─enqueue─▶ pending ─dispatch (each worker ≤ HOLD_S of work per slot)─▶ the pool's listener
                                                                                  │
    allocation (a pilot job: corral.lanes.fast.worker) ◀────── batches ─────────────┘
         └─ launcher runs each task as a process ─▶ starts, outcomes (pushed as reports)
                                                     ─▶ the service records them

The pool composes four parts: its queue of waiting tasks (queue.py), the scaling
strategy that reads the pool's state and answers when to grow, how big, what to give
back or release (scaling.py), the circuit breaker that turns the pool off after
allocations fail to start (breaker.py), each tested alone, and the engine (engine.py:
the listener its workers join, and what crosses it: wire.py). Records and ports: model.py. What stays
here is what ties them: placing batches on workers, hearing outcomes, salvaging lost
batches, and acting on the strategy's answers.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path
from typing import Any, Callable

from corral.core.jobs import JobState
from corral.lanes.fast import scaling, trace
from corral.lanes.fast.journals import read_off_loop
from corral.lanes.fast.breaker import Breaker
from corral.lanes.fast.demand import HOLD_S, Demand
from corral.lanes.fast.engine import Engine, Lost
from corral.lanes.fast.model import Allocation, Allocations, PoolConfig, PoolKey, Reports, Shape, Task, Waiting
from corral.lanes.fast.queue import TaskQueue, salvage

__all__ = ["Allocation", "Allocations", "Pool", "PoolConfig", "PoolKey", "Reports", "Shape", "Task", "Waiting"]

log = logging.getLogger("corral.lanes.fast")
MAX_BATCH = 512


class Pool:
    def __init__(self, key: PoolKey, shape: Shape, directory: Path, cfg: PoolConfig, allocations: Allocations,
                 reports: Reports, tls: ssl.SSLContext | None = None) -> None:
        self.key, self.shape, self.dir, self.cfg = key, shape, directory, cfg
        self.allocations_port, self.reports = allocations, reports
        self.engine = Engine(cfg.host, tls, key.slug)
        self.queue = TaskQueue()
        """Tasks waiting for a worker's room."""
        self.inflight: dict[int, Task] = {}
        self.load: dict[str, float] = {}
        """Worker address -> expected seconds of CPU slots of the tasks sent to it and not yet ended."""
        self.demand = Demand()
        self._growing = False
        self._by_name: dict[str, Allocation] = {}
        """Worker address -> its allocation, for the workers up."""
        self.tell: Callable[[list[int], str], None] | None = None  # writes why tasks wait (the lane sets it)
        self._told: tuple[str | None, int] = (None, 0)
        self.gave_to: tuple[int, float] | None = None
        """The batch job this pool last gave cores back to, and when."""
        self.known: set[int] = set()
        """Every task waiting or running here: submit is idempotent per job id."""
        self.reported: set[int] = set()
        """Tasks of batches still out whose outcome a worker already pushed (recorded once)."""
        self.allocations: dict[int, Allocation] = {}
        self.breaker = Breaker(cfg.breaker_failures, cfg.breaker_cooldown_s)
        self.last_work = time.monotonic()
        self._wake = asyncio.Event()
        self.background: set[asyncio.Future[Any]] = set()
        """Every task this pool started: kept (asyncio holds weak references), awaited at close."""
        self.trace = trace.gateway_dir()
        """Where each stage of a task is timed (bench/fast_lane.py --trace), or None."""

    # -- life ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.engine.start(self._on_report)
        self.keep(asyncio.create_task(self._dispatch_loop(), name=f"fastlane-dispatch-{self.key.slug}"))

    def keep(self, task: "asyncio.Future[Any]") -> None:
        """Hold ``task`` until it ends (a task nobody holds may be collected mid-way)."""
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close(self) -> None:
        tasks = list(self.background)
        for t in tasks:
            t.cancel()
        if tasks:  # bounded: the gateway's shutdown has a deadline (api.settle)
            await asyncio.wait(tasks, timeout=1.0)
        for a in list(self.allocations.values()):
            await self.allocations_port.stop(a.job_id)
        await self.engine.close()

    @property
    def address(self) -> str:
        return self.engine.address

    def workers_up(self) -> dict[str, str]:
        """Worker name -> address, for the workers connected now."""
        return self.engine.workers_up()

    # -- tasks --------------------------------------------------------------------
    def enqueue(self, task: Task) -> None:
        task.work = self.demand.expect(task.spec)
        if self.trace:
            trace.mark("enqueued", [task.job_id])
            task.spec["trace"] = self.trace
        self.known.add(task.job_id)
        self.queue.put(task)
        self.last_work = time.monotonic()
        self._wake.set()

    def cancel(self, job_ids: set[int]) -> list[int]:
        """Drop waiting tasks (returned) and tell workers to kill running ones."""
        dropped = self.queue.drop(job_ids)
        self.known.difference_update(dropped)
        running = [j for j in job_ids if j in self.inflight]
        if running and self.engine.up:
            self.engine.kill(running)
        return dropped

    def dispatch(self) -> None:
        """Hand pending tasks to the workers up, each up to ``HOLD_S`` seconds of expected
        work per CPU slot (running and queued in its launcher: demand.py); the rest wait
        here for a worker's room. A task sent is a task placed: it cannot move to an
        allocation that joins later, so a small warm allocation takes only what it can
        soon run and the next allocation gets the rest, while a burst of millisecond tasks
        goes out in a few large batches. Called at the end of a batch submission (its
        tasks go out before the next request is read), by the loop below for single
        submissions, for tasks that waited for room, and when tasks end."""
        if self.queue:
            n = len(self.queue) + len(self.inflight)  # every task wants a CPU at least
            self.demand.wanted(self.shape.cpus if n >= self.shape.cpus else min(self.shape.cpus, sum(
                t.spec["cpus"] for t in (*self.queue, *self.inflight.values()))))
            self._grow_soon()
        if not self.queue or not self.engine.has_workers():
            return
        up = self.workers_up()
        room: list[tuple[float, str, Shape]] = []
        for a in self.allocations.values():
            addr = up.get(a.name)
            if addr is None or a.draining:
                continue
            cap = HOLD_S * a.shape.cpus
            load = self.load.get(addr, 0.0)
            free = cap - load
            # Refill by halves: batches of ~100 `true` cost the gateway and the worker
            # 0.2 s less CPU per 1,000 than batches of 32 (measured), so no trickle.
            if load == 0 or (free > 0 and free >= min(cap / 2, self.queue.work)):
                room.append((free, addr, a.shape))
        for free, addr, shape in sorted(room, reverse=True):
            if not self.queue:
                break
            # tasks were routed to fit the pool's shape: a full-size allocation takes any of them
            take = self.queue.take(free, shape, shape == self.shape)
            for i in range(0, len(take), MAX_BATCH):
                self._send(take[i:i + MAX_BATCH], addr)

    def _send(self, batch: list[Task], addr: str) -> None:
        for t in batch:
            t.addr = addr
            self.inflight[t.job_id] = t
        self.load[addr] = self.load.get(addr, 0.0) + sum(t.work for t in batch)
        a = self._by_name.get(addr)
        if a is not None:
            a.idle_since = None
        if self.trace:
            trace.mark("sent", [t.job_id for t in batch])
        fut = self.engine.send([t.spec for t in batch], addr)
        self.keep(asyncio.ensure_future(self._collect(fut, batch)))

    def _unload(self, tasks: list[Task]) -> None:
        """These tasks no longer hold room in their worker."""
        for t in tasks:
            if t.addr is not None:
                left = self.load.get(t.addr, 0.0) - t.work
                if left > 1e-9:
                    self.load[t.addr] = left
                else:
                    self.load.pop(t.addr, None)
                    a = self._by_name.get(t.addr)
                    if a is not None and a.idle_since is None:
                        a.idle_since = time.time()
                t.addr = None
        if self.queue:
            self._wake.set()

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let a burst of submissions land in one round
            self.dispatch()

    def _on_report(self, addr: str, news: dict[int, float], all_ended: list[dict[str, Any]]) -> None:
        """A worker's push of what started and ended since its last one (as wire.report
        rebuilt it). Only the tasks sent to that worker and still out count: a worker cannot
        report (or re-report) anything else."""
        def sent_there(j: int) -> bool:
            t = self.inflight.get(j)
            return t is not None and t.addr == addr

        ended = [r for r in all_ended if sent_there(r["job_id"]) and r["job_id"] not in self.reported]
        over = {r["job_id"] for r in all_ended}
        started = {j: t for j, t in news.items() if sent_there(j) and j not in over}
        if started:
            self.reports.started(started)
        if ended:
            self._learn(ended)
            if self.trace:
                trace.mark("heard", [r["job_id"] for r in ended])
            self.reported.update(r["job_id"] for r in ended)
            self.reports.ended(ended)
            if self.trace:
                trace.mark("recorded", [r["job_id"] for r in ended])
                trace.flush(self.trace)
            self._unload([self.inflight[r["job_id"]] for r in ended])

    def _learn(self, ended: list[dict[str, Any]]) -> None:
        """How long tasks of each kind ran (the outcomes of tasks that ran)."""
        for r in ended:
            t = self.inflight.get(int(r["job_id"]))
            if t is not None and r.get("start") and r.get("end") and r.get("state") in ("COMPLETED", "FAILED"):
                self.demand.ran(t.spec, max(0.0, r["end"] - r["start"]))

    async def _collect(self, fut: "asyncio.Future[list[dict[str, Any]]]", batch: list[Task]) -> None:
        """A batch came back: record what its worker had not pushed already (its answer
        carries only that: wire.py)."""
        why: str | None = None
        """Why the worker answered without outcomes (None: it answered, or it is gone)."""
        gone = False
        try:
            results = await fut
        except asyncio.CancelledError:
            raise
        except Lost as e:  # the worker is gone: its journal says what ran, the rest may run again
            gone = True
            results = await self._salvage([t for t in batch if t.job_id not in self.reported], str(e)[:300])
        except Exception as e:  # it answered, without outcomes (engine.Failed: its word, or what broke)
            results, why = [], str(e)[:300]
        finally:
            self._unload(batch)  # what a report did not unload already
            for t in batch:
                self.inflight.pop(t.job_id, None)
            self.last_work = time.monotonic()
        pushed = {t.job_id for t in batch if t.job_id in self.reported}
        self.reported.difference_update(pushed)
        self.known.difference_update(pushed)
        mine = {t.job_id for t in batch} - pushed
        results = [r for r in results if r["job_id"] in mine]  # a worker answers for its own batch alone
        heard = pushed | {r["job_id"] for r in results}
        lost = [t for t in batch if t.job_id not in heard]
        if lost and not gone:
            # The worker is up and answered without these: what its journal says; the rest
            # fail, never sent again (to the same worker, they would come back the same).
            results += await self._unanswered(lost, why or "its worker answered the batch without their outcome")
        if results:
            self._learn(results)
            self.known.difference_update(int(r["job_id"]) for r in results)
            self.reports.ended(results)
        if self.queue:
            self._wake.set()

    async def _unanswered(self, tasks: list[Task], why: str) -> list[dict[str, Any]]:
        """Tasks a live worker answered for without an outcome: their journaled ends, else FAILED."""
        journal = await read_off_loop(self.dir)
        now = time.time()
        out = []
        for t in tasks:
            rec = journal.get(t.job_id)
            out.append(rec if rec and rec.get("event") == "ended" else
                       {"job_id": t.job_id, "state": "FAILED", "exit_code": None, "start": rec and rec.get("start"),
                        "end": now, "cpu_s": None, "reason": f"{why}; submit it again, or with lane=batch"})
        return out

    async def _salvage(self, batch: list[Task], why: str) -> list[dict[str, Any]]:
        """A batch lost with its allocation: keep outcomes its worker journaled (read off
        the event loop, bounded: journals.py), rerun what may be rerun, fail the rest."""
        rerun, out = salvage(batch, await read_off_loop(self.dir), why)
        for t in rerun:
            log.info("fast-lane task %s requeued after its allocation was lost", t.job_id)
            self.queue.requeue(t)
        return out

    # -- scaling --------------------------------------------------------------------
    async def maintain(self) -> None:
        """Called every tick: track allocations, scale, give cores back, say what waiting
        tasks wait for, trip or close the breaker."""
        up = self.workers_up()
        now = time.time()
        for a in list(self.allocations.values()):
            if a.name in up and a.up_since is None:
                a.up_since = a.idle_since = now
                self._by_name[up[a.name]] = a
                self.demand.started(now - a.asked)
                self.breaker.joined()
                self._retire(a)
                self._wake.set()
            state, reason = self.allocations_port.state(a.job_id)
            if state is JobState.RUNNING and a.running_since is None:
                a.running_since = now
            # Waiting in the scheduler's queue is not failing; running without a worker is.
            stuck = a.up_since is None and a.running_since is not None and now - a.running_since > self.cfg.start_timeout_s
            if state.terminal or stuck:
                self._forget(a)
                if a.up_since is None:
                    self._failed(a, reason if state.terminal else None)
                    if not state.terminal:
                        await self.allocations_port.stop(a.job_id)
        await self._give_back(now)
        await self._grow()
        await self._replace()
        for old in scaling.retired_empty(self):
            await self.release(old, "replaced by a larger allocation, its tasks ended")
        if scaling.undersized(self):  # the next burst finds an allocation sized to the last
            room = await self.allocations_port.free(self.key.partition)
            if room is not None and room[0] > max(a.shape.cpus for a in self.allocations.values()):
                await self._add()  # only one that starts now and is bigger than what it has
        if len(self.allocations) < self.cfg.min_allocations and not self.breaker.is_open \
                and not any(a.up_since is None for a in self.allocations.values()):
            await self._add()
        victim = scaling.idle_victim(self, time.monotonic() - self.last_work)
        if victim is not None:
            await self.release(victim, "idle")
            self.last_work = time.monotonic()
        self._say_why()

    async def _give_back(self, now: float) -> None:
        """Release or drain allocations that hold cores a waiting batch job needs."""
        if not self.allocations:
            return
        waiting = self.allocations_port.waiting(self.key.partition)
        if not waiting:
            for a in self.allocations.values():
                a.draining = a.retired  # nothing waits any more: take tasks again (unless replaced)
            return
        free = await self.allocations_port.free(self.key.partition) or (0, 0)
        for g in scaling.give_back(self, waiting, free, now):
            self.gave_to = (g.to.job_id, now)
            if g.release:
                await self.release(g.allocation, f"batch job {g.to.job_id} waited {now - g.to.since:.0f} s for its cores")
            else:
                g.allocation.draining = True
                log.info("fast-lane pool %s: allocation %s takes no new tasks, batch job %s waits for its cores",
                         self.key.slug, g.allocation.job_id, g.to.job_id)

    def _say_why(self) -> None:
        """Tell waiting tasks what they wait for, when that changed or new ones came."""
        if self.tell is None:
            return
        why = scaling.waiting_reason(self, self.allocations_port)
        if why is None:
            self._told = (None, 0)
        elif self._told != (why, len(self.queue)):
            self._told = (why, len(self.queue))
            self.tell([t.job_id for t in self.queue], why)

    def address_of(self, a: Allocation) -> str | None:
        """The address of this allocation's worker, None while it is not up."""
        return next((addr for addr, x in self._by_name.items() if x is a), None)

    def _forget(self, a: Allocation) -> None:
        self.allocations.pop(a.job_id, None)
        addr = self.address_of(a)
        if addr is not None:
            del self._by_name[addr]
            self.engine.drop(addr)  # a dead node's connection says nothing: its batches are lost now

    async def release(self, a: Allocation, why: str) -> None:
        self._forget(a)
        log.info("fast-lane pool %s: releasing allocation %s (%s)", self.key.slug, a.job_id, why)
        await self.allocations_port.stop(a.job_id)

    async def _grow(self) -> None:
        if self._growing:
            return
        if scaling.may_grow(self, time.time()):
            self._growing = True
            try:
                await self._add()
            finally:
                self._growing = False

    async def _replace(self) -> None:
        """A busy pool at its cap asks for one allocation of its shape in place of its
        smallest (scaling.replaceable). The small one keeps taking tasks until the new one
        is up (_retire), so the pool holds one allocation over its cap while that starts:
        draining it at once would shrink the pool for a join (seconds), and a replacement
        that never starts then costs nothing. Only one replacement is out at a time."""
        if self._growing:
            return
        small = scaling.replaceable(self)
        if small is None:
            return
        self._growing = True
        try:
            shape = scaling.replacement(self, small, await self.allocations_port.free(self.key.partition))
            if shape is not None:
                log.info("fast-lane pool %s at its cap of %d: asking for %d CPUs to replace allocation %s (%d CPUs)",
                         self.key.slug, self.cfg.max_allocations, shape.cpus, small.job_id, small.shape.cpus)
                await self._add(shape, replaces=small.job_id)
        finally:
            self._growing = False

    def _retire(self, a: Allocation) -> None:
        """``a`` is up: the allocation it replaces takes no new tasks from now."""
        old = self.allocations.get(a.replaces) if a.replaces is not None else None
        if old is not None:
            old.draining = old.retired = True
            log.info("fast-lane pool %s: allocation %s replaces %s, which takes no new tasks",
                     self.key.slug, a.job_id, old.job_id)

    def _grow_soon(self) -> None:
        """Ask for an allocation now, not at the next tick, when the backlog calls for one."""
        if (not self._growing and self.engine.up and len(self.allocations) < self.cfg.max_allocations
                and scaling.backlogged(self, time.time())):
            self.keep(asyncio.ensure_future(self._grow()))

    def _failed(self, a: Allocation, reason: str | None) -> None:
        why = reason or f"no worker joined within {self.cfg.start_timeout_s:.0f} s of the job starting"
        log.warning("fast-lane allocation %s of pool %s failed to start: %s", a.job_id, self.key.slug, why)
        b = self.breaker
        if b.failed(why):
            self.fail_pending(f"the fast lane of pool {self.key.slug} is off for {b.cooldown_s:.0f} s: "
                              f"{b.failures} allocations in a row failed to start (last: {why}); "
                              "submit with lane=batch")

    async def _add(self, shape: Shape | None = None, replaces: int | None = None) -> None:
        if shape is None:
            shape = scaling.size(self, await self.allocations_port.free(self.key.partition))
        job_id = await self.allocations_port.start(self, shape)
        self.allocations[job_id] = Allocation(job_id, f"alloc-{job_id}", time.time(), shape, replaces=replaces)

    def fail_pending(self, reason: str) -> None:
        failed = self.queue.fail_all(reason)
        self.known.difference_update(r["job_id"] for r in failed)
        if failed:
            self.reports.ended(failed)

    def describe(self) -> dict[str, Any]:
        k, gave = self.key, self.gave_to
        return {"pool": k.slug, "unix_user": k.unix_user, "account": k.account, "partition": k.partition,
                "cluster": k.cluster,
                "shape": vars(self.shape), "allocations": [a.describe() for a in self.allocations.values()],
                "pending": len(self.queue), "running": len(self.inflight),
                "gave_cores_to": None if gave is None else {"job_id": gave[0], "at": gave[1]},
                "breaker": self.breaker.describe()}
