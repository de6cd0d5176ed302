"""TLS as an admin sets it up: `corral serve --tls-cert --tls-key` answers real HTTPS with
a certificate a site CA made in the test signed; the CLI and the MCP relay verify it (with
CORRAL_CA_FILE; without it they refuse, saying what to set, and send nothing); and a
gateway told to listen beyond loopback without TLS refuses to start unless --insecure."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from .conftest import TEST_NSS, TEST_UIDS, free_port

CORRAL = [sys.executable, "-m", "corral.entry"]


def _pem_pair(tmp: Path) -> tuple[Path, Path, Path]:
    """A site CA and a server certificate it signed for 127.0.0.1 and localhost: (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test site CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral gateway")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") and k != "SSL_CERT_FILE"}
    return {**env, "CORRAL_HOME": str(home), "CORRAL_SANDBOX__UID_REGISTRY": TEST_UIDS,
            "CORRAL_SANDBOX__NSS_USERS": TEST_NSS, **extra}


def _started(proc: subprocess.Popen[bytes], url: str, log: Path, verify: ssl.SSLContext | bool) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"gateway exited: {log.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"gateway did not start: {log.read_text()}")


def _serve(home: Path, *args: str) -> subprocess.Popen[bytes]:
    home.mkdir(exist_ok=True)
    log = home.parent / "gateway.log"
    return subprocess.Popen([*CORRAL, "serve", "--tick", "0.2", "--cpus", "2", *args], env=_env(home),
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=home.parent)


@pytest.fixture
def tls_gateway(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """(https URL, CA file, home) of a gateway serving TLS."""
    ca, cert, key = _pem_pair(tmp_path)
    port, home = free_port(), tmp_path / "home"
    proc = _serve(home, "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key))
    url = f"https://127.0.0.1:{port}"
    try:
        _started(proc, url, tmp_path / "gateway.log", ssl.create_default_context(cafile=str(ca)))
        yield url, ca, home
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_gateway_serves_https_and_the_cli_verifies_it(tls_gateway: tuple[str, Path, Path]) -> None:
    url, ca, home = tls_gateway
    token = (home / "admin.token").read_text().strip()
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
        httpx.get(url.replace("https", "http") + "/healthz", timeout=5)
    env = _env(home, CORRAL_URL=url, CORRAL_TOKEN=token)
    ok = subprocess.run([*CORRAL, "--json", "whoami"], env={**env, "CORRAL_CA_FILE": str(ca)},
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["name"] == "admin", ok.stderr
    bad = subprocess.run([*CORRAL, "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "could not be verified" in bad.stderr and "CORRAL_CA_FILE" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def _relay(env: dict[str, str]) -> tuple[list[dict[str, object]], str]:
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    r = subprocess.run([*CORRAL, "mcp"], env=env, input="".join(json.dumps(m) + "\n" for m in lines),
                       capture_output=True, text=True, timeout=60)
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()], r.stderr


def test_the_mcp_relay_verifies_the_gateway(tls_gateway: tuple[str, Path, Path]) -> None:
    url, ca, home = tls_gateway
    env = _env(home, CORRAL_URL=url, CORRAL_TOKEN=(home / "admin.token").read_text().strip())
    answers, _ = _relay({**env, "CORRAL_CA_FILE": str(ca)})
    tools = next(a for a in answers if a.get("id") == 2)["result"]["tools"]  # type: ignore[index]
    assert any(t["name"] == "submit_job" for t in tools), tools
    answers, stderr = _relay(env)  # not verified: told why, and no tool of the gateway's
    assert "could not be verified" in stderr and "CORRAL_CA_FILE" in stderr, stderr
    tools = next(a for a in answers if a.get("id") == 2)["result"]["tools"]  # type: ignore[index]
    assert [t["name"] for t in tools] == ["corral_status"] and "CORRAL_CA_FILE" in tools[0]["description"]


def test_a_network_address_without_tls_is_refused_unless_insecure(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    r = subprocess.run([*CORRAL, "serve", "--host", "0.0.0.0", "--port", str(port)], env=_env(home),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "refusing to listen on 0.0.0.0" in r.stderr and "without TLS" in r.stderr and "bearer token" in r.stderr
    assert "--insecure" in r.stderr and "Traceback" not in r.stderr
    _, cert, _ = _pem_pair(tmp_path)
    r = subprocess.run([*CORRAL, "serve", "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(cert)],
                       env=_env(home), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TLS: cannot use certificate" in r.stderr, r.stderr
    proc = _serve(home, "--host", "0.0.0.0", "--port", str(port), "--insecure")
    try:
        _started(proc, f"http://127.0.0.1:{port}", tmp_path / "gateway.log", False)
        assert "tokens cross it in clear" in (tmp_path / "gateway.log").read_text()
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_agent_session_carries_the_ca_to_its_mcp_relay(tls_gateway: tuple[str, Path, Path], tmp_path: Path) -> None:
    """`corral agent run` hands CORRAL_CA_FILE to the agent's MCP server (Codex forwards only
    the variables it is told of): without it the relay could not verify an https gateway."""
    url, ca, home = tls_gateway
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").write_text('#!/bin/sh\necho "ARGS $*"\ncat "$CORRAL_MCP_CONFIG"\n')
    (bin_dir / "codex").chmod(0o755)
    env = _env(home, CORRAL_URL=url, CORRAL_TOKEN=(home / "admin.token").read_text().strip(),
               CORRAL_CA_FILE=str(ca), PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run([*CORRAL, "agent", "run", "--no-fence", "--", "codex"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    args = next(line for line in r.stdout.splitlines() if line.startswith("ARGS "))
    assert '"CORRAL_CA_FILE"' in args.split("env_vars=", 1)[1], args
    config = json.loads(r.stdout[r.stdout.index("{"):])
    assert config["mcpServers"]["corral"]["env"]["CORRAL_CA_FILE"] == str(ca)


def test_a_second_gateway_on_a_tls_port_names_the_first(tls_gateway: tuple[str, Path, Path], tmp_path: Path) -> None:
    url, _, _ = tls_gateway
    port = url.rsplit(":", 1)[1]
    _, cert, key = _pem_pair(tmp_path)
    r = subprocess.run([*CORRAL, "serve", "--port", port, "--tls-cert", str(cert), "--tls-key", str(key)],
                       env=_env(tmp_path / "other"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"port {port} on 127.0.0.1 is taken by a corral gateway" in r.stderr, r.stderr
