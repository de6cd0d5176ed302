"""The command line's shared parts, for every module that adds commands (jobs, memory,
storage, safety, sandbox): the context each command gets (its gateway client and its
``--json`` switch), the one way to stop with a message (exit 2, and a JSON error under
``--json``), and times and tables as people read them."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import click

if TYPE_CHECKING:
    from corral.edges.client import Client


def for_people(text: str) -> str:
    """Delimited untrusted data (corral/safety/guard.py) shown to a person as a quotation
    naming its source; the JSON a program or model reads keeps the tags. The guard is
    imported only when there is something to render (it loads the secret detectors)."""
    if "<untrusted-data-" not in text:
        return text
    from corral.safety.guard import for_people as render

    return render(text)


def fail(message: str, code: int = 2, hint: str | None = None, kind: str = "invalid_request") -> NoReturn:
    click.echo(f"error: {for_people(message)}", err=True)
    if hint:
        click.echo(f"hint: {for_people(hint)}", err=True)
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().obj if ctx is not None else None
    if isinstance(root, Ctx) and root.as_json:
        click.echo(json.dumps({"error": {"code": kind, "message": message, **({"hint": hint} if hint else {})}}))
    sys.exit(code)


class Ctx:
    def __init__(self, url: str | None, token: str | None, session: str | None, as_json: bool) -> None:
        self.url = url or os.environ.get("CORRAL_URL") or "http://127.0.0.1:8765"
        self.token = token
        self.session = session or os.environ.get("CORRAL_SESSION")
        self.as_json = as_json
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            from corral.edges.client import Client, default_token

            token = self.token or default_token(url=self.url)
            if token is None:  # a person on a login node: signed in by munge (decision 0060)
                from corral.edges.signin_client import automatic

                token = automatic(self.url)
            self._client = Client(self.url, token, self.session)
        return self._client

    def out(self, data: Any, human: Callable[[Any], str] | None = None) -> None:
        if self.as_json or human is None:
            click.echo(json.dumps(data, indent=None if self.as_json else 2, default=str))
        else:
            click.echo(human(data))


def ts(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[("-" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
