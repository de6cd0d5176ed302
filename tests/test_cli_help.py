"""The CLI's help as a new user reads it: every command in one of the sections of
`corral --help`, every command's help with at least one example, and the top-level help
(and each command's) loading none of the heavy libraries a command imports only when it
runs. How long help takes is measured in bench/first_run.py, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from corral.edges.cli.main import LAZY, cli
from corral.edges.cli.help import SECTIONS, SUMMARIES

HEAVY = ("numpy", "polars", "cedarpy", "tree_sitter", "onnxruntime", "dask", "distributed", "fastapi", "uvicorn",
         "corral.gateway.service", "corral.core.jobs")


def commands() -> list[tuple[str, click.Command]]:
    """(path, command) for every command and subcommand."""
    ctx = click.Context(cli)
    out: list[tuple[str, click.Command]] = []
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            sub = click.Context(cmd, parent=ctx)
            out += [(f"{name} {s}", cmd.get_command(sub, s)) for s in cmd.list_commands(sub)]  # type: ignore[misc]
    return out


def test_every_command_is_in_exactly_one_section() -> None:
    listed = [n for _, names in SECTIONS for n in names]
    assert sorted(listed) == sorted(set(listed)), "a command is in two sections"
    assert sorted(listed) == cli.list_commands(click.Context(cli))


def test_the_summaries_of_lazy_commands_are_their_own() -> None:
    ctx = click.Context(cli)
    assert set(SUMMARIES) == set(LAZY)
    for name, summary in SUMMARIES.items():
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.get_short_help_str(limit=1000) == summary, name


def has_example(text: str) -> bool:
    """An example: a line of the help that is a corral command (or runs one: a pipeline, an agent attached)."""
    return any(line.strip().startswith(("corral ", "$ corral")) or "| corral " in line or "-- corral " in line
               for line in text.splitlines())


@pytest.mark.parametrize("path", [p for p, _ in commands()])
def test_every_command_documents_itself_with_an_example(path: str) -> None:
    """A command's help shows an example; a subcommand's, or its group's for it."""
    found = dict(commands())
    cmd = found[path]
    assert (cmd.help or "").strip(), f"corral {path} has no help text"
    text = cmd.get_help(click.Context(cmd, info_name=f"corral {path}"))
    if " " in path and not has_example(text):
        group = path.split()[0]
        text = found[group].get_help(click.Context(found[group], info_name=f"corral {group}"))
        assert f"corral {path}" in text, f"neither corral {path} --help nor corral {group} --help shows it in an example"
        return
    assert has_example(text), f"corral {path} --help shows no example ('corral {path} ...')"


def loaded_by(argv: list[str]) -> list[str]:
    """The heavy modules loaded by `corral ARGV` in a fresh process."""
    code = ("import sys, json\nfrom corral.edges.cli.main import cli\n"
            f"try:\n    cli({argv!r}, prog_name='corral')\nexcept SystemExit:\n    pass\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(cp.stderr.strip().splitlines()[-1])


def test_top_level_help_loads_no_heavy_library() -> None:
    assert loaded_by(["--help"]) == []


@pytest.mark.parametrize("name", sorted(n for _, names in SECTIONS for n in names if n != "simulate"))
def test_a_commands_help_loads_no_heavy_library(name: str) -> None:
    assert loaded_by([name, "--help"]) == [], f"corral {name} --help"
