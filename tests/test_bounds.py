"""Bounded work before authentication (issue 39): a real gateway process over real
sockets, refusing what no honest client sends with its own status and a sentence, while
it keeps answering everyone else."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx

from tests.conftest import Gateway, running


def raw(gw: Gateway, data: bytes, source: str = "127.0.0.1", read_s: float = 15.0) -> tuple[int, dict]:
    """Send these bytes as they are; -> (status, JSON error body) of the answer."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=read_s, source_address=(source, 0)) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending: the answer is still there to read
        return read_answer(s)


def read_answer(s: socket.socket) -> tuple[int, dict]:
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < length(got):
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body or b"{}")


def length(got: bytes) -> int:
    for line in got.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def healthy(gw: Gateway) -> bool:
    return httpx.get(f"{gw.url}/healthz", timeout=5).status_code == 200


def test_a_huge_header_is_refused_431_before_it_is_read(gateway: Gateway) -> None:
    # 16 MB of one header: refused at 64 KiB, the rest never parsed.
    status, body = raw(gateway, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16_000_000 + b"\r\n\r\n")
    assert status == 431, body
    assert body["error"]["code"] == "headers_too_large" and "65536 bytes" in body["error"]["message"]
    status, body = raw(gateway, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n")
    assert status == 431 and "100 headers" in body["error"]["message"], body
    assert healthy(gateway)


def test_a_body_over_the_route_limit_is_refused_413_from_its_length(gateway: Gateway) -> None:
    # No token, and Content-Length says 50 MB: refused before a byte of the body is sent.
    status, body = raw(gateway, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 50000000\r\n\r\n")
    assert status == 413 and body["error"]["code"] == "body_too_large", body
    assert "at most 1,048,576" in body["error"]["message"]
    # Chunked, so no length to judge by: refused as it streams past the bound.
    chunk = b"%x\r\n%s\r\n" % (60_000, b"[" * 60_000)
    status, body = raw(gateway, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 40)
    assert status == 413, body
    assert healthy(gateway)


def test_a_large_body_without_a_valid_token_is_401_unparsed(gateway: Gateway) -> None:
    body = json.dumps({"command": "true", "labels": {f"k{i}": "v" for i in range(60_000)}})
    r = httpx.post(f"{gateway.url}/v1/jobs", content=body, headers={"Content-Type": "application/json"},
                   timeout=30)
    assert r.status_code == 401, r.text
    deep = "[" * 5000 + "]" * 5000
    with gateway.http() as h:
        r = h.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "deeper than 32 levels" in r.json()["error"]["message"], r.text


def test_half_sent_requests_time_out_408(tmp_path: Path) -> None:
    with running(tmp_path, CORRAL_HTTP__HEADER_TIMEOUT_S="1", CORRAL_HTTP__BODY_TIMEOUT_S="1") as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
            status, body = read_answer(s)
        assert status == 408 and "headers did not arrive within 1 s" in body["error"]["message"], body
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"comm")
            status, body = read_answer(s)
        assert status == 408 and "body did not arrive" in body["error"]["message"], body
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:  # says nothing at all
            t = time.monotonic()
            assert s.recv(10) == b""
            assert time.monotonic() - t < 8
        assert healthy(gw)


# Connection caps: tests/test_bounds_connections.py (counted per network, idle ones closed first).


def test_inputs_that_reached_a_500_answer_400_with_a_sentence(gateway: Gateway) -> None:
    """Each of these answered 500 (or was silently changed) before."""
    bad = [("/v1/jobs", '{"command": "true", "env": {"A": "x\\ud800y"}}', "half of a UTF-16 surrogate pair"),
           ("/v1/jobs", '{"command": "true", "labels": {"k": "\\udc00"}}', "labels.k holds half"),
           ("/v1/jobs", '{"command": "true", "labels": {"\\ud800k": "v"}}', "a key of labels holds half"),
           ("/v1/tokens", '{"for": "admin", "note": "n\\ud800"}', "note holds half"),
           ("/v1/tokens", '{"for": "admin", "note": "a\\u0000b"}', "note holds a NUL"),
           ("/v1/notes", '{"text": "a\\u0000b"}', "text holds a NUL"),
           ("/v1/jobs/batch", '{"jobs": [{"command": "true"}], "array": "1-' + "9" * 190 + '"}', "4000000"),
           ("/v1/jobs", '{"command": "true", "after_ok": [1, 1]}', "after_ok names job 1 twice")]
    with gateway.http() as h:
        for path, body, words in bad:
            r = h.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (path, body, r.text)
            assert words in r.json()["error"]["message"], (body, r.text)
        assert h.get("/v1/tokens").status_code == 200
        assert h.post("/v1/jobs", json={"command": "true", "labels": {"k": "\U0001F600"}}).status_code == 201


def test_corral_records_reach_only_its_own_plain_handlers(tmp_path: Path) -> None:
    """The MCP SDK calls logging.basicConfig with a Rich handler (rich tracebacks held the
    loop 1-2 s per 500); the gateway's logging is set first, so it installs nothing, and
    corral's records stop at corral's own handler whatever is on the root logger."""
    import logging

    from mcp.server.mcpserver.utilities.logging import configure_logging

    from corral.core.config import Settings
    from corral.edges.http.serve import setup_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("corral").handlers[:])
    try:
        setup_logging(Settings(home=tmp_path / "home"))
        configure_logging("INFO")  # what building the gateway's MCP server does
        logger, seen = logging.getLogger("corral.edges.http.app"), []
        while logger is not None:
            seen += logger.handlers
            logger = logger.parent if logger.propagate else None  # type: ignore[assignment]
        assert seen and all(type(h).__name__ == "QueueHandler" for h in seen), seen
        assert not any(type(h).__name__ == "RichHandler" for h in root.handlers), root.handlers
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("corral.edges.http.app").exception("unexpected error on POST /v1/jobs")
        deadline = time.monotonic() + 5
        log = tmp_path / "home" / "gateway.log"
        while "ValueError: boom" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Traceback (most recent call last)" in log.read_text()
    finally:
        root.handlers[:], _, _ = saved[0], None, None
        root.setLevel(saved[1])
        logging.getLogger("corral").handlers[:] = saved[2]
        logging.getLogger("corral").propagate = True


