"""A contained job's egress to a host off the allow-list, asked of its sponsor (issue 51
item 3, decision 0062): the proxy refuses it meanwhile saying who must answer and until
when; approved, that job alone reaches that host:port until it ends; declined or expired,
it stays refused and the agent is told. Real gateway, real bubblewrap-contained jobs, a
real HTTP server as the destination (on an address of this machine that is not loopback:
a grant never reaches the gateway's own loopback), the real proxy."""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from corral.core.destinations import Refused
from corral.safety.policy import DEFAULT_POLICY
from corral.sandbox import egress_grants

from .conftest import Gateway, add_people, file_server, running
from .test_notify import NOTIFY, hook, until
from .test_approvals import asked
from .test_sandbox import need_bwrap

ASK = """
@id("egress-asks-sponsor")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"egress", resource)
when { resource.port > 1024 };
"""

PROBE = r"""
import os, sys, time, urllib.error, urllib.request
url, seconds = os.environ["URL"], float(sys.argv[1])
proxy = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("http_proxy", "")
open("proxy.txt", "w").write(os.environ.get("http_proxy", ""))  # (its output hides the credential: redacted)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
said, deadline = None, time.time() + seconds
while time.time() < deadline:
    try:
        print("GOT", opener.open(url, timeout=10).read().decode(), flush=True)
        if os.environ.get("TUNNEL"):  # and through CONNECT (as HTTPS goes), the credential in its header
            import base64, socket, urllib.parse
            p, t = urllib.parse.urlsplit(proxy), urllib.parse.urlsplit(url)
            auth = base64.b64encode(("%s:%s" % (p.username, p.password)).encode()).decode()
            s = socket.create_connection((p.hostname, p.port), 10)
            s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\nProxy-Authorization: Basic %s\r\n\r\n"
                       % (t.hostname, t.port, t.hostname, t.port, auth)).encode())
            head = s.recv(4096).decode()
            s.sendall(("GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" % (t.path, t.hostname)).encode())
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            print("TUNNEL", head.split("\r\n")[0], got.decode().rsplit("\r\n\r\n", 1)[-1], flush=True)
        sys.exit(0)
    except urllib.error.HTTPError as e:
        text = "REFUSED %d %s" % (e.code, e.read().decode().strip())
    except OSError as e:
        text = "ERROR %s" % e
    if text != said:
        print(text, flush=True)
        said = text
    if "declined by" in text or "expired unanswered" in text:  # final: it stays refused
        sys.exit(1)
    time.sleep(0.3)
print("GAVE-UP", flush=True)
"""


SPRAY = r"""
import os, time, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["http_proxy"]}))
def ask(port):
    try:
        return "GOT %s" % opener.open("%s:%d/" % (os.environ["BASE"], port), timeout=10).status
    except urllib.error.HTTPError as e:
        return e.read().decode().strip()
deadline = time.time() + 60
while time.time() < deadline:
    said = [ask(port) for port in range(20001, 20018)]
    capped = [x for x in said if "more than 16 hosts" in x]
    if capped:
        print("CAPPED", len(capped), capped[0], flush=True)
        break
    time.sleep(0.5)
"""


