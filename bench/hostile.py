"""Hostile clients: 20 honest agents poll their jobs' status (and now and then submit)
while 5 hostile clients send the largest and most expensive requests they can, valid
and invalid: 64 KiB commands, 256 KiB scripts, 256 environment variables, ids past
2^63, NUL bytes, 1e400, malformed JSON. Then, without any token, from another address
(127.0.0.2): an 8 MB header and a 36 MB JSON body of 2.5 M labels (each at most twice a
second, one at a time), and slowloris (1,500 connections that trickle a header a byte a
second). Three arms in one run, quiet,
hostile and unauthenticated, against the same gateway (local backend); /healthz is
probed throughout.

    python bench/hostile.py [--quick] [--duration 15] [--baseline DIR]

``--baseline DIR``: the same arms again against the gateway of another checkout (e.g.
the commit before, ``git archive 9cbaf98 | tar -x -C DIR``), side by side.

Reports honest agents' status p99 and /healthz p99 in each arm, their ratio, and every
5xx the gateway answered. Last line: one JSON object with honest_p99_ms_quiet,
honest_p99_ms_hostile, ratio (target <= 2), honest_p99_ms_unauth, unauth_ratio (target
<= 2), server_errors (target 0) and honest_lost_<arm>: honest requests that got no answer
at all (checked: any lost, and the run exits 4 naming the arm, after the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, KeepAliveGet, finish, pct, sponsored_agents  # noqa: E402

BIG = 2**63


def hostile_bodies(workdir: str) -> list[tuple[str, str, str]]:
    """(method, path, raw body): the largest valid requests and a spread of invalid ones.
    The valid jobs exit at once (on a real facility a job's CPU is a compute node's, not
    the gateway's); all their cost to corral is in reading, parsing and recording them."""
    script = "#!/bin/bash\nexit 0\n" + "".join(f"echo line {i} $(( {i} * 3 )) | grep -v x >> out.txt\n"
                                              for i in range(5400))
    env = {f"V{i}": "x" * 480 for i in range(256)}
    return [
        ("POST", "/v1/jobs", json.dumps({"command": "true; echo " + "a" * 65_000, "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"script": script[:262_000], "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"command": "true", "env": env, "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"command": ":(){ :|:& };: # " + "x" * 60_000, "walltime": "1m"})),
        ("POST", "/v1/advice", json.dumps({"script": script[:262_000]})),
        ("POST", "/v1/jobs", json.dumps({"command": "echo " + "a" * 70_000})),  # over the limit
        ("GET", f"/v1/jobs/{BIG}", ""), ("POST", "/v1/jobs/wait", '{"ids": [%d]}' % BIG),
        ("POST", "/v1/jobs", '{"command": "x", "memory": 1e400}'), ("POST", "/v1/jobs", '{"command": "a\\u0000b"}'),
        ("POST", "/v1/jobs", "{not json" + "x" * 100_000), ("GET", "/v1/jobs/batch", ""),
        ("POST", "/v1/jobs", json.dumps({"command": "x", "env": {f"V{i}": "x" for i in range(5000)}})),
    ]


async def probe(port: int, token: str, until: float, out: list[float], failed: list[int]) -> None:
    c = KeepAliveGet(port, token)
    try:
        while time.perf_counter() < until:
            t = time.perf_counter()
            try:
                await asyncio.wait_for(c.get("/healthz"), 30)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                failed.append(1)  # counted, and its time too: a probe that could not get an answer
                c.close()
                c = KeepAliveGet(port, token)
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.02)
    finally:
        c.close()


LOST = 599
"""An honest request that got no answer at all (refused at connect, reset, closed, timed
out): worse than any status, and checked: a run that loses one exits 4 naming the arm."""


async def honest(c: KeepAliveGet, h: httpx.AsyncClient, job_id: int, until: float, lat: list[float],
                 errors: list[int], refused: list[int]) -> None:
    rng = random.Random(job_id)
    while time.perf_counter() < until:
        t = time.perf_counter()
        try:
            status, _ = await asyncio.wait_for(c.get(f"/v1/jobs/{job_id}"), 30)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            status = LOST
            c.close()
            c.reader = c.writer = None
        lat.append((time.perf_counter() - t) * 1000)
        if status >= 500:
            errors.append(status)
        elif status >= 400:
            refused.append(status)
        if rng.random() < 0.02:  # an agent's loop submits now and then
            try:
                code = (await h.post("/v1/jobs", json={"command": "true", "walltime": "1m"})).status_code
            except httpx.TransportError:
                code = LOST
            if code >= 500:
                errors.append(code)
            elif code >= 400:
                refused.append(code)
        await asyncio.sleep(0.2)  # an agent's pace: 5 polls a second, 100/s for 20 agents


async def attacker(h: httpx.AsyncClient, bodies: list[tuple[str, str, str]], until: float, errors: list[int],
                   sent: list[int]) -> None:
    i = 0
    while time.perf_counter() < until:
        method, path, body = bodies[i % len(bodies)]
        i += 1
        # A fresh byte each time: no cache (risk tags, decisions) may answer for it.
        body = body.replace("a" * 8, f"{i:08d}", 1) if "a" * 8 in body else body.replace("line 1 ", f"line {i} ", 1)
        r = await h.request(method, path, content=body)
        sent.append(r.status_code)
        if r.status_code >= 500:
            errors.append(r.status_code)


def attackers(url: str, tokens: list[str], bodies: list[tuple[str, str, str]], duration: float,
              ready: Any, out: Any) -> None:
    """The hostile clients, in a process of their own: building and sending their bodies
    must not slow the loop that times the honest agents (on a facility they are other
    machines; here they still share the gateway's 2 cores)."""
    async def run() -> tuple[int, int]:
        errors: list[int] = []
        sent: list[int] = []
        clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {t}",
                                                             "Content-Type": "application/json"}, timeout=120)
                   for t in tokens]
        ready.set()
        try:
            until = time.perf_counter() + duration
            await asyncio.gather(*(attacker(h, bodies, until, errors, sent) for h in clients))
        finally:
            for h in clients:
                await h.aclose()
        return len(sent), len(errors)

    out.put(asyncio.run(run()))


