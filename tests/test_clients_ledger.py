"""What a client drops is not lost (issue 51 item 1), through the real clients agents run
(Claude Code and Codex, each against the scripted stand-in for its model service): a
wait the client abandons (its tool timeout) leaves the job's end for the next call of any
tool, and a job longer than the client's patience never surfaces as a client timeout when
the wait is left to corral's own bound."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .clients.standin import StandIn, Step, job_id_in
from .conftest import Gateway, running
from .test_mcp_clients import _agent, _stdio, claude_config, run_claude, run_codex


def _codex_stdio() -> list[str]:
    return ["-c", f"mcp_servers.corral.command={json.dumps(sys.executable)}",
            "-c", 'mcp_servers.corral.args=["-m", "corral.entry", "mcp"]',
            "-c", 'mcp_servers.corral.env_vars=["CORRAL_TOKEN", "CORRAL_URL", "PYTHONPATH"]']


def _run(client: str, standin: StandIn, gateway: Gateway, token: str, tmp_path: Path, agent_dir: Path,
         tool_timeout_s: int | None) -> subprocess.CompletedProcess[str]:
    """``client`` (Claude Code in print mode, or Codex) on corral over stdio, its tool
    timeout set (None: the client's own default)."""
    if client == "claude":
        cfg = claude_config(tmp_path / "mcp.json", _stdio(gateway, token))
        args = [cfg, "--strict-mcp-config", "-p", "go", "--allowedTools", "mcp__corral"]
        if tool_timeout_s is None:
            return run_claude(standin, args, tmp_path / "home", agent_dir)
        return run_claude(standin, args, tmp_path / "home", agent_dir, MCP_TOOL_TIMEOUT=str(tool_timeout_s * 1000))
    timeout = ["-c", f"mcp_servers.corral.tool_timeout_sec={tool_timeout_s}"] if tool_timeout_s else []
    return run_codex(standin, [*_codex_stdio(), *timeout], tmp_path / "home", agent_dir, CORRAL_TOKEN=token,
                     CORRAL_URL=gateway.url)


def _later(step: dict[str, Any], seconds: float) -> Any:
    """A step the 'model' takes only after ``seconds`` (the job ends meanwhile)."""
    def wait(results: list[str]) -> dict[str, Any]:
        time.sleep(seconds)
        return step
    return wait


def _abandoning_script(workdir: str) -> list[Step]:
    return [("submit_job", {"command": "sleep 6; echo done", "workdir": workdir}),
            ("wait_for_job", lambda r: {"job_id": job_id_in(r), "timeout_s": 40}),  # the client gives up at 3 s
            ("list_jobs", _later({}, 9))]


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_a_wait_the_client_abandoned_is_said_on_its_next_call(gateway: Gateway, agent_dir: Path, tmp_path: Path,
                                                              client: str) -> None:
    token = _agent(gateway)
    with StandIn(_abandoning_script(str(agent_dir))) as standin:
        cp = _run(client, standin, gateway, token, tmp_path, agent_dir, tool_timeout_s=3)
        assert cp.returncode == 0, cp.stderr[-3000:]
        said = standin.tool_results()
    assert len(said) == 3, said
    job = job_id_in(said[:1])
    assert "COMPLETED" not in said[1], said[1]  # the wait was abandoned: the model never saw the end there
    assert f"Since your last call: job {job} COMPLETED" in said[2], said[2]


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_a_job_longer_than_the_clients_patience_is_never_a_timeout(tmp_path: Path, agent_dir: Path,
                                                                   client: str) -> None:
    """Scaled down: the client's tool timeout 6 s, corral's wait bound 3 s, a 10 s job."""
    with running(tmp_path, CORRAL_MCP_WAIT_S="3", CORRAL_MCP_PROGRESS_S="1") as gateway:
        token = _agent(gateway)
        script: list[Step] = [("submit_job", {"command": "sleep 10; echo slept", "workdir": str(agent_dir)}),
                              *[("wait_for_job", lambda r: {"job_id": job_id_in(r)})] * 6]
        with StandIn(script) as standin:
            cp = _run(client, standin, gateway, token, tmp_path, agent_dir, tool_timeout_s=6)
            assert cp.returncode == 0, cp.stderr[-3000:]
            said = standin.tool_results()
    waits = said[1:]
    assert any('"state":"COMPLETED"' in s or "COMPLETED" in s for s in waits), said
    assert not any("timed out" in s.lower() or "timeout" in s.lower() and "reached" not in s for s in waits), said


def test_a_150_s_job_at_the_clients_own_defaults_is_never_a_timeout(tmp_path: Path, agent_dir: Path) -> None:
    """Full scale (issue 51): corral's own bound ([mcp] wait 50 s, progress every 10 s), each
    client at its own defaults (Codex stops waiting after 60 s; Claude Code backgrounds a
    call after 120 s), a 150 s job. Both clients at once on one gateway: the suite pays
    ~160 s of one worker's time, ~8 s of it on a CPU (decision 0047, "The 150 s case")."""
    with running(tmp_path) as gateway:
        token = _agent(gateway)
        said: dict[str, tuple[subprocess.CompletedProcess[str], list[str], list[float]]] = {}

        def one(client: str) -> None:
            stamps: list[float] = []

            def wait(results: list[str]) -> dict[str, Any]:
                stamps.append(time.monotonic())  # the last tool's answer has just reached the model
                return {"job_id": job_id_in(results)}

            script: list[Step] = [("submit_job", {"command": "sleep 150; echo slept", "workdir": str(agent_dir)}),
                                  *[("wait_for_job", wait)] * 5, ("wait_for_job", wait)]
            (tmp_path / client).mkdir()
            with StandIn(script) as standin:
                cp = _run(client, standin, gateway, token, tmp_path / client, agent_dir, tool_timeout_s=None)
                said[client] = (cp, standin.tool_results(), stamps)

        threads = [threading.Thread(target=one, args=(c,)) for c in ("claude", "codex")]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert sorted(said) == ["claude", "codex"], sorted(said)  # each client's run came back
    for client, (cp, results, stamps) in said.items():
        assert cp.returncode == 0, (client, cp.stderr[-3000:])
        waits = results[1:]
        assert any("COMPLETED" in s for s in waits), (client, results)
        assert not any("timed out" in s.lower() or "timeout" in s.lower() and "reached" not in s for s in waits), \
            (client, results)
        calls = [b - a for a, b in zip(stamps, stamps[1:])]
        assert calls and max(calls) < 58, (client, calls)  # each answered within corral's bound, under 60 s
