"""corral through the clients agents run: Claude Code and Codex CLI (pinned in
tests/clients/package-lock.json, installed by scripts/clients-up), each pointed at a
scripted stand-in for its model service (tests/clients/standin.py), over stdio
(``corral mcp``), over streamable HTTP, and through ``corral agent run``.

What is asserted is what the model receives: corral's tools in the first turn, a job's
output text, a refusal's sentence, an auth error's sentence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .clients.standin import StandIn, Step, job_id_in
from .conftest import Gateway

CLIENTS = Path(__file__).parent / "clients" / "node_modules" / ".bin"
ROOT = Path(__file__).parent.parent
MARK = "hello-from-the-job"


def _client(name: str) -> str:
    path = CLIENTS / name
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed: run scripts/clients-up")
        pytest.skip(f"{name} is not installed: run scripts/clients-up")
    return str(path)


def _agent(gateway: Gateway, **caps: Any) -> str:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "claude", "kind": "agent", "sponsor": "alice"})
        return h.post("/v1/tokens", json={"for": "claude", "expires": "1h", **caps}).json()["token"]


def loop(workdir: str) -> list[Step]:
    """Submit, wait, read; then a job over the token's CPU cap (refused)."""
    return [("submit_job", {"command": f"echo {MARK}", "workdir": workdir}),
            ("wait_for_job", lambda r: {"job_id": job_id_in(r), "timeout_s": 60}),
            ("job_output", lambda r: {"job_id": job_id_in(r)}),
            ("submit_job", {"command": "true", "cpus": 2, "workdir": workdir})]


def _env(home: Path, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT), **extra}  # extra may set PATH


