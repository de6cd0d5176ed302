"""Who may act: the core's verbs for principals and their tokens (the admin's
bootstrap, adding principals, minting and revoking tokens). An object the service
holds (``service.accounts``); every edge reaches these through it, and each runs
authenticate -> check -> record."""

from __future__ import annotations

import logging
import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.store.conn import INTEGRITY_ERRORS
from corral.core.errors import Conflict, Forbidden, InvalidRequest
from corral.core.text import text_problem
from corral.core.principals import (ADMIN_PRINCIPAL, CORRAL_PRINCIPAL, RESERVED, Caller, Kind, Principal,
                                   check_name, check_unreserved, is_own_service, new_token)
from corral.safety.tokens import ACTIONS, Caveats, expires_in

if TYPE_CHECKING:
    from corral.core.config import Settings
    from corral.core.db import Database
    from corral.safety.audit import Audit
    from corral.safety.credentials import Credentials
    from corral.safety.gate import Gate

log = logging.getLogger(__name__)
ADMIN = ADMIN_PRINCIPAL


class Accounts:
    def __init__(self, settings: "Settings", db: "Database", credentials: "Credentials", gate: "Gate",
                 audit: "Audit") -> None:
        self.settings, self.db, self.credentials, self.gate, self.audit = settings, db, credentials, gate, audit

    # -- bootstrap ----------------------------------------------------------------

    def bootstrap_admin(self) -> Path | None:
        """On first start: create the admin principal and write its token (0600). -> path, if new."""
        if self.db.get_principal(ADMIN) is not None:
            return None
        self.db.add_principal(Principal(ADMIN, Kind.HUMAN, is_admin=True))
        token_id, token, hash_ = new_token()
        self.db.add_token(token_id, ADMIN, hash_, None, "admin token created on first start")
        path = self.settings.admin_token_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        return path

    def reclaim(self) -> list[str]:
        """At start: a reserved name (core/principals.py: RESERVED) that the store holds in
        a shape corral did not give it, made by someone before the names were reserved, is
        taken back: made corral's own service principal again (no sponsor, Unix user,
        account or admin right), so its former sponsor no longer sees, lists or cancels
        what corral records under it; its tokens stopped acting as it already
        (``Credentials``: no token acts as a tokenless name). Each taking is logged and
        audited, naming what the principal was. Jobs recorded under the name stay recorded
        under it. An ``admin`` that is not the admin person stops the start: taking it back
        would make its holder the admin. -> the names taken back."""
        taken = []
        for name in sorted(RESERVED):
            p = self.db.get_principal(name)
            if p is None:
                continue
            if name == ADMIN:
                if not (p.kind is Kind.HUMAN and p.is_admin):
                    raise InvalidRequest(
                        f"this store's principal {name!r} is a {p.kind.value} without the admin right, but corral "
                        "keeps that name for the facility's first admin; the gateway will not start with it",
                        hint="restore the store from a backup, or ask corral's maintainers how to rename it")
                continue
            if is_own_service(p):
                continue
            with self.db.transaction():
                self.db.reshape_principal(Principal(name, Kind.SERVICE, created=p.created))
                self.audit.record(Caller(Principal(CORRAL_PRINCIPAL, Kind.SERVICE), None, "startup", frozenset()),
                                  "manage", "allow", "reserved-name", [{"reclaim": name, "was": p.to_dict()}])
            self.credentials.clear()
            log.warning("principal %r (kind %s, sponsor %s), made before the name was reserved for %s: taken back "
                        "as corral's own; its tokens no longer authenticate", name, p.kind.value, p.sponsor,
                        RESERVED[name])
            taken.append(name)
        return taken

    # -- authentication -------------------------------------------------------------

    def authenticate(self, token: str | None, session: str | None = None) -> Caller:
        """Token -> caller, on every request of every edge; rate-limits API calls."""
        return self.credentials.authenticate(token, session)

    # -- principals and tokens --------------------------------------------------------

    def add_principal(
        self, caller: Caller, name: str, kind: str, sponsor: str | None = None,
        unix_user: str | None = None, account: str | None = None, admin: bool = False,
    ) -> Principal:
        with self.audit.refusals(caller, "manage", {"add_principal": name}):
            p = self._add_principal(caller, name, kind, sponsor, unix_user, account, admin)
        self.audit.record(caller, "manage", "allow", "policy", [{"add_principal": name, "kind": p.kind.value,
                                                                 "sponsor": p.sponsor}])
        return p

    def _add_principal(self, caller: Caller, name: str, kind: str, sponsor: str | None,
                       unix_user: str | None, account: str | None, admin: bool) -> Principal:
        check_unreserved(check_name(name))
        try:
            k = Kind(kind)
        except ValueError:
            raise InvalidRequest(f"kind {kind!r} is unknown; use one of: human, agent, service") from None
        if not caller.principal.is_admin:
            # A human may register agents it sponsors itself; everything else is the admin's.
            if not (caller.principal.kind is Kind.HUMAN and k is Kind.AGENT and sponsor in (None, caller.name)):
                raise Forbidden("only an admin may add humans and services; a human may add agents it sponsors")
            sponsor = caller.name
        if admin and not caller.principal.is_admin:
            raise Forbidden("only an admin may create another admin")
        if k is Kind.AGENT:
            if not sponsor:
                raise InvalidRequest("an agent needs a sponsor: the human who answers for it (--sponsor NAME)")
            sp = self.db.get_principal(sponsor)
            if sp is None or sp.kind is not Kind.HUMAN:
                raise InvalidRequest(f"sponsor {sponsor!r} is not a human principal; add the human first")
            # An agent acts under its sponsor's name: it runs as the sponsor's Unix user and
            # is charged to the sponsor's account. Only an admin may place it elsewhere, or
            # a sponsor could have its agent run as any user (root included).
            if not caller.principal.is_admin and (unix_user not in (None, sp.unix_user) or account not in (None, sp.account)):
                raise Forbidden("an agent runs as its sponsor's Unix user and account; only an admin may set others")
            unix_user = unix_user if unix_user is not None else sp.unix_user
            account = account if account is not None else sp.account
        elif sponsor:
            raise InvalidRequest("only agents have sponsors; drop --sponsor for humans and services")
        if unix_user and _uid(unix_user) == 0:
            raise InvalidRequest(f"unix user {unix_user!r} is root: corral never runs a job as root",
                                 hint="give the principal an unprivileged Unix user, or none")
        if unix_user and _gid(unix_user) == 0:
            raise Forbidden(f"unix user {unix_user!r} has gid 0 (root's group) as its primary group: corral never "
                            "runs a job in root's group",
                            hint=f"give {unix_user} another primary group, or the principal another Unix user")
        if self.db.get_principal(name) is not None:
            raise Conflict(f"principal {name!r} already exists")
        self.gate.check(caller, "manage", "Facility")
        self.credentials.clear()
        try:
            return self.db.add_principal(Principal(name, k, sponsor, unix_user, account, admin and k is Kind.HUMAN))
        except INTEGRITY_ERRORS:
            raise Conflict(f"principal {name!r} already exists") from None

    def list_principals(self, caller: Caller) -> list[Principal]:
        return [p for p in self.db.list_principals() if caller.sees(p.name)]

    def mint_token(self, caller: Caller, for_name: str, expires: str | None = "8h", note: str | None = None,
                   caveats: Caveats | None = None) -> dict[str, Any]:
        """A capability token for ``for_name`` with ``caveats``; shown once."""
        with self.audit.refusals(caller, "manage", {"mint_for": for_name}):
            if note is not None and (problem := text_problem(note, "note")):
                raise InvalidRequest(problem)
            expires_at = expires_in(expires, self.gate.clock.time())
            self.credentials.check_mint(caller, for_name, expires_at)
            caveats = self._within_site_limits(caller, for_name, expires_at, caveats or Caveats())
            self.gate.check(caller, "manage", "Facility")
            with self.db.transaction():  # the token and its record together, or neither (a full disk)
                minted = self.credentials.mint(caller, for_name, expires_at, note, caveats)
                self.audit.record(caller, "manage", "allow", "policy", [{"mint_for": for_name, "token_id": minted["id"],
                                                                   "caveats": minted["caveats"]}])
        return minted

    def _within_site_limits(self, caller: Caller, for_name: str, expires_at: float | None,
                            caveats: Caveats) -> Caveats:
        """What a person (not an admin) may mint, as the site set it ([signin]): a lifetime
        at most agent_token_max_s, for themselves too (a stolen sign-in token must not
        become one that never expires); for an agent, only the actions the site lets people
        grant (a token that names none gets those) and at most agent_tokens_max live tokens."""
        if caller.principal.is_admin:
            return caveats
        limits, now = self.settings.signin, self.gate.clock.time()
        if expires_at is None or expires_at - now > limits.agent_token_max_s + 1:
            raise Forbidden(f"this site lets a person mint tokens of at most {_span(limits.agent_token_max_s)}",
                            hint=f"ask for less, e.g. --expires {_span(min(8 * 3600, limits.agent_token_max_s))}; "
                                 "longer takes an admin", rule="mint-limit")
        if for_name == caller.name:
            self._not_renewed(caller, expires_at)
        target = self.db.get_principal(for_name)
        if target is None or target.kind is not Kind.AGENT:
            return caveats
        allowed = limits.agent_actions if limits.agent_actions is not None else [a for a in ACTIONS if a != "manage"]
        beyond = sorted(set(caveats.actions or ()) & set(ACTIONS) - set(allowed))  # unknown ones: said later
        if beyond:
            raise Forbidden(f"this site lets a person grant an agent only: {', '.join(allowed)}; not {', '.join(beyond)}",
                            hint="mint without those actions, or ask an admin", rule="mint-limit")
        if caveats.actions is None and set(allowed) != set(ACTIONS):
            caveats.actions = list(allowed)
        live = [t for t in self.db.list_tokens([for_name])
                if not t["revoked"] and (t["expires"] is None or t["expires"] > now)]
        if len(live) >= limits.agent_tokens_max:
            raise Forbidden(f"{for_name} holds {len(live)} live tokens; this site allows an agent "
                            f"{limits.agent_tokens_max}", hint="revoke one first: 'corral token list', then "
                            "'corral token revoke ID'", rule="mint-limit")
        return caveats

    def _not_renewed(self, caller: Caller, expires_at: float) -> None:
        """A person's token for themselves outlives the token minting it only when that one
        is a sign-in's (a proof made then): else a stolen token would mint the next one
        before it expired, and the next, for ever."""
        record = self.db.get_token(caller.cap.root if caller.cap is not None else caller.token_id)
        if record is not None and str(record["note"] or "").startswith(SIGNED_IN):
            return
        mine = caller.cap.expires_at if caller.cap is not None else (record or {}).get("expires")
        if mine is not None and expires_at > mine + 1:
            raise Forbidden("a token you mint for yourself expires no later than the one you mint it with, unless "
                            "that one is a sign-in's", hint="sign in again ('corral login'), then mint",
                            rule="mint-limit")

    def list_tokens(self, caller: Caller) -> list[dict[str, Any]]:
        return self.credentials.list(caller)

    def revoke_token(self, caller: Caller, token_id: str) -> None:
        with self.audit.refusals(caller, "manage", {"revoke": token_id}):
            self.gate.check(caller, "manage", "Facility")
            self.credentials.revoke(caller, token_id)
        self.audit.record(caller, "manage", "allow", "policy", [{"revoke": token_id}])

    def clear_taint(self, caller: Caller, token_id: str) -> str:
        with self.audit.refusals(caller, "manage", {"clear_taint": token_id}):
            self.gate.check(caller, "manage", "Facility")
            why = self.credentials.clear_taint(caller, token_id)
        self.audit.record(caller, "manage", "allow", "policy", [{"clear_taint": token_id, "was": why[:200]}])
        return why

    def token_public_key(self) -> str:
        """Hex of the key that verifies this gateway's tokens: what narrowing a token needs."""
        return self.gate.tokens.public_key.hex()


SIGNED_IN = "signed in by "
"""The note of a sign-in's token (gateway/signin.py writes it)."""


def _span(s: int) -> str:
    """Seconds as --expires takes them: 7d, 8h, 30m, 45s."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


def _gid(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_gid
    except KeyError:
        return None


def _uid(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None
