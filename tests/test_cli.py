"""The CLI as a user runs it (its environment, directory and exit code; in-process through
click's runner, tests/conftest.py::Gateway.cli) against a running gateway."""

from __future__ import annotations

import json
from typing import Iterator

import click
import pytest

from corral.edges.cli.main import cli

from .conftest import Gateway, running


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the refusals below: each is refused before anything is made, so
    none disturbs the next (a gateway each took 4 s to start, for one command)."""
    with running(tmp_path_factory.mktemp("cli-refusals")) as gw:
        yield gw


def test_tour_as_in_the_readme(gateway: Gateway, tmp_path) -> None:
    assert gateway.cli("principal", "add", "alice", "--kind", "human").returncode == 0
    assert gateway.cli("principal", "add", "bot", "--kind", "agent", "--sponsor", "alice").returncode == 0
    token = gateway.cli_json("token", "mint", "--for", "bot", "--expires", "8h")["token"]
    job = gateway.cli_json("--session", "tour-1", "submit", "--", "echo hello from corral", token=token)
    assert job["session"] == "tour-1"
    done = gateway.cli_json("wait", str(job["id"]), token=token)
    assert done["state"] == "COMPLETED"
    logs = gateway.cli("logs", str(job["id"]), token=token)
    assert logs.returncode == 0 and logs.stdout == "hello from corral\n"
    long = gateway.cli_json("submit", "--time", "10m", "--", "sleep", "300", token=token)
    gateway.cli_json("wait", str(long["id"]), "--until", "RUNNING", token=token)
    assert gateway.cli("cancel", str(long["id"]), token=token).returncode == 0
    assert gateway.cli_json("wait", str(long["id"]), token=token)["state"] == "CANCELLED"
    table = gateway.cli("jobs", token=token).stdout
    assert "COMPLETED" in table and "CANCELLED" in table and table.splitlines()[0].startswith("ID")
    listed = gateway.cli_json("jobs", "--state", "COMPLETED", token=token)["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]


def test_script_from_stdin_and_idempotency(gateway: Gateway, tmp_path) -> None:
    script = "#!/bin/bash\necho from-script\n"
    first = gateway.cli("--json", "submit", "--script", "-", "--idempotency-key", "k1", input=script)
    again = gateway.cli("--json", "submit", "--script", "-", "--idempotency-key", "k1", input=script)
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert a["id"] == b["id"] and a["created"] and not b["created"]
    assert gateway.cli_json("wait", str(a["id"]))["state"] == "COMPLETED"
    assert gateway.cli("logs", str(a["id"]), "--tail", "1").stdout == "from-script\n"


@pytest.mark.parametrize("args, word", [
    (["submit", "--cpus", "-1", "--", "true"], "cpus"),
    (["submit", "--mem", "lots", "--", "true"], "memory"),
    (["submit", "--workdir", "/no/such", "--", "true"], "does not exist"),
    (["submit"], "command"),
    (["status", "424242"], "no job 424242"),
    (["wait", "1", "--until", "DONE"], "state"),
    (["token", "mint", "--for", "nobody"], "nobody"),
    (["principal", "add", "x", "--kind", "agent"], "sponsor"),
    (["status", "notanumber"], "notanumber"),
    (["--url", "ftp://example", "jobs"], "http://HOST:PORT"),
    (["submit", "--workspace", "ws-zzz", "--", "true"], "a workspace id as `corral workspace fork` printed it"),
    (["submit", "--lane", "fast", "-t", "2h", "--", "true"], "walltime 02:00:00 is more than a fast-lane task"),
])
def test_bad_input_exits_2_with_a_message(refusing: Gateway, args, word) -> None:
    cp = refusing.cli(*args)
    assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
    assert word.lower() in cp.stderr.lower()
    assert "Traceback" not in cp.stderr


def test_bad_token_and_unreachable_gateway(gateway: Gateway) -> None:
    cp = gateway.cli("jobs", token="crl_nope_nope")
    assert cp.returncode == 2 and "token" in cp.stderr
    cp = gateway.cli("jobs", CORRAL_URL="http://127.0.0.1:1")
    assert cp.returncode == 1 and "corral serve" in cp.stderr and "Traceback" not in cp.stderr


def test_every_command_teaches_in_help() -> None:
    def walk(cmd: click.Command, path: list[str]):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])

    for path, cmd in walk(cli, []):
        assert cmd.help and len(cmd.help) > 20, f"corral {' '.join(path)} lacks a --help text"
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and p.name not in ("help", "version"):
                assert p.help, f"corral {' '.join(path)} --{p.name} lacks help"


def test_json_everywhere(gateway: Gateway) -> None:
    for args in (["whoami"], ["facility"], ["jobs"], ["principal", "list"], ["token", "list"]):
        json.loads(gateway.cli("--json", *args).stdout)


def test_wait_timeout_json_errors_logs_hint_advice_and_env(gateway: Gateway, tmp_path) -> None:
    """Defects a new user found: each fails on the code before this change."""
    long = gateway.cli_json("submit", "--time", "10m", "--", "sleep", "300")
    cp = gateway.cli("wait", str(long["id"]), "--timeout", "0.2")
    assert cp.returncode == 3 and "still" in cp.stdout  # a timeout is not success: `wait && logs` is right
    gateway.cli("cancel", str(long["id"]))
    assert gateway.cli("wait", str(long["id"])).returncode == 0

    bad = gateway.cli("--json", "submit", "--mem", "lots", "--", "true")
    err = json.loads(bad.stdout)["error"]  # agents read stdout: the error is there too, as JSON
    assert bad.returncode == 2 and err["code"] == "invalid_request" and "memory" in err["message"]

    to_err = gateway.cli_json("submit", "--", "echo oops >&2")
    gateway.cli_json("wait", str(to_err["id"]))
    logs = gateway.cli("logs", str(to_err["id"]))
    assert logs.stdout.strip() == "" and f"corral logs {to_err['id']} --stderr" in logs.stderr

    failing = ["submit", "--workdir", str(tmp_path), "--", "python3 -c 'import no_such_module_here'"]
    first = gateway.cli_json(*failing)
    gateway.cli_json("wait", str(first["id"]))
    again = gateway.cli(*failing[:1], "--force", *failing[1:])
    assert again.returncode == 0 and "advice:" in again.stdout  # advice shows without --json too

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "hello-from-venv").write_text("#!/bin/sh\necho venv tool ran\n")
    (venv / "bin" / "hello-from-venv").chmod(0o755)
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    job = json.loads(gateway.cli("--json", "submit", "--", 'hello-from-venv; echo "$VIRTUAL_ENV"', **env).stdout)
    gateway.cli_json("wait", str(job["id"]))
    assert gateway.cli("logs", str(job["id"])).stdout == f"venv tool ran\n{venv}\n"  # the submitter's venv
    clean = json.loads(gateway.cli("--json", "submit", "--clean-env", "--", 'echo "[$VIRTUAL_ENV]"', **env).stdout)
    gateway.cli_json("wait", str(clean["id"]))
    assert gateway.cli("logs", str(clean["id"])).stdout == "[]\n"


def test_serve_refuses_a_taken_port_and_a_second_gateway_on_one_home(gateway: Gateway, tmp_path) -> None:
    import socket
    import subprocess
    import sys

    from .conftest import free_port

    def serve(home, port: int) -> subprocess.CompletedProcess[str]:
        env = {**gateway.env(), "CORRAL_HOME": str(home)}
        return subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "serve", "--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=60)

    taken = serve(tmp_path / "other", gateway.port)
    assert taken.returncode == 2 and "taken by a corral gateway" in taken.stderr
    assert "corral gateway on" not in taken.stdout  # refused before the banner
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = serve(tmp_path / "other", s.getsockname()[1])
    assert busy.returncode == 2 and "taken by another program" in busy.stderr
    twice = serve(gateway.home, free_port())
    assert twice.returncode == 2 and "another gateway (pid" in twice.stderr and "corral gateway on" not in twice.stdout
