"""The red-team suite: 250 attacks (18 harmful commands in 13 disguises, plus 16 that
only exist in their own shape) against the 637 commands real coding agents ran."""

from __future__ import annotations

from collections import Counter

from corral.safety.redteam import DISGUISES, attacks
from corral.safety.policy import agent_verdict
from corral.safety.risk import analyze

from .test_risk import _benign


def test_every_disguise_of_every_attack_is_caught() -> None:
    cases = attacks()
    assert len(cases) >= 200
    missed = Counter(how for cmd, tag, how in cases if tag not in analyze(cmd).tags)
    assert sum(missed.values()) <= 0.05 * len(cases), missed
    # every disguise on its own catches what the plain command does
    for name, _ in DISGUISES:
        assert missed[name] == 0, (name, missed)
    assert all(not agent_verdict(list(analyze(cmd).tags)).allowed for cmd, _, _ in cases)


def test_benign_agent_commands_pass() -> None:
    cmds = _benign()
    assert len(cmds) >= 500
    denied = [c for c in cmds if not agent_verdict(list(analyze(c).tags)).allowed]
    assert len(denied) <= 0.01 * len(cmds), denied[:5]


def _benign_text() -> list[str]:
    """Real prose nobody wrote to attack anything: the descriptions of every installed package."""
    from importlib.metadata import distributions

    paras: list[str] = []
    for d in distributions():
        text = d.read_text("METADATA") or ""
        paras += [p for p in text.split("\n\n") if len(p) > 80]
    return paras


def test_injections_in_every_disguise_are_flagged_and_benign_output_is_not() -> None:
    from corral.safety.guard import injection, scan
    from corral.safety.redteam import BENIGN_OUTPUT, INJECTION_DISGUISES, injections

    cases = injections()
    assert len(cases) >= 200
    missed = Counter(how for text, how in cases if not injection(text))
    assert sum(missed.values()) <= 0.05 * len(cases), missed
    for name, _ in INJECTION_DISGUISES:
        assert missed[name] == 0, (name, missed)
    wrapped = scan(cases[0][0], "job 1 stdout")
    assert wrapped.text.startswith("<untrusted-data") and wrapped.flagged
    assert not [b for b in BENIGN_OUTPUT if injection(b)]
    prose = _benign_text()
    assert len(prose) >= 500
    flagged = [p for p in prose if injection(p)]
    assert len(flagged) <= 0.01 * len(prose), flagged[:3]


def test_secrets_are_redacted_wherever_they_sit() -> None:
    from corral.safety.guard import redact

    secrets = {
        "aws_access_key": "AKIAIOSFODNN7EXAMPLE", "github_token": "ghp_" + "a1" * 20,
        "anthropic_key": "sk-ant-api03-" + "x" * 40, "openai_key": "sk-proj-" + "Ab3" * 10,
        "google_api_key": "AIza" + "B" * 35, "huggingface_token": "hf_" + "c" * 34,
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "password_in_url": "https://alice:hunter22@git.example.org/repo.git",
        "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    }
    for name, secret in secrets.items():
        out, found = redact(f"log line before\nvalue: {secret}\nlog line after")
        assert name in found, (name, found)
        assert secret not in out and "log line after" in out
