"""The one exception tree of corral.

Every error a caller can cause or meet is a ``CorralError``; each edge maps the
class to its own vocabulary (an HTTP status, a CLI exit status, an MCP tool error)
and shows ``message`` verbatim, so messages are written for the caller and say
what to do next::

    CorralError
     ├── InvalidRequest      bad input: a field, a resource, a path    (HTTP 400, CLI 2)
     ├── Unauthenticated     missing, expired, revoked or forged token (HTTP 401, CLI 2)
     ├── Forbidden           authenticated but not allowed             (HTTP 403, CLI 2)
     ├── NotFound            unknown id, or one the caller may not see (HTTP 404, CLI 2)
     ├── Conflict            the request clashes with current state    (HTTP 409, CLI 2)
     ├── RateLimited         too fast, or too many at once; retry later (HTTP 429 + Retry-After, CLI 2)
     └── BackendError        the scheduler failed or is unreachable   (HTTP 503, CLI 1)
"""

from __future__ import annotations

from typing import Any, Iterable


class CorralError(Exception):
    """Root of every corral error. ``message`` is shown to the caller as is."""

    status: int = 500
    code: str = "internal"

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


def describe_validation(errors: Iterable[dict[str, Any]], where_default: str, unknown_field: str | None = None) -> str:
    """pydantic's errors as one line a caller can act on: 'cpus: Input should be >= 1; ...'.
    ``unknown_field`` replaces the message for a field the model forbids."""
    parts = []
    for err in list(errors)[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or where_default
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if unknown_field and err.get("type") == "extra_forbidden":
            msg = unknown_field
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)
