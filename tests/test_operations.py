"""deploy/'s operations files as an admin installs them (issue 48 item 8): Debian's
logrotate runs deploy/corral.logrotate (paths replaced, a state file of the test's own)
against a live gateway, which keeps logging to the new file and whose audit chain still
verifies; a naive stanza over the audit shows why the audit is not rotated so. Debian's
promtool checks the scrape configuration and the alert rules and runs their unit tests,
and every metric the rules read is one a gateway's /metrics exports (scripts/ops-up
installs both tools)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import Gateway, free_port

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"
CORRAL = [sys.executable, "-m", "corral.entry"]


def _tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI: scripts/ops-up installs it")
        pytest.skip(f"no {name} here: scripts/ops-up installs it")
    return path


def _until(what: str, check: object, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _logged(gw: Gateway, path: Path, n: int, policy: str) -> None:
    """One more line in the gateway's log at ``path``: a policy file that does not parse is
    logged (and the one in force stays) when a submission next reads it, 2 s after a change."""
    (gw.home / "policy.cedar").write_text(policy)
    with gw.http() as h:
        def more() -> bool:
            assert h.post("/v1/jobs", json={"command": "true", "workdir": str(gw.home.parent)}).status_code == 201
            return path.exists() and path.read_text().count("not reloaded") >= n
        _until(f"the gateway logged its {n}th line to {path}", more)


def test_logrotate_moves_the_gateways_log_and_leaves_the_audit_whole(tmp_path: Path) -> None:
    logrotate = _tool("logrotate")
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_LOG_MAX_MB": "0"})
    gw.home.mkdir()
    gw.start()
    log = gw.home / "gateway.log"
    try:
        _logged(gw, log, 1, "not cedar 1")
        conf = tmp_path / "corral.logrotate"
        conf.write_text((ROOT / "deploy" / "corral.logrotate").read_text()
                        .replace("/var/lib/corral", str(gw.home)).replace("su corral corral", "su root root")
                        .replace("create 0600 corral corral", "create 0600 root root"))
        state = tmp_path / "logrotate.state"
        r = subprocess.run([logrotate, "--force", "--state", str(state), str(conf)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        rotated = list(gw.home.glob("gateway.log-*"))
        assert len(rotated) == 1 and "not reloaded" in rotated[0].read_text() and str(gw.home) in state.read_text()
        assert log.exists() and oct(log.stat().st_mode & 0o777) == "0o600"
        _logged(gw, log, 1, "not cedar 2")  # the gateway writes to the new file, no signal sent
        assert rotated[0].read_text().count("not reloaded") == 1  # and nothing more to the moved one
        assert sorted(p.name for p in gw.home.glob("audit*")) == ["audit.jsonl", "audit.key"]
        verify = subprocess.run([*CORRAL, "--json", "audit", "verify"], env=gw.env(), capture_output=True, text=True,
                                timeout=120)
        said = json.loads(verify.stdout)
        assert verify.returncode == 0 and said["ok"] and said["records"] >= 2, verify.stdout
    finally:
        gw.kill(signal.SIGTERM)
    # Why the audit is not in that file: a stanza that rotates it as a log breaks the chain.
    naive = tmp_path / "naive.logrotate"
    naive.write_text(f"{gw.home}/audit.jsonl {{\n    su root root\n    rotate 3\n    create 0600 root root\n}}\n")
    subprocess.run([logrotate, "--force", "--state", str(tmp_path / "naive.state"), str(naive)], check=True, timeout=120)
    broken = subprocess.run([*CORRAL, "--json", "audit", "verify"], env=gw.env(), capture_output=True, text=True,
                            timeout=120)
    assert broken.returncode == 1 and "cut off" in json.loads(broken.stdout)["problems"][0]["what"]


def _promtool() -> str:
    return _tool("promtool")


def test_the_scrape_configuration_and_the_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = _promtool()
    for name in ("corral.rules.yml", "corral.rules.test.yml"):
        shutil.copy(PROM / name, tmp_path / name)
    secret, ca = tmp_path / "corral-metrics.token", tmp_path / "site-ca.pem"
    secret.write_text("a-long-random-secret\n")
    from .test_tls import _pem_pair

    (tmp_path / "tls").mkdir()
    site_ca, _, _ = _pem_pair(tmp_path / "tls")
    shutil.copy(site_ca, ca)
    (tmp_path / "prometheus.yml").write_text((PROM / "prometheus.yml").read_text()
                                             .replace("/etc/prometheus/corral-metrics.token", str(secret))
                                             .replace("/etc/corral/tls/site-ca.pem", str(ca)))
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "corral.rules.yml"],
                 ["test", "rules", "corral.rules.test.yml"]):
        r = subprocess.run([promtool, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    (tmp_path / "corral.rules.yml").write_text((PROM / "corral.rules.yml").read_text().replace("== 0\n", "== \n", 1))
    r = subprocess.run([promtool, "check", "rules", "corral.rules.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0  # the check reads what it checks


def test_every_metric_the_rules_read_is_exported(tmp_path: Path) -> None:
    """The rules name only what a gateway's /metrics says (the HELP of each family; the
    audit's figures once the board has verified the chain)."""
    rules = (PROM / "corral.rules.yml").read_text()
    named = set(re.findall(r"\b(corral_[a-z_]+?)(?:_total|_bucket)?\b", rules))
    gw = Gateway(tmp_path / "home", free_port())
    gw.home.mkdir()
    gw.start()
    try:
        with gw.http() as h:  # a 404 is counted as a 4xx, not a 5xx
            assert h.get("/v1/jobs/999999").status_code == 404
        text = httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {gw.admin_token}"}, timeout=30).text
        assert re.search(r'^corral_http_responses_total\{code="4xx"\} [1-9]', text, re.M), text[:2000]
        assert not re.search(r'^corral_http_responses_total\{code="5xx"\}', text, re.M)
        assert re.search(r'^corral_notify_outbox\{state=', text, re.M) is None  # an empty outbox: no series
    finally:
        gw.kill(signal.SIGTERM)
    exported = {n.removesuffix("_total") for n in re.findall(r"^# HELP (corral_[a-z_]+)", text, re.M)}
    # the audit's two figures appear once the dashboard's board has verified the chain
    later = set(re.findall(r'"(corral_audit_[a-z_]+)"', (ROOT / "corral/edges/dashboard/metrics.py").read_text()))
    missing = {n.removesuffix("_total") for n in named} - exported - later
    assert not missing and {"corral_audit_chain_ok", "corral_audit_records"} <= later, (missing, sorted(exported))
