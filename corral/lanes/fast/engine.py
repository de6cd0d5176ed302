"""A fast-lane pool's engine: its own Dask scheduler, which only that pool's workers join
(over TLS, with the pool's certificate), and the gateway's client to it, in the same
process (inproc: no socket, no encryption). The pool (corral/lanes/fast/pool.py) sends
batches of task specs through it to one worker each, and hears the workers' pushed
events; nothing here knows tasks, allocations or scaling."""

from __future__ import annotations

import logging
import pickle
import uuid
from typing import Any, Callable

from corral.lanes.fast import launcher

log = logging.getLogger("corral.lanes.fast")


class Engine:
    def __init__(self, host: str, security: Any, slug: str) -> None:
        self.host, self.security, self.slug = host, security, slug
        self.scheduler: Any = None
        self.client: Any = None

    @property
    def up(self) -> bool:
        """The scheduler listens and the client is connected."""
        return self.client is not None

    async def start(self, on_event: Callable[[tuple[float, bytes | dict[str, Any]]], None]) -> None:
        import dask
        from distributed import Client, Scheduler

        # A task must never run twice unless it says it may: no silent retries on a lost worker.
        # No HTTP routes: Dask's diagnostics server (workers, their addresses, their logs and
        # call stacks, fetched on request) answered anyone who reached the address the
        # nodes use, unauthenticated, beside the TLS the workers must join with. The server
        # Dask always starts is kept to loopback with nothing to serve.
        dask.config.set({"distributed.scheduler.allowed-failures": 0,
                         "distributed.scheduler.work-stealing": True,
                         "distributed.scheduler.http.routes": []})
        # Workers join over the network (TLS); the gateway's own client sits in the same
        # process and talks to the scheduler in memory (inproc): no socket, no encryption.
        # (Lists give one listener each: accepted by Dask, though its annotations say str.)
        self.scheduler = await Scheduler(host=[self.host, None], port=[0, None],  # type: ignore[arg-type]
                                         dashboard=False, dashboard_address="127.0.0.1:0",
                                         security=self.security,
                                         protocol=["tls" if self.security else "tcp", "inproc"])  # type: ignore[arg-type]
        self.client = await Client(self.scheduler.listeners[1].contact_address, asynchronous=True,
                                   security=self.security)
        self.client.subscribe_topic(launcher.TOPIC, on_event)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.scheduler is not None:
            try:
                await self.scheduler.close()
            except RuntimeError as e:  # Dask's close can race a connection still opening
                log.warning("fast-lane pool %s: the scheduler's close was untidy (%s)", self.slug, e)

    @property
    def address(self) -> str:
        """Where workers join (the network listener)."""
        return str(self.scheduler.address)

    def workers_up(self) -> dict[str, str]:
        """Worker name -> address, for the workers connected now."""
        if self.scheduler is None:
            return {}
        return {str(ws.name): addr for addr, ws in self.scheduler.workers.items()}

    def has_workers(self) -> bool:
        return self.up and bool(self.scheduler.workers)

    def send(self, specs: list[dict[str, Any]], addr: str) -> Any:
        """Run these task specs as one batch on the worker at ``addr``; -> its Dask future."""
        # One opaque argument: Dask would otherwise walk every spec looking for its own
        # keys, and pickle each task's environment anew (one object for many tasks here).
        payload = pickle.dumps(specs, protocol=pickle.HIGHEST_PROTOCOL)
        return self.client.submit(launcher.run_batch, payload, pure=False, key=f"batch-{uuid.uuid4().hex}",
                                  workers=[addr], allow_other_workers=False)

    async def kill(self, job_ids: list[int]) -> None:
        """Tell every worker to kill these tasks if it runs them."""
        await self.client.run(launcher.cancel, job_ids)
