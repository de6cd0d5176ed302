"""A small synchronous client of the gateway's HTTP API, shared by the CLI and the
stdio MCP server: both are thin clients of one running gateway, never a second core.

The CLI and the Slurm shims start once per command (agents run them in loops): plain
HTTP is spoken over a socket here (importing http.client, which pulls in the email
parser and ssl, was 30 ms of the 107 ms of CPU a shim call cost); https goes through
the standard library's http.client, imported only then.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Callable, ParamSpec, Protocol

from corral.core.paths import client_home, home_dir
from corral.edges.declare import Declared
from corral.edges.verbs import BY_NAME
from corral.core.errors import (BackendError, Conflict, CorralError, Forbidden, InvalidRequest, NotFound, RateLimited,
                     Unauthenticated)

P = ParamSpec("P")

_BY_STATUS: dict[int, type[CorralError]] = {
    400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: Conflict, 422: InvalidRequest,
}


class GatewayUnreachable(CorralError):
    status = 503
    code = "gateway_unreachable"


def default_token(home: Path | None = None, url: str | None = None) -> str | None:
    """CORRAL_TOKEN, else the admin token file of the local gateway at ``url`` when this
    user can read it (found from any directory: corral/core/paths.py)."""
    token = os.environ.get("CORRAL_TOKEN")
    if token:
        return token.strip()
    if os.environ.get("CORRAL_AGENT") == "1":
        # Inside `corral agent run`: the agent acts with its own token or not at all, never
        # with the admin token of a gateway its user happens to run (the fence hides those
        # files too; this holds where there is no fence).
        return None
    path = (home or (client_home(url) if url else home_dir())) / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


class _BadResponse(Exception):
    """The server's answer was cut or not HTTP: the connection is dropped and retried once."""


class _TlsRefused(Exception):
    """The gateway's certificate could not be verified, or TLS itself failed: no retry helps."""


class _Connection(Protocol):
    def settimeout(self, timeout: float) -> None: ...
    def exchange(self, method: str, target: str, body: bytes | None,
                 headers: dict[str, str]) -> tuple[int, bytes, str | None]: ...
    def close(self) -> None: ...


