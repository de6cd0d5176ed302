"""Status fan-in: 50 clients poll their jobs' status for a fixed time, through corral
versus calling the backend's status directly. Reports the backend calls each arm
caused, their ratio, and corral's status throughput and latency.

Both arms poll at the same pace: together ``--rate`` requests/s (default 1,000),
each client every clients/rate seconds. Latency is measured from the moment a
request was due, not when it was sent, so a stalled server cannot hide its stall
(no coordinated omission). A third arm polls through corral with no pause at all
to find its saturation throughput.

    python bench/status_fanin.py [--quick] [--clients 50] [--duration 10] [--rate 1000]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, KeepAliveGet, finish, pct  # noqa: E402
from corral.lanes.backend import SubmitContext  # noqa: E402
from corral.lanes.local import LocalBackend  # noqa: E402
from corral.core.jobs import JobSpec  # noqa: E402


def corral_arm(clients: int, duration: float, tick: float, rate: float | None) -> dict:
    """rate=None: closed loop, each client sends its next request as soon as the last returns."""
    gw = GatewayProcess("--tick", str(tick), "--cpus", str(clients + 8))
    try:
        with gw.client() as h:
            ids = [h.post("/v1/jobs", json={"command": "sleep 600", "walltime": "20m", "memory": "16M"}).json()["id"]
                   for _ in range(clients)]
            for j in ids:
                h.get(f"/v1/jobs/{j}/wait", params={"until": "RUNNING", "timeout": 30})
        latencies: list[float] = []
        errors = 0
        interval = clients / rate if rate else 0.0

        async def client(k: int, job_id: int, start: asyncio.Event, window: list[float]) -> None:
            nonlocal errors
            c = KeepAliveGet(gw.port, gw.token)
            await c.get(f"/v1/jobs/{job_id}")  # warm-up: connected before the measured window opens
            await start.wait()
            t_start, stop_at = window
            due = t_start + interval * k / clients  # spread the clients over one interval
            try:
                while due < stop_at:
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    t0 = due if interval else time.perf_counter()
                    status, body = await c.get(f"/v1/jobs/{job_id}")
                    now = time.perf_counter()
                    latencies.append(now - t0)
                    due = due + interval if interval else now
                    if status != 200 or b'"RUNNING"' not in body:
                        errors += 1
            finally:
                c.close()

        async def run() -> float:
            start, window = asyncio.Event(), [0.0, 0.0]
            tasks = [asyncio.ensure_future(client(k, j, start, window)) for k, j in enumerate(ids)]
            await asyncio.sleep(1.0)
            window[0] = time.perf_counter()
            window[1] = window[0] + duration
            start.set()
            await asyncio.gather(*tasks)
            return time.perf_counter() - window[0]

        before = gw.metric('corral_backend_calls_total{op="status"}')
        # The load generator shares 2 cores with the server: keep it lean (uvloop, no GC pauses).
        gc.disable()
        try:
            elapsed = uvloop.run(run())
        finally:
            gc.enable()
        calls = gw.metric('corral_backend_calls_total{op="status"}') - before
        return {"requests": len(latencies), "elapsed": elapsed, "backend_calls": int(calls), "errors": errors,
                "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}
    finally:
        with gw.client() as h:  # leave no sleeping jobs behind, whatever happened
            h.post("/v1/jobs/cancel", json={"ids": list(range(1, clients + 1))})
        gw.stop()


def direct_arm(clients: int, duration: float, rate: float) -> dict:
    backend = LocalBackend(Path(tempfile.mkdtemp(prefix="corral-direct-")), cpus=clients + 8, memory_mb=10**6)
    ids = [backend.submit(SubmitContext(i, "bench", "agent"), JobSpec(command="sleep 600", walltime="20m"))
           for i in range(clients)]
    time.sleep(1.5)
    counts = [0] * clients
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + duration
    interval = clients / rate

    def client(i: int) -> None:
        local: list[float] = []
        due = time.perf_counter() + interval * i / clients
        while due < stop_at:
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            due += interval
            t0 = time.perf_counter()
            backend.status([ids[i]])
            local.append(time.perf_counter() - t0)
            counts[i] += 1
        with lock:
            latencies.extend(local)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backend.cancel(ids)
    return {"backend_calls": sum(counts), "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of polling per arm")
    ap.add_argument("--tick", type=float, default=0.5, help="corral's reconcile interval")
    ap.add_argument("--rate", type=float, default=1000.0, help="all clients' requests per second together")
    ap.add_argument("--quick", action="store_true", help="4 s per arm")
    args = ap.parse_args()
    duration = 4.0 if args.quick else args.duration

    print(f"direct arm: {args.clients} clients call backend.status, {args.rate:.0f}/s in all, for {duration:.0f}s",
          file=sys.stderr)
    direct = direct_arm(args.clients, duration, args.rate)
    print(f"corral arm: {args.clients} clients poll GET /v1/jobs/ID, {args.rate:.0f}/s in all, for {duration:.0f}s",
          file=sys.stderr)
    via = corral_arm(args.clients, duration, args.tick, args.rate)
    print(f"saturation arm: {args.clients} clients poll corral with no pause for {duration:.0f}s", file=sys.stderr)
    sat = corral_arm(args.clients, duration, args.tick, None)
    ratio = round(direct["backend_calls"] / via["backend_calls"], 1) if via["backend_calls"] else None
    result = {
        "clients": args.clients,
        "duration_s": duration,
        "tick_s": args.tick,
        "backend_calls_direct": direct["backend_calls"],
        "backend_calls_corral": via["backend_calls"],
        "ratio": ratio,
        "requests_corral": via["requests"],
        "req_per_s": round(via["requests"] / via["elapsed"], 1),
        "p50_ms": round(via["p50_ms"], 2),
        "p99_ms": round(via["p99_ms"], 2),
        "errors": via["errors"],
        "direct_p50_ms": round(direct["p50_ms"], 3),
        "rate_target": args.rate,
        "saturation_req_per_s": round(sat["requests"] / sat["elapsed"], 1),
        "saturation_p50_ms": round(sat["p50_ms"], 2),
    }
    print(f"backend status calls: direct {direct['backend_calls']}, via corral {via['backend_calls']} "
          f"(ratio {ratio}x); corral served {result['req_per_s']:.0f} req/s, "
          f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms; "
          f"saturated: {result['saturation_req_per_s']:.0f} req/s", file=sys.stderr)
    # corral's backend calls are the ratio's denominator: none means its reconciler never
    # asked (the jobs were not running), not that fan-in was infinite. Requests that all
    # failed measured no status.
    finish("status_fanin", result, {
        "direct": direct["backend_calls"] > 0, "corral_backend_calls": via["backend_calls"] > 0,
        "corral": via["requests"] > via["errors"], "saturation": sat["requests"] > sat["errors"]})


if __name__ == "__main__":
    main()
