"""Advice for whoever reads it (issue 49 item 5): every hint the service can raise, for
every error code, reaches an agent (through the MCP edge's own error path) as something
an agent can do: a tool, a field, wait and retry, ask its sponsor. A hint naming what
only a person or the admin can do (mint a token, install, configure the gateway) is
framed as what to ask the sponsor for, never handed over as a command to run."""

from __future__ import annotations

import ast
import asyncio
import re
from collections import defaultdict
from pathlib import Path
from typing import Awaitable, Callable

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from corral.core import errors
from corral.edges.mcp.advice import PEOPLE_ONLY, for_agent
from corral.edges.mcp.answers import guarded

ROOT = Path(__file__).parent.parent
SERVICE = ["gateway", "safety", "core", "lanes", "storage", "memory", "sandbox", "control", "edges/mcp"]
"""What runs inside the gateway, where an agent's request may meet an error (the CLI's own
commands are a person's)."""
PEOPLES = ("corral/core/principals.py", "corral/gateway/approvals.py", "corral/gateway/backup.py",
           "corral/gateway/signin.py")
"""Verbs only people reach (registering principals, a sponsor's approvals, an admin's backup and
restore on the gateway's host, a person's sign-in): their hints
are written for a person."""
TOOLS = ("submit_job", "submit_jobs", "plan_job", "job_status", "wait_for_job", "wait_for_events", "job_output",
         "cancel_job", "job_control", "job_usage", "list_jobs", "facility_info", "remember", "recall",
         "build_environment", "workspace")
AGENT_CAN = re.compile(
    r"\b(" + "|".join(TOOLS) + r")\b|ask your sponsor|\b(retry|wait|waits|call|again|send|list|write|fix|drop|give|"
    r"set|use|open|read|narrow|split|ask|remove|choose|pick|fewer|less|smaller|shorter|submit|cancel|signal|leave|"
    r"put|hold|release|see|name|for example)\b", re.I)
CLASSES = {c.__name__: c for c in vars(errors).values()
           if isinstance(c, type) and issubclass(c, errors.CorralError)}


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join("{}" if isinstance(v, ast.FormattedValue) else _text(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " / " + _text(node.orelse)
    return ""


def raised_hints() -> dict[str, list[tuple[str, str]]]:
    """error code -> (where, hint) of every error raised with a hint in the service."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for part in SERVICE:
        for f in sorted((ROOT / "corral" / part).rglob("*.py")):
            for n in ast.walk(ast.parse(f.read_text())):
                name = getattr(n.func, "id", None) if isinstance(n, ast.Call) else None
                if name in CLASSES and not str(f.relative_to(ROOT)).startswith(PEOPLES):
                    for k in n.keywords:  # type: ignore[attr-defined]
                        if k.arg == "hint" and _text(k.value):
                            line = getattr(n, "lineno", 0)
                            out[CLASSES[name].code].append((f"{f.relative_to(ROOT)}:{line}", _text(k.value)))
    out["rate_limited"].append(("errors.RateLimited (default)", errors.RateLimited("x", retry_after=3).hint or ""))
    return out


async def _call(tool: Callable[[], Awaitable[None]]) -> None:
    await guarded(tool)()


def test_every_error_codes_hints_name_something_an_agent_can_do() -> None:
    hints = raised_hints()
    assert {"invalid_request", "unauthenticated", "forbidden", "not_found", "conflict", "rate_limited",
            "backend_unavailable"} <= set(hints), sorted(hints)  # every code an agent meets, enumerated
    bad = []
    for code, found in sorted(hints.items()):
        for where, hint in found:
            told = for_agent(hint)
            if not AGENT_CAN.search(told) or (PEOPLE_ONLY.search(hint) and "ask your sponsor" not in told):
                bad.append(f"{code} {where}: {told}")
    assert not bad, "\n".join(bad)
    assert sum(len(v) for v in hints.values()) > 50  # the scan found the hints, not nothing


@pytest.mark.parametrize("error", [
    errors.Unauthenticated("token t1 expired at 2026-01-01 00:00:00 UTC",
                           hint="mint a new one with 'corral token mint --for bot' (using a token still valid)"),
    errors.Forbidden("jobs may not run as the gateway's account", hint="an admin gives bot a Unix user of its own "
                                                                        "(corral principal add bot --unix-user U)"),
    errors.BackendError("this node can mount no workspace", hint="run the gateway as root, or install fuse-overlayfs"),
])
def test_a_people_only_hint_reaches_the_agent_as_what_to_ask_its_sponsor(error: errors.CorralError) -> None:
    async def tool() -> None:
        raise error

    with pytest.raises(ToolError) as got:
        asyncio.run(_call(tool))
    said = str(got.value)
    assert said.startswith(error.message) and "ask your sponsor" in said, said
    assert said.index("ask your sponsor") < said.index(error.hint or ""), said  # framed before it is quoted


def test_an_unexpected_failure_tells_the_agent_what_it_can_do() -> None:
    async def tool() -> None:
        raise RuntimeError("boom")

    with pytest.raises(ToolError) as got:
        asyncio.run(_call(tool))
    assert "retry once" in str(got.value) and "tell your user" in str(got.value) and "boom" not in str(got.value)
