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