def outside_address() -> str:
    """An address of this machine that is not loopback (a grant never reaches loopback)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.77", 9))  # no packet is sent: the kernel picks the outgoing address
        addr = str(s.getsockname()[0])
    finally:
        s.close()
    assert addr and not addr.startswith("127."), f"this machine has no address besides loopback ({addr})"
    return addr


def submit(gw: Gateway, token: str, workdir: Path, url: str, *args: str, script: str = PROBE, **env: str) -> int:
    workdir.mkdir(exist_ok=True)
    workdir.chmod(0o777)
    (workdir / "probe.py").write_text(script)
    (workdir / "probe.py").chmod(0o644)
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": f"python3 - {' '.join(args)} < probe.py", "workdir": str(workdir),
                                     "walltime": "5m", "env": {"URL": url, **env}})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def output(gw: Gateway, token: str, job: int) -> str:
    with gw.http(token) as h:
        return str(h.get(f"/v1/jobs/{job}/output").json().get("data") or "")


def ended(gw: Gateway, token: str, job: int) -> tuple[str, str]:
    with gw.http(token) as h:
        done = h.get(f"/v1/jobs/{job}/wait", params={"timeout": 120}).json()
    return done["state"], output(gw, token, job)


def told(gw: Gateway, token: str) -> list[str]:
    with gw.http(token) as h:
        return [i["text"] for i in h.get("/v1/ledger").json()["unacked"] if i["kind"] == "approval"]


def pending_of(gw: Gateway, token: str, job: int) -> dict[str, Any] | None:
    rows = gw.cli_json("approvals", "list", token=token)["approvals"]
    return next((a for a in rows if a["action"] == "egress" and a["jobs"] == [job]), None)


def test_egress_off_the_list_waits_for_the_sponsor_and_opens_for_that_job_alone(
        tmp_path: Path, agent_dir: Path) -> None:
    need_bwrap()
    addr = outside_address()
    policy = tmp_path / "policy.cedar"
    policy.write_text(DEFAULT_POLICY.read_text() + ASK)
    with hook() as h, file_server(tmp_path / "dest", addr, "from-the-approved-host") as port, \
            running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS=f'["{addr}:1"]', CORRAL_SAFETY__POLICY_FILE=str(policy),
                    CORRAL_NOTIFY__APPROVAL_WAIT_S="30", **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        url = f"http://{addr}:{port}/ok.txt"
        first = submit(gw, t["bot1"], agent_dir / "a", url, "120", TUNNEL="1")
        aid, _ = asked(h)  # the sponsor is asked, with a link
        # Meanwhile the job is refused, told who answers and until when; its agent is told too.
        said = until(lambda: "waiting for approval" in (o := output(gw, t["bot1"], first)) and o, within=60)
        assert f"REFUSED 403 corral: {addr}:{port} is not on this facility's egress allow-list; waiting for " \
               f"approval #{aid} by alice until" in said, said
        assert until(lambda: [x for x in told(gw, t["bot1"]) if f"#{aid} by alice" in x and f"job {first}" in x])
        row = pending_of(gw, t["alice"], first)
        assert row and row["id"] == aid and row["args"] == {"job_id": first, "host": addr, "port": port,
                                                            "addresses": [addr]}, row  # the digest not shown
        # Another job of the same agent, in another sandbox, with no credential or a forged one: refused.
        for proxy in ("http://127.0.0.1:3128", f"http://corral-job:cre_{first}_{'0' * 64}@127.0.0.1:3128"):
            other = submit(gw, t["bot1"], agent_dir / "b", url, "3", proxy)
            state, out = ended(gw, t["bot1"], other)
            assert "GOT" not in out and "REFUSED 403" in out, out
        gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        state, out = ended(gw, t["bot1"], first)
        assert state == "COMPLETED" and "GOT from-the-approved-host" in out, (state, out)
        assert "TUNNEL HTTP/1.1 200 Connection established from-the-approved-host" in out, out
        leaked = (agent_dir / "a" / "proxy.txt").read_text()  # as if the first job's credential had leaked
        assert leaked.startswith(f"http://corral-job:cre_{first}_"), leaked
        assert until(lambda: [x for x in told(gw, t["bot1"]) if f"approval #{aid}" in x and "approved by alice" in x
                              and f"job {first} may reach {addr}:{port}" in x])
        # Another job of the same agent (its own credential), and another agent: refused, asked apart.
        same = submit(gw, t["bot1"], agent_dir / "c", url, "6")
        other_agent = submit(gw, t["bot2"], agent_dir / "d", url, "60")
        state, out = ended(gw, t["bot1"], same)
        assert "GOT" not in out and "waiting for approval" in out, out
        left = until(lambda: pending_of(gw, t["alice"], same))
        # The first job's credential replayed after its end (what its output showed): refused.
        replay = submit(gw, t["bot1"], agent_dir / "e", url, "3", leaked)
        state, out = ended(gw, t["bot1"], replay)
        assert "GOT" not in out and "REFUSED 403" in out, out
        # Declined: stays refused, saying so; the agent told.
        theirs = until(lambda: pending_of(gw, t["alice"], other_agent))
        gw.cli_json("approvals", "decline", str(theirs["id"]), "--note", "not that host", token=t["alice"])
        state, out = ended(gw, t["bot2"], other_agent)
        assert "GOT" not in out and "declined by alice: not that host" in out, out
        assert until(lambda: [x for x in told(gw, t["bot2"]) if f"#{theirs['id']}" in x and "declined by alice" in x])
        # Unanswered: expires; the agent told.
        assert until(lambda: [x for x in told(gw, t["bot1"]) if f"approval #{left['id']} by alice expired" in x],
                     within=90)
        # A job that sprays names: past 16 hosts, refused without asking anyone.
        spray = submit(gw, t["bot2"], agent_dir / "f", url, script=SPRAY, BASE=f"http://{addr}")
        state, out = ended(gw, t["bot2"], spray)
        assert "CAPPED 1 " in out and "asked for more than 16 hosts off the list" in out, out
        assert len([a for a in gw.cli_json("approvals", "list", token=t["alice"])["approvals"]
                    if a["jobs"] == [spray]]) == 16
        records = [json.loads(line.split(" ", 1)[1]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
        assert [(r["principal"], r["approval"]) for r in records if r["action"] == "approve"] == [("alice", aid)]


def test_a_granted_name_rebound_elsewhere_reaches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grant holds the addresses the host had when the job asked (what the sponsor saw):
    the name answering another address later (DNS rebinding), or one of the gateway's own
    machine, reaches nothing; the address granted is connected to as resolved once."""
    answer = ["203.0.113.5"]

    def resolver(host: str, port: int, *a: Any, **k: Any) -> Any:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (x, port)) for x in answer]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    entry = {"state": "approved", "addresses": ["203.0.113.5"], "until": time.time() + 60,
             "cred": egress_grants.digest("cre_1_" + "a" * 64)}
    assert egress_grants.address_for(entry, "files.example.org", 443) == "203.0.113.5"
    for elsewhere in (["127.0.0.1"], ["10.0.0.9"], ["169.254.169.254"]):
        answer[:] = elsewhere
        with pytest.raises(Refused, match="not to an address your sponsor approved"):
            egress_grants.address_for(entry, "files.example.org", 443)
    # ... and a grant that named a loopback address (asked when the name pointed there) still refuses it
    answer[:] = ["127.0.0.1"]
    with pytest.raises(Refused):
        egress_grants.address_for({**entry, "addresses": ["127.0.0.1"]}, "files.example.org", 443)
    # Only the credential granted, while the grant holds.
    assert egress_grants.granted(entry, "cre_1_" + "a" * 64)
    assert not egress_grants.granted(entry, "cre_2_" + "a" * 64)
    assert not egress_grants.granted({**entry, "until": time.time() - 1}, "cre_1_" + "a" * 64)
    header = b"Basic " + base64.b64encode(b"corral-job:cre_1_" + b"a" * 64)
    assert egress_grants.presented(header) == (1, "cre_1_" + "a" * 64)
    assert egress_grants.presented(b"Basic " + base64.b64encode(b"someone:cre_1_" + b"a" * 64)) is None
    assert egress_grants.presented(b"Basic !!!") is None
    # What a job reads: corral asked only where the job named itself.
    assert egress_grants.refusal("h", 1, None, asked=False).endswith("ask the admin to add it to [sandbox] allow_hosts")
    assert "corral has asked them" in egress_grants.refusal("h", 1, None)
