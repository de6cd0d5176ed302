"""Helpers shared by benchmarks: a gateway process, percentiles, a lean HTTP client."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def shared_data(name: str) -> Path:
    """A file or directory of the facility's ../shared/data (real job traces, real agents'
    commands): under $CORRAL_SHARED_DATA, else beside the checkout wherever the clone lives."""
    candidates = [Path(p) / name for p in filter(None, [os.environ.get("CORRAL_SHARED_DATA")])]
    candidates += [parent / "shared" / "data" / name for parent in Path(__file__).resolve().parents]
    candidates.append(Path("/work/shared/data") / name)
    return next((c for c in candidates if c.exists()), candidates[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """A real ``corral serve`` on a loopback port with its own temporary home."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, home: Path | None = None) -> None:
        self.home = home or Path(tempfile.mkdtemp(prefix="corral-bench-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Rate limits off unless a benchmark sets them: these measure throughput, and one
        # synthetic agent here sends far more than any real agent's fair share.
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
                    "CORRAL_HOME": str(self.home), "CORRAL_URL": self.url, "CORRAL_RATE_API_PER_S": "0",
                    "CORRAL_RATE_SUBMIT_PER_MIN": "0", "CORRAL_AGENT_MAX_ACTIVE_JOBS": "0", **(env or {})}
        self.log = open(self.home / "serve.log", "wb")
        # Another commit's tree (PYTHONPATH, as bench/fast_lane.py's --before sets it) is run
        # from its own directory (`python -m` puts the working directory first on the path)
        # by its own entry point: the CLI moved to corral/edges/cli/ in issue 36.
        tree = Path(self.env["PYTHONPATH"]) if self.env.get("PYTHONPATH") else None
        module = ("corral.cli" if tree is not None and not (tree / "corral" / "edges" / "cli" / "main.py").exists()
                  else "corral.edges.cli.main")
        self.proc = subprocess.Popen([sys.executable, "-m", module, "serve", "--port", str(self.port), *args],
                                     env=self.env, stdout=self.log, stderr=self.log, cwd=tree)
        deadline = time.monotonic() + 90  # a loaded machine (shared CI runners) starts it slowly
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError((self.home / "serve.log").read_text())
        self.token = (self.home / "admin.token").read_text().strip()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def sponsored_agents(gw: GatewayProcess, n: int) -> list[str]:
    """n agent principals under one sponsor -> their tokens."""
    with gw.client() as h:
        h.post("/v1/principals", json={"name": "sponsor", "kind": "human"})
        out = []
        for i in range(n):
            h.post("/v1/principals", json={"name": f"agent{i}", "kind": "agent", "sponsor": "sponsor"})
            out.append(h.post("/v1/tokens", json={"for": f"agent{i}", "expires": "2h"}).json()["token"])
        return out


class KeepAliveGet:
    """A minimal HTTP/1.1 keep-alive GET client: the load generator must not need
    the CPU the server is being measured on (httpx costs ~0.5 ms a request)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, extra_headers: str = "") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n"
               f"{extra_headers}\r\n").encode()
        self.writer.write(req)
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, close = 0, False
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            close = close or line.lower() == b"connection: close"
        body = await self.reader.readexactly(length)
        if close:  # as HTTP/1.1 says: the server ends the connection; the next request opens one
            self.close()
            self.reader = self.writer = None
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def finish(name: str, result: dict, measured: dict[str, bool]) -> None:
    """Print the run's one JSON object last, then fail the run if an arm measured nothing.

    ``measured`` maps each arm (or figure) to whether it measured something: samples taken,
    failures seen where failures are the point, a denominator above zero. A benchmark whose
    arm measured nothing is a claim, not a measurement (issue 46): the run exits 3 and names
    the arm on stderr, after the JSON (which carries the same names under "measured_nothing")
    so the figures that were taken are still readable.
    """
    empty = sorted(arm for arm, ok in measured.items() if not ok)
    result = {**result, "measured_nothing": empty}
    print(json.dumps(result), flush=True)
    if empty:
        print(f"bench/{name}.py: measured nothing in {', '.join(empty)}", file=sys.stderr)
        raise SystemExit(3)
