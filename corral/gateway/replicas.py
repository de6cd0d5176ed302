"""Replicas: N gateways on one PostgreSQL store, behind any HTTP load balancer. Any
replica answers any request; one of them, the leader, runs the facility's loops (the
reconciler and its sender, the lanes' pool managers, the facts, the collectors), so the
scheduler is asked once per tick whatever N is.

The leader holds the store's advisory lock (corral/core/store/cluster.py: the
Coordinator tries it every half second on a dedicated session). Gaining it: the lanes
read again what the previous leader started (``take_over``), the sender sends, the
facility's loops start and the reconciler ticks at once (jobs recorded meanwhile are
sent). Losing it (its session ended: the store restarted, the network failed): the loops
stop and the sender stops sending; the server has already released the lock for a
follower to take.

Between replicas: a change of jobs' states here is published (``NOTIFY``) and wakes the
long-polls and event streams of every other replica; a job recorded by a follower is not
sent by it but wakes the leader's reconciler, which sends it (send_unsent) at once. Each
replica says it is there every ``BEAT_S``; the replicas heard within ``GONE_S`` share the
facility's rate limits (safety/limits.py: each refills at 1/N of the rate).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.store.cluster import Coordinator

if TYPE_CHECKING:
    from corral.gateway.service import Service


class Runtime(Protocol):
    """What the replicas ask of the runtime that starts them (gateway/runtime.py): named here
    so that neither imports the other."""

    service: "Service"
    backend: Any
    leader: bool

    def lead(self) -> None: ...

    def follow(self) -> None: ...

log = logging.getLogger("corral")

BEAT_S = 2.0
GONE_S = 3 * BEAT_S
"""A replica not heard for this long is gone: the others' shares of the rates grow back."""
MAX_IDS = 400
"""More jobs than this changed at once are published as '*': every waiter wakes and re-reads."""


class Replicas:
    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime
        s = runtime.service
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        """This replica, in its words to the others (its own words come back: ignored)."""
        self.coordinator = Coordinator(s.db.url, self._gained, self._lost, self._heard)
        s.sender.leading = False  # until the lock is ours
        s.sender.wake_leader = s.reconciler.elsewhere = self._wake_leader
        s.sender.cancels_elsewhere = True
        self._waking = False
        s.watchers.publish = self._publish
        self.peers: dict[str, float] = {}
        """The other replicas, by name: when each was last heard (monotonic)."""

    @property
    def count(self) -> int:
        """The replicas there now, this one included."""
        return 1 + len(self.peers)

    async def run(self) -> None:
        beat = asyncio.create_task(self._beat())
        try:
            await self.coordinator.run()
        finally:
            beat.cancel()

    async def _beat(self) -> None:
        while True:
            self._say("h", "")
            now = asyncio.get_running_loop().time()
            for rid, heard in list(self.peers.items()):
                if now - heard > GONE_S:
                    del self.peers[rid]
            self.runtime.service.gate.buckets.share = self.count
            await asyncio.sleep(BEAT_S)

    def _wake_leader(self) -> None:
        """Jobs to send or a hold released here: the leader's reconciler ticks now. One word per
        turn of the event loop, however many asked (a submit both sends and kicks)."""
        if self._waking:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called from a worker thread: said at once
            self._say("s", "")
            return
        self._waking = True
        loop.call_soon(self._woken)

    def _woken(self) -> None:
        self._waking = False
        self._say("s", "")

    def _publish(self, job_ids: list[int]) -> None:
        self._say("j", "*" if len(job_ids) > MAX_IDS else ",".join(map(str, job_ids)))

    def _say(self, kind: str, payload: str) -> None:
        try:
            self.runtime.service.db.notify(f"{self.id}|{kind}|{payload}")
        except Exception as e:  # a word lost costs the others latency (their waits time out and re-read)
            log.warning("replicas: could not tell the others of a change (%s)", e)

    def _heard(self, payload: str) -> None:
        rid, kind, rest = (payload.split("|", 2) + ["", ""])[:3]
        if rid == self.id:
            return
        s = self.runtime.service
        if rid not in self.peers:
            self.peers[rid] = 0.0
            s.gate.buckets.share = self.count  # at once: a new replica takes its share from now
        self.peers[rid] = asyncio.get_running_loop().time()
        if kind == "j":
            s.watchers.wake(None if rest == "*" else [int(x) for x in rest.split(",") if x])
        elif kind == "s" and self.runtime.leader:
            s.reconciler.kick()

    def _gained(self) -> None:
        log.warning("replicas: %s leads now: it runs the facility's loops (reconciler, sender, lanes)", self.id)
        s = self.runtime.service
        take_over = getattr(self.runtime.backend, "take_over", None)
        if take_over is not None:
            take_over()
        s.sender.leading, s.reconciler.elsewhere = True, None
        self.runtime.lead()
        s.reconciler.kick()

    def _lost(self) -> None:
        log.warning("replicas: %s leads no more: its facility loops stop", self.id)
        s = self.runtime.service
        s.sender.leading, s.reconciler.elsewhere = False, self._wake_leader
        self.runtime.follow()
