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
