"""Notifications to sponsors (issue 51 item 2), through a real gateway, real HTTP, a real
webhook receiver and a real SMTP server (aiosmtpd): who is told what, where, once."""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, add_people, free_port, running
from corral.core.config import NotifySettings
from corral.notify import compose
from corral.notify.prefs import checked, effective


class Hook:
    """A webhook receiver: every POST kept (headers and body); ``fail`` answers 500."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.fail = False
        self.port = free_port()
        hook = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hook.fail:
                    self.send_response(500)
                else:
                    hook.got.append({"headers": dict(self.headers), "body": body.decode()})
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alice"

    def ids(self) -> list[str]:
        return [h["headers"]["Corral-Notification-Id"] for h in self.got]


@contextlib.contextmanager
def hook() -> Iterator[Hook]:
    h = Hook()
    try:
        yield h
    finally:
        h.srv.shutdown()


def until(pred: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not within {within} s")


def settle(gw: Gateway, token: str, job_id: int) -> dict[str, Any]:
    with gw.http(token) as h:
        return h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 60}).json()


NOTIFY = {"CORRAL_NOTIFY__WEBHOOK_HOSTS": '["127.0.0.1"]'}


def test_a_sponsor_is_told_of_a_failed_job_once_and_not_of_a_success(tmp_path: Path, agent_dir: Path) -> None:
    with hook() as h, running(tmp_path, **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            r = a.put("/v1/notify", json={"webhook": h.url, "jobs": "failures"})
            assert r.status_code == 200, r.text
            assert r.json()["effective"]["jobs"] == "failures"
        with gw.http(t["bot1"]) as b:
            ok = b.post("/v1/jobs", json={"command": "true", "workdir": str(agent_dir), "name": "fine"}).json()["id"]
            bad = b.post("/v1/jobs", json={"command": "exit 3", "workdir": str(agent_dir), "name": "broken"}).json()["id"]
        settle(gw, t["bot1"], ok)
        assert settle(gw, t["bot1"], bad)["state"] == "FAILED"
        until(lambda: h.got)
        time.sleep(1.5)  # three more ticks: nothing else may come
        assert len(h.got) == 1, h.got
        body = json.loads(h.got[0]["body"])
        assert f"job {bad} of bot1 FAILED exit 3" in body["subject"]
        assert "broken" in body["body"] and "sponsored by alice" in body["body"]
        with gw.http(t["alice"]) as a:
            sent = a.get("/v1/notify/sent").json()["notifications"]
        assert [(n["kind"], n["state"], n["about"]) for n in sent] == [("job", "sent", "bot1")]


def test_nothing_is_lost_or_told_twice_across_a_kill_9(tmp_path: Path, agent_dir: Path) -> None:
    """The webhook is down when the job ends; the gateway is killed -9 with the notification
    waiting; after a restart it is delivered, once (by its id)."""
    with hook() as h, running(tmp_path, **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "all"}).status_code == 200
        h.fail = True
        with gw.http(t["bot1"]) as b:
            ids = [b.post("/v1/jobs", json={"command": f"exit {i}", "workdir": str(agent_dir)}).json()["id"]
                   for i in range(3)]
        for i in ids:
            settle(gw, t["bot1"], i)
        with gw.http(t["alice"]) as a:  # each tried once at least, failed, kept for later
            until(lambda: len([n for n in a.get("/v1/notify/sent").json()["notifications"] if n["attempts"]]) == 3)
        gw.kill(signal.SIGKILL)
        h.fail = False
        gw.start()
        until(lambda: len(h.got) >= 3, within=60)
        time.sleep(1.5)
        assert sorted(h.ids()) == sorted(set(h.ids())) and len(h.got) == 3, h.ids()
        told = sorted(json.loads(x["body"])["subject"].split()[2] for x in h.got)
        assert told == sorted(str(i) for i in ids)


def test_email_through_a_real_smtp_server_and_a_refusal_told(tmp_path: Path, agent_dir: Path) -> None:
    from aiosmtpd.controller import Controller

    got: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
            got.append(envelope)
            return "250 OK"

    port = free_port()
    smtp = Controller(Handler(), hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        with running(tmp_path, CORRAL_NOTIFY__SMTP_HOST="127.0.0.1", CORRAL_NOTIFY__SMTP_PORT=str(port)) as gw:
            t = add_people(gw)
            with gw.http(t["alice"]) as a:
                r = a.put("/v1/notify", json={"email": "alice@uni.example", "jobs": "none"})
                assert r.status_code == 200, r.text
            with gw.http(t["bot1"]) as b:
                r = b.post("/v1/jobs", json={"command": "cat ~/.ssh/id_rsa", "workdir": str(agent_dir)})
                assert r.status_code == 403, r.text
                again = b.post("/v1/jobs", json={"command": "cat ~/.ssh/id_ed25519", "workdir": str(agent_dir)})
                assert again.status_code == 403
            until(lambda: got)
            time.sleep(1.5)
            assert len(got) == 1, "a second refusal by the same rule within the hour is not told again"
            mail = got[0].content.decode()
            assert got[0].rcpt_tos == ["alice@uni.example"]
            assert "bot1 was refused (agents-no-harmful-commands)" in mail
            assert "deny:bot1:agents-no-harmful-commands" in mail
    finally:
        smtp.stop()


def test_who_may_choose_and_what_is_refused(gateway: Gateway) -> None:
    t = add_people(gateway)
    with gateway.http(t["bot1"]) as b:
        r = b.put("/v1/notify", json={"jobs": "none"})
        assert r.status_code == 403 and "ask your sponsor (alice)" in r.json()["error"]["hint"]
        assert b.get("/v1/notify").json()["principal"] == "bot1"  # it may read its own
    with gateway.http(t["carol"]) as c:  # not bot1's sponsor; a missing name answers alike
        for name in ("bot1", "nobody-at-all"):
            r = c.put("/v1/notify", params={"principal": name}, json={"jobs": "all"})
            assert r.status_code == 403 and "do not sponsor" in r.json()["error"]["message"], r.text
    with gateway.http(t["alice"]) as a:
        r = a.put("/v1/notify", params={"principal": "bot1"}, json={"jobs": "all"})
        assert r.status_code == 200 and r.json()["effective"]["jobs"] == "all"
        r = a.put("/v1/notify", json={"webhook": "https://169.254.169.254/latest/meta-data"})
        assert r.status_code == 400 and "not allowed here" in r.json()["error"]["message"]
        assert "[notify] webhook_hosts" in r.json()["error"]["hint"]
        r = a.put("/v1/notify", json={"email": "alice@uni.example"})
        assert r.status_code == 400 and "sends no email" in r.json()["error"]["message"]
        r = a.put("/v1/notify", json={"quiet_hours": "25-7"})
        assert r.status_code == 400 and "HH-HH" in r.json()["error"]["message"]
        r = a.put("/v1/notify", json={"pager": "yes"})
        assert r.status_code in (400, 422) and "pager" in r.text
    cp = gateway.cli("--json", "notify", "set", "--jobs", "sometimes", token=t["alice"])
    assert cp.returncode == 2
    cp = gateway.cli("--json", "notify", "set", "--jobs", "all", "--quiet", "22-07", token=t["alice"])
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["effective"] == {**json.loads(cp.stdout)["effective"], "jobs": "all",
                                                  "quiet_hours": "22-07"}
    cp = gateway.cli("notify", "show", token=t["alice"])
    assert "job ends: all" in cp.stdout and "quiet hours: 22-07" in cp.stdout


def test_quiet_hours_and_digest_and_no_secret_in_a_note() -> None:
    site = NotifySettings(webhook_hosts=["hooks.example"])
    eff = effective(checked({"webhook": "https://hooks.example/x", "quiet_hours": "22-07"}, site).model_dump(), site)
    night = time.mktime((2026, 12, 7, 23, 30, 0, 0, 0, -1))
    morning = time.mktime((2026, 12, 8, 7, 0, 0, 0, 0, -1))
    assert eff.quiet_until(night) == morning
    assert eff.quiet_until(time.mktime((2026, 12, 8, 3, 0, 0, 0, 0, -1))) == morning
    assert eff.quiet_until(time.mktime((2026, 12, 8, 12, 0, 0, 0, 0, -1))) is None
    note = compose.denial({"principal": "bot1", "rule": "r", "action": "submit",
                           "reason": "read AKIAIOSFODNN7EXAMPLE and ghp_" + "a" * 36})
    assert "AKIAIOSFODNN7EXAMPLE" not in note.body and "ghp_" + "a" * 36 not in note.body
    headers, body = compose.webhook_body("slack", "<!channel> s", "b <@here>", [{"key": "k", "kind": "job"}])
    assert b"<!channel>" not in body and b"&lt;!channel&gt;" in body
    headers, body = compose.webhook_body("ntfy", "subject", "body", [{"key": "k", "kind": "job"}])
    assert headers["Title"] == "subject" and body == b"body"


def test_an_unreachable_webhook_delays_no_request(tmp_path: Path, agent_dir: Path) -> None:
    """Deliveries that hang (a port that takes the connection and never answers) are
    bounded by their timeout and run beside the requests: a status poll stays fast."""
    import socket

    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1000)
    port = sink.getsockname()[1]
    try:
        with running(tmp_path, **NOTIFY) as gw:
            t = add_people(gw)
            with gw.http(t["alice"]) as a:
                a.put("/v1/notify", json={"webhook": f"http://127.0.0.1:{port}/x", "jobs": "all"})
            with gw.http(t["bot1"]) as b:
                r = b.post("/v1/jobs/batch", json={"jobs": [{"command": "true", "workdir": str(agent_dir)}] * 40})
                ids = [j["id"] for j in r.json()["jobs"]]
                for i in ids:
                    settle(gw, t["bot1"], i)
                slow = []
                for _ in range(30):
                    t0 = time.monotonic()
                    assert b.get(f"/v1/jobs/{ids[0]}").status_code == 200
                    slow.append(time.monotonic() - t0)
            assert sorted(slow)[-2] < 1.0, slow  # a hang would be the delivery's 5 s timeout
            with gw.http(t["alice"]) as a:
                states = {n["state"] for n in a.get("/v1/notify/sent", params={"limit": 100}).json()["notifications"]}
            assert states == {"pending"}, states
    finally:
        sink.close()


@pytest.mark.parametrize("fmt", ["generic", "ntfy", "slack"])
def test_each_webhook_format_is_delivered(tmp_path: Path, fmt: str) -> None:
    with hook() as h, running(tmp_path, **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "webhook_format": fmt}).status_code == 200
            assert a.post("/v1/notify/test").json()["queued"] == 1
        until(lambda: h.got)
        got = h.got[0]
        if fmt == "ntfy":
            assert got["headers"]["Title"] == "[corral] test notification"
        else:
            text = json.loads(got["body"])["text" if fmt == "slack" else "body"]
            assert "test notification for alice" in text
        out = until(lambda: next((o for o in [gw.cli("notify", "sent", token=t["alice"]).stdout] if " sent " in o), None))
        assert "test" in out and "webhook:" + fmt in out


def test_a_sponsor_is_told_each_budget_level_once(tmp_path: Path, agent_dir: Path) -> None:
    """A 1 CPU-hour token; each job reserves 1 CPU x 20 min (a third): the first takes it
    past nothing, the second past 50%, the third to 100%; a fourth is refused (told as a
    refusal, not again as a level)."""
    with hook() as h, running(tmp_path, **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none", "denials": False}).status_code == 200
            tok = a.post("/v1/tokens", json={"for": "bot1", "expires": "1h", "cpu_hours": 1}).json()["token"]
        with gw.http(tok) as b:
            codes = [b.post("/v1/jobs", params={"hold": "true"}, json={
                "command": "sleep 30", "workdir": str(agent_dir), "cpus": 1, "walltime": "20m"}).status_code
                for _ in range(4)]
        assert codes[:3] == [201, 201, 201] and codes[3] >= 400, codes
        until(lambda: len(h.got) >= 2)
        time.sleep(1.5)
        subjects = sorted(json.loads(x["body"])["subject"] for x in h.got)
        assert subjects == ["[corral] bot1 has used 100% of its cpu_hours budget",
                            "[corral] bot1 has used 50% of its cpu_hours budget"], subjects