def run_claude(standin: StandIn, args: list[str], home: Path, cwd: Path, prefix: list[str] | None = None,
               **env: str) -> subprocess.CompletedProcess[str]:
    """Claude Code in print mode; tool search off, so MCP tools are in the first turn."""
    env = _env(home, ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY="sk-ant-standin", ENABLE_TOOL_SEARCH="false",
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", **env)
    return subprocess.run([*(prefix or []), _client("claude"), *args], env=env, capture_output=True, text=True,
                          timeout=240, cwd=cwd)


def claude_config(path: Path, server: dict[str, Any]) -> str:
    path.write_text(json.dumps({"mcpServers": {"corral": server}}))
    return f"--mcp-config={path}"


def run_codex(standin: StandIn, config: list[str], home: Path, cwd: Path, prefix: list[str] | None = None,
              **env: str) -> subprocess.CompletedProcess[str]:
    provider = (f'model_providers.standin={{name="standin", base_url="{standin.url}/v1", wire_api="responses", '
                'env_key="STANDIN_KEY"}')
    args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-c", 'model_provider="standin"', "-c", 'model="gpt-5"', "-c", provider, *config, "go"]
    return subprocess.run([*(prefix or []), _client("codex"), *args], capture_output=True, text=True, timeout=240,
                          cwd=cwd, env=_env(home, CODEX_HOME=str(home), STANDIN_KEY="sk-standin", **env))


def assert_the_model_read(standin: StandIn, cp: subprocess.CompletedProcess[str]) -> None:
    assert cp.returncode == 0, cp.stderr[-3000:]
    names = standin.tool_names()
    assert any(n.endswith("submit_job") and "corral" in n for n in names), names  # in the first turn
    results = standin.tool_results()
    assert len(results) == 4, results
    assert MARK in results[2], results  # the job's output text itself, not only where it lies
    assert "untrusted-data-" in results[2]
    assert "allows at most 1 CPUs" in results[3], results[3]  # the cap's refusal, in corral's words


def _stdio(gateway: Gateway, token: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": ["-m", "corral.entry", "mcp"],
            "env": {"CORRAL_TOKEN": token, "CORRAL_URL": gateway.url, "PYTHONPATH": str(ROOT)}}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_claude_code_hands_the_model_what_corral_says(gateway: Gateway, agent_dir: Path, tmp_path: Path,
                                                      transport: str) -> None:
    token = _agent(gateway, max_cpus=1)
    server = _stdio(gateway, token) if transport == "stdio" else {
        "type": "http", "url": f"{gateway.url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
    with StandIn(loop(str(agent_dir))) as standin:
        cp = run_claude(standin, [claude_config(tmp_path / "mcp.json", server), "--strict-mcp-config", "-p",
                                  "run the job", "--allowedTools", "mcp__corral"], tmp_path / "home", agent_dir)
        assert_the_model_read(standin, cp)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_codex_hands_the_model_what_corral_says(gateway: Gateway, agent_dir: Path, tmp_path: Path,
                                                transport: str) -> None:
    token = _agent(gateway, max_cpus=1)
    if transport == "stdio":
        config = ["-c", f"mcp_servers.corral.command={json.dumps(sys.executable)}",
                  "-c", 'mcp_servers.corral.args=["-m", "corral.entry", "mcp"]',
                  "-c", 'mcp_servers.corral.env_vars=["CORRAL_TOKEN", "CORRAL_URL", "PYTHONPATH"]']
    else:
        config = ["-c", f'mcp_servers.corral.url="{gateway.url}/mcp"',
                  "-c", 'mcp_servers.corral.bearer_token_env_var="CORRAL_TOKEN"']
    with StandIn(loop(str(agent_dir))) as standin:
        cp = run_codex(standin, config, tmp_path / "home", agent_dir, CORRAL_TOKEN=token, CORRAL_URL=gateway.url)
        assert_the_model_read(standin, cp)


@pytest.mark.parametrize("client,transport", [("claude", "stdio"), ("claude", "http"), ("codex", "stdio"),
                                              ("codex", "http")])
def test_an_auth_error_reaches_the_model_in_corrals_words(gateway: Gateway, agent_dir: Path, tmp_path: Path,
                                                          client: str, transport: str) -> None:
    """A revoked token: the client still lists corral's tools, and a call answers what
    is wrong and what to do (not 'Connection closed', not an OAuth registration)."""
    _agent(gateway)
    with gateway.http() as h:
        minted = h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()
        assert h.delete(f"/v1/tokens/{minted['id']}").status_code == 200
    script: list[Step] = [("submit_job", {"command": "true", "workdir": str(agent_dir)})]
    with StandIn(script) as standin:
        if client == "claude":
            server = _stdio(gateway, minted["token"]) if transport == "stdio" else {
                "type": "http", "url": f"{gateway.url}/mcp", "headers": {"Authorization": f"Bearer {minted['token']}"}}
            cfg = claude_config(tmp_path / "mcp.json", server)
            cp = run_claude(standin, [cfg, "--strict-mcp-config", "-p", "go", "--allowedTools", "mcp__corral"],
                            tmp_path / "home", agent_dir)
        else:
            config = (["-c", f'mcp_servers.corral.url="{gateway.url}/mcp"',
                       "-c", 'mcp_servers.corral.bearer_token_env_var="CORRAL_TOKEN"'] if transport == "http" else
                      ["-c", f"mcp_servers.corral.command={json.dumps(sys.executable)}",
                       "-c", 'mcp_servers.corral.args=["-m", "corral.entry", "mcp"]',
                       "-c", 'mcp_servers.corral.env_vars=["CORRAL_TOKEN", "CORRAL_URL", "PYTHONPATH"]'])
            cp = run_codex(standin, config, tmp_path / "home", agent_dir, CORRAL_TOKEN=minted["token"],
                           CORRAL_URL=gateway.url)
        assert cp.returncode == 0, cp.stderr[-3000:]
        assert any(n.endswith("submit_job") for n in standin.tool_names()), standin.tool_names()
        said = standin.tool_results()
        assert said and "revoked" in said[0] and "new one" in said[0], said


def test_agent_run_starts_claude_code_and_codex_with_corral(gateway: Gateway, agent_dir: Path,
                                                            tmp_path: Path) -> None:
    """`corral agent run -- claude "prompt"`: the prompt reaches the model (it is not taken
    for an MCP config file), corral's tools are there; `-- claude mcp list` runs; Codex
    gets the token from its environment, and its command line does not carry it."""
    token = _agent(gateway, max_cpus=1)
    corral = [sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--no-fence", "--quiet", "--"]
    # `corral` on PATH as installed, running this tree (codex forwards only the variables it is told to)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "corral").write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m corral.entry \"$@\"\n")
    (bin_dir / "corral").chmod(0o755)
    env = {"CORRAL_TOKEN": token, "CORRAL_URL": gateway.url, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with StandIn(loop(str(agent_dir))) as standin:
        cp = run_claude(standin, ["-p", "please run the hello job", "--allowedTools", "mcp__corral"],
                        tmp_path / "home", agent_dir, prefix=corral, **env)
        assert_the_model_read(standin, cp)
        first = json.dumps(standin.agent_turns()[0]["body"]["messages"][0])
        assert "please run the hello job" in first
    cp = run_claude(standin, ["mcp", "list"], tmp_path / "home", agent_dir, prefix=corral, **env)
    assert cp.returncode == 0, cp.stderr
    with StandIn(loop(str(agent_dir))) as standin:
        cp = run_codex(standin, [], tmp_path / "home2", agent_dir, prefix=corral, **env)
        assert_the_model_read(standin, cp)


def test_the_clients_are_pinned() -> None:
    lock = json.loads((Path(__file__).parent / "clients" / "package-lock.json").read_text())
    deps = json.loads((Path(__file__).parent / "clients" / "package.json").read_text())["dependencies"]
    assert all(v[0].isdigit() for v in deps.values()), deps  # exact versions, no ranges
    for name, version in deps.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    assert shutil.which("node") or os.environ.get("CI") != "true"


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_typescript_sdk_client_validates_every_result_against_its_schema(
        gateway: Gateway, agent_dir: Path, tmp_path: Path, transport: str) -> None:
    _client("claude")  # installed together (scripts/clients-up)
    token = _agent(gateway, max_cpus=1)
    cp = subprocess.run(["node", str(Path(__file__).parent / "clients" / "ts_client.mjs"), transport, str(agent_dir)],
                        capture_output=True, text=True, timeout=180, cwd=Path(__file__).parent / "clients",
                        env=_env(tmp_path / "home", CORRAL_TOKEN=token, CORRAL_URL=gateway.url,
                                 CORRAL_PYTHON=sys.executable))
    assert cp.returncode == 0, cp.stderr[-3000:]
    got = json.loads(cp.stdout.strip().splitlines()[-1])
    assert "submit_job" in got["tools"] and got["state"] == "COMPLETED"
    assert "ts-sdk-output" in got["page"]["text"] and got["page"]["eof"]
    assert got["plan"]["allowed"]  # plan_job takes the fields as submit_job does, '4G' and '30m' included
    assert got["refused"]["isError"] and "at most 1 CPUs" in got["refused"]["text"]


def test_a_long_wait_answers_within_claude_codes_tool_timeout(tmp_path: Path, agent_dir: Path) -> None:
    """A job that runs past the client's tool timeout. Claude Code does not extend its
    timeout on progress notifications (measured: a wait of 30 s with progress every 1 s
    failed at MCP_TOOL_TIMEOUT=4 s), so the wait answers 'not yet, call again' within
    mcp_wait_s, shorter than the client's timeout, and the next call gets the end."""
    from .conftest import running

    with running(tmp_path, CORRAL_MCP_WAIT_S="3", CORRAL_MCP_PROGRESS_S="1") as gateway:
        token = _agent(gateway)
        script: list[Step] = [("submit_job", {"command": "sleep 5; echo slept", "workdir": str(agent_dir)}),
                              ("wait_for_job", lambda r: {"job_id": job_id_in(r)}),
                              ("wait_for_job", lambda r: {"job_id": job_id_in(r)}),
                              ("wait_for_job", lambda r: {"job_id": job_id_in(r)})]
        with StandIn(script) as standin:
            cfg = claude_config(tmp_path / "mcp.json", _stdio(gateway, token))
            cp = run_claude(standin, [cfg, "--strict-mcp-config", "-p", "go", "--allowedTools", "mcp__corral"],
                            tmp_path / "home", agent_dir, MCP_TOOL_TIMEOUT="6000")
            assert cp.returncode == 0, cp.stderr[-3000:]
            said = standin.tool_results()
            assert '"reached":false' in said[1] and "again" in said[1], said  # not a timeout: call again
            assert any('"state":"COMPLETED"' in s for s in said[2:]), said
            assert not any("timed out" in s for s in said), said


def inspector(gateway: Gateway, token: str, transport: str, home: Path, *args: str) -> list[str]:
    """The MCP Inspector's CLI (pinned in tests/clients) running one method, protocol 2026-07-28."""
    target = ([f"{gateway.url}/mcp", "--transport", "http", "--header", f"Authorization: Bearer {token}"]
              if transport == "http" else ["-e", f"CORRAL_TOKEN={token}", "-e", f"CORRAL_URL={gateway.url}",
                                           "-e", f"PYTHONPATH={ROOT}", "--", sys.executable, "-m", "corral.entry", "mcp"])
    return [_client("inspector"), "--cli", "--format", "json", "--protocol-era", "modern", *args, *target]


def inspected(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-3000:])
    return json.loads(cp.stdout)["result"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_mcp_inspector_lists_and_calls_corrals_tools(gateway: Gateway, agent_dir: Path, tmp_path: Path,
                                                         transport: str) -> None:
    """The Inspector's CLI (TypeScript SDK v2 and the tasks extension's requester, protocol
    2026-07-28): the tools listed, a job submitted, and its wait run as an MCP task to the
    job's end (corral answers a declaring client's wait with a task handle). The job runs
    until the task exists, so the wait cannot find it ended, however slowly the client starts."""
    token = _agent(gateway)
    home = tmp_path / "home"
    env = _env(home, MCP_CATALOG_PATH=str(home / "c.json"))

    def run(*args: str) -> Any:
        return inspected(subprocess.run(inspector(gateway, token, transport, home, *args), capture_output=True,
                                        text=True, timeout=180, env=env))

    names = [t["name"] for t in run("--method", "tools/list")["tools"]]
    assert "submit_job" in names and "wait_for_job" in names, names
    flag = agent_dir / "go"
    sub = run("--method", "tools/call", "--tool-name", "submit_job", "--tool-args-json", json.dumps(
        {"command": f"while [ ! -e {flag} ]; do sleep 0.2; done; echo inspected", "workdir": str(agent_dir)}))
    job_id = sub["structuredContent"]["job_id"]
    wait = subprocess.Popen(inspector(gateway, token, transport, home, "--method", "tools/call", "--tool-name",
                                      "wait_for_job", "--tool-args-json", json.dumps({"job_id": job_id})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    made = 'corral_requests_total{edge="mcp",op="task_created"} 1.0'
    deadline = time.monotonic() + 120
    while made not in httpx.get(f"{gateway.url}/metrics").text and wait.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    flag.touch()  # the job ends now, while the Inspector polls tasks/get
    out, err = wait.communicate(timeout=120)
    waited = inspected(subprocess.CompletedProcess(wait.args, wait.returncode, out, err))
    assert waited["structuredContent"]["state"] == "COMPLETED" and waited["structuredContent"]["reached"], waited
    metrics = httpx.get(f"{gateway.url}/metrics").text  # the wait was a task, polled to its end
    assert made in metrics, metrics
    assert 'op="tasks/get"' in metrics
