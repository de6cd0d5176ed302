"""The program a fast-lane allocation runs: the pool's worker, around the task launcher.

    python -I -m corral.lanes.fast.worker --scheduler tls://HOST:PORT --cpus 32 --memory-mb 64000 \\
        --gpus 0 --name alloc-17 --tls-dir DIR

It connects to its pool's scheduler inside the gateway (TLS, with the certificate its
pool's CA issued it: trust.py), says its name, runs the batches it is given with the
allocation's resources, pushes starts and ends as they happen, and answers each batch
with the outcomes not pushed yet (wire.py: lines of JSON). It exits, ending its tasks,
when the scheduler goes (a gateway restart ends its pools cleanly), or when it cannot
reach it within ``--death-timeout`` seconds of starting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.lanes.fast import launcher, trust, wire
from corral.lanes.fast.engine import PING_S, tune

if TYPE_CHECKING:
    from corral.sandbox.egress import Relay

MIN_THREADS = 16
"""Fewest batches a worker runs at once (each waits in one thread while the launcher
runs it): the batches of a burst from ten agents, on the smallest allocation."""


_relays: list["Relay"] = []
"""This worker's egress relay, if its tasks need one: closed however the worker ends."""


async def run(a: argparse.Namespace) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(a.gpus)]
    sandbox = None
    if a.sandbox is not None:
        from corral.sandbox.bwrap import Sandbox

        sandbox = Sandbox.loads(a.sandbox.read_text())
    relay = None
    if sandbox is not None and sandbox.egress and sandbox.relay and not sandbox.network:
        # The gateway's Unix socket connects on the gateway's machine alone: this node's
        # tasks reach the proxy's TCP address through a relay of this worker's
        # ([sandbox] egress_listen; corral/sandbox/egress.py).
        from dataclasses import replace

        from corral.sandbox.egress import Relay

        # no SIGTERM between its directory's making and its being known to ``finish``
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            relay = Relay(sandbox.relay, sandbox.run_as)
            _relays.append(relay)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        sandbox = replace(sandbox, egress=str(relay.socket))
    launcher.configure(launcher.Slots(a.cpus, a.memory_mb, gpus[: a.gpus]), sandbox)
    reader, writer = await connect(a.scheduler, a.tls_dir, a.death_timeout)
    tune(writer.get_extra_info("socket"))
    loop = asyncio.get_running_loop()
    writer.write(wire.line({"op": "hello", "name": a.name}))
    # Starts and outcomes go to the gateway as they happen, from the launcher's thread, in
    # order with the answers below (both reach the loop through call_soon_threadsafe):
    # a batch's answer never overtakes the report that carried its outcomes.
    def push(msg: bytes) -> None:
        loop.call_soon_threadsafe(writer.write, msg)

    launcher.report_to(push)

    async def ping() -> None:  # the gateway closes a worker silent for engine.IDLE_S
        while True:
            await asyncio.sleep(a.ping_s)
            writer.write(wire.line({"op": "ping"}))

    pinging = asyncio.ensure_future(ping())
    # A thread only waits for its batch in the launcher, which runs every batch at once:
    # a batch queued for a thread behind others waited ~0.7 s of a 1,000-task burst on a
    # 4-CPU allocation with 4 threads (bench/fast_lane.py --trace), so never fewer than
    # MIN_THREADS.
    threads = ThreadPoolExecutor(max(MIN_THREADS, min(a.cpus, 64)), thread_name_prefix="corral-batch")
    held: set[asyncio.Future[None]] = set()

    async def answer(n: int, specs: list[dict[str, Any]]) -> None:
        try:
            results = await loop.run_in_executor(threads, launcher.run_batch, specs)
            out = wire.line({"op": "done", "batch": n, "results": results})
        except Exception as e:  # its tasks fail with this reason at the gateway
            out = wire.line({"op": "done", "batch": n, "error": f"{type(e).__name__}: {e}"[:300]})
        writer.write(out)

    try:
        while line := await reader.readline():
            msg = json.loads(line)
            if msg["op"] == "batch":
                t = asyncio.ensure_future(answer(msg["batch"], msg["specs"]))
                held.add(t)
                t.add_done_callback(held.discard)
            elif msg["op"] == "cancel":
                launcher.cancel(msg["ids"])
    finally:
        pinging.cancel()
        threads.shutdown(wait=False, cancel_futures=True)


async def connect(address: str, tls_dir: Path | None, within: float) -> tuple[asyncio.StreamReader,
                                                                               asyncio.StreamWriter]:
    """The pool's scheduler, tried until it answers or ``within`` seconds have passed."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    ctx = trust.worker_context(tls_dir) if scheme == "tls" and tls_dir is not None else None
    deadline = time.monotonic() + within
    while True:
        try:
            # The gateway's lines are trusted and may be large (a batch of 128 tasks with long
            # commands and environments passed 8 MiB, and readline's ValueError ended the worker
            # with every other principal's tasks): the gateway's bound on what it sends, not MAX_LINE.
            return await asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx, limit=wire.GATEWAY_LINE)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", required=True, help="the pool's scheduler address")
    ap.add_argument("--cpus", type=int, required=True)
    ap.add_argument("--memory-mb", type=int, required=True)
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--name", required=True)
    ap.add_argument("--tls-dir", type=Path, help="its pool's CA certificate and its own certificate and key")
    ap.add_argument("--sandbox", type=Path, help="the facility's sandbox (JSON), for the tasks it contains")
    ap.add_argument("--ping-s", type=float, default=PING_S, help=argparse.SUPPRESS)  # tests: a quick gateway's IDLE_S
    ap.add_argument("--death-timeout", type=float, default=30.0, help="seconds to keep trying to reach the scheduler")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def finish(code: int) -> None:
        """End the worker once, whichever way it ends: no signal cuts its cleanup short (the
        scheduler's going and the allocation's cancel often come together), the relay's
        directory first (quick), then the tasks (their sandboxes may take a while)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        # each step whatever the one before raised: an exception here (in a signal handler)
        # skipped the exit, and the worker lived on with its relay's directory
        for step in [*(r.close for r in _relays), launcher.kill_all, logging.shutdown]:
            try:
                step()
            except Exception:  # noqa: BLE001 (nothing may stop the worker's end)
                pass
        # Not a normal exit: a batch whose tasks never started still holds a thread, which
        # the interpreter would wait for at exit. The worker's end is its batches' end.
        os._exit(code)

    signal.signal(signal.SIGTERM, lambda signum, frame: finish(128 + signum))  # scancel, the local cancel
    signal.signal(signal.SIGINT, lambda signum, frame: finish(128 + signum))
    code = 0
    try:
        asyncio.run(run(a))
    except Exception:
        logging.getLogger("corral.lanes.fast.worker").exception("the worker ended")
        code = 1
    finally:
        finish(code)

if __name__ == "__main__":
    main()
