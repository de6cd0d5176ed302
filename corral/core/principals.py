"""Who acts: principals (human, agent, service), their tokens, and who may see what.

Minted tokens are capability tokens (corral/safety/tokens.py). The opaque bearer
secrets here, ``crl_<id>_<secret>``, are the admin's first token and tokens minted
before capability tokens existed. Only a SHA-256 of the secret is stored: the secret
has 256 bits of entropy, so a slow password hash would add latency to every request
and no security.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.errors import Forbidden, InvalidRequest

if TYPE_CHECKING:
    from corral.safety.tokens import Capability

ADMIN_PRINCIPAL = "admin"
"""The facility's first admin, a person: made with its token on the gateway's first start."""
PILOT_PRINCIPAL = "fastlane"
"""The service principal that owns corral's own jobs (the fast lane's allocations):
never advised, never remembered as an outcome."""
BUILD_PRINCIPAL = "envbuild"
"""The service principal that packs an environment image (gateway/images.py)."""
CORRAL_PRINCIPAL = "corral"
"""corral itself where no principal acts (the audit's record of its own repair)."""

RESERVED: dict[str, str] = {
    ADMIN_PRINCIPAL: "the facility's first admin, made on the gateway's first start",
    PILOT_PRINCIPAL: "corral's own service principal: the fast lane's allocations",
    BUILD_PRINCIPAL: "corral's own service principal: environment images' pack jobs",
    CORRAL_PRINCIPAL: "corral itself, in the audit log",
}
"""The names corral uses for itself, each with what it is: no one may add a principal by
one of these names, and those below hold no token. A gateway that finds one in its
store in another shape (made before the names were reserved) takes it back at start
(gateway/accounts.py: ``Accounts.reclaim``)."""
TOKENLESS = frozenset(RESERVED) - {ADMIN_PRINCIPAL}
"""Reserved names whose principal corral acts as without a token (``Intake.service``):
no token may act as one, whoever minted it and whenever."""
NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


class Kind(str, enum.Enum):
    HUMAN = "human"
    AGENT = "agent"
    SERVICE = "service"


@dataclass(frozen=True)
class Principal:
    name: str
    kind: Kind
    sponsor: str | None = None
    unix_user: str | None = None
    account: str | None = None
    is_admin: bool = False
    created: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "sponsor": self.sponsor,
            "unix_user": self.unix_user,
            "account": self.account,
            "admin": self.is_admin,
            "created": self.created,
        }


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the principal, its session, and whom it may see."""

    principal: Principal
    session: str | None
    token_id: str
    visible: frozenset[str]
    """Principals whose jobs this caller may see and act on (itself, its agents)."""
    cap: "Capability | None" = None
    """The capability token's verified blocks; None for an opaque (legacy or admin) token."""

    @property
    def name(self) -> str:
        return self.principal.name

    def sees(self, owner: str) -> bool:
        return self.principal.is_admin or owner in self.visible


def session_holder(caller: Caller) -> str:
    """The credential a session belongs to: the token's last block (a narrowed token
    is a holder of its own, so a sub-agent's session is never its parent's)."""
    return caller.cap.block_ids[-1] if caller.cap is not None else caller.token_id


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):  # not match: "$" lets one trailing newline through ("fastlane\n")
        raise InvalidRequest(
            f"principal name {name!r} is invalid; use 1-64 lowercase letters, digits, '_', '.', '-', starting with a letter"
        )
    return name


def check_unreserved(name: str) -> str:
    """Refuse a name corral keeps for itself (RESERVED), in the caller's terms."""
    if name in RESERVED:
        raise Forbidden(f"principal name {name!r} is reserved: it is {RESERVED[name]}; pick another name",
                        hint=f"names corral keeps for itself: {', '.join(sorted(RESERVED))}", rule="reserved-name")
    return name


def is_own_service(p: Principal) -> bool:
    """Whether ``p`` has the shape corral gives its own service principals: a service
    with no sponsor, Unix user, account or admin right (what ``Intake.service`` makes)."""
    return p.kind is Kind.SERVICE and not (p.sponsor or p.unix_user or p.account or p.is_admin)


SESSION_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def check_session(session: str | None) -> str | None:
    if session is None or session == "":
        return None
    if not SESSION_RE.match(session):
        raise InvalidRequest("session id must be 1-128 characters of letters, digits, '_', '.', ':', '-'")
    return session


def new_token() -> tuple[str, str, str]:
    """A fresh token: (token_id, full token shown once, stored hash)."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return token_id, f"crl_{token_id}_{secret}", hash_secret(secret)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an Authorization header ('Bearer <token>', or the bare token)."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return authorization


def split_token(token: str) -> tuple[str, str] | None:
    parts = token.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != "crl" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
