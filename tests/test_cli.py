"""The CLI, run as a real subprocess against a running gateway."""

from __future__ import annotations

import json

import click
import pytest

from corral.cli import cli

from .conftest import Gateway


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
])
def test_bad_input_exits_2_with_a_message(gateway: Gateway, args, word) -> None:
    cp = gateway.cli(*args)
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
