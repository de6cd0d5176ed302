"""``corral mcp``: MCP over stdio as a relay of JSON-RPC to the gateway's streamable
HTTP endpoint (``/mcp``), so that there is one MCP implementation, the gateway's.

Standard library only, and little of it (HTTP/1.1 spoken on a socket here: http.client
would import the email package, most of the relay's start), and nothing of corral's
heavy modules: a client (Claude Code, Codex) waits for ``initialize`` before it lists
tools, and one-shot runs that start before the answer have no corral tools at all
(docs/decisions/0006-mcp-stdio-relay.md).

Each message read from stdin is POSTed on a thread of its own (a long wait does not
hold up a status call); the answer, JSON or a stream of server-sent events (progress
notifications, then the result), is written to stdout line by line. The transport's
``Mcp-Session-Id`` and protocol version are carried from the ``initialize`` answer; a
gateway that lost the session (restarted) is re-initialized with the same parameters.

Failures stay inside the protocol, never an exit: a gateway that does not answer gets
every request answered here (``initialize`` with the sentence as instructions, tool
calls as tool errors saying what is wrong and what to do), and it is tried again on
each request. A bad, missing or revoked token is the gateway's to say: it answers tool
calls with a tool error in its own words.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import threading
from typing import Any, BinaryIO, Iterator

TIMEOUT_S = 300.0
"""Longest one HTTP exchange may stay silent: the gateway sends progress at least every
``mcp_progress_s`` while a call waits, so only a hung gateway reaches it."""


class Relay:
    def __init__(self, url: str, token: str | None, session: str | None, out: BinaryIO) -> None:
        scheme, _, rest = url.rstrip("/").partition("://")
        netloc, slash, path = rest.partition("/")
        self.https = scheme == "https"
        host, colon, port = netloc.rpartition(":") if "]" not in netloc.rpartition(":")[2] else ("", "", "")
        self.host = (host if colon else netloc).strip("[]") or "127.0.0.1"
        self.port = int(port) if colon and port.isdigit() else (443 if self.https else 80)
        self.path = (slash + path if path else "") + "/mcp"
        self.url = url
        self.token = token
        self.session = session
        self.out = out
        self.lock = threading.Lock()
        self.sid: str | None = None
        self.version: str | None = None
        self.init: dict[str, Any] | None = None
        """The client's initialize request, to open the session again after a gateway restart."""

    # -- output ---------------------------------------------------------------------
    def write(self, message: Any) -> None:
        data = (message if isinstance(message, bytes) else json.dumps(message).encode()) + b"\n"
        with self.lock:
            self.out.write(data)
            self.out.flush()

    # -- upstream -------------------------------------------------------------------
    def _headers(self, message: dict[str, Any]) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if self.session:
            h["X-Corral-Session"] = self.session
        modern = _envelope_version(message)
        if modern:
            # Protocol 2026-07-28: each request carries its own version in its envelope, and
            # the transport's headers must repeat it, the method and the name it is about
            # (a tool, a resource, a task), as an HTTP client of the gateway would send them.
            h["Mcp-Protocol-Version"] = modern
            h["Mcp-Method"] = str(message.get("method"))
            params = message.get("params") or {}
            name = params.get(_NAMED.get(str(message.get("method")), "")) if isinstance(params, dict) else None
            if isinstance(name, str):
                h["Mcp-Name"] = name if name.isascii() and name.isprintable() else \
                    "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
            return h
        if self.sid:
            h["Mcp-Session-Id"] = self.sid
        if self.version:
            h["Mcp-Protocol-Version"] = self.version
        return h

    def _post(self, message: dict[str, Any]) -> tuple[int, dict[str, str], Iterator[bytes]]:
        """(status, headers, the JSON-RPC messages of the answer, as they arrive)."""
        body = json.dumps(message).encode()
        sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT_S)
        if self.https:
            import ssl

            import os

            # The system's CAs, or the site CA's file (CORRAL_CA_FILE), as the CLI verifies it.
            context = ssl.create_default_context(cafile=os.environ.get("CORRAL_CA_FILE") or None)
            try:
                sock = context.wrap_socket(sock, server_hostname=self.host)
            except OSError:
                sock.close()
                raise
        head = "".join(f"{k}: {v}\r\n" for k, v in self._headers(message).items())
        sock.sendall(f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n"
                     f"Content-Length: {len(body)}\r\n{head}\r\n".encode("latin-1") + body)
        f = sock.makefile("rb")
        try:
            status = int(f.readline().split()[1])
        except (IndexError, ValueError):
            sock.close()
            raise ConnectionError("the gateway's answer is not HTTP") from None
        headers: dict[str, str] = {}
        while (line := f.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()

        def messages() -> Iterator[bytes]:
            try:
                lines = _lines(_body(f, headers))
                if headers.get("content-type", "").startswith("text/event-stream"):
                    data: list[bytes] = []
                    for line in lines:
                        line = line.rstrip(b"\r\n")
                        if not line:
                            if data:
                                yield b"\n".join(data)
                            data = []
                        elif line.startswith(b"data:"):
                            data.append(line[5:].lstrip(b" "))
                    if data:
                        yield b"\n".join(data)
                else:
                    whole = b"".join(lines).strip()
                    if whole:
                        yield whole
            finally:
                f.close()
                sock.close()

        return status, headers, messages()

    def _open(self) -> None:
        """Initialize a new upstream session with the client's own parameters."""
        assert self.init is not None
        self.sid = None
        status, headers, answer = self._post(self.init)
        list(answer)
        if status != 200:
            raise ConnectionError(f"the gateway answered HTTP {status} to initialize")
        self.sid = headers.get("mcp-session-id")
        list(self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})[2])

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        try:
            if method == "initialize":
                self.init = message
                self.sid = None
            status, headers, answer = self._post(message)
            if status == 404 and self.sid and self.init is not None and method != "initialize":
                list(answer)
                self._open()  # the gateway restarted and forgot the session: a new one, same client
                status, headers, answer = self._post(message)
            if status >= 400:
                body = b"".join(answer)
                error = _rpc_error(body)
                if error is not None and method not in _ANSWERED_HERE and "id" in message:
                    # The gateway's own JSON-RPC error (an unknown task: -32602): the client's to read
                    self.write({"jsonrpc": "2.0", "id": message["id"], "error": error})
                    return
                self.fail(message, _refusal(status, body, self.url))
                return
            if method == "initialize":
                self.sid = headers.get("mcp-session-id")
            for raw in answer:
                if method == "initialize":
                    self.version = (json.loads(raw).get("result") or {}).get("protocolVersion") or self.version
                self.write(raw)
        except (OSError, ValueError, ConnectionError) as e:
            if self.https and e.__class__.__name__.startswith(("SSL", "Certificate")):
                self.fail(message, f"the corral gateway at {self.url} could not be verified ({e}); if the site "
                                   "signs its own certificates, set CORRAL_CA_FILE to its CA's PEM file")
                return
            self.fail(message, f"the corral gateway at {self.url} does not answer ({e.__class__.__name__}: {e}); "
                               "start it (corral serve) or set CORRAL_URL to where it runs, then call again")

    def fail(self, message: dict[str, Any], sentence: str) -> None:
        """Answer a request here, in the protocol, since the gateway cannot."""
        print(f"corral mcp: {sentence}", file=sys.stderr, flush=True)
        if "id" not in message or message.get("method") is None:
            return  # a notification or a response: nothing to answer
        method, rid = message["method"], message["id"]
        if method == "initialize":
            params = message.get("params") or {}
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "corral", "version": "relay"},
                "instructions": f"corral is not usable right now: {sentence}",
            }
        elif method == "tools/list":
            result = {"tools": [{
                "name": "corral_status",
                "description": f"corral is not usable right now: {sentence}. Call this to check again.",
                "inputSchema": {"type": "object", "properties": {}},
            }]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": sentence}], "isError": True}
        elif method == "ping":
            result = {}
        else:
            self.write({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": sentence}})
            return
        self.write({"jsonrpc": "2.0", "id": rid, "result": result})


_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
          "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
"""Which parameter a request is about, mirrored in ``Mcp-Name`` (protocol 2026-07-28, and
the tasks extension for its methods)."""


def _envelope_version(message: dict[str, Any]) -> str | None:
    """The protocol version a 2026-07-28 request carries in its own ``_meta``, if any."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get("io.modelcontextprotocol/protocolVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version.isascii() and version.isprintable() else None


def _body(f: Any, headers: dict[str, str]) -> Iterator[bytes]:
    """An HTTP/1.1 body as it arrives: chunked, by length, or to the connection's end."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int(f.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield f.read(size)
            f.readline()  # the chunk's CRLF
    elif "content-length" in headers:
        yield f.read(int(headers["content-length"]))
    else:
        while chunk := f.read1(65536):
            yield chunk


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        for line in whole:
            yield line + b"\n"
    if rest:
        yield rest


_ANSWERED_HERE = ("initialize", "tools/list", "tools/call", "ping")
"""Methods whose refusal (a bad token) the relay turns into something each client shows:
instructions, a tool that says what is wrong, a tool error."""


def _rpc_error(body: bytes) -> dict[str, Any] | None:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    return error if isinstance(error, dict) and isinstance(error.get("code"), int) else None


def _refusal(status: int, body: bytes, url: str) -> str:
    """The gateway's own sentence from a refused request (a JSON-RPC error), else one here."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"the corral gateway at {url} answered HTTP {status}; retry, and if it persists tell the facility admin"


def serve(url: str, token: str | None, session: str | None, stdin: BinaryIO | None = None,
          stdout: BinaryIO | None = None) -> int:
    relay = Relay(url, token, session, stdout or sys.stdout.buffer)
    threads: list[threading.Thread] = []
    for line in stdin or sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except ValueError as e:
            relay.write({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"parse error: {e}"}})
            continue
        if message.get("method") == "initialize" or "id" not in message:
            # initialize first, alone: the session id every later message carries; notifications
            # (initialized, cancelled) in order, so none overtakes what it is about
            relay.handle(message)
            continue
        t = threading.Thread(target=relay.handle, args=(message,), daemon=True)
        t.start()
        threads = [x for x in threads if x.is_alive()] + [t]
    for t in threads:  # stdin closed: let the answers already asked for arrive
        t.join(timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.edges.mcp.relay``: the same relay without the CLI around it."""
    import os

    url = os.environ.get("CORRAL_URL", "http://127.0.0.1:8765")
    return serve(url, os.environ.get("CORRAL_TOKEN"), os.environ.get("CORRAL_SESSION"))


if __name__ == "__main__":
    sys.exit(main())
