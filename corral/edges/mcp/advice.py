"""Advice for whoever reads it (issue 49 item 5). What corral says to do next is written
once, in the core's errors, for every edge; an agent reads it through MCP and can do only
what an agent can: call a tool, change a field, wait and retry, ask its sponsor. A hint
that names what only a person or the facility's admin can do (mint or clear a token,
register a principal, install a package, change the gateway's configuration or run it
as root) reaches the agent framed as what to ask its sponsor for, never as a command to
run (tests/test_agent_hints.py enumerates every hint the service can raise)."""

from __future__ import annotations

import re

PEOPLE_ONLY = re.compile(
    r"\badmin|\broot\b|\bsudo\b|\binstall\b|apt-get|/etc/|\[[a-z_]+\] [a-z_]+|"
    r"corral (token (mint|clear-taint|revoke)|principal|approvals|config|serve|slurm)|"
    r"restart the gateway|the gateway as|\bCORRAL_[A-Z_]+|docs/|README", re.I)
"""What only a person or the facility's admin can do."""


def for_agent(hint: str) -> str:
    """``hint`` as an agent can follow it."""
    if PEOPLE_ONLY.search(hint):
        return f"not yours to do: ask your sponsor (or the facility's admin) to see to it: {hint}"
    return hint


def said(message: str, hint: str | None) -> str:
    """An error as an agent reads it: the message, then the hint it can follow."""
    return message + (f" (hint: {for_agent(hint)})" if hint else "")
