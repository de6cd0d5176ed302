"""Limits hold across replicas (issue 47 item 12): three real `corral serve` replicas on one
PostgreSQL store, one agent's submissions sent to all three at once over real HTTP. Its
CPU-hour budget, its token's cap on unfinished jobs and the facility's submission burst
each admit exactly what one gateway would: admission reads and reserves them in the
store, under the principal's lock, on every replica (decision 0043). Before, each
replica read what the others had not yet recorded (a 10 CPU-hour budget granted 27) and
kept a burst of its own (three bursts across three). Fails under CI=true without the
server of scripts/postgres-up."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.conftest import Gateway, add_people
from tests.test_ha import replicas

BURST = 6
"""The facility's submission burst in these tests; its refill (1 every 10 minutes) adds nothing meanwhile."""


def volley(gws: list[Gateway], token: str, body: dict, n: int) -> list[httpx.Response]:
    """``n`` submissions of ``body`` (held: recorded, never run), spread round robin over the
    replicas and sent together (released at one barrier) -> their answers."""
    clients = [httpx.Client(base_url=g.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) for g in gws]
    start = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        start.wait()
        return clients[i % len(clients)].post("/v1/jobs", params={"hold": "true"}, json=body)

    try:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for c in clients:
            c.close()


def admitted(answers: list[httpx.Response], refused: int) -> int:
    """How many were admitted (201); every other one was refused with ``refused``, never a 5xx."""
    codes = sorted(r.status_code for r in answers)
    assert set(codes) <= {201, refused}, [r.text for r in answers if r.status_code not in (201, refused)]
    return codes.count(201)


def mine(gw: Gateway, token: str) -> int:
    with gw.http(token) as h:
        return len(h.get("/v1/jobs", params={"limit": 1000}).json()["jobs"])


def test_budget_active_cap_and_burst_hold_across_three_replicas(tmp_path: Path, agent_dir: Path) -> None:
    env = {"CORRAL_SAFETY__RATE_SUBMIT_BURST": str(BURST), "CORRAL_SAFETY__RATE_SUBMIT_PER_MIN": "0.1"}
    with replicas(tmp_path, 3, **env) as (_, gws):
        people = add_people(gws[0])
        with gws[0].http() as h:  # each agent its own: the facility's burst is per principal
            assert h.post("/v1/principals", json={"name": "bot3", "kind": "agent", "sponsor": "alice"}).status_code == 201
        with gws[0].http(people["alice"]) as h:
            # A 4 CPU-hour budget: four 1-CPU, 1-hour jobs fit, a fifth does not.
            budget = h.post("/v1/tokens", json={"for": "bot1", "expires": "1h", "cpu_hours": 4}).json()["token"]
            # At most 5 unfinished jobs under this token.
            capped = h.post("/v1/tokens", json={"for": "bot3", "expires": "1h", "max_active_jobs": 5}).json()["token"]
        job = {"command": "true", "workdir": str(agent_dir), "walltime": "1h", "cpus": 1}

        # All three volleys first, then the counts together: before, every one was over.
        spent = volley(gws, budget, job, 30)
        full = volley(gws, capped, {**job, "walltime": "1m"}, 30)
        # The facility's burst is one, not one per replica: bot2 (no token limits) gets 6 of 30.
        burst = volley(gws, people["bot2"], {**job, "walltime": "1m"}, 30)
        counts = (admitted(spent, 403), admitted(full, 429), admitted(burst, 429))
        assert counts == (4, 5, BURST), f"admitted {counts}: budget 4 jobs, at most 5 unfinished, burst {BURST}"
        assert all("budget" in r.json()["error"]["message"] for r in spent if r.status_code == 403)
        assert all("unfinished jobs" in r.json()["error"]["message"] for r in full if r.status_code == 429)
        refusal = next(r for r in burst if r.status_code == 429)
        assert "submissions of bot2" in refusal.json()["error"]["message"] and int(refusal.headers["Retry-After"]) > 0
        # Recorded: what was admitted, no more.
        assert (mine(gws[0], budget), mine(gws[1], capped), mine(gws[2], people["bot2"])) == (4, 5, BURST)
        # A plan says what a submission would meet now: refused, the burst spent on every replica.
        for g in gws:
            with g.http(people["bot2"]) as h:
                plan = h.post("/v1/plan", json=job).json()
                assert plan["allowed"] is False and "submissions of bot2" in plan["refused"]["message"], plan


def test_replicas_clocks_skew_gives_no_refill() -> None:
    """The facility's buckets are stamped with the replicas' wall clocks: one 10 s behind
    another must not move a stamp back, or an agent alternating between them would be
    refilled 10 s' worth each time (attacked from the code: ``take_stored``)."""
    from corral.core.errors import RateLimited
    from corral.safety.limits import take_stored

    want = [("sub:bot", 1.0, 1.0, 2.0, "submissions of bot")]  # 1 a second, burst 2
    held: dict[str, tuple[float, float]] = {}
    granted = 0
    for i in range(20):  # ahead, behind, ahead, ...: no real time passes
        now = 1000.0 + (10.0 if i % 2 == 0 else 0.0)
        try:
            (row,) = take_stored(held, want, now)
        except RateLimited:
            continue
        held["sub:bot"] = row[1:]
        granted += 1
    assert granted == 2  # the burst, and nothing from the skew
