"""Sponsors' notifications (issue 51): how soon a sponsor hears of a job's end, and what
1,000 notifications waiting on a webhook that never answers cost everyone else's requests.

Latency: a real gateway; a sponsor's webhook is a local receiver; an agent runs short jobs
one after another; each notification's arrival minus its job's recorded end.

Requests under pending notifications, side by side: two gateways at once, the same jobs;
one holds 1,000 notifications for 100 sponsors whose webhook takes the connection and
never answers (each try then lasts the delivery timeout), the other none. Status polls
alternate between the two, so both arms see the same machine at the same moments; the
ratio of their p99s is the cost.

    python bench/notify.py [--quick]

Last line: one JSON object (notify_p50_ms, notify_p99_ms, p99_ratio_unreachable, ...).
"""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402

ENV = {"CORRAL_NOTIFY__WEBHOOK_HOSTS": '["127.0.0.1"]', "CORRAL_NOTIFY__FLOOD_PER_HOUR": "0"}
"""(No flood bound: the latency arm's jobs all tell one sponsor, as fast as they end.)"""


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[int, float] = {}
        me = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                at = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                words = body["subject"].split()  # "[corral] job 41 of bot ..."
                if words[1] == "job":
                    me.arrivals.setdefault(int(words[2]), at)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def people(gw: GatewayProcess, webhook: str, sponsors: int = 1) -> str:
    """Sponsors with ``webhook`` (all job ends), an agent under the first -> its token."""
    with gw.client() as h:
        for i in range(sponsors):
            h.post("/v1/principals", json={"name": f"sponsor{i}", "kind": "human"})
            tok = h.post("/v1/tokens", json={"for": f"sponsor{i}", "expires": "2h"}).json()["token"]
            r = h.put("/v1/notify", json={"webhook": webhook, "jobs": "all"},
                      headers={"Authorization": f"Bearer {tok}"})
            assert r.status_code == 200, r.text
        h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "sponsor0"})
        return h.post("/v1/tokens", json={"for": "bot", "expires": "2h"}).json()["token"]


def latency_arm(gw: GatewayProcess, rx: Receiver, jobs: int) -> list[float]:
    token = people(gw, f"http://127.0.0.1:{rx.port}/hook")
    out = []
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as b:
        for _ in range(jobs):
            j = b.post("/v1/jobs", json={"command": "true", "workdir": "/tmp"}).json()["id"]
            end = b.get(f"/v1/jobs/{j}/wait", params={"timeout": 60}).json()["end_time"]
            deadline = time.monotonic() + 30
            while j not in rx.arrivals and time.monotonic() < deadline:
                time.sleep(0.005)
            if j in rx.arrivals:
                out.append((rx.arrivals[j] - end) * 1000)
    return out


def pending(gw: GatewayProcess, n: int, sponsors: int, hook: str) -> None:
    """``n`` notifications waiting for ``sponsors`` sponsors, as n job ends would leave them."""
    from corral.core.db import Database

    db = Database(gw.home / "corral.db")
    now = time.time()
    db.notifications.enqueue([{"key": f"bench:{i}", "recipient": f"sponsor{i % sponsors}", "about": "bot",
                               "kind": "job", "channel": "webhook:generic", "target": hook,
                               "subject": f"[corral] job {i} of bot FAILED", "body": "x" * 300,
                               "created": now, "due": now} for i in range(n)])
    db.close()


def waiting(gw: GatewayProcess) -> int:
    """Notifications still waiting on the loaded gateway (none can be delivered)."""
    import sqlite3

    with sqlite3.connect(gw.home / "corral.db") as c:
        return int(c.execute("SELECT COUNT(*) FROM notify_outbox WHERE state='pending'").fetchone()[0])


def polls_arm(quiet: GatewayProcess, loaded: GatewayProcess, polls: int, n_pending: int,
              sponsors: int) -> tuple[list[float], list[float], int]:
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(4096)  # connections taken by the kernel, never accepted: every try hangs
    hook = f"http://127.0.0.1:{sink.getsockname()[1]}/never"
    try:
        clients = []
        for gw in (loaded, quiet):
            token = people(gw, hook, sponsors) if gw is loaded else \
                gw.client().post("/v1/tokens", json={"for": "bot", "expires": "2h"}).json()["token"]
            c = httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            j = c.post("/v1/jobs", json={"command": "true", "workdir": "/tmp"}).json()["id"]
            c.get(f"/v1/jobs/{j}/wait", params={"timeout": 60})
            clients.append((c, j))
        pending(loaded, n_pending, sponsors, hook)
        time.sleep(1.5)  # the notifier has taken them up: its tries hang on the sink
        lat: list[list[float]] = [[], []]
        for k in range(polls):
            for arm in ((0, 1) if k % 2 else (1, 0)):
                c, j = clients[arm]
                t0 = time.perf_counter()
                assert c.get(f"/v1/jobs/{j}").status_code == 200
                lat[arm].append((time.perf_counter() - t0) * 1000)
        for c, _ in clients:
            c.close()
        return lat[0], lat[1], waiting(loaded)
    finally:
        sink.close()


def gateways() -> tuple[GatewayProcess, GatewayProcess]:
    """Two gateways, started at once (each start is a few seconds of a loaded CI machine)."""
    made: list[GatewayProcess] = []
    threads = [threading.Thread(target=lambda: made.append(GatewayProcess("--tick", "0.1", "--cpus", "2", env=ENV)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(made) != 2:
        for gw in made:
            gw.stop()
        raise SystemExit("bench/notify.py: a gateway did not start")
    return made[0], made[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer jobs and polls (CI: under 30 s)")
    a = ap.parse_args()
    jobs, polls = (8, 300) if a.quick else (200, 4000)
    quiet, loaded = gateways()
    rx = Receiver()
    try:
        lat = latency_arm(quiet, rx, jobs)
        with_pending, without, left = polls_arm(quiet, loaded, polls, 1000, 100)
    finally:
        quiet.stop()
        loaded.stop()
        rx.srv.shutdown()
    p99_with, p99_without = pct(with_pending, 99), pct(without, 99)
    result = {
        "bench": "notify", "quick": a.quick, "jobs": jobs, "notified": len(lat),
        "notify_p50_ms": round(pct(lat, 50), 1), "notify_p99_ms": round(pct(lat, 99), 1),
        "polls_per_arm": polls, "pending_notifications": left,
        "poll_p50_ms_pending": round(pct(with_pending, 50), 2), "poll_p50_ms_none": round(pct(without, 50), 2),
        "poll_p99_ms_pending": round(p99_with, 2), "poll_p99_ms_none": round(p99_without, 2),
        "p99_ratio_unreachable": round(p99_with / p99_without, 3) if without else None,
    }
    finish("notify", result, {"latency": len(lat) == jobs, "polls_pending": len(with_pending) == polls,
                              "polls_none": len(without) == polls, "notifications_waiting": left >= 900})


if __name__ == "__main__":
    main()