SOURCE = "127.0.0.2"
"""The unauthenticated attackers' address: another client to the gateway (all of 127/8 is loopback)."""


async def open_from(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(SOURCE, 0))


async def send_and_read(port: int, data: bytes, counts: dict[str, int]) -> None:
    """Send a whole request as fast as the socket takes it; count the answer's status."""
    try:
        r, w = await open_from(port)
    except OSError:
        counts["connect_failed"] = counts.get("connect_failed", 0) + 1
        return
    try:
        w.write(data)
        with contextlib.suppress(OSError):
            await asyncio.wait_for(w.drain(), 60)
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60)
        key = head[9:12].decode()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        key = "closed_unanswered"  # a refusal may close before the client reads it
    except asyncio.TimeoutError:
        key = "no_answer_60s"
    finally:
        w.close()
    counts[key] = counts.get(key, 0) + 1


def big_header() -> bytes:
    return b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8_000_000 + b"\r\n\r\n"


def big_body() -> bytes:
    body = json.dumps({"command": "true", "labels": {f"k{i}": "v" for i in range(2_500_000)}}).encode()
    return (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


async def repeat(port: int, data: bytes, until: float, counts: dict[str, int], per_s: float = 2.0) -> None:
    """At most ``per_s`` attempts a second, one at a time: the gateway's cost per attack is
    measured, not the attacker's CPU (it shares this machine's cores with the gateway)."""
    while time.perf_counter() < until:
        t = time.perf_counter()
        await send_and_read(port, data, counts)
        await asyncio.sleep(max(0.0, 1 / per_s - (time.perf_counter() - t)))


async def slowloris(port: int, until: float, counts: dict[str, int], n: int = 1500) -> None:
    """n connections, each sending a header a byte a second, opened again when closed."""
    async def one(i: int) -> None:
        while time.perf_counter() < until:
            try:
                r, w = await open_from(port)
            except OSError:
                counts["connect_failed"] = counts.get("connect_failed", 0) + 1
                await asyncio.sleep(1)
                continue
            counts["opened"] = counts.get("opened", 0) + 1
            try:
                w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while time.perf_counter() < until and not w.is_closing() and not r.at_eof():
                    w.write(b"a")
                    await w.drain()
                    await asyncio.sleep(1)
            except OSError:
                pass
            finally:
                w.close()
            await asyncio.sleep(1)  # then a new one: slowloris, not a connection flood
    await asyncio.gather(*(one(i) for i in range(n)))


def unauthenticated(port: int, duration: float, ready: Any, out: Any) -> None:
    """The attackers without a token, in a process of their own."""
    async def run() -> dict[str, dict[str, int]]:
        header: dict[str, int] = {}
        body: dict[str, int] = {}
        slow: dict[str, int] = {}
        header_bytes, body_bytes = big_header(), big_body()  # built before the clock starts
        ready.set()
        until = time.perf_counter() + duration + 1.0
        await asyncio.gather(repeat(port, header_bytes, until, header), repeat(port, body_bytes, until, body),
                             slowloris(port, until, slow))
        return {"huge_header": header, "huge_body": body, "slowloris": slow}

    out.put(asyncio.run(run()))


async def arm(gw: GatewayProcess, tokens: list[str], jobs: list[int], hostile_tokens: list[str],
              duration: float, bodies: list[tuple[str, str, str]], unauth: bool = False) -> dict[str, Any]:
    lat: list[float] = []
    health: list[float] = []
    health_failed: list[int] = []
    errors: list[int] = []
    refused: list[int] = []
    attacks: dict[str, Any] = {}
    sent, hostile_errors = 0, 0
    # Every client is made before the clock starts, as an agent's session holds one
    # (making 20 httpx clients inside the window cost the first second's polls ~250 ms).
    polls = [KeepAliveGet(gw.port, t) for t in tokens]
    posts = [httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=60) for t in tokens]
    proc = None
    if hostile_tokens:
        ctx = multiprocessing.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=attackers, args=(gw.url, hostile_tokens, bodies, duration, ready, out))
        proc.start()
        await asyncio.to_thread(ready.wait, 60)
    elif unauth:
        ctx = multiprocessing.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=unauthenticated, args=(gw.port, duration, ready, out))
        proc.start()
        await asyncio.to_thread(ready.wait, 60)
        await asyncio.sleep(1.0)  # the attackers' bodies built, their connections opening
    until = time.perf_counter() + duration
    try:
        await asyncio.gather(*(honest(c, h, j, until, lat, errors, refused) for c, h, j in zip(polls, posts, jobs)),
                             probe(gw.port, gw.token, until, health, health_failed))
        if proc is not None and unauth:
            attacks = await asyncio.to_thread(out.get, True, 300)
            proc.join(30)
        elif proc is not None:
            sent, hostile_errors = await asyncio.to_thread(out.get, True, 120)
            proc.join(30)
    finally:
        for c in polls:
            c.close()
        for h in posts:
            await h.aclose()
    return {"status_p50_ms": round(pct(lat, 50), 2), "status_p99_ms": round(pct(lat, 99), 2),
            "healthz_p99_ms": round(pct(health, 99), 2), "polls": len(lat), "hostile_requests": sent,
            "server_errors": len(errors) + hostile_errors, "healthz_failed": len(health_failed),
            "honest_lost": errors.count(LOST), "honest_refused": len(refused),
            **({"attacks": attacks} if unauth else {})}


