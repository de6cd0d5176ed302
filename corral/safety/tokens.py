"""Capability tokens: biscuits a sponsor mints for an agent, which the holder may narrow
(for a sub-agent) but never widen.

A token is ``crb_`` + a biscuit (Ed25519-signed blocks, datalog caveats). The gateway
holds the root key (``$CORRAL_HOME/token.key``, 0600) and is the only minter; anyone
holding a token can append a block of further checks with only the public key, and a block can
only add checks, so no holder can widen what it got. Each block has a revocation id; the
first 24 hex digits of it are the block's id, and revoking any id kills that token and
every token derived from it.

Two kinds of caveat:
- stateless checks (expiry, actions, partitions, per-job CPU/GPU/walltime caps) are
  datalog checks that biscuit's own authorizer evaluates against the request's facts;
- stateful limits (CPU- and GPU-hour budgets, submissions per minute, concurrent jobs)
  are facts of a block that the gateway reads and enforces (corral/safety/limits.py)
  over everything submitted with that block or a block derived from it.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biscuit_auth import (Algorithm, AuthorizationError, AuthorizerBuilder, Biscuit, BiscuitBuilder, BlockBuilder, KeyPair,
                          PrivateKey, PublicKey, UnverifiedBiscuit)

from corral.core.errors import Forbidden, InvalidRequest, Unauthenticated
from corral.core.jobs import format_duration

PREFIX = "crb_"
STORAGE_ACTIONS = ("workspace_fork", "workspace_commit", "workspace_discard", "env_build")
"""The storage verbs that change something (corral/gateway/storage_verbs.py): each its own action,
so a token narrowed to reading cannot fork, write a project back or start a build."""
ACTIONS = ("submit", "cancel", "status", "read_output", "write_note", "read_notes", "advice", "manage", *STORAGE_ACTIONS,
           "env_use")
"""What a token may be limited to. ``status`` covers reading jobs, waiting and usage (and
listing and diffing workspaces, listing images); ``manage`` covers principals and tokens."""
LIMIT_FACTS = ("budget_cpu_s", "budget_gpu_s", "submits_per_min", "max_active_jobs")
EVAL_BUDGET = dt.timedelta(milliseconds=250)
"""Wall time a token's checks may take. Biscuit's default, 1 ms, is wall time too: on a
busy gateway a preempted thread ran past it, and a valid token was refused (a 403 for
an agent's wait, seen in the fast-lane bench). corral's own checks take ~0.1 ms; facts
and iterations stay at biscuit's limits, which bound what an added block can cost."""
_FACT_RE = re.compile(r"^(\w+)\((\d+)\);$", re.M)
_EXPIRY_RE = re.compile(r"check if time\(\$t\), \$t <= (\S+);")
_PRINCIPAL_RE = re.compile(r'^principal\("([^"]+)"\);$', re.M)


@dataclass
class Caveats:
    """What one block restricts. None: this block does not restrict it."""

    expires_at: float | None = None
    actions: list[str] | None = None
    partitions: list[str] | None = None
    max_cpus: int | None = None
    max_gpus: int | None = None
    max_walltime_s: int | None = None
    cpu_hours: float | None = None
    gpu_hours: float | None = None
    submits_per_min: int | None = None
    max_active_jobs: int | None = None

    def datalog(self) -> str:
        """The block's source. Strings are quoted by biscuit's parameter binding, never pasted."""
        lines: list[str] = []
        if self.expires_at is not None:
            when = dt.datetime.fromtimestamp(int(self.expires_at), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            lines.append(f"check if time($t), $t <= {when};")
        if self.actions is not None:
            bad = sorted(set(self.actions) - set(ACTIONS))
            if bad:
                raise InvalidRequest(f"unknown actions {bad}; use some of: {', '.join(ACTIONS)}")
            lines.append("check if operation($op), " + _set(self.actions) + ".contains($op);")
        if self.partitions is not None:
            for p in self.partitions:
                if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", p):
                    raise InvalidRequest(f"partition {p!r} is not a valid partition name")
            lines.append('check if operation($op), $op != "submit" or partition($p), '
                         + _set(self.partitions) + ".contains($p);")
        for name, cap in (("cpus", self.max_cpus), ("gpus", self.max_gpus), ("walltime_s", self.max_walltime_s)):
            if cap is not None:
                lines.append(f'check if operation($op), $op != "submit" or {name}($v), $v <= {_nat(cap, name)};')
        for name, value in (("budget_cpu_s", None if self.cpu_hours is None else self.cpu_hours * 3600),
                            ("budget_gpu_s", None if self.gpu_hours is None else self.gpu_hours * 3600),
                            ("submits_per_min", self.submits_per_min), ("max_active_jobs", self.max_active_jobs)):
            if value is not None:
                lines.append(f"{name}({_nat(value, name)});")
        return "\n".join(lines)


_WORDS = (
    (re.compile(r"check if time\(\$t\), \$t <= (\S+);"), "expires {0}"),
    (re.compile(r'check if operation\(\$op\), \$op != "submit" or partition\(\$p\), \[(.*)\]\.contains\(\$p\);'),
     "submits only to partitions {0}"),
    (re.compile(r"check if operation\(\$op\), \[(.*)\]\.contains\(\$op\);"), "may only {0}"),
    (re.compile(r'check if operation\(\$op\), \$op != "submit" or walltime_s\(\$v\), \$v <= (\d+);'),
     "a job's walltime at most {0} s"),
    (re.compile(r'check if operation\(\$op\), \$op != "submit" or (cpus|gpus)\(\$v\), \$v <= (\d+);'),
     "at most {1} {0} a job"),
    (re.compile(r"^budget_(cpu|gpu)_s\((\d+)\);$"), "at most {1:h} {0}-hours in all"),
    (re.compile(r"^submits_per_min\((\d+)\);$"), "at most {0} submissions a minute"),
    (re.compile(r"^max_active_jobs\((\d+)\);$"), "at most {0} jobs at once"),
)


def in_words(line: str) -> str:
    """One of the caveats corral writes (``Caveats.datalog``), as a person reads it."""
    for pattern, words in _WORDS:
        m = pattern.search(line)
        if m:
            said = [g.replace('"', "") for g in m.groups()]
            if "{1:h}" in words:  # seconds held, hours said
                return words.replace("{1:h}", f"{int(said[1]) / 3600:g}").format(said[0].upper())
            return words.format(*said)
    return line


def _nat(value: float, name: str) -> int:
    """A cap as Datalog takes it: a whole number from 0 to 2^63 - 1."""
    if not (isinstance(value, (int, float)) and math.isfinite(value)) or not 0 <= value <= 2**63 - 1:
        raise InvalidRequest(f"{name} must be a number from 0 to {2**63 - 1}")
    return int(value)


def _set(items: list[str]) -> str:
    for s in items:
        if '"' in s or "\\" in s:
            raise InvalidRequest(f"{s!r}: quotes and backslashes are not allowed")
    return "[" + ", ".join(f'"{s}"' for s in items) + "]"


@dataclass(frozen=True)
class Capability:
    """A verified token: who it acts as and what each of its blocks limits."""

    principal: str
    block_ids: tuple[str, ...]
    limits: tuple[dict[str, int], ...]
    """Per block, its stateful limits (LIMIT_FACTS -> value)."""
    expires_at: float | None
    biscuit: Biscuit = field(compare=False, repr=False)

    @property
    def root(self) -> str:
        return self.block_ids[0]

    @property
    def path(self) -> str:
        """Block ids root/.../leaf: what a job records so budgets add up per subtree."""
        return "/".join(self.block_ids)


MAX_BLOCKS = 16
"""Blocks a token may carry (its root and 15 narrowings). Verifying costs per block (each
has its signature): 16 blocks ~1 ms, the reviewer's 180 ~14 ms on the event loop (H4 F20)."""
MAX_TOKEN_CHARS = 8192
"""A token's length at most: 16 blocks of the longest caveats corral writes fit."""
TOO_LONG_HINT = "narrow the token you were given, not a narrowed token narrowed again; or ask your sponsor to mint one"


def _block_ids(b: Biscuit | UnverifiedBiscuit) -> tuple[str, ...]:
    return tuple(r[:24] for r in b.revocation_ids)


def precheck(token: str) -> str:
    """The cheap look before a signature is checked: length and block count bounded, and
    -> the root block's id (what rate-limits verifications of one token's variants).
    Unauthenticated when out of bounds or unreadable."""
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated(f"the token is {len(token):,} characters long; corral takes at most "
                              f"{MAX_TOKEN_CHARS:,} ({MAX_BLOCKS} blocks)", hint=TOO_LONG_HINT)
    try:
        u = UnverifiedBiscuit.from_base64(token[len(PREFIX):])
    except Exception:
        raise Unauthenticated("the token is not valid (bad signature or format); ask your sponsor "
                              "to mint one") from None
    if u.block_count() > MAX_BLOCKS:
        raise Unauthenticated(f"the token has {u.block_count()} blocks; corral takes at most {MAX_BLOCKS}",
                              hint=TOO_LONG_HINT)
    return _block_ids(u)[0]


class TokenAuthority:
    """The gateway's root key: mints tokens and verifies them."""

    def __init__(self, key_path: Path) -> None:
        if key_path.exists():
            self._private = PrivateKey.from_bytes(key_path.read_bytes(), Algorithm.Ed25519)  # type: ignore[call-arg,attr-defined]
            self._public = KeyPair.from_private_key(self._private).public_key
        else:
            kp = KeyPair()
            key_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(kp.private_key.to_bytes()))
            self._private, self._public = kp.private_key, kp.public_key

    @property
    def public_key(self) -> bytes:
        return bytes(self._public.to_bytes())

    def secret(self) -> bytes:
        """The root key's bytes, for keys derived from it (jobs' credentials: safety/job_credentials.py)."""
        return bytes(self._private.to_bytes())

    def mint(self, principal: str, caveats: Caveats) -> tuple[str, str]:
        """-> (token id, token)."""
        builder = BiscuitBuilder('principal({p});\n' + caveats.datalog(), {"p": principal})
        b = builder.build(self._private)
        return _block_ids(b)[0], PREFIX + b.to_base64()

    def verify(self, token: str) -> Capability:
        """Signature and shape only; revocation and checks are the caller's next steps."""
        if not token.startswith(PREFIX):
            raise Unauthenticated("the token is not valid; check CORRAL_TOKEN or ask your sponsor to mint one")
        try:
            b = Biscuit.from_base64(token[len(PREFIX):], self._public)
        except Exception:
            # Forged, tampered, truncated or from another gateway: all look the same to the caller.
            raise Unauthenticated("the token is not valid (bad signature or format); ask your sponsor "
                                  "to mint one") from None
        m = _PRINCIPAL_RE.search(b.block_source(0))
        if m is None:
            raise Unauthenticated("the token names no principal; ask your sponsor to mint one")
        limits: list[dict[str, int]] = []
        expiry: float | None = None
        for i in range(b.block_count()):
            src = b.block_source(i)
            limits.append({k: int(v) for k, v in _FACT_RE.findall(src) if k in LIMIT_FACTS})
            for when in _EXPIRY_RE.findall(src):
                t = dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
                expiry = t if expiry is None else min(expiry, t)
        return Capability(m.group(1), _block_ids(b), tuple(limits), expiry, b)

    @staticmethod
    def authorize(cap: Capability, action: str, facts: dict[str, str | int], now: float | None = None) -> None:
        """Run every block's checks against this request at ``now`` (default: the system's
        time). Raises Forbidden naming the first failing check."""
        code = ["operation({op});", "time({now});"]
        when = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc)
        params: dict[str, object] = {"op": action, "now": when}
        for k, v in facts.items():
            code.append(f"{k}({{{k}}});")
            params[k] = v
        code.append("allow if true;")
        builder = AuthorizerBuilder("\n".join(code), params)
        # limits()/set_limits() exist at run time; biscuit-python's stubs do not list them.
        limits = builder.limits()  # type: ignore[attr-defined]
        limits.max_time = EVAL_BUDGET
        builder.set_limits(limits)  # type: ignore[attr-defined]
        try:
            builder.build(cap.biscuit).authorize()
        except AuthorizationError as e:
            failed = str(e).split("checks failed: ", 1)[-1]
            raise Forbidden(f"your token does not allow this {action}: {_explain(failed)}",
                            hint="ask your sponsor for a token that allows it") from None