def test_sigterm_drains_and_exits_0(tmp_path: Path) -> None:
    import signal

    with running(tmp_path) as gw:
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(20) == 0


def test_healthz_shows_the_reconciler_beating_on_an_idle_gateway(gateway: Gateway) -> None:
    deadline = time.monotonic() + 30  # its first tick
    while (h := httpx.get(f"{gateway.url}/healthz", timeout=5)).json().get("last_tick") is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert h.status_code == 200, h.text
    body = h.json()
    assert body["last_tick"] is not None and time.time() - body["last_beat"] < 5, body
    assert body["loops"]["reconciler"] == "running" and body["stalled"] == [], body


def test_healthz_fails_when_the_reconciler_stalls(tmp_path: Path) -> None:
    with running(tmp_path, CORRAL_FAULT="reconciler_stall", CORRAL_MAX_BACKOFF_S="0.5") as gw:
        deadline = time.monotonic() + 30  # stalled after 3 x 0.5 + 10 x 0.2 s of silence
        while (r := httpx.get(f"{gw.url}/healthz", timeout=5)).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert r.status_code == 503 and r.json()["stalled"] == ["reconciler"], r.text


def test_a_removed_scratch_directory_is_made_again(gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    """systemd-tmpfiles' age rule removes /var/tmp/corral-<hash>; an agent's job must still run."""
    import shutil

    from corral.core.config import StorageSettings
    from corral.gateway.storage_verbs import scratch_dir

    scratch = scratch_dir(StorageSettings(), gateway.home.resolve())
    assert scratch.is_dir()
    shutil.rmtree(scratch)
    with gateway.http(people["bot1"]) as h:
        job = h.post("/v1/jobs", json={"command": "echo hi", "workdir": str(agent_dir), "walltime": "1m"})
        assert job.status_code == 201, job.text
        done = h.get(f"/v1/jobs/{job.json()['id']}/wait", params={"timeout": 60}).json()
    assert done["state"] == "COMPLETED", done
    assert (scratch / "workspaces").is_dir()


def test_old_job_events_are_pruned_without_anyone_asking_for_events(tmp_path: Path) -> None:
    import sqlite3

    with running(tmp_path) as gw:
        with gw.http() as h:
            job = h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}).json()["id"]
            h.get(f"/v1/jobs/{job}/wait", params={"timeout": 30})
        gw.kill()
        db = sqlite3.connect(gw.home / "corral.db", isolation_level=None)
        try:
            assert db.execute("SELECT count(*) FROM job_events").fetchone()[0] > 0
            db.execute("UPDATE job_events SET at = at - 8 * 86400")  # older than the week kept
        finally:
            db.close()
        gw.start()  # no one calls /v1/events
        deadline = time.monotonic() + 20
        while (left := events(gw.home)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == 0


def events(home: Path) -> int:
    import sqlite3

    db = sqlite3.connect(home / "corral.db", isolation_level=None)
    try:
        return int(db.execute("SELECT count(*) FROM job_events").fetchone()[0])
    finally:
        db.close()
