"""What a pool's scheduler (in the gateway) and its workers say to each other, and what the
gateway believes of it (decision 0040).

One TLS connection per worker, opened by the worker (it listens nowhere). Each message
is one line of JSON, plain data only, at most ``MAX_LINE`` bytes:

    worker -> gateway   {"op": "hello", "name": "alloc-17"}                  first, once
                        {"op": "report", "started": [[id, t], ...], "ended": [record, ...]}
                        {"op": "done", "batch": n, "results": [record, ...]}  or "error": "why"
                        {"op": "ping"}                  every engine.PING_S: silent ones are closed
    gateway -> worker   {"op": "batch", "batch": n, "specs": [spec, ...]}
                        {"op": "cancel", "ids": [id, ...]}

The gateway may run as root; a worker runs as the pool's user, whose program it may as
well be. Nothing a worker sends is executed, unpickled, or believed beyond what a task's
own outcome may say (``outcome``: a known state, numbers, bounded text); a line that is
not that ends the worker's connection, and its batches fail with the reason. Dask, which
carried this before, unpickles what any peer sends (``distributed.protocol.core.loads``
on ``__Pickled__`` frames, whatever its settings): the gateway ran a worker's command as
root (tests/test_fastlane_trust.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_LINE = 8 << 20
GATEWAY_LINE = 512 << 20
"""What a worker reads of one line from the gateway (a batch: up to 128 tasks of 64 KiB
commands and 128 KiB environments, JSON-escaped): the worker trusts the gateway."""
"""A message's most bytes: a batch of 512 outcomes is ~150 KB."""
MAX_TEXT = 2000
"""A reason's most characters (a node's name: 255)."""
STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"})
"""The ends a launcher records (launcher.py); any other is refused."""


class Refused(ValueError):
    """A worker said something that is not the protocol: its connection ends."""


def line(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def parse(raw: bytes) -> dict[str, Any]:
    """One line from a worker as a message with a known ``op``; Refused otherwise."""
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError) as e:  # not JSON, or nested past the parser's depth
        raise Refused(f"not a message ({type(e).__name__})") from None
    if not isinstance(msg, dict) or msg.get("op") not in ("hello", "report", "done", "ping"):
        raise Refused("not a message of the protocol")
    return msg


def hello(msg: dict[str, Any]) -> str:
    name = msg.get("name")
    if msg["op"] != "hello" or not isinstance(name, str) or not 0 < len(name) <= 128 or not name.isprintable():
        raise Refused("a worker must say its name first")
    return name


def number(v: Any) -> float | None:
    """A finite number, or None: an int too large for a float (a 400-digit one in a
    journal raised OverflowError, which stopped the fast lane at every start) is None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _text(v: Any, most: int = MAX_TEXT) -> str | None:
    return v[:most] if isinstance(v, str) else None


def outcome(r: Any) -> dict[str, Any] | None:
    """A task's end as a launcher records it, rebuilt from known fields of plain types;
    None when it names no task or no known end."""
    if not isinstance(r, dict):
        return None
    jid, state = r.get("job_id"), r.get("state")
    if type(jid) is not int or not isinstance(state, str) or state not in STATES:
        return None
    code = r.get("exit_code")
    return {"job_id": jid, "event": "ended", "state": state,
            "exit_code": code if type(code) is int and -(1 << 31) <= code < (1 << 31) else None,
            "start": number(r.get("start")), "end": number(r.get("end")), "cpu_s": number(r.get("cpu_s")),
            "reason": _text(r.get("reason")), "node": _text(r.get("node"), 255),
            "max_rss_mb": number(r.get("max_rss_mb"))}


def outcomes(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise Refused("outcomes must be a list")
    return [o for o in map(outcome, v) if o is not None]


def started(v: Any) -> dict[int, float]:
    """``[[job id, start], ...]`` -> job id -> start (pairs of other shapes are dropped)."""
    if not isinstance(v, list):
        raise Refused("starts must be a list")
    out: dict[int, float] = {}
    for p in v:
        if isinstance(p, list) and len(p) == 2 and type(p[0]) is int:
            t = number(p[1])
            if t is not None:
                out[p[0]] = t
    return out


def report(msg: dict[str, Any]) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """A worker's push: (started, ended)."""
    return started(msg.get("started", [])), outcomes(msg.get("ended", []))


def done(msg: dict[str, Any]) -> tuple[int, list[dict[str, Any]] | str]:
    """A batch's answer: (its number, its outcomes or the worker's reason it could not)."""
    n = msg.get("batch")
    if type(n) is not int:
        raise Refused("an answer must name its batch")
    if "error" in msg:
        return n, _text(msg["error"], 300) or "no reason given"
    return n, outcomes(msg.get("results"))