def _explain(failed: str) -> str:
    """The failed check, in the caller's words (never the check's Datalog)."""
    if "execution limits" in failed:
        return ("its checks take too much work to evaluate (more facts, rule iterations or time than the "
                "gateway allows); use a token with fewer or simpler added checks")
    failed = ("check if " + failed.split("check if ", 2)[1]) if "check if " in failed else failed  # the first
    if "time($t)" in failed:
        return "it has expired"
    if "partition($p)" in failed:
        names = re.findall(r'"([^"]+)"', failed.split("partition($p)", 1)[1])
        return f"it allows submitting only to partition {', '.join(names)}"
    if "operation($op), [" in failed:
        names = re.findall(r'"([^"]+)"', failed)
        return f"the action is not among those it allows ({', '.join(names)})"
    limit = re.search(r"\$v <= (\d+)", failed)
    for name, words in (("cpus($v)", "CPUs"), ("gpus($v)", "GPUs"), ("walltime_s($v)", "walltime")):
        if name in failed and limit:
            most = int(limit.group(1))
            shown = format_duration(most) if name.startswith("walltime") else str(most)
            return f"it allows at most {shown} {words} per job; ask for less"
    return "one of its checks failed"


def attenuate(token: str, caveats: Caveats, public_key: bytes) -> tuple[str, str]:
    """Append a block of further restrictions. Needs only the gateway's public key
    (``GET /v1/tokens/public-key``), never its secret. -> (new block id, token)."""
    if not token.startswith(PREFIX):
        raise InvalidRequest("only capability tokens (crb_...) can be narrowed; ask for one with 'corral token mint'")
    text = caveats.datalog()
    if not text:
        raise InvalidRequest("give at least one restriction to add (see --help)")
    try:
        b = Biscuit.from_base64(token[len(PREFIX):], PublicKey.from_bytes(public_key, Algorithm.Ed25519))  # type: ignore[call-arg,attr-defined]
    except Exception:
        raise InvalidRequest("the token does not verify against this gateway's public key; is it this "
                             "gateway's token, copied whole?") from None
    if b.block_count() >= MAX_BLOCKS:
        raise InvalidRequest(f"the token already has {b.block_count()} blocks, the most a gateway takes is "
                             f"{MAX_BLOCKS}", hint=TOO_LONG_HINT)
    narrowed = b.append(BlockBuilder(text))
    return _block_ids(narrowed)[-1], PREFIX + narrowed.to_base64()


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: how lists are written on a command line."""
    return [x.strip() for x in text.split(",") if x.strip()]


def caveats_from(fields: dict[str, Any]) -> Caveats:
    """Caveats from the edges' names: max_walltime as a duration ('2h'), lists as lists
    or comma-separated text; None or missing: no restriction."""
    from corral.core.jobs import parse_duration_s

    f = {k: v for k, v in fields.items() if v is not None}
    for k in ("actions", "partitions"):
        if isinstance(f.get(k), str):
            f[k] = csv_list(f[k])
    if "max_walltime" in f:
        try:
            f["max_walltime_s"] = parse_duration_s(str(f.pop("max_walltime")))
        except ValueError as e:
            raise InvalidRequest(f"max_walltime: {e}") from None
    unknown = set(f) - set(Caveats.__dataclass_fields__) - {"expires_at"}
    if unknown:
        raise InvalidRequest(f"unknown restrictions {sorted(unknown)}")
    return Caveats(**f)


def expires_in(value: str | None, now: float | None = None) -> float | None:
    """'8h' -> an absolute time (from ``now``, default the system's); None/''/'never' -> None."""
    from corral.core.jobs import parse_duration_s

    if value in (None, "", "never"):
        return None
    try:
        return (time.time() if now is None else now) + parse_duration_s(value, "expiry")
    except ValueError as e:
        raise InvalidRequest(f"{e} (for example '8h', '7d', or 'never' for humans and services)") from None
