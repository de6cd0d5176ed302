"""A new user's first hour, as README leads them: the gateway started as `make run`
starts it (the relative home `.corral`, no CORRAL_HOME), an agent's job run in the
sandbox, and the CLI finding the admin token from any directory. Real gateway, real
bubblewrap, real CLI processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from .conftest import drop_scratch, free_port
from .test_sandbox import need_bwrap


class RelativeGateway:
    """`corral serve` started in ``checkout`` with no CORRAL_HOME, as `make run` does."""

    def __init__(self, checkout: Path, state: Path) -> None:
        self.checkout, self.port = checkout, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The user's own state directory (where the gateway leaves the pointer to its home),
        # kept inside the test's directory.
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        # As `make run` starts it: run by a plain user (place-check), the gateway is hers alone.
        self.base_env.update(XDG_STATE_HOME=str(state), CORRAL_URL=self.url, CORRAL_PERSONAL="true")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.checkout / "gateway.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.edges.cli.main", "serve", "--port", str(self.port),
                                      "--tick", "0.2", "--cpus", "2"],
                                     env=self.base_env, cwd=self.checkout, stdout=log, stderr=log)
        deadline = time.monotonic() + 90  # a loaded machine (tests/conftest.py waits as long)
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, (self.checkout / "gateway.out").read_text()
            time.sleep(0.1)
        raise RuntimeError("gateway did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def cli(self, *args: str, cwd: Path, token: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.base_env, **({"CORRAL_TOKEN": token} if token else {}), **extra)
        return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", *args], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=120)


@pytest.fixture
def relative(tmp_path: Path) -> Iterator[RelativeGateway]:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    gw = RelativeGateway(checkout, tmp_path / "state")
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()
        drop_scratch(checkout / ".corral")


def test_relative_home_runs_an_agents_job_in_the_sandbox(relative: RelativeGateway, agent_dir: Path) -> None:
    need_bwrap()
    c = relative.checkout
    assert relative.cli("principal", "add", "alice", "--kind", "human", cwd=c).returncode == 0
    assert relative.cli("principal", "add", "bot", "--kind", "agent", "--sponsor", "alice", cwd=c).returncode == 0
    minted = relative.cli("--json", "token", "mint", "--for", "bot", "--expires", "1h", cwd=c)
    token = json.loads(minted.stdout)["token"]
    sub = relative.cli("--json", "submit", "--workdir", str(agent_dir), "--", "echo sandboxed", cwd=agent_dir,
                       token=token)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job = json.loads(sub.stdout)["id"]
    done = json.loads(relative.cli("--json", "wait", str(job), cwd=c, token=token).stdout)
    logs = relative.cli("logs", str(job), cwd=c, token=token)
    assert done["state"] == "COMPLETED", (done, relative.cli("logs", str(job), "--stderr", cwd=c, token=token).stdout)
    assert logs.stdout == "sandboxed\n"
    # The admin sees what the sandbox hides: corral's own state, as an absolute path.
    shown = relative.cli("sandbox", "show", cwd=c)
    assert str(c / ".corral") in shown.stdout and " .corral" not in shown.stdout, shown.stdout + shown.stderr


def test_an_agents_job_runs_python_from_the_venv_make_built(relative: RelativeGateway, agent_dir: Path) -> None:
    """The tour activates .venv, and "an activated venv is the job's too": an agent's job
    runs as an identity of its own, which must be able to run that venv's python (built on
    root's pyenv under /root, 0700, every `python` in a job was "command not found")."""
    need_bwrap()
    c = relative.checkout
    assert relative.cli("principal", "add", "alice", "--kind", "human", cwd=c).returncode == 0
    assert relative.cli("principal", "add", "bot", "--kind", "agent", "--sponsor", "alice", cwd=c).returncode == 0
    token = json.loads(relative.cli("--json", "token", "mint", "--for", "bot", "--expires", "1h", cwd=c).stdout)["token"]
    venv = Path(sys.prefix)  # the suite runs on the venv make built
    active = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    for lane in ("batch", "fast"):
        sub = relative.cli("--json", "submit", "--lane", lane, "-t", "1m", "--workdir", str(agent_dir), "--",
                           "python -c 'import sys; print(6 * 7, sys.prefix)'", cwd=agent_dir, token=token, **active)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        job = json.loads(sub.stdout)["id"]
        done = json.loads(relative.cli("--json", "wait", str(job), cwd=c, token=token).stdout)
        err = relative.cli("logs", str(job), "--stderr", cwd=c, token=token).stdout
        assert done["state"] == "COMPLETED", (lane, done, err)
        assert relative.cli("logs", str(job), cwd=c, token=token).stdout == f"42 {venv}\n", lane


def test_the_admin_token_is_found_from_any_directory(relative: RelativeGateway, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    for where in (relative.checkout, elsewhere, Path("/")):
        me = relative.cli("whoami", cwd=where)
        assert me.returncode == 0 and me.stdout.startswith("admin"), (where, me.stdout, me.stderr)
    # Stopped, the gateway takes its pointer away: nothing stale is left behind.
    relative.stop()
    assert not list((tmp_path / "state" / "corral" / "gateways").iterdir())
