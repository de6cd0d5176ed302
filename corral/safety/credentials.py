"""Authentication and tokens: who is asking, and the tokens people mint for agents.

Every minted token is a capability token (corral/safety/tokens.py). Opaque bearer
secrets (``crl_...``: the admin's first token, and tokens minted before capability
tokens existed) are still accepted until revoked or expired.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from corral.core.errors import Forbidden, InvalidRequest, NotFound, Unauthenticated
from corral.core.principals import (RESERVED, TOKENLESS, Caller, Kind, Principal, check_session, secret_matches,
                                   split_token)
from corral.safety import job_credentials
from corral.safety.job_credentials import EgressCredentials, JobCredentials
from corral.safety.tokens import MAX_TOKEN_CHARS, PREFIX, TOO_LONG_HINT, Capability, Caveats, precheck

if TYPE_CHECKING:
    from corral.core.db import Database
    from corral.safety.gate import Gate


VERIFY_PER_S = 20.0
"""Verifications per second of tokens not seen before, per root token (all its narrowed
variants together); an honest agent verifies each of its tokens once."""
VERIFY_BURST = 100.0


class Credentials:
    def __init__(self, db: "Database", gate: "Gate") -> None:
        self.db = db
        self.gate = gate
        # token -> (expiry, principal, visible names, capability, token id). Every write to principals
        # or tokens clears it, so a revocation takes effect on the very next request.
        self._cache: dict[bytes, tuple[float | None, Principal, frozenset[str], Capability | None, str]] = {}
        self.jobs = JobCredentials(gate.tokens.secret())
        self.egress = EgressCredentials(gate.tokens.secret())  # a job's name at the egress proxy
        """Contained jobs' own credentials (``crj_``): their Slurm commands inside (decision 0057)."""
        self._job_caps: dict[str, Capability] = {}
        """principal -> the read-only capability its jobs' credentials act with (minted once an hour)."""

    def clear(self) -> None:
        self._cache.clear()

    def authenticate(self, token: str | None, session: str | None = None) -> Caller:
        if not token:
            raise Unauthenticated("no token given: the CLI takes --token or CORRAL_TOKEN; over HTTP send "
                                  "'Authorization: Bearer <token>'")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated(f"the token is {len(token):,} characters long; corral takes at most "
                                  f"{MAX_TOKEN_CHARS:,}", hint=TOO_LONG_HINT)
        key = hashlib.sha256(token.encode()).digest()  # a bounded key, whatever the token's length
        hit = self._cache.get(key)
        if hit is None or (hit[0] is not None and hit[0] < self.gate.clock.time()):
            if token.startswith(PREFIX):
                # Bounded before the signatures are checked, and charged: a flood of fresh
                # variants of one token is refused (429) before the costly part (H4 F20).
                root = precheck(token)
                self.gate.buckets.take_all([(f"verify:{root}", 1.0, VERIFY_PER_S, VERIFY_BURST,
                                             "fresh variants of one token")], self.gate.clock.monotonic())
            if token.startswith(job_credentials.PREFIX):  # its job's record read at every request: never cached
                hit = self._job(token)
            else:
                hit = self._verify(token)
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[key] = hit
        expires, principal, visible, cap, token_id = hit
        caller = Caller(principal, check_session(session), token_id, visible, cap)
        self.gate.api_call(caller)
        return caller

    def _job(self, token: str) -> tuple[float | None, Principal, frozenset[str], Capability | None, str]:
        """A contained job's credential: its principal's reads of that principal's own jobs
        (never an admin's view), while corral's record of the job is not terminal."""
        job_id = self.jobs.check(token)
        job = self.db.get_job(job_id) if job_id is not None else None
        if job is None:
            raise Unauthenticated("the job credential is not valid: Slurm's commands inside a job use the one "
                                  "corral gave it (CORRAL_TOKEN)")
        if job.state.terminal:
            raise Unauthenticated(f"job {job_id} has ended, and the credential corral gave it ended with it")
        principal = self.db.get_principal(job.principal)
        if principal is None:
            raise Unauthenticated("the job's principal no longer exists")
        now = self.gate.clock.time()
        held = self._job_caps.get(principal.name)
        if held is None or held.expires_at is None or held.expires_at < now + 600:
            held = self.gate.tokens.verify(self.gate.tokens.mint(principal.name, Caveats(
                expires_at=now + 3600, actions=list(job_credentials.ACTIONS)))[1])
            self._job_caps[principal.name] = held
        return None, replace(principal, is_admin=False), frozenset([principal.name]), held, f"job-{job_id}"

    def _verify(self, token: str) -> tuple[float | None, Principal, frozenset[str], Capability | None, str]:
        cap: Capability | None = None
        if token.startswith(PREFIX):
            cap = self.gate.tokens.verify(token)
            record = self.db.get_token(cap.root)
            if record is None:
                raise Unauthenticated("the token was not minted by this gateway; ask your sponsor for one")
            dead = [b for b in cap.block_ids if b in self.gate.revoked]
            if dead:
                raise Unauthenticated(f"token {dead[0]} was revoked; ask your sponsor for a new one")
            expires = cap.expires_at
        else:
            parts = split_token(token)
            record = self.db.get_token(parts[0]) if parts else None
            if parts is None or record is None or not record["hash"] or not secret_matches(parts[1], record["hash"]):
                raise Unauthenticated("the token is not valid; check CORRAL_TOKEN or ask your sponsor to mint one")
            if record["revoked"]:
                raise Unauthenticated(f"token {record['id']} was revoked; ask your sponsor for a new one")
            expires = record["expires"]
        if expires is not None and expires < self.gate.clock.time():
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expires))
            raise Unauthenticated(f"token {record['id']} expired at {when}",
                                  hint=self._renewal(record["principal"]))
        principal = self.db.get_principal(record["principal"])
        if principal is None:
            raise Unauthenticated("the token's principal no longer exists")
        if principal.name in TOKENLESS:  # minted before the name was reserved: corral acts as it, no token does
            raise Unauthenticated(f"token {record['id']} acts as {principal.name!r}, a name corral keeps for itself; "
                                  "no token acts as it", hint="ask your sponsor for a token of your own")
        if cap is not None and len(cap.block_ids) > 1:
            self.gate.store.seen_blocks(cap.root, principal.name, cap.block_ids)
        if cap is not None:
            self.gate.store.saw_limits(principal.name, cap.block_ids, cap.limits)
        visible = frozenset([principal.name, *self.db.sponsored_by(principal.name)])
        return expires, principal, visible, cap, cap.block_ids[-1] if cap else record["id"]

    def _renewal(self, name: str) -> str:
        """What the holder of an expired token can do: an agent cannot mint (only people
        do), so it asks its sponsor; a person mints with a token still valid."""
        holder = self.db.get_principal(name)
        if holder is not None and holder.kind is not Kind.HUMAN:
            sponsor = f" ({holder.sponsor})" if holder.sponsor else ""
            return (f"ask your sponsor{sponsor} for a new token, then start again with it; "
                    "an agent cannot mint one")
        return f"mint a new one with 'corral token mint --for {name}' (using a token still valid), or ask an admin"

    def clear_taint(self, caller: Caller, token_id: str) -> str:
        """Lift a token's taint: its principal's sponsor or an admin, never the tainted
        agent itself. -> the reason it was tainted."""
        record = self.db.get_token(token_id)
        owner = record["principal"] if record else self.gate.store.block_owner(token_id)
        if owner is None or not caller.sees(owner):
            raise NotFound(f"no token {token_id!r} that you may clear; see 'corral token list'")
        if owner == caller.name and not caller.principal.is_admin:
            raise Forbidden("a token's own holder cannot clear its taint; its sponsor or an admin can, "
                            f"with 'corral token clear-taint {token_id}'")
        why = self.gate.clear_taint(token_id, owner)
        if why is None:
            root = self.gate.store.block_root(token_id) or token_id
            held = [b for b in (root, *self.gate.store.blocks_of(root))
                    if b != token_id and self.gate.taint_key(b) in self.gate.tainted_keys()]
            if held:  # narrowed from a tainted token: that one holds it
                raise NotFound(f"token {token_id!r} is not tainted itself; the taint is on {', '.join(held)}, "
                               "which it shares a root with",
                               hint=f"clear that one: 'corral token clear-taint {held[0]}'")
            raise NotFound(f"token {token_id!r} is not tainted")
        self._cache.clear()
        return why

    def check_mint(self, caller: Caller, for_name: str, expires_at: float | None) -> None:
        """What the core itself requires of minting, before the facility policy is asked."""
        if not caller.principal.is_admin and caller.principal.kind is not Kind.HUMAN:
            # An agent with an 8-hour token must not be able to renew itself forever.
            raise Forbidden("only people mint tokens: ask your sponsor for a new one",
                            hint="to hand a sub-agent less than you have, use 'corral token attenuate'")
        if for_name in TOKENLESS:
            raise Forbidden(f"{for_name!r} is {RESERVED[for_name]}: corral acts as it, and no token may",
                            rule="reserved-name")
        target = self.db.get_principal(for_name)
        if target is None or not caller.sees(for_name):
            raise NotFound(f"no principal {for_name!r} that you may mint tokens for; see 'corral principal list'")
        if expires_at is None and target.kind is Kind.AGENT:
            raise InvalidRequest("agent tokens must expire; give --expires such as 8h or 7d")

    def mint(self, caller: Caller, for_name: str, expires_at: float | None, note: str | None,
             caveats: Caveats) -> dict[str, Any]:
        self.check_mint(caller, for_name, expires_at)
        caveats.expires_at = expires_at
        token_id, token = self.gate.tokens.mint(for_name, caveats)
        self.db.add_token(token_id, for_name, "", expires_at, note)
        return {"id": token_id, "token": token, "principal": for_name, "expires": expires_at,
                "caveats": caveats.datalog().splitlines()}

    def list(self, caller: Caller) -> list[dict[str, Any]]:
        names = None if caller.principal.is_admin else sorted(caller.visible)
        tokens = self.db.list_tokens(names)
        opaque = self._opaque_ids()  # once, not once per token
        for t in tokens:
            t["kind"] = "opaque" if t["id"] in opaque else "capability"
        derived = [{"id": b["id"], "principal": b["principal"], "created": b["first_seen"], "expires": None,
                    "revoked": b["revoked"], "note": f"narrowed from {b['root']} (seen in use)", "kind": "derived"}
                   for b in self.gate.store.blocks(names)]
        return tokens + derived

    def _opaque_ids(self) -> set[str]:
        return self.db.opaque_token_ids()

    def revoke(self, caller: Caller, token_id: str) -> None:
        """By id: a minted token's, or a derived block's once it has been used. Kills every
        token derived from it too."""
        record = self.db.get_token(token_id)
        owner = record["principal"] if record else self.gate.store.block_owner(token_id)
        if owner is None or not caller.sees(owner):
            raise NotFound(f"no token {token_id!r} that you may revoke; see 'corral token list'")
        self.gate.store.revoke(token_id, caller.name)
        self.gate.revoked.add(token_id)
        self._cache.clear()
