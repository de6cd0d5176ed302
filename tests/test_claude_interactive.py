"""Claude Code's interactive mode, the way people run it, in a terminal driven by tmux
with the stand-in model service (issue 49 item 2). There, Claude Code declares the MCP
tasks extension, so ``wait_for_job`` runs as a background task: a background wait
completes and its result reaches the model; a wait the model stops (its TaskStop tool,
which sends ``tasks/cancel``) ends the wait and leaves the job running."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .clients.standin import StandIn, Step, job_id_in
from .conftest import Gateway
from .test_mcp_clients import _agent, _client

KEY = "sk-ant-standin-0123456789abcdefghij"


def _tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed")
        pytest.skip("tmux is not installed")
    return path


def _background_task(results: list[str]) -> dict[str, str]:
    m = re.search(r'use TaskStop with task_id "([^"]+)"', results[-1])
    assert m, f"the wait did not move to the background: {results[-1]}"
    return {"task_id": m[1]}


def _job_state(gateway: Gateway, token: str, job_id: int) -> str:
    with gateway.http(token) as h:
        return str(h.get(f"/v1/jobs/{job_id}").json()["state"])


def test_claude_codes_interactive_mode_waits_in_the_background_and_stopping_a_wait_leaves_the_job(
        gateway: Gateway, agent_dir: Path, tmp_path: Path) -> None:
    tmux, claude = _tmux(), _client("claude")
    token = _agent(gateway)
    stop_me, finish = agent_dir / "stop-me", agent_dir / "finish"
    until = "while [ ! -e {} ]; do sleep 0.2; done; echo finished"
    script: list[Step] = [
        ("submit_job", {"command": until.format(stop_me), "workdir": str(agent_dir)}),
        ("wait_for_job", lambda r: {"job_id": job_id_in(r)}),
        ("TaskStop", _background_task),  # the model stops the background wait
        ("submit_job", {"command": until.format(finish), "workdir": str(agent_dir)}),
        ("wait_for_job", lambda r: {"job_id": job_id_in(r)}),
    ]
    home = tmp_path / "claude-home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({  # a user who has been through the first-run screens
        "hasCompletedOnboarding": True, "theme": "dark",
        "customApiKeyResponses": {"approved": [KEY[-20:]], "rejected": []},
        "projects": {str(agent_dir): {"hasTrustDialogAccepted": True, "allowedTools": []}}}))
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"corral": {
        "type": "http", "url": f"{gateway.url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}}}))
    name = f"corral-{uuid.uuid4().hex[:8]}"
    with StandIn(script) as standin:
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": standin.url,
               "ANTHROPIC_API_KEY": KEY, "ENABLE_TOOL_SEARCH": "false", "DISABLE_TELEMETRY": "1",
               "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "TERM": "xterm-256color"}
        subprocess.run([tmux, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", "-c", str(agent_dir),
                        *(a for k, v in env.items() for a in ("-e", f"{k}={v}")),
                        claude, f"--mcp-config={config}", "--strict-mcp-config", "--allowedTools", "mcp__corral"],
                       check=True)
        try:
            # Typed before the input box is drawn (and corral's tools listed), the prompt is
            # lost or goes to a model without them: a fixed 3 s lost that race on a loaded runner.
            deadline = time.monotonic() + 60
            while not ("❯" in (screen := _screen(tmux, name)) and "shift+tab" in screen) \
                    and time.monotonic() < deadline:
                time.sleep(0.3)
            assert "❯" in screen, screen
            time.sleep(2)
            subprocess.run([tmux, "send-keys", "-t", name, "run the jobs", "Enter"], check=True)
            deadline = time.monotonic() + 120
            while len(_results(standin)) < 5 and time.monotonic() < deadline:
                time.sleep(0.5)
            results = _results(standin)
            assert len(results) >= 5, (results, _screen(tmux, name))
            stopped, waited = job_id_in(results[:1]), job_id_in(results[:4])
            assert "moved to the background" in results[1] and "moved to the background" in results[4], results
            finish.touch()  # the second job ends: its background wait completes, and the model is told
            done = re.compile(rf'id\\*":{waited},\\*"state\\*":\\*"COMPLETED')
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not any(done.search(json.dumps(r)) for r in standin.requests):
                time.sleep(0.5)
            assert any(done.search(json.dumps(r)) for r in standin.requests), _screen(tmux, name)
            # ... and the stopped wait's job goes on: stopping a wait never cancels a job
            assert gateway.metric('corral_requests_total{edge="mcp",op="tasks/cancel"}') >= 1
            assert _job_state(gateway, token, stopped) in ("PENDING", "RUNNING"), _screen(tmux, name)
        finally:
            subprocess.run([tmux, "kill-session", "-t", name], capture_output=True)
            stop_me.touch()


def _results(standin: StandIn) -> list[str]:
    """The tool results of the agent's longest turn (its side requests, a title or a
    permission check, carry fewer)."""
    turns = [[b.get("content") for m in t["body"].get("messages") or [] if isinstance(m.get("content"), list)
              for b in m["content"] if b.get("type") == "tool_result"] for t in standin.agent_turns()]
    return [c if isinstance(c, str) else json.dumps(c) for c in max(turns, key=len, default=[])]


def _screen(tmux: str, name: str) -> str:
    return subprocess.run([tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
