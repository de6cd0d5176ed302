"""People sign in as HPC signs them in (decision 0060): the proof is the login node's,
not a password or a pasted token.

- **munge**: the person's ``corral`` asks the local munged for a credential whose payload
  names this gateway (``corral-signin/1 URL``); the gateway decodes it with ``unmunge``
  and takes the uid munged vouches for. A credential is refused when munge refuses it
  (another key, expired, tampered, replayed on this munged), when it names another
  gateway, when it is older than ``[signin] max_age_s``, and when any replica took it
  before (the store remembers each one until it is too old to take: munge's own replay
  cache is per munged).
- **peer credentials**: on a local Unix socket, the kernel says who connected
  (SO_PEERCRED; corral/edges/http/peer_signin.py).

Either way the uid is mapped to the one person (a human principal) whose Unix user has
that uid; root is never anyone. The person gets a short-lived token of their own, and
with it mints their agents' tokens within the site's limits (gateway/accounts.py). A
one-time link signs a browser in to the dashboard as the person who asked for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import pwd
import re
import secrets
from typing import TYPE_CHECKING, Any

from corral.core import proc
from corral.core.errors import BackendError, Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from corral.core.principals import CORRAL_PRINCIPAL, Caller, Kind, Principal
from corral.gateway.accounts import SIGNED_IN
from corral.safety.tokens import Caveats

if TYPE_CHECKING:
    from corral.core.config import Settings
    from corral.core.db import Database
    from corral.safety.audit import Audit
    from corral.safety.gate import Gate

log = logging.getLogger(__name__)
PAYLOAD = "corral-signin/1 "
"""What a sign-in credential's payload starts with; the gateway's URL follows."""
MAX_CREDENTIAL = 4096
"""Characters of a munge credential at most: corral's are ~200; checked before unmunge runs."""
ATTEMPTS_PER_S = 10.0
ATTEMPTS_BURST = 50.0
"""Sign-ins a gateway checks per second (and at once), munge's and the socket's each: each
one, asked with no token, starts an unmunge or mints a token, and writes an audit record,
so a flood is refused (429) before either."""
SKEW_S = 5.0
"""Clock difference between the login node and the gateway a credential's age allows."""
_STATUS = {1: "munge failed", 3: "the credential is malformed", 6: "munged could not be reached",
           7: "munged did not answer in time", 8: "the credential is malformed", 9: "the credential is malformed",
           10: "the credential is not valid (altered)", 11: "the credential is not valid (altered)",
           13: "the credential is not valid (another munge realm)",
           14: "the credential is not valid (not this munge realm's key, or altered)",
           15: "the credential expired", 16: "the credential was made in the future (a clock is wrong)",
           17: "the credential was used already", 18: "the credential is not for this gateway's user"}
"""munge's error codes (munge.h, ``munge_err_t``) in the caller's words."""


def payload_for(url: str) -> str:
    """The payload a sign-in credential for the gateway at ``url`` carries."""
    return PAYLOAD + url.rstrip("/")


def munge_socket(settings: "Settings") -> str | None:
    """munged's socket: [signin] munge_socket, else the one slurm.conf's AuthInfo names,
    else None (munge's own default, /run/munge/munge.socket.2)."""
    if settings.signin.munge_socket:
        return settings.signin.munge_socket
    return socket_in_slurm_conf(settings.slurm.conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


def socket_in_slurm_conf(conf: str) -> str | None:
    try:
        text = open(conf, encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    m = re.search(r"^\s*AuthInfo\s*=.*socket=([^,\s]+)", text, re.M)
    return m[1] if m else None


def _metadata(out: str) -> tuple[dict[str, str], str]:
    """unmunge -N's output -> (its fields, the payload)."""
    head, _, payload = out.partition("\n\n")
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in head.splitlines())}
    return fields, payload