def run_all(duration: float, pythonpath: str | None) -> dict[str, Any]:
    """The three arms against one gateway (of ``pythonpath``'s corral, if given)."""
    # The facility's default rate limits stay on: they are part of the defence measured.
    env = {"CORRAL_LOCAL_CPUS": "2", "CORRAL_FASTLANE": "false", "CORRAL_RATE_API_PER_S": "50",
           "CORRAL_RATE_SUBMIT_PER_MIN": "600", "CORRAL_AGENT_MAX_ACTIVE_JOBS": "2000"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with contextlib.chdir(pythonpath or "."):  # `python -m` puts its cwd first on the path: the tree's own corral
        gw = GatewayProcess(env=env)
    try:
        tokens = sponsored_agents(gw, 25)
        honest_tokens, hostile_tokens = tokens[:20], tokens[20:]
        workdir = str(gw.home)
        jobs = []
        for t in honest_tokens:
            with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=60) as h:
                jobs.append(h.post("/v1/jobs", json={"command": "sleep 600", "walltime": "15m"}).json()["id"])
        bodies = hostile_bodies(workdir)
        uvloop.install()
        quiet = asyncio.run(arm(gw, honest_tokens, jobs, [], duration, bodies))
        loud = asyncio.run(arm(gw, honest_tokens, jobs, hostile_tokens, duration, bodies))
        unauth = asyncio.run(arm(gw, honest_tokens, jobs, [], duration, bodies, unauth=True))
        rss_mb = int(Path(f"/proc/{gw.proc.pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024
    finally:
        with contextlib.suppress(httpx.HTTPError), gw.client() as h:  # local jobs outlive the gateway: end them
            live = h.get("/v1/jobs", params={"state": ["PENDING", "RUNNING"], "limit": 1000}).json()["jobs"]
            if live:
                h.post("/v1/jobs/cancel", json={"ids": [j["id"] for j in live]})
        gw.stop()

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    return {"honest_p99_ms_quiet": quiet["status_p99_ms"], "honest_p99_ms_hostile": loud["status_p99_ms"],
            "ratio": ratio(loud["status_p99_ms"], quiet["status_p99_ms"]),
            "honest_p99_ms_unauth": unauth["status_p99_ms"],
            "unauth_ratio": ratio(unauth["status_p99_ms"], quiet["status_p99_ms"]),
            "healthz_p99_ms_quiet": quiet["healthz_p99_ms"], "healthz_p99_ms_hostile": loud["healthz_p99_ms"],
            "healthz_p99_ms_unauth": unauth["healthz_p99_ms"], "hostile_requests": loud["hostile_requests"],
            "server_errors": quiet["server_errors"] + loud["server_errors"] + unauth["server_errors"],
            "honest_lost_quiet": quiet["honest_lost"], "honest_lost_hostile": loud["honest_lost"],
            "honest_lost_unauth": unauth["honest_lost"],
            "rss_mb_after": rss_mb, "quiet": quiet, "hostile": loud, "unauth": unauth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 s per arm")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per arm (default 15)")
    ap.add_argument("--baseline", type=Path, help="another checkout whose gateway runs the same arms, side by side")
    args = ap.parse_args()
    duration = 4.0 if args.quick else args.duration
    here = str(Path(__file__).resolve().parent.parent)
    out: dict[str, Any] = {"bench": "hostile", "duration_s": duration, "honest_agents": 20, "hostile_clients": 5,
                           **run_all(duration, here)}
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}), flush=True)  # kept if the baseline fails
    if args.baseline:
        out["baseline"] = {"tree": str(args.baseline), **run_all(duration, str(args.baseline.resolve()))}
    for name, r in [("this tree", out), *([("baseline", out["baseline"])] if args.baseline else [])]:
        print(f"{name}: honest status p99 {r['honest_p99_ms_quiet']} ms quiet, {r['honest_p99_ms_hostile']} ms "
              f"under {r['hostile_requests']} hostile requests (x{r['ratio']}), {r['honest_p99_ms_unauth']} ms "
              f"under unauthenticated attackers (x{r['unauth_ratio']}); /healthz p99 {r['healthz_p99_ms_quiet']} / "
              f"{r['healthz_p99_ms_hostile']} / {r['healthz_p99_ms_unauth']} ms; 5xx: {r['server_errors']}; "
              f"honest requests lost (no answer) {r['honest_lost_quiet']} / {r['honest_lost_hostile']} / "
              f"{r['honest_lost_unauth']}; attacks answered: {r['unauth'].get('attacks')}")
    lost = [arm for arm in ARMS if out[arm]["honest_lost"]]
    # The honest agents polled in each arm, the hostile clients' requests were sent, and each
    # unauthenticated attack was made (answered, refused or cut: what it met is the figure).
    attacks = out["unauth"].get("attacks", {})
    finish("hostile", out, {**{arm: out[arm]["polls"] > 0 for arm in ARMS},
                            "hostile requests": out["hostile"]["hostile_requests"] > 0,
                            **{f"unauth {kind}": sum(attacks.get(kind, {}).values()) > 0
                               for kind in ("huge_header", "huge_body", "slowloris")}})
    if lost:
        print("bench/hostile.py: honest requests lost (no answer) in "
              + ", ".join(f"{arm} ({out[arm]['honest_lost']})" for arm in lost), file=sys.stderr)
        raise SystemExit(4)


ARMS = ("quiet", "hostile", "unauth")


if __name__ == "__main__":
    main()