class _Plain:
    """One keep-alive HTTP/1.1 connection over a socket: a request, then its response
    (Content-Length or chunked), no more. What the gateway speaks to its own clients."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.buf = b""

    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout
        if self.sock is not None:
            self.sock.settimeout(timeout)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _read(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _BadResponse("connection closed")
        return chunk

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self.buf += self._read()
        head, self.buf = self.buf.split(marker, 1)
        return head

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += self._read()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def exchange(self, method: str, target: str, body: bytes | None,
                 headers: dict[str, str]) -> tuple[int, bytes, str | None]:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body or b'')}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        head = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise _BadResponse(head[0]) from None
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        if status in (204, 304) or 100 <= status < 200 or method == "HEAD":
            data = b""
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    break
                data += self._exactly(size)
                self._exactly(2)
        elif "content-length" in fields:
            data = self._exactly(int(fields["content-length"]))
        else:  # no length: the body runs to the end of the connection
            data = self.buf
            try:
                while True:
                    data += self._read()
            except _BadResponse:
                pass
            self.close()
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, data, fields.get("retry-after")


class _Https:
    """https through the standard library (imported here: plain http never pays for it)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        import http.client
        import ssl

        # The system's CAs, or the site CA's file (CORRAL_CA_FILE); the hostname is checked.
        context = ssl.create_default_context(cafile=os.environ.get("CORRAL_CA_FILE") or None)
        self.conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        self.errors: tuple[type[BaseException], ...] = (http.client.HTTPException,)
        self.tls_errors: tuple[type[BaseException], ...] = (ssl.SSLError, ssl.CertificateError)

    def settimeout(self, timeout: float) -> None:
        self.conn.timeout = timeout
        if self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)

    def exchange(self, method: str, target: str, body: bytes | None,
                 headers: dict[str, str]) -> tuple[int, bytes, str | None]:
        try:
            self.conn.request(method, target, body=body, headers=headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read(), resp.getheader("Retry-After")
        except self.tls_errors as e:
            raise _TlsRefused(getattr(e, "verify_message", None) or getattr(e, "reason", None) or str(e)) from None
        except self.errors as e:
            raise _BadResponse(str(e)) from None

    def close(self) -> None:
        self.conn.close()


class Client:
    def __init__(self, url: str, token: str | None, session: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"gateway URL {url!r} must look like http://HOST:PORT")
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"User-Agent": "corral-cli", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        if session:
            self.headers["X-Corral-Session"] = session
        self._local = threading.local()  # one keep-alive connection per thread (the MCP relay uses threads)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _conn(self, timeout: float) -> "_Connection":
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _Https(self._host, self._port, timeout) if self._scheme == "https" else \
                _Plain(self._host, self._port, timeout)
            self._local.conn = conn
        conn.settimeout(timeout)
        return conn

    def request(self, method: str, path: str, *, timeout: float | None = None, params: dict[str, Any] | None = None,
                json_body: Any = None, headers: dict[str, str] | None = None) -> Any:
        query = ""
        if params:
            pairs = [(k, x) for k, v in params.items() if v is not None for x in (v if isinstance(v, list) else [v])]
            query = "?" + urllib.parse.urlencode(pairs)
        body = json.dumps(json_body).encode() if json_body is not None else None
        hdrs = {**self.headers, **(headers or {})}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        for attempt in (1, 2):  # a keep-alive connection the server closed is retried once, fresh
            conn = self._conn(timeout or self.timeout)
            try:
                status, data, resp_retry = conn.exchange(method, self._prefix + path + query, body, hdrs)
                break
            except _TlsRefused as e:
                self.close()
                raise GatewayUnreachable(
                    f"the gateway at {self.url} could not be verified ({e}): nothing was sent",
                    hint="if the site signs its own certificates, set CORRAL_CA_FILE to its CA's PEM file") from None
            except (ConnectionRefusedError, socket.gaierror):
                self.close()
                raise GatewayUnreachable(
                    f"cannot reach the corral gateway at {self.url}; start it with 'corral serve' (or 'make run'), "
                    "or point CORRAL_URL at it"
                ) from None
            except (TimeoutError, socket.timeout):
                self.close()
                raise GatewayUnreachable(f"the gateway at {self.url} did not answer in time; retry") from None
            except (_BadResponse, ConnectionError, OSError):
                self.close()
                if attempt == 2:
                    raise GatewayUnreachable(f"the connection to the gateway at {self.url} broke; retry") from None
        if status >= 400:
            try:
                err = json.loads(data)["error"]
                message, hint = err["message"], err.get("hint")
            except (ValueError, KeyError, TypeError):
                message, hint = f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}", None
            if status == 429:
                raise RateLimited(message, retry_after=float(resp_retry or 1), hint=hint)
            cls = _BY_STATUS.get(status, BackendError if status >= 500 else InvalidRequest)
            raise cls(message, hint=hint)
        return json.loads(data)

    # -- the API: one method a verb, from the table (corral/edges/verbs.py) ------------

    def call(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Verb ``name`` with these arguments (positional ones in the row's order): each to
        its place in the path, the query, a header or the body, as the row says."""
        verb = BY_NAME[name]
        if len(args) > len(verb.args):
            raise TypeError(f"{name}() takes at most {len(verb.args)} positional arguments ({', '.join(verb.args)})")
        given = {**dict(zip(verb.args, args)), **kwargs}
        path = verb.url(given)
        params = {k: given[k] for k in verb.query if given.get(k) is not None}
        headers = {h: str(given[k]) for k, h in verb.headers.items() if given.get(k) is not None}
        rest = {k: v for k, v in given.items()
                if k not in verb.in_path and k not in verb.query and k not in verb.headers}
        body: Any = None
        if verb.whole is not None:
            body = rest.pop(verb.whole)
        elif verb.body is not None:
            body = {verb.wire.get(k, k): v for k, v in rest.items() if v is not None or k in verb.keep_none}
            rest = {}
        if rest:
            raise TypeError(f"{name}() got unexpected arguments: {', '.join(rest)}")
        timeout = float(given[verb.long]) + 30 if verb.long and given.get(verb.long) is not None else None
        return self.request(verb.method, path, params=params or None, json_body=body, headers=headers or None,
                            timeout=timeout)

    def run(self, verb: Declared[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """A declared verb (corral/edges/declare.py), its arguments checked by mypy against
        the function that serves it: ``client.run(reads.job, 7)``. The answer's JSON data."""
        return self.call(verb.name, *args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """Any verb by name, unchecked: for tests and scripts; the product's edges call
        declared verbs through ``run`` (tests/test_verb_edges.py holds them to it)."""
        if name not in BY_NAME:
            raise AttributeError(f"the gateway has no verb {name!r}; see corral/edges/verbs.py")
        return functools.partial(self.call, name)
