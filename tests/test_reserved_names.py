"""The names corral keeps for itself (issue 47, item 6; core/principals.py: RESERVED).

A person once added an agent named ``fastlane``: the fast lane's allocations were then
recorded as that person's agent, who listed and cancelled them. Every reserved name is
now refused on every edge that adds a principal (HTTP, the CLI; MCP has no such tool,
and nothing renames one), for every caller and kind, in the caller's terms; no token is
minted for, or acts as, corral's own service principals; and a store that holds one of
those names from before is taken back when the gateway starts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.control.intake import Intake
from corral.core.config import Settings
from corral.core.errors import Conflict, InvalidRequest, Unauthenticated
from corral.core.principals import (BUILD_PRINCIPAL, PILOT_PRINCIPAL, RESERVED, TOKENLESS, Kind, Principal,
                                    new_token)
from corral.edges.http.serve import build_service
from corral.edges.verbs import VERBS
from corral.safety.audit import AuditLog
from corral.safety.tokens import Caveats

from .conftest import Gateway


def _audit(home: Path) -> list[dict[str, Any]]:
    return list(AuditLog(home / "audit.jsonl", home / "audit.key").records())


def _refused(what: str, code: int, error: dict[str, Any], name: str) -> None:
    assert code == 403, (what, code, error)
    assert error["code"] == "forbidden" and f"{name!r} is reserved" in error["message"], (what, error)
    assert "pick another name" in error["message"], (what, error)


def test_no_one_adds_a_reserved_name_on_any_edge(gateway: Gateway) -> None:
    """Each reserved name, each kind, as the admin and as a person adding an agent: a 403
    over HTTP, an exit 2 with the JSON error under --json from `corral principal add`;
    nothing made, and the refusals audited with the rule that refused."""
    with gateway.http() as h:
        assert h.post("/v1/principals", json={"name": "alice", "kind": "human"}).status_code == 201
        alice = h.post("/v1/tokens", json={"for": "alice", "expires": "1h"}).json()["token"]
        before = h.get("/v1/principals").json()
    with gateway.http(alice) as h_alice:
        for name in RESERVED:
            tries: list[tuple[str, dict[str, Any], str | None]] = [
                (f"admin adds a {kind}", {"name": name, "kind": kind, **({"sponsor": "alice"} if kind == "agent"
                                                                         else {})}, None)
                for kind in ("human", "agent", "service")]
            tries.append(("alice adds her agent", {"name": name, "kind": "agent"}, alice))
            tries.append(("admin adds an admin", {"name": name, "kind": "human", "admin": True}, None))
            for what, body, token in tries:
                r = (h_alice if token else gateway.http()).post("/v1/principals", json=body)
                _refused(f"HTTP: {what} named {name}", r.status_code, r.json()["error"], name)
                args = ["--json", "principal", "add", name, "--kind", body["kind"]]
                args += ["--sponsor", body["sponsor"]] if "sponsor" in body else []
                args += ["--admin"] if body.get("admin") else []
                cp: subprocess.CompletedProcess[str] = gateway.cli(*args, token=token)
                assert cp.returncode == 2, (what, name, cp.stdout, cp.stderr)
                _refused(f"CLI: {what} named {name}", 403, json.loads(cp.stdout)["error"], name)
                assert "reserved" in cp.stderr
    with gateway.http() as h:
        assert h.get("/v1/principals").json() == before
    refusals = [r for r in _audit(gateway.home) if r.get("add_principal") in RESERVED]
    assert refusals and all(r["decision"] == "deny" and r["rule"] == "reserved-name" for r in refusals), refusals


def test_no_edge_but_http_and_the_cli_adds_or_renames_a_principal() -> None:
    """The verbs that change principals: only add_principal, with no MCP tool. If a verb
    that adds or renames principals is ever declared, this fails until it is in the test above."""
    changes = {v.name for v in VERBS if v.method != "GET" and "principal" in v.path}
    assert changes == {"add_principal"}, changes
    assert all(v.tool is None for v in VERBS if v.name in changes)


def test_no_token_is_minted_for_corrals_own_principals(gateway: Gateway) -> None:
    with gateway.http() as h:
        for name in sorted(TOKENLESS):
            r = h.post("/v1/tokens", json={"for": name, "expires": "1h"})
            assert r.status_code == 403 and "no token may" in r.json()["error"]["message"], (name, r.text)
            cp = gateway.cli("--json", "token", "mint", "--for", name, "--expires", "1h")
            assert cp.returncode == 2 and json.loads(cp.stdout)["error"]["code"] == "forbidden", cp.stdout
        # The admin's own name is a person's: its holder mints for it as before.
        assert h.post("/v1/tokens", json={"for": "admin", "expires": "1h"}).status_code == 201


def _squat(db: Any, tokens: Any) -> dict[str, list[str]]:
    """What a store made before the names were reserved may hold: alice's agent named
    fastlane, a person named envbuild and one named corral, each with a capability
    token and an opaque one. -> name: its tokens."""
    db.add_principal(Principal("alice", Kind.HUMAN))
    out: dict[str, list[str]] = {}
    for p in (Principal(PILOT_PRINCIPAL, Kind.AGENT, sponsor="alice"), Principal(BUILD_PRINCIPAL, Kind.HUMAN),
              Principal("corral", Kind.AGENT, sponsor="alice", account="alices")):
        db.add_principal(p)
        cap_id, cap = tokens.mint(p.name, Caveats())
        db.add_token(cap_id, p.name, "", None, "minted before the names were reserved")
        opaque_id, opaque, hash_ = new_token()
        db.add_token(opaque_id, p.name, hash_, None, "opaque, from before")
        out[p.name] = [cap, opaque]
    return out


def test_a_store_that_holds_a_reserved_name_is_taken_back_at_start(tmp_path: Path) -> None:
    """A store from before the fix, where alice's agent is named fastlane: corral refuses
    to act as it while it is someone's, and the next start takes it back. Then it is a
    service again, alice no longer sees it or its jobs, the old tokens no longer
    authenticate, and the taking is audited naming what it was."""
    settings = Settings(home=tmp_path / "home", local_cpus=2, fastlane=False)
    first = build_service(settings)
    first.accounts.bootstrap_admin()
    old = _squat(first.db, first.gate.tokens)
    alice = first.accounts.mint_token(first.authenticate(settings.admin_token_path.read_text().strip()), "alice",
                                      "1h")["token"]
    for token in old[PILOT_PRINCIPAL]:  # before the start that takes it back, its tokens are already dead
        with pytest.raises(Unauthenticated, match="a name corral keeps for itself"):
            first.authenticate(token)
    with pytest.raises(Conflict, match="not corral's own service"):  # corral records nothing as alice's agent
        Intake(first.db, first.audit, first.sender).service(PILOT_PRINCIPAL, "pool:x")
    assert PILOT_PRINCIPAL in first.authenticate(alice).visible
    first.db.close()

    again = build_service(settings)  # the next start
    for name in (PILOT_PRINCIPAL, BUILD_PRINCIPAL, "corral"):
        p = again.db.get_principal(name)
        assert p is not None and p.kind is Kind.SERVICE and not (p.sponsor or p.unix_user or p.account), p
        for token in old[name]:
            with pytest.raises(Unauthenticated):
                again.authenticate(token)
    caller = again.authenticate(alice)
    assert PILOT_PRINCIPAL not in caller.visible and "corral" not in caller.visible
    assert [p.name for p in again.accounts.list_principals(caller)] == ["alice"]
    me = Intake(again.db, again.audit, again.sender).service(PILOT_PRINCIPAL, "pool:x")
    assert me.principal.kind is Kind.SERVICE
    taken = {r["reclaim"]: r for r in _audit(settings.home) if "reclaim" in r}
    assert set(taken) == {PILOT_PRINCIPAL, BUILD_PRINCIPAL, "corral"}, taken
    assert taken[PILOT_PRINCIPAL]["was"]["sponsor"] == "alice" and taken[PILOT_PRINCIPAL]["rule"] == "reserved-name"
    again.db.close()
    third = build_service(settings)  # taken once: a later start finds it corral's and records nothing
    assert len([r for r in _audit(settings.home) if "reclaim" in r]) == 3
    third.db.close()


def test_an_admin_name_that_is_not_the_admin_stops_the_start(tmp_path: Path) -> None:
    """Taking ``admin`` back would make its holder the admin: the gateway does not start,
    and says why."""
    settings = Settings(home=tmp_path / "home", local_cpus=2, fastlane=False)
    first = build_service(settings)
    first.db.add_principal(Principal("admin", Kind.AGENT, sponsor=None))
    first.db.close()
    with pytest.raises(InvalidRequest, match="keeps that name for the facility's first admin"):
        build_service(settings)
