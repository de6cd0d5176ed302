"""docs/deploy.md as an admin follows it: the systemd units in deploy/ pass Debian's
`systemd-analyze verify`, the sudoers drop-in passes `visudo -c`, and the "nginx in
front" block, run by Debian's nginx as written (ports and paths replaced), carries the
CLI, a job's long-poll and the MCP relay over HTTPS to a gateway on loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import running
from .test_tls import _pem_pair

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CORRAL = [sys.executable, "-m", "corral.entry"]


def _tool(name: str, how: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI: {how}")
        pytest.skip(f"no {name} here: {how}")
    return path


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _tool("systemd-analyze", "Debian's systemd")
    corral = Path(sys.executable).with_name("corral")  # where /opt/corral/bin/corral is on a site
    units = []
    for unit in ("corral-gateway.service", "corral-gateway@.service"):
        text = (DEPLOY / unit).read_text()
        assert "/opt/corral/bin/corral serve" in text and "User=corral" in text
        name = unit.replace("@.", "@8766.")  # a template is verified as one of its instances
        (tmp_path / name).write_text(text.replace("/opt/corral/bin/corral", str(corral)))
        units.append(str(tmp_path / name))
    r = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout
    broken = tmp_path / "corral-broken.service"
    broken.write_text((tmp_path / "corral-gateway.service").read_text().replace("KillMode=mixed", "KillMode=blend"))
    r = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=120)
    assert "kill mode" in r.stderr  # the check reads what it verifies


def test_the_sudoers_drop_in_is_valid() -> None:
    visudo = _tool("visudo", "scripts/privsep-up --sudo-only installs sudo")
    r = subprocess.run([visudo, "-c", "-f", str(DEPLOY / "corral.sudoers")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "corral ALL=(root) NOPASSWD: /usr/local/libexec/corral-submit" in (DEPLOY / "corral.sudoers").read_text()


def nginx_block() -> str:
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("**nginx in front**"):]
    return re.search(r"```nginx\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nginx_in_front_as_documented(tmp_path: Path) -> None:
    nginx = _tool("nginx", "scripts/nginx-up installs Debian's nginx-light")
    ca, cert, key = _pem_pair(tmp_path)
    with running(tmp_path) as gw:
        port = _free_port()
        server = (nginx_block().replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
                  .replace("/etc/corral/tls/fullchain.pem", str(cert)).replace("/etc/corral/tls/privkey.pem", str(key))
                  .replace("http://127.0.0.1:8765", gw.url))
        assert str(port) in server and gw.url in server and str(key) in server
        prefix = tmp_path / "nginx"
        (prefix / "logs").mkdir(parents=True)
        temp = "".join(f"{kind}_temp_path {prefix}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (prefix / "nginx.conf").write_text(
            f"pid {prefix}/nginx.pid;\nerror_log {prefix}/logs/error.log;\n"
            + ("user root;\n" if os.geteuid() == 0 else "")
            + f"events {{}}\nhttp {{\naccess_log {prefix}/logs/access.log;\n{temp}{server}\n}}\n")
        proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            _through(proc, port, gw, ca, prefix)
        finally:
            proc.terminate()
            proc.wait(30)


def _through(proc: subprocess.Popen[bytes], port: int, gw: object, ca: Path, prefix: Path) -> None:
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (proc.stdout.read() if proc.stdout else b"",
                                                                        (prefix / "logs/error.log").read_text())
            time.sleep(0.1)
    token = gw.admin_token  # type: ignore[attr-defined]
    env = {**gw.env(token), "CORRAL_URL": url, "CORRAL_CA_FILE": str(ca)}  # type: ignore[attr-defined]
    me = subprocess.run([*CORRAL, "--json", "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert me.returncode == 0 and json.loads(me.stdout)["name"] == "admin", me.stderr
    # a job and its long-poll through the proxy (the wait is the gateway's, held open by nginx)
    job = subprocess.run([*CORRAL, "--json", "submit", "--wait", "60", "--", "sleep 2; echo through-nginx"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=prefix)
    done = json.loads(job.stdout)
    assert job.returncode == 0 and done["state"] == "COMPLETED", job.stdout + job.stderr
    out = subprocess.run([*CORRAL, "logs", str(done["id"])], env=env, capture_output=True, text=True, timeout=60)
    assert "through-nginx" in out.stdout
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    r = subprocess.run([*CORRAL, "mcp"], env=env, input="".join(json.dumps(m) + "\n" for m in lines),
                       capture_output=True, text=True, timeout=60)
    answers = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    tools = next(a for a in answers if a.get("id") == 2)["result"]["tools"]
    assert any(t["name"] == "submit_job" for t in tools), r.stderr
    assert "GET /v1/whoami" in (prefix / "logs/access.log").read_text()  # it did go through nginx


def test_mcp_answers_by_the_public_name_and_refuses_others(tmp_path: Path) -> None:
    """Behind a proxy the Host header is the gateway's public name (its `url`): MCP answers
    it (the SDK's loopback list answered 421), and a name it was not given stays refused
    (DNS rebinding)."""
    import httpx

    with running(tmp_path, CORRAL_URL="https://corral.cluster.example") as gw:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        headers = {"Authorization": f"Bearer {gw.admin_token}", "Accept": "application/json, text/event-stream"}
        for host, status in (("corral.cluster.example", 200), ("127.0.0.1", 200), ("evil.example", 421)):
            r = httpx.post(f"http://127.0.0.1:{gw.port}/mcp", json=init, headers={**headers, "Host": host}, timeout=30)
            assert r.status_code == status, (host, r.status_code, r.text[:200])
