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


def test_generated_submissions_are_mostly_accepted(gateway: Gateway, tmp_path) -> None:
    """The schema of a job states what the gateway accepts (one of command or script, text
    without NUL, absolute paths, sizes with their units, this facility's largest node), so
    valid jobs generated from it are accepted unless they name what the schema cannot
    know: a directory, image, workspace or parent job that does not exist, a parent that
    failed, a repeat of a job that failed; each of those is a clear refusal. A generator reusing an Idempotency-Key with another body
    is refused (409) by design, and those bodies are left out of the count."""
    import json

    st = Path(sys.executable).with_name("st")
    har = tmp_path / "run.har"
    cp = subprocess.run(
        [str(st), "run", f"{gateway.url}/openapi.json", "-H", f"Authorization: Bearer {gateway.admin_token}",
         "-c", "not_a_server_error", "-n", "40", "--phases", "fuzzing", "-m", "positive", "--generation-deterministic",
         "--include-path", "/v1/jobs", "--workers", "1", "--no-color", "--request-timeout", "30",
         "--report", "har", "--report-har-path", str(har)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert cp.returncode == 0, cp.stdout[-3000:]
    answers = [(e["response"]["status"], e["response"]["content"].get("text", ""))
               for e in json.loads(har.read_text())["log"]["entries"]
               if e["request"]["method"] == "POST" and e["request"]["url"].endswith("/v1/jobs")]
    # Left out of the count: bodies refused for what they repeat, not for what they are (a
    # reused Idempotency-Key; a repeat of a job that already failed, whose share depends on
    # how fast the generated jobs fail on this machine). Both are still answered with a reason.
    decided = [(code, text) for code, text in answers
               if not (code == 409 and ("idempotency key" in text or "this exact job" in text))]
    assert all('"message"' in text for code, text in answers if code >= 400)
    accepted = [code for code, _ in decided if code in (200, 201)]
    assert len(decided) >= 10, answers
    refused = [t for c, t in decided if c >= 400]
    # Every refusal is one the schema cannot foresee: what the body names does not exist
    # (here, or for this caller), or a job it waits for has already failed. A refusal of
    # anything else is a rule the schema does not state (seen: ids over its maximum, which
    # a client reading numbers as doubles rounded up).
    unforeseeable = ("which is not visible to you", "does not exist", "no environment image", "no workspace",
                     "dependency never satisfied", "not found")
    # A walltime given as text ('8664:00:00', '30h') has no maximum JSON Schema can state (its
    # number form has one): its refusal names the limit and what to ask for instead.
    # Nor can it tie one field to another: the fast lane's shorter walltime (lane 'fast' with
    # a batch-length walltime) is said in the lane's description and in its refusal.
    text_walltime = [t for t in refused if "walltime" in t and "over the limit" in t and "ask for walltime" in t]
    fast_lane = [t for t in refused if "lane 'fast': walltime" in t and "more than a fast-lane task may have" in t]
    assert [t[:200] for t in refused
            if not any(p in t for p in unforeseeable) and t not in text_walltime + fast_lane] == []
    assert len(accepted) >= len(decided) / 4, [t[:160] for t in refused]
    assert all('"message"' in text for code, text in decided if code >= 400)  # every refusal says why
