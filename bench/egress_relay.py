"""egress_relay: a fast-lane worker's relay to the egress proxy, corral's own (each
identity held to a share, corral/sandbox/relay.py) against the socat relay it replaced
(``relay_argv``, 64 connections in all), side by side in one run.

Each relay listens on a Unix socket and carries each connection to a TCP server on
loopback standing in for the proxy's front: for ``bulk``, the server sends 64 MiB and
closes (a wheel being downloaded); for ``connect``, it answers one line (a small
request: the cost of a connection through the relay). Figures: MB/s of the bulk copy
(median of the runs), and connections per second, one after another, each a connect, a
line back and a close.

    python bench/egress_relay.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402
from corral.sandbox.egress import relay_argv  # noqa: E402

CHUNK = b"x" * (1 << 20)


def server(bulk_mb: int) -> tuple[int, int]:
    """Two loopback servers (bulk, line) on threads: -> their ports."""
    def run(sock: socket.socket, send: bytes | None) -> None:
        while True:
            c, _ = sock.accept()
            with c:
                if send is None:
                    for _ in range(bulk_mb):
                        c.sendall(CHUNK)
                else:
                    c.sendall(send)

    ports = []
    for send in (None, b"ok\n"):
        s = socket.create_server(("127.0.0.1", 0), backlog=256)
        threading.Thread(target=run, args=(s, send), daemon=True).start()
        ports.append(s.getsockname()[1])
    return ports[0], ports[1]


def start(kind: str, path: str, port: int) -> subprocess.Popen[bytes]:
    listen = f"127.0.0.1:{port}"
    argv = ([sys.executable, "-m", "corral.sandbox.relay", path, listen] if kind == "corral"
            else relay_argv(path, listen, perm="0666"))
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.exists(path):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {kind} relay did not start")
        time.sleep(0.01)
    return p


def bulk(path: str) -> tuple[float, int]:
    """-> (MB/s, bytes received): a relay that cut the copy short would look fast."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    got, t = 0, time.perf_counter()
    while data := s.recv(1 << 20):
        got += len(data)
    s.close()
    return got / (1 << 20) / (time.perf_counter() - t), got


def connects(path: str, n: int) -> tuple[float, int]:
    """-> (connections a second, how many carried the server's line back)."""
    t, answered = time.perf_counter(), 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        got = b""
        while data := s.recv(64):
            got += data
        answered += got == b"ok\n"
        s.close()
    return n / (time.perf_counter() - t), answered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 MiB copies, 200 connections, 3 runs")
    a = ap.parse_args()
    mb, n, runs = (16, 200, 3) if a.quick else (64, 1000, 5)
    bulk_port, line_port = server(mb)
    out: dict[str, dict[str, float]] = {}
    whole: dict[str, bool] = {}
    d = Path(tempfile.mkdtemp(prefix="corral-bench-relay-"))
    for kind in ("socat", "corral"):
        rates, conns, copied, answered = [], [], [], []
        for r in range(runs):  # a relay per figure, so that each kind starts as fresh
            b = start(kind, str(d / f"{kind}-b{r}.sock"), bulk_port)
            c = start(kind, str(d / f"{kind}-c{r}.sock"), line_port)
            try:
                rate, got = bulk(str(d / f"{kind}-b{r}.sock"))
                per_s, ok = connects(str(d / f"{kind}-c{r}.sock"), n)
                rates.append(rate)
                conns.append(per_s)
                copied.append(got == mb << 20)
                answered.append(ok == n)
            finally:
                for p in (b, c):
                    p.kill()
                    p.wait()
        out[kind] = {"bulk_mb_per_s": round(statistics.median(rates), 1),
                     "connections_per_s": round(statistics.median(conns), 1)}
        whole[f"{kind} bulk"] = all(copied)
        whole[f"{kind} connect"] = all(answered)
        print(f"{kind}: {out[kind]}", file=sys.stderr)
    # A copy cut short, or a connection closed without the server's line, carried nothing.
    finish("egress_relay", {"bench": "egress_relay", "bulk_mb": mb, "connections": n, "runs": runs, **out}, whole)


if __name__ == "__main__":
    main()
