"""The program a fast-lane allocation runs: one Dask worker plus the task launcher.

    python -m corral.lanes.fast.worker --scheduler tls://HOST:PORT --cpus 32 --memory-mb 64000 \\
        --gpus 0 --name pool-3-alloc-17 --tls-dir DIR

It connects to its pool's scheduler inside the gateway, runs the batches it is given
with the allocation's resources, and exits when the scheduler has been gone for
``--death-timeout`` seconds (a gateway restart ends its pools cleanly).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.lanes.fast import launcher

if TYPE_CHECKING:
    from corral.sandbox.egress import Relay

MIN_THREADS = 16
"""Fewest batches a worker holds at once (each waits in one thread while the launcher
runs it): the batches of a burst from ten agents, on the smallest allocation."""


def security(tls_dir: Path | None) -> Any:
    if tls_dir is None:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=str(tls_dir / "ca.pem"), tls_worker_cert=str(tls_dir / "cert.pem"),
                    tls_worker_key=str(tls_dir / "key.pem"), require_encryption=True)


_relays: list["Relay"] = []
"""This worker's egress relay, if its tasks need one: closed however the worker ends."""


async def run(a: argparse.Namespace) -> None:
    import dask
    from distributed import Worker

    # The worker's sampling profiler walks every thread's stack 100 times a second:
    # measured, that doubled the worker's CPU per task. Off, as are its other monitors.
    # No HTTP routes, and its server (Dask always starts one) on the node's loopback: it
    # answered /metrics and /health to anyone on the cluster's network, on 0.0.0.0.
    dask.config.set({"distributed.worker.profile.enabled": False,
                     "distributed.admin.system-monitor.interval": "10s",
                     "distributed.worker.http.routes": []})

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

        relay = Relay(sandbox.relay, sandbox.run_as)
        _relays.append(relay)
        sandbox = replace(sandbox, egress=str(relay.socket))
    launcher.configure(launcher.Slots(a.cpus, a.memory_mb, gpus[: a.gpus]), sandbox)
    # A thread only waits for its batch in the launcher, which runs every batch at once:
    # a batch queued for a thread behind others waited ~0.7 s of a 1,000-task burst on a
    # 4-CPU allocation with 4 threads (bench/fast_lane.py --trace), so never fewer than
    # MIN_THREADS. But measured before: more threads than CPUs cost the worker CPU (GIL
    # hand-offs as they wake) without starting tasks sooner, when batches are small.
    async with Worker(a.scheduler, nthreads=max(MIN_THREADS, min(a.cpus, 64)), name=a.name, death_timeout=a.death_timeout,
                      dashboard=False, dashboard_address="127.0.0.1:0", security=security(a.tls_dir),
                      memory_limit=0) as w:
        # Starts and outcomes go to the gateway as they happen, over the worker's own
        # connection (Dask's events), not only when a whole batch has returned.
        launcher.report_to(lambda msg: w.log_event(launcher.TOPIC, msg))
        await w.finished()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", required=True, help="the pool's scheduler address")
    ap.add_argument("--cpus", type=int, required=True)
    ap.add_argument("--memory-mb", type=int, required=True)
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--name", required=True)
    ap.add_argument("--tls-dir", type=Path)
    ap.add_argument("--sandbox", type=Path, help="the facility's sandbox (JSON), for the tasks it contains")
    ap.add_argument("--death-timeout", type=float, default=30.0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def end(signum: int, frame: object) -> None:  # scancel, or the local backend's cancel
        launcher.kill_all()
        for r in _relays:
            r.close()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    try:
        asyncio.run(run(a))
    finally:
        launcher.kill_all()
        for r in _relays:
            r.close()


if __name__ == "__main__":
    main()
