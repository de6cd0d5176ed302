"""The contract is the code: schemathesis (the real tool, its own CLI) generates requests
from the gateway's OpenAPI and checks every answer against it, as an admin and as an
agent: no 5xx, only documented status codes and content types, bodies that match the
documented schemas. Bounded examples per operation, deterministic, so the suite stays fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Gateway, running


@pytest.fixture
def gateway(tmp_path):
    """Long-polls (wait, events) bounded to 1 s here: a generated timeout must not outlast
    schemathesis' request timeout; a longer one is a documented 400."""
    with running(tmp_path, CORRAL_WAIT_MAX_S="1") as gw:
        yield gw

# One worker: with two, hypothesis's lambda descriptions parse source with ast in both threads
# at once, and CPython 3.11 may raise "AST constructor recursion depth mismatch" inside
# schemathesis (seen under load, on a string path parameter), a failure of the tool, not of corral.
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"


@pytest.mark.parametrize("who", ["admin", "agent"])
def test_schemathesis_finds_no_5xx_and_nothing_undocumented(gateway: Gateway, people, who: str, tmp_path) -> None:
    token = gateway.admin_token if who == "admin" else people["bot1"]
    st = Path(sys.executable).with_name("st")
    cp = subprocess.run(
        [str(st), "run", f"{gateway.url}/openapi.json", "-H", f"Authorization: Bearer {token}", "-c", CHECKS,
         "-n", "6", "--phases", "coverage,fuzzing", "--generation-deterministic", "--request-timeout", "30",
         "--workers", "1", "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    lines = cp.stdout.splitlines()
    # the errors' own section (a runtime error's cause is there), then the summary
    errors = next((i for i, ln in enumerate(lines) if ln.strip("= ").upper() in ("ERRORS", "FAILURES")), len(lines))
    tail = "\n".join(lines[errors:errors + 40] + ["..."] + lines[-40:])
    assert cp.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail.split("Test cases:")[-1], tail
