"""The one exception tree of corral.

Every error a caller can cause or meet is a ``CorralError``; each edge maps the
class to its own vocabulary (an HTTP status, a CLI exit status, an MCP tool error)
and shows ``message`` verbatim, so messages are written for the caller and say
what to do next (the client adds one more child, ``client.GatewayUnreachable``: no
answer from the gateway, CLI 1)::

    CorralError
     ├── InvalidRequest      bad input: a field, a resource, a path    (HTTP 400, CLI 2)
     ├── Unauthenticated     missing, expired, revoked or forged token (HTTP 401, CLI 2)
     ├── Forbidden           authenticated but not allowed             (HTTP 403, CLI 2)
     ├── NotFound            unknown id, or one the caller may not see (HTTP 404, CLI 2)
     ├── Conflict            the request clashes with current state    (HTTP 409, CLI 2)
     ├── RateLimited         too fast, or too many at once; retry later (HTTP 429 + Retry-After, CLI 2)
     ├── BackendError        the scheduler failed or is unreachable   (HTTP 503, CLI 1)
     ├── SandboxUnavailable  a job that must be contained, and no sandbox here (HTTP 503, CLI 1)
     ├── Restarting          the gateway is stopping; call again      (HTTP 503 + Retry-After, CLI 1)
     ├── StoreUnavailable    the store did not answer; call again      (HTTP 503 + Retry-After, CLI 1)
     └── StorageFull         the gateway's disk is full; nothing kept  (HTTP 507, CLI 1)
"""

from __future__ import annotations

from typing import Any, Iterable

from corral.core.text import SHAPES


