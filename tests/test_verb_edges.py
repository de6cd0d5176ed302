"""Every verb's edges (issue 53): each verb of the table (corral/edges/verbs.py) is an
HTTP route and a client method; it is an MCP tool and a ``corral`` command, or its row
says why not (``without``), and never both. The list, with the differences, is
docs/verbs.md (regenerate: ``.venv/bin/python tests/test_verb_edges.py > docs/verbs.md``).
The product's edges call a declared verb through ``run`` (mypy checks the call against
the function that serves it), never by name."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from mcp import Client as McpClient

from corral.edges import verbs
from corral.edges.cli.main import cli
from corral.edges.declare import DECLARED
from corral.edges.mcp.tools import build_mcp

if TYPE_CHECKING:
    from .conftest import Gateway

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "verbs.md"


def tool_names() -> set[str]:
    async def listed() -> set[str]:
        async def card() -> dict[str, object]:
            return {}

        async with McpClient(build_mcp(lambda ctx: None, card)) as c:  # type: ignore[arg-type,return-value]
            return {t.name for t in (await c.list_tools()).tools}

    return asyncio.run(listed())


def command_of(path: str) -> click.Command | None:
    """The ``corral`` command a row names ('token mint'; 'submit --array' is submit)."""
    cmd: click.Command | None = cli
    ctx = click.Context(cli)
    for word in (w for w in path.split() if not w.startswith("-")):
        if not isinstance(cmd, click.Group):
            return None
        cmd = cmd.get_command(ctx, word)
        if cmd is None:
            return None
        ctx = click.Context(cmd, parent=ctx)
    return cmd


def render() -> str:
    lines = ["# corral's verbs and their edges", "",
             "Generated from corral/edges/verbs.py by tests/test_verb_edges.py (which fails when this is stale): every "
             "verb is declared once, typed (corral/edges/declare.py; its edges' calls checked by mypy), and is an "
             "HTTP route and a `Client` method; its MCP tool and `corral` command, or why it has none.", "",
             "| verb | HTTP | MCP tool | CLI |", "|---|---|---|---|"]
    for v in verbs.VERBS:
        mcp = f"`{v.tool.name}`" if v.tool else f"none: {v.without.get('mcp', '?')}"
        cmd = f"`corral {v.cli}`" if v.cli else f"none: {v.without.get('cli', '?')}"
        lines.append(f"| {v.name} | `{v.method} {v.path}` | {mcp} | {cmd} |")
    return "\n".join(lines) + "\n"


def test_every_verb_reaches_every_edge_or_says_why() -> None:
    tools = tool_names()
    for v in verbs.VERBS:
        for edge, present in (("mcp", v.tool is not None), ("cli", v.cli is not None)):
            assert present != bool(v.without.get(edge)), f"{v.name}: {edge} edge and no reason, or both"
        if v.tool is not None:
            assert v.tool.name in tools, f"{v.name}: its tool {v.tool.name} is not listed"
        if v.cli is not None:
            assert command_of(v.cli) is not None, f"{v.name}: 'corral {v.cli}' does not exist"
    assert command_of("plan") is not None and command_of("budget") is not None


def test_every_verb_is_declared_typed() -> None:
    """No row written by hand: a job as the whole body (submit, plan) and fields only some
    of which are sent (a token's caveats, notify's choices) are declared too."""
    rows = [d.row for d in DECLARED]
    assert [v.name for v in verbs.VERBS if v not in rows] == []


def test_docs_verbs_md_is_the_table() -> None:
    assert DOC.read_text() == render(), "regenerate: .venv/bin/python tests/test_verb_edges.py > docs/verbs.md"


def test_the_edges_call_declared_verbs_typed() -> None:
    """No ``client.job(...)``/``ops.wait(...)`` in the product for a declared verb: through
    ``run(reads.job, ...)``, so mypy checks the arguments."""
    names = {d.name for d in DECLARED}
    found = []
    for path in (ROOT / "corral").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
                receiver = ast.unparse(node.func.value)
                if receiver.split(".")[-1] in ("client", "c", "ops", "remote") or receiver.startswith("ops_for("):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {receiver}.{node.func.attr}")
    assert not found, found


def test_mypy_refuses_a_wrong_call_of_a_declared_verb(tmp_path: Path) -> None:
    bad = tmp_path / "edge.py"
    bad.write_text("from corral.edges import acts, reads\nfrom corral.edges.client import Client\n\n\n"
                   "def f(c: Client) -> None:\n    c.run(reads.job, 'seven')\n    c.run(reads.jobs, colour='red')\n"
                   "    c.run(acts.mint_token, 'bot', max_cpu=4)\n    c.run(acts.submit, {}, hold='yes')\n")
    cp = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(bad)],
                        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert 'incompatible type "str"; expected "int"' in cp.stdout, cp.stdout
    assert 'Unexpected keyword argument "colour"' in cp.stdout, cp.stdout
    assert 'Unexpected keyword argument "max_cpu"' in cp.stdout, cp.stdout
    assert 'incompatible type "str"; expected "bool"' in cp.stdout, cp.stdout


def test_budget_is_a_command_made_from_its_declaration(gateway: Gateway) -> None:
    """`corral budget` (issue 53: declared in four files, reachable by none but HTTP): a
    table of the token's limited blocks, or the HTTP answer under --json."""
    gateway.cli_json("principal", "add", "alice", "--kind", "human")
    gateway.cli_json("principal", "add", "bot", "--kind", "agent", "--sponsor", "alice")
    minted = gateway.cli_json("token", "mint", "--for", "bot", "--cpu-hours", "5", "--max-active", "3")
    with gateway.http(minted["token"]) as h:
        assert gateway.cli_json("budget", token=minted["token"]) == h.get("/v1/budget").json()
    shown = gateway.cli("budget", token=minted["token"])
    assert shown.returncode == 0, shown.stderr
    head, row = shown.stdout.splitlines()[:2]
    assert head.split()[:3] == ["BLOCK", "CPU_HOURS", "GPU_HOURS"], shown.stdout
    assert row.startswith(minted["id"]) and "limit 5.0, used 0.0, left 5.0" in row and "limit 3, now 0" in row, row


if __name__ == "__main__":
    sys.stdout.write(render())
