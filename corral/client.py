"""A small synchronous client of the gateway's HTTP API, shared by the CLI and the
stdio MCP server: both are thin clients of one running gateway, never a second core."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from .errors import BackendError, Conflict, CorralError, Forbidden, InvalidRequest, NotFound, Unauthenticated

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
    path = (home or Path(os.environ.get("CORRAL_HOME", ".corral"))) / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


class Client:
    def __init__(self, url: str, token: str | None, session: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"User-Agent": "corral-cli"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if session:
            headers["X-Corral-Session"] = session
        # A plain-http gateway URL never does TLS, so skip building a verifying SSL
        # context (~100 ms per CLI run); https URLs verify as usual.
        verify = not self.url.startswith("http://")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, timeout=timeout or self.http.timeout, **kwargs)
        except httpx.ConnectError:
            raise GatewayUnreachable(
                f"cannot reach the corral gateway at {self.url}; start it with 'corral serve' (or 'make run'), "
                "or point CORRAL_URL at it"
            ) from None
        except httpx.TimeoutException:
            raise GatewayUnreachable(f"the gateway at {self.url} did not answer in time; retry") from None
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                message, hint = err["message"], err.get("hint")
            except (ValueError, KeyError, TypeError):
                message, hint = f"HTTP {resp.status_code}: {resp.text[:200]}", None
            cls = _BY_STATUS.get(resp.status_code, BackendError if resp.status_code >= 500 else InvalidRequest)
            raise cls(message, hint=hint)
        return resp.json()

    # -- the API, one method a route ------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        return self.request("GET", "/v1/whoami")

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json=spec, headers=headers)

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, **params: Any) -> dict[str, Any]:
        return self.request("GET", "/v1/jobs", params={k: v for k, v in params.items() if v is not None})

    def wait(self, job_id: int, timeout: float, until: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout": timeout}
        if until:
            params["until"] = until
        return self.request("GET", f"/v1/jobs/{job_id}/wait", params=params, timeout=timeout + 30)

    def output(self, job_id: int, **params: Any) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/output", params={k: v for k, v in params.items() if v is not None})

    def cancel(self, job_ids: list[int]) -> dict[str, Any]:
        return self.request("POST", "/v1/jobs/cancel", json={"ids": job_ids})

    def facility(self) -> dict[str, Any]:
        return self.request("GET", "/v1/facility")

    def add_principal(self, **body: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/principals", json={k: v for k, v in body.items() if v is not None})

    def principals(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/principals")

    def mint_token(self, for_: str, expires: str | None, note: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/v1/tokens", json={"for": for_, "expires": expires, "note": note})

    def tokens(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/tokens")

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/tokens/{token_id}")
