"""A request body read, checked and parsed before FastAPI sees it (corral/edges/http/app.py's route class).

Past the protocol's byte bounds (corral/edges/http/bounds.py), a body is still work: a large
one is parsed only once its token is good, and every body is refused (400, with where)
when it nests deeper than the bound or holds text no part of corral can keep: a NUL
character, or half of a UTF-16 surrogate pair (neither can be encoded in UTF-8, so
SQLite, the audit log and every file refused them with a 500 before).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from corral.core.text import text_problem
from corral.core.errors import InvalidRequest

_SUSPECT = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")
"""A JSON escape that may decode to a NUL or a surrogate: only then are the strings walked."""


def parse_body(body: bytes, max_depth: int) -> Any:
    """The JSON of ``body``, or InvalidRequest saying what to fix."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise InvalidRequest(f"the request body nests arrays or objects deeper than {max_depth} levels; "
                             "flatten it") from None
    except ValueError as e:  # includes invalid UTF-8
        where = f" at byte {e.pos}" if isinstance(e, json.JSONDecodeError) else ""
        raise InvalidRequest(f"the request body is not valid JSON{where}; send a JSON object") from None
    if body.count(b"[") + body.count(b"{") > max_depth and _depth(data) > max_depth:
        raise InvalidRequest(f"the request body nests arrays or objects deeper than {max_depth} levels; "
                             "flatten it")
    if _SUSPECT.search(body):
        problem = _first(data, "", text_problem)
        if problem:
            raise InvalidRequest(problem)
    return data


def _depth(data: Any) -> int:
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, d)
            stack.extend((child, d + 1) for child in node if isinstance(child, (list, dict)))
    return deepest


def _first(data: Any, where: str, check: Callable[[str, str], str | None]) -> str | None:
    """The first problem ``check`` finds in a string of ``data`` (keys too), with its path."""
    stack: list[tuple[Any, str]] = [(data, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            problem = check(node, at or "the request body")
            if problem:
                return problem
        elif isinstance(node, dict):
            for k, v in node.items():
                problem = check(k, f"a key of {at or 'the request body'}")
                if problem:
                    return problem
                stack.append((v, f"{at}.{k}" if at else k))
        elif isinstance(node, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(node))
    return None