class CorralError(Exception):
    """Root of every corral error. ``message`` is shown to the caller as is."""

    status: int = 500
    code: str = "internal"
    nearest: dict[str, Any] | None = None
    """A refusal of sizes: the nearest request that passes this check (JobSpec's fields
    and values), for plan_job to report and check in the same call."""

    def __init__(self, message: str, *, hint: str | None = None, rule: str | None = None,
                 tags: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.rule = rule
        """The rule that refused (a policy rule, 'token-caveat', 'rate-limit', 'budget'), for the audit."""
        self.tags = tags or []
        """Risk tags of what was refused, for the audit."""

    def to_dict(self) -> dict[str, str]:
        out = {"code": self.code, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        return out


class InvalidRequest(CorralError):
    status = 400
    code = "invalid_request"


class Unauthenticated(CorralError):
    status = 401
    code = "unauthenticated"


class Forbidden(CorralError):
    status = 403
    code = "forbidden"


class ApprovalNeeded(Forbidden):
    """A policy rule annotated ``@ask("sponsor")`` fired: the action waits for a person
    (corral/gateway/approvals.py) instead of being refused."""

    code = "approval_required"


class ApprovalPending(Forbidden):
    """An action other than a submission that a rule asks a person to approve, recorded
    to be carried out once when they do (corral/gateway/approvals.py): not done yet, and
    not refused either. ``approval``: its id, who answers, until when, under which rule."""

    code = "approval_pending"

    def __init__(self, message: str, approval: dict[str, Any], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.approval = approval

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "approval": self.approval}


class NotFound(CorralError):
    status = 404
    code = "not_found"


class Conflict(CorralError):
    status = 409
    code = "conflict"


class RateLimited(CorralError):
    """A rate limit or a concurrency cap: the same request succeeds later."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float, hint: str | None = None, rule: str | None = None) -> None:
        super().__init__(message, hint=hint or f"wait {max(1, round(retry_after))} s, then retry", rule=rule)
        self.retry_after = retry_after


class BackendError(CorralError):
    """The scheduler failed. Carries what a person needs to debug it."""

    status = 503
    code = "backend_unavailable"

    def __init__(
        self,
        message: str,
        *,
        argv: list[str] | None = None,
        returncode: int | None = None,
        stderr: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


_WORDS = {
    "missing": "is required", "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number", "float_parsing": "must be a number", "float_type": "must be a number",
    "finite_number": "must be a finite number", "bool_parsing": "must be true or false",
    "bool_type": "must be true or false", "string_type": "must be a string", "list_type": "must be a list",
    "dict_type": "must be an object", "model_type": "must be an object", "json_invalid": "is not valid JSON",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "string_too_short": "must be at least {min_length} characters", "string_too_long":
    "must be at most {max_length} characters", "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items", "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}", "string_pattern_mismatch": "must match {pattern}",
}
"""pydantic's error types in corral's words: a caller reads 'tail must be at least 0',
not a library's phrasing and field path."""


class SandboxUnavailable(CorralError):
    """A job that must run contained, on a gateway that cannot contain it (fail closed)."""

    status = 503
    code = "sandbox_unavailable"


class Restarting(CorralError):
    """The gateway is shutting down (a restart): the same call succeeds once it is back."""

    status = 503
    code = "restarting"
    retry_after = 2.0

    def __init__(self, message: str = "the gateway is restarting; nothing was lost, call again in a few seconds",
                 *, hint: str | None = "call again: your job keeps running and its state is kept") -> None:
        super().__init__(message, hint=hint)


class StoreUnavailable(CorralError):
    """The store (PostgreSQL) dropped or refused this request's statement: it restarted, a
    failover, another replica's admission held a lock too long. Nothing half-done stays
    (its transaction rolled back); the same call, with the same Idempotency-Key, is safe."""

    status = 503
    code = "store_unavailable"
    retry_after = 2.0

    def __init__(self, cause: str) -> None:
        super().__init__(f"the gateway's store did not answer ({cause}); nothing of this request was half-done",
                         hint="call again in a few seconds (a submission with the same Idempotency-Key "
                              "answers with its jobs if they were recorded)")


def store_unavailable(exc: BaseException) -> StoreUnavailable | None:
    """``exc`` as a StoreUnavailable if the store failed to answer (PostgreSQL's connection
    lost or its server shutting down, a lock or statement timeout, a deadlock; SQLite's
    database locked past its busy timeout), else None."""
    import sqlite3

    from corral.core.store.conn import Unreachable

    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return StoreUnavailable("the database file is locked by another writer")
    if isinstance(exc, Unreachable):  # reconnecting after the server went: it is not back yet
        return StoreUnavailable("PostgreSQL: " + str(exc).split(": ", 1)[-1].split("; check")[0])
    try:
        import psycopg
    except ImportError:  # pragma: no cover - pinned in pyproject.toml
        return None
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and \
            getattr(exc, "sqlstate", None) != "53100":  # a full disk is StorageFull's (507)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return StoreUnavailable(f"PostgreSQL: {first}")
    return None


class StorageFull(CorralError):
    """The gateway could not write its state (its disk or quota is full): the request was
    refused whole, nothing of it recorded. ``full``: the path that could not be written."""

    status = 507
    code = "storage_full"

    def __init__(self, full: str, free_bytes: int | None) -> None:
        free = f" ({free_bytes:,} bytes free there)" if free_bytes is not None else ""
        super().__init__(f"the gateway's disk is full: it could not write {full}{free}; nothing of this request "
                         "was recorded or done", hint="tell the facility's admin to free space on that filesystem "
                         "(old job output, gateway.log.*); then send the same request again")
        self.full = full


def storage_full(exc: BaseException, home: Any) -> StorageFull | None:
    """``exc`` as a StorageFull if it is a full disk or quota (an OSError, or SQLite's
    'database or disk is full', or PostgreSQL's disk_full), else None. ``home``: the gateway's state directory."""
    import errno
    import os
    import sqlite3

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        path = str(exc.filename or home)
    elif isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
        path = f"{home}/corral.db"
    elif getattr(exc, "sqlstate", None) == "53100":  # PostgreSQL's disk_full: its disk, not ours
        return StorageFull("the PostgreSQL server's data directory ([store] url)", None)
    else:
        return None
    try:
        st = os.statvfs(os.path.dirname(path) if not os.path.isdir(path) else path)
        free: int | None = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return StorageFull(path, free)


def describe_validation(errors: Iterable[dict[str, Any]], where_default: str, unknown_field: str | None = None) -> str:
    """Validation errors as one line a caller can act on: 'cpus must be at least 1; ...'.
    ``unknown_field`` replaces the message for a field the model forbids."""
    parts = []
    for err in list(errors)[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        where = ".".join(loc) or where_default
        kind = str(err.get("type", ""))
        if kind == "json_invalid":
            parts.append("the request body is not valid JSON; send a JSON object")
        elif unknown_field and kind == "extra_forbidden":
            parts.append(f"{where}: {unknown_field}")
        elif kind == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") in SHAPES:
            parts.append(f"{where} must be {SHAPES[err['ctx']['pattern']]}")
        elif kind in _WORDS:
            try:
                parts.append(f"{where} {_WORDS[kind].format(**(err.get('ctx') or {}))}")
            except (KeyError, IndexError):
                parts.append(f"{where} is not valid")
        else:  # our own validators' messages already name the field and say what to write
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
            named = not loc or msg.lower().startswith(loc[-1].lower().replace("_", " "))
            parts.append(msg if named else f"{where}: {msg}")  # a model's own check names its field
    return "; ".join(parts)
