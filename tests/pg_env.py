"""The private PostgreSQL server of scripts/postgres-up, for the store's tests: each test
gets a database of its own, dropped afterwards. Missing, a test needing it skips with how
to get it, and fails under CI=true."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

ENV_FILE = Path(os.environ.get("CORRAL_PG_DIR", "/tmp/corral-pg")) / "env"


def server_url() -> str | None:
    """The server's URL: $CORRAL_TEST_PG_URL, else what scripts/postgres-up wrote."""
    url = os.environ.get("CORRAL_TEST_PG_URL")
    if not url and ENV_FILE.exists():
        for line in ENV_FILE.read_text().splitlines():
            if line.startswith("export CORRAL_TEST_PG_URL="):
                url = line.split("=", 1)[1].strip()
    return url or None


def _unavailable(why: str) -> None:
    msg = f"no PostgreSQL for the store's tests ({why}); run scripts/postgres-up"
    if os.environ.get("CI") == "true":
        pytest.fail(msg)
    pytest.skip(msg)


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server -> its URL; dropped at the end."""
    import psycopg

    url = server_url()
    if url is None:
        _unavailable("scripts/postgres-up has not run")
        raise AssertionError  # unreachable: skip and fail raise
    try:
        admin = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        _unavailable(str(e).strip().splitlines()[0])
        raise
    name = f"corral_t_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            yield url.rsplit("/", 1)[0] + "/" + name
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class PrivateServer:
    """A PostgreSQL server of one test's or bench's own (``private_server``): one that may be
    restarted under load without disturbing the shared server other tests use."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.url = f"postgresql://corral@127.0.0.1:{port}/corral"

    def _ctl(self, *args: str) -> None:
        import glob
        import subprocess

        ctl = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
        subprocess.run(["runuser", "-u", "postgres", "--", ctl, "-D", str(self.root / "data"), "-w", "-t", "60",
                        *args], check=True, capture_output=True)

    def restart(self, down_s: float = 0.0) -> None:
        """Stopped fast (its sessions ended, their transactions rolled back), ``down_s``
        seconds away, started again: back when this returns."""
        import time

        self._ctl("-m", "fast", "stop")
        time.sleep(down_s)
        self._ctl("-l", str(self.root / "server.log"), "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")


@contextlib.contextmanager
def private_server() -> Iterator[PrivateServer]:
    """scripts/postgres-up in a directory and on a port of its own -> the server; stopped
    and removed afterwards. Without PostgreSQL installed: skipped, failed under CI=true."""
    import shutil
    import socket
    import subprocess
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="corral-pg-own-", dir="/tmp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).resolve().parent.parent / "scripts" / "postgres-up"
    cp = subprocess.run([str(script)], env={**os.environ, "CORRAL_PG_DIR": str(root), "CORRAL_PG_PORT": str(port)},
                        capture_output=True, text=True)
    if cp.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(f"scripts/postgres-up failed: {cp.stderr.strip()[-300:]}")
    server = PrivateServer(root, port)
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
