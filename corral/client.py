"""A small synchronous client of the gateway's HTTP API, shared by the CLI and the
stdio MCP server: both are thin clients of one running gateway, never a second core.

Built on the standard library's http.client: the CLI starts once per command (agents
run it often), and importing httpx alone cost ~180 ms of every run.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from .paths import home_dir
from .errors import (BackendError, Conflict, CorralError, Forbidden, InvalidRequest, NotFound, RateLimited,
                     Unauthenticated)

_BY_STATUS: dict[int, type[CorralError]] = {
    400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: Conflict, 422: InvalidRequest,
}


class GatewayUnreachable(CorralError):
    status = 503
    code = "gateway_unreachable"


def default_token(home: Path | None = None) -> str | None:
    """CORRAL_TOKEN, else the admin token file of the local gateway when this user can read it."""
    token = os.environ.get("CORRAL_TOKEN")
    if token:
        return token.strip()
    path = (home or home_dir()) / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


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

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._scheme == "https":
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                   context=ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
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
                conn.request(method, self._prefix + path + query, body=body, headers=hdrs)
                resp = conn.getresponse()
                status, data = resp.status, resp.read()
                resp_retry = resp.getheader("Retry-After")
                break
            except (ConnectionRefusedError, socket.gaierror):
                self.close()
                raise GatewayUnreachable(
                    f"cannot reach the corral gateway at {self.url}; start it with 'corral serve' (or 'make run'), "
                    "or point CORRAL_URL at it"
                ) from None
            except (TimeoutError, socket.timeout):
                self.close()
                raise GatewayUnreachable(f"the gateway at {self.url} did not answer in time; retry") from None
            except (http.client.HTTPException, ConnectionError, OSError):
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

    # -- the API, one method a route ------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        return self.request("GET", "/v1/whoami")

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json_body=spec, headers=headers)

    def remember(self, text: str, scope: str = "user", expires: str | None = None,
                 job_id: int | None = None) -> dict[str, Any]:
        body = {"text": text, "scope": scope, "expires": expires, "job_id": job_id}
        return self.request("POST", "/v1/notes", json_body={k: v for k, v in body.items() if v is not None})

    def recall(self, query: str, k: int = 5) -> dict[str, Any]:
        return self.request("GET", "/v1/notes", params={"q": query, "k": k})

    def advice(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/advice", json_body=spec)

    def submit_batch(self, specs: list[dict[str, Any]], idempotency_key: str | None = None,
                     array: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body: dict[str, Any] = {"jobs": specs, **({"array": array} if array is not None else {})}
        return self.request("POST", "/v1/jobs/batch", json_body=body, headers=headers)

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/plan", json_body=spec)

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, **params: Any) -> dict[str, Any]:
        return self.request("GET", "/v1/jobs", params={k: v for k, v in params.items() if v is not None})

    def wait(self, job_id: int, timeout: float, until: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout": timeout}
        if until:
            params["until"] = until
        return self.request("GET", f"/v1/jobs/{job_id}/wait", params=params, timeout=timeout + 30)

    def events(self, cursor: int | None, timeout: float, limit: int = 200) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout": timeout, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        return self.request("GET", "/v1/events", params=params, timeout=timeout + 30)

    def output(self, job_id: int, **params: Any) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/output", params={k: v for k, v in params.items() if v is not None})

    def cancel(self, job_ids: list[int]) -> dict[str, Any]:
        return self.request("POST", "/v1/jobs/cancel", json_body={"ids": job_ids})

    def control(self, job_id: int, action: str, signal: str | None = None) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{job_id}/control",
                            json_body={"action": action, **({"signal": signal} if signal else {})})

    def usage(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/usage")

    def facility(self) -> dict[str, Any]:
        return self.request("GET", "/v1/facility")

    def add_principal(self, **body: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/principals", json_body={k: v for k, v in body.items() if v is not None})

    def principals(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/principals")

    def mint_token(self, for_: str, expires: str | None, note: str | None = None,
                   caveats: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("POST", "/v1/tokens", json_body={"for": for_, "expires": expires, "note": note,
                                                             **(caveats or {})})

    def tokens(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/tokens")

    def clear_taint(self, token_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/tokens/{token_id}/clear-taint")

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/tokens/{token_id}")