class Signin:
    def __init__(self, settings: "Settings", db: "Database", gate: "Gate", audit: "Audit") -> None:
        self.settings, self.db, self.gate, self.audit = settings, db, gate, audit

    # -- proofs -------------------------------------------------------------------------------

    async def by_munge(self, credential: str) -> dict[str, Any]:
        """A munge credential -> the person's token."""
        s = self.settings.signin
        if not s.munge:
            raise Forbidden("this gateway does not take munge sign-ins ([signin] munge = false)",
                            hint="ask your admin for a token")
        self._contained_agents("munge")
        credential = credential.strip()
        if not credential or len(credential) > MAX_CREDENTIAL or not credential.isascii():
            raise InvalidRequest(f"a munge credential is 1 to {MAX_CREDENTIAL} ASCII characters (MUNGE:...)")
        self._bounded("munge")
        fields, payload, refused = await asyncio.to_thread(self._unmunge, credential)
        if refused:
            self._refused("munge", None, "munge", refused)
            raise Unauthenticated(f"the munge credential was refused: {refused}", hint="sign in again")
        uid, made = int(fields.get("UID", "-1")), float(fields.get("ENCODE_TIME", "0"))
        now = self.gate.clock.time()
        if payload not in {payload_for(a) for a in self.audiences()}:
            self._refused("munge", uid, "audience")
            raise Unauthenticated("the credential was made for another gateway (or for something else)",
                                  hint=f"sign in with 'corral login' against {self.settings.base_url}")
        if not now - s.max_age_s - SKEW_S <= made <= now + SKEW_S:
            self._refused("munge", uid, "age")
            raise Unauthenticated(f"the credential was made {now - made:.0f} s ago; the gateway takes one at most "
                                  f"{s.max_age_s} s old", hint="sign in again (a clock may be wrong)")
        key = "munge:" + hashlib.sha256(credential.encode()).hexdigest()
        if not self.db.signin.first_use(key, None, made + s.max_age_s + 2 * SKEW_S, now):
            self._refused("munge", uid, "replay")
            raise Unauthenticated("the credential was used already", hint="sign in again: each credential counts once")
        return self.issue(self.person_of(uid, "munge"), "munge", {"uid": uid, "host": fields.get("ENCODE_HOST")})

    def _unmunge(self, credential: str) -> tuple[dict[str, str], str, str | None]:
        """(the credential's fields, its payload, why munge refused it or None); off the loop."""
        sock = munge_socket(self.settings)
        try:
            cp = proc.run(["unmunge", "-N"] + (["-S", sock] if sock else []), input=credential, timeout=10,
                          check=False)
        except BackendError as e:
            raise BackendError(f"the gateway cannot check munge credentials: {e.message}",
                               hint="the admin installs munge and starts munged ('corral doctor' checks it)") from None
        fields, payload = _metadata(cp.stdout)
        status = int(fields.get("STATUS", str(cp.returncode or 1)).split()[0])
        if cp.returncode != 0 or status != 0:
            return fields, payload, _STATUS.get(status, (cp.stderr.strip() or f"unmunge status {status}")[:200])
        return fields, payload, None

    def by_peer(self, uid: int) -> dict[str, Any]:
        """The kernel's word for who connected to the sign-in socket -> the person's token."""
        self._contained_agents("socket")
        self._bounded("socket")
        return self.issue(self.person_of(uid, "socket"), "socket", {"uid": uid})

    def _contained_agents(self, via: str) -> None:
        # An agent's job runs as its sponsor's uid: uncontained, it reaches munged, and on
        # the gateway's machine (the local lane) the sign-in socket, and would sign in as
        # the sponsor.
        if "agent" not in self.settings.sandbox.kinds:
            raise Forbidden(f"this site runs agents' jobs uncontained ([sandbox] kinds), where they could sign in as "
                            f"their sponsors; {via} sign-in is off", hint="ask your admin for a token")

    def _bounded(self, via: str) -> None:
        self.gate.buckets.take_all([(f"signin:{via}", 1.0, ATTEMPTS_PER_S, ATTEMPTS_BURST, f"{via} sign-ins")],
                                   self.gate.clock.monotonic())

    def audiences(self) -> list[str]:
        return [a.rstrip("/") for a in self.settings.signin.audiences] or [self.settings.base_url]

    # -- who ------------------------------------------------------------------------------------

    def person_of(self, uid: int, via: str) -> Principal:
        """The one human principal whose Unix user has ``uid`` (by uid, not name: decision 0046)."""
        if uid == 0:
            self._refused(via, uid, "root")
            raise Forbidden("root is no person at this gateway: root signs in as the admin, with HOME/admin.token",
                            rule="signin-root")
        name = _user(uid)
        found = [p for p in self.db.list_principals()
                 if p.kind is Kind.HUMAN and p.unix_user and _uid(p.unix_user) == uid]
        if not found:
            self._refused(via, uid, "no-person")
            raise Forbidden(f"uid {uid} ({name or 'no such user'}) is no person's Unix user at this gateway",
                            hint=f"ask an admin: corral principal add {name or 'NAME'} --kind human "
                                 f"--unix-user {name or 'USER'}", rule="signin-unknown")
        if len(found) > 1:
            self._refused(via, uid, "ambiguous")
            raise Conflict(f"uid {uid} is the Unix user of {len(found)} people here "
                           f"({', '.join(p.name for p in found)}); the gateway will not choose",
                           hint="ask an admin to give each person a Unix user of their own")
        return found[0]

    def issue(self, person: Principal, via: str, detail: dict[str, Any], lifetime: float | None = None) -> dict[str, Any]:
        """A short-lived token for ``person``, recorded and audited with how they proved it."""
        expires = self.gate.clock.time() + (lifetime or self.settings.signin.token_s)
        caller = Caller(person, None, f"signin:{via}", frozenset({person.name}))
        with self.db.transaction():
            token_id, token = self.gate.tokens.mint(person.name, Caveats(expires_at=expires))
            self.db.add_token(token_id, person.name, "", expires, SIGNED_IN + via)
            self.audit.record(caller, "signin", "allow", via, [{"signin": via, "token_id": token_id, **detail}])
        log.info("%s signed in by %s (%s)", person.name, via, detail)
        return {"id": token_id, "token": token, "principal": person.name, "expires": expires, "via": via}

    def _refused(self, via: str, uid: int | None, rule: str, said: str | None = None) -> None:
        """Audited (as corral: no one is signed in) and logged; ``said``: munge's reason."""
        corral = Caller(Principal(CORRAL_PRINCIPAL, Kind.SERVICE), None, f"signin:{via}", frozenset())
        self.audit.record(corral, "signin", "deny", f"signin-{rule}", [{"signin": via, "uid": uid,
                                                                         **({"munge": said} if said else {})}])
        log.warning("sign-in by %s refused (uid %s): %s", via, uid, said or rule)

    # -- the dashboard's one-time link ------------------------------------------------------

    def link(self, caller: Caller) -> dict[str, Any]:
        """A link that signs one browser in to the dashboard as ``caller``, once, soon."""
        if caller.principal.kind is not Kind.HUMAN:
            raise Forbidden("the dashboard is for people: an agent gets no sign-in link")
        # The link mints a fresh, un-narrowed token of the person: what minting asks of the
        # caller's own token (a token narrowed to reads, or a job's credential, mints none).
        self.gate.check(caller, "manage", "Facility")
        code = secrets.token_urlsafe(32)
        now = self.gate.clock.time()
        until = now + self.settings.signin.link_s
        self.db.signin.offer(_link_key(code), caller.name, until, now)
        self.audit.record(caller, "signin", "allow", "link", [{"signin": "link", "until": until}])
        path = f"/dashboard/signin?code={code}"
        return {"path": path, "url": self.settings.base_url + path, "principal": caller.name, "expires": until}

    def link_holder(self, code: str) -> str | None:
        """Whose the link is, if it is still good (nothing used)."""
        return self.db.signin.peek(_link_key(code), self.gate.clock.time()) if _plausible(code) else None

    def take_link(self, code: str, lifetime: float) -> dict[str, Any]:
        """Use the link: a fresh token of its person, once."""
        name = self.db.signin.take(_link_key(code), self.gate.clock.time()) if _plausible(code) else None
        person = self.db.get_principal(name) if name else None
        if person is None:
            raise NotFound("this sign-in link was used already, has expired, or is not one",
                           hint="run 'corral dashboard' for a new one")
        return self.issue(person, "link", {}, min(lifetime, self.settings.signin.token_s))


def _link_key(code: str) -> str:
    return "link:" + hashlib.sha256(code.encode()).hexdigest()


def _plausible(code: str) -> bool:
    return 20 <= len(code) <= 100 and re.fullmatch(r"[A-Za-z0-9_-]+", code) is not None


def _uid(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _user(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
