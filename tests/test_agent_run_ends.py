"""``corral agent run``: no token on a command line or left on disk (issue 49 item 4).
The token is read from a file or stdin; every way a session ends (the agent's exit,
SIGHUP or SIGTERM of ``corral agent run``, SIGKILL of it) removes the session's
directory (its mcp.json holds the token) and stops its shim helper; a session killed
without a helper is swept at the next start. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Gateway, ended


def _token(gateway: Gateway, tmp_path: Path) -> tuple[str, Path]:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
        token = str(h.post("/v1/tokens", json={"for": "bot", "expires": "1h"}).json()["token"])
    path = tmp_path / "agent.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (token + "\n").encode())
    os.close(fd)
    return token, path


def _start(gateway: Gateway, tmp_path: Path, token_file: Path, script: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--token-file",
                             str(token_file), "--no-fence", "--quiet", "--", "sh", "-c", script],
                            env=gateway.env(**env), cwd=tmp_path, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_hangup_as_at_a_terminal)


def _hangup_as_at_a_terminal() -> None:
    """A session at a terminal takes SIGHUP's default; a test run under nohup (CI's own
    runner may be) would hand its ignoring down to the agent, which then outlives it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _session(out: Path, parent: subprocess.Popen[bytes]) -> tuple[Path, dict[str, object]]:
    """The session's directory (where its mcp.json is) and its mark, once the agent runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().strip():
            root = Path(out.read_text().strip()).parent
            owner = json.loads((root / "session.json").read_text())
            if owner.get("helper") or os.environ.get("CORRAL_SHIM_HELPER") == "0":
                return root, owner
        assert parent.poll() is None, parent.communicate()
        time.sleep(0.1)
    raise AssertionError("the agent did not start")


def _gone(path: Path, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not path.exists():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["exit", "SIGHUP", "SIGTERM", "SIGKILL"])
def test_every_way_a_session_ends_removes_its_token_and_stops_its_helper(gateway: Gateway, tmp_path: Path,
                                                                        how: str) -> None:
    token, token_file = _token(gateway, tmp_path)
    out = tmp_path / "config-path"
    script = f'echo "$CORRAL_MCP_CONFIG" > {out}; ' + ("sleep 1; exit 3" if how == "exit" else "exec sleep 120")
    parent = _start(gateway, tmp_path, token_file, script)
    try:
        root, owner = _session(out, parent)
        assert token in (root / "mcp.json").read_text()  # what must not outlive the session
        assert token.encode() not in Path(f"/proc/{parent.pid}/cmdline").read_bytes()  # nor be in its argv
        helper = owner["helper"]
        assert isinstance(helper, int) and not ended(helper, 0.2)
        if how != "exit":
            os.kill(parent.pid, getattr(signal, how))
        if how != "SIGKILL":
            rc = parent.wait(30)
            assert rc == (3 if how == "exit" else 128 + getattr(signal, how)), (rc, parent.stderr.read())  # type: ignore[union-attr]
        assert _gone(root), sorted(p.name for p in root.iterdir())
        assert ended(helper), f"the shim helper {helper} outlived the session ({how})"
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)  # the agent too, were it left
        except ProcessLookupError:
            pass
        parent.wait(10)


def test_a_session_killed_without_a_helper_is_swept_at_the_next_start(gateway: Gateway, tmp_path: Path) -> None:
    _, token_file = _token(gateway, tmp_path)
    out = tmp_path / "config-path"
    own = tmp_path / "tmp"  # its sessions alone: another test's session starting meanwhile sweeps /tmp's
    own.mkdir()
    parent = _start(gateway, tmp_path, token_file, f'echo "$CORRAL_MCP_CONFIG" > {out}; exec sleep 120',
                    CORRAL_SHIM_HELPER="0", TMPDIR=str(own))
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        root = Path(out.read_text().strip()).parent
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(0.5)
        assert (root / "mcp.json").exists()  # nothing was left to remove it ...
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    again = _start(gateway, tmp_path, token_file, "true", TMPDIR=str(own))
    assert again.wait(60) == 0, again.communicate()
    assert not root.exists()  # ... until the next session started


def test_the_token_comes_from_stdin_or_a_file_never_the_command_line(gateway: Gateway, tmp_path: Path) -> None:
    token, token_file = _token(gateway, tmp_path)
    base = [sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--no-fence", "--quiet"]
    check = ["--", "sh", "-c", f'test "$CORRAL_TOKEN" = "{token}" && echo agent-has-it']
    cp = subprocess.run([*base, "--token", "-", *check], input=token + "\n", env=gateway.env(), cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and "agent-has-it" in cp.stdout, cp.stderr
    cp = subprocess.run([*base, "--token-file", "-", *check], input=token + "\n", env=gateway.env(), cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and "agent-has-it" in cp.stdout, cp.stderr
    missing = subprocess.run([*base, "--token-file", str(tmp_path / "nope"), *check], env=gateway.env(),
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read the token file" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    loud = subprocess.run([*base[:-1], "--token", token, *check], env=gateway.env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert loud.returncode == 0 and "readable in /proc" in loud.stderr, loud.stderr  # said, still served
