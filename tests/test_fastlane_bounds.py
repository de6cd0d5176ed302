"""The fast lane's gateway side under a pool's user, or anyone who reaches its address
(issue 47, review findings): what it reads of a pool's journals is bounded and read off
the event loop; its listener caps connections before TLS and closes silent ones; two
pools never share a name. Real engine, real worker process, real TLS."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.core.paths import CODE_ROOT
from corral.lanes.fast import engine as engine_mod
from corral.lanes.fast import journals, trust
from corral.lanes.fast.engine import Engine, Lost
from corral.lanes.fast.model import PoolConfig, PoolKey, Shape, Task


# -- pools never share a name -------------------------------------------------------------

def test_two_pool_keys_never_share_a_slug() -> None:
    """``bob`` + ``chem-lab`` and ``bob-chem`` + ``lab`` were one pool (one directory, one
    listener, one's tasks run as the other's Unix user)."""
    keys = [PoolKey(u, a, p) for u in ("bob", "bob-chem", "_", None, "a:b", "a/b", "x+2Dy", "é")
            for a in ("chem-lab", "lab", "_", None, "-") for p in (None, "_", "a-b", "b")]
    slugs = {k.slug for k in keys}
    assert len(slugs) == len(keys), "two pool keys share a slug"
    assert PoolKey("bob", "chem-lab", None).slug != PoolKey("bob-chem", "lab", None).slug
    for s in slugs:  # a directory's name, in a backend id fast:<slug>:<id>, always two dashes
        assert re.fullmatch(r"[A-Za-z0-9_.+-]+", s) and s.count("-") == 2, s  # a job's name may carry it
    assert PoolKey("alice", "proj-a", None).slug == "alice-proj+2Da-_"
    assert PoolKey("corralp1", "proj", None).slug == "corralp1-proj-_"  # the common case unchanged


def test_a_pools_cluster_is_a_fourth_part_of_its_slug() -> None:
    """Pools per cluster (decision 0066): with a cluster, a slug of four parts that no key
    without one shares; without, the slug as it was (ids and directories found again)."""
    keys = [PoolKey(u, a, p, c) for u in ("bob", "bob-one", None) for a in ("lab", "lab-one", None)
            for p in (None, "one", "a-b") for c in (None, "one", "two", "one-two")]
    slugs = {k.slug for k in keys}
    assert len(slugs) == len(keys), "two pool keys share a slug"
    assert all(k.slug.count("-") == (3 if k.cluster else 2) for k in keys)
    assert PoolKey("ann", "proj", None, "two").slug == "ann-proj-_-two"
    assert PoolKey("ann", "proj", None).slug == PoolKey("ann", "proj", None, None).slug == "ann-proj-_"


# -- journals: bounded, off the loop ------------------------------------------------------

def test_journals_are_read_within_a_count_and_size_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's user may put millions of journals there: only the newest MAX_FILES are
    read, among at most MAX_ENTRIES names, and at most MAX_TOTAL bytes in all."""
    d = tmp_path / "pool" / journals.JOURNALS
    d.mkdir(parents=True)
    n = journals.MAX_FILES + 50
    for i in range(n):
        f = d / f"w{i}.jsonl"
        f.write_text(f'{{"job_id": {i}, "event": "ended", "state": "COMPLETED", "exit_code": 0}}\n')
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    got = journals.read_journals(tmp_path / "pool")
    assert len(got) == journals.MAX_FILES and set(got) == set(range(50, n)), "read past the count bound"
    monkeypatch.setattr(journals, "MAX_TOTAL", 200)
    assert 0 < len(journals.read_journals(tmp_path / "pool")) <= 3, "read past the size bound"


class _Ports:
    """A pool's two ports, recording what it reports."""

    def __init__(self) -> None:
        self.ended_records: list[dict[str, Any]] = []

    def ended(self, results: list[dict[str, Any]]) -> None:
        self.ended_records += results

    def started(self, started: dict[int, float]) -> None:
        pass


def test_a_lost_batchs_journals_are_read_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_salvage`` read every journal on the gateway's event loop: a large one held every
    principal's requests."""
    from corral.lanes.fast.pool import Pool

    (tmp_path / journals.JOURNALS).mkdir()
    (tmp_path / journals.JOURNALS / "w.jsonl").write_text(
        '{"job_id": 1, "event": "ended", "state": "COMPLETED", "exit_code": 0, "end": 5.0}\n')
    threads: list[int] = []
    real = journals.read_journals

    def spy(d: Path) -> dict[int, dict[str, Any]]:
        threads.append(threading.get_ident())
        return real(d)

    monkeypatch.setattr(journals, "read_journals", spy)
    ports = _Ports()

    async def main() -> tuple[int, list[int]]:
        pool = Pool(PoolKey("u", "a", None), Shape(2, 1000, 0, 600), tmp_path, PoolConfig(), SimpleNamespace(),
                    ports)
        fut: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        fut.set_exception(Lost("gone"))
        await pool._collect(fut, [Task(1, {"cpus": 1}), Task(2, {"cpus": 1})])
        return threading.get_ident(), [t.job_id for t in pool.queue]

    loop_thread, requeued = asyncio.run(main())
    assert threads and loop_thread not in threads, "the journals were read on the event loop"
    # its journal's outcome kept; the task that never started waits again
    assert [(r["job_id"], r["state"]) for r in ports.ended_records] == [(1, "COMPLETED")] and requeued == [2]


# -- the listener: a cap before TLS, silent workers closed ----------------------------------

async def _closed_within(writers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], s: float) -> int:
    """How many of these connections the other side closed within ``s`` seconds."""
    async def eof(r: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(r.read(1), s) == b""
        except (asyncio.TimeoutError, OSError):
            return False
    return sum(await asyncio.gather(*(eof(r) for r, _ in writers)))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # the gateway runs uvloop (edges/http/serve.py)
def test_idle_connections_are_capped_and_closed_and_a_worker_is_still_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """Anyone who reaches a pool's address held a TLS handshake and a socket of the
    gateway per connection, for as many as it opened; a worker that said its name and
    then nothing held its connection for ever. Now: at most MAX_PENDING connections wait
    for their handshake and hello (the oldest shed), a silent worker is closed after
    IDLE_S, and an honest worker (a real one, pinging) joins and runs a task meanwhile."""
    monkeypatch.setattr(engine_mod, "HELLO_S", 3.0)
    monkeypatch.setattr(engine_mod, "IDLE_S", 3.0, raising=False)
    pool_dir = tmp_path / "u-a-_"
    pool_dir.mkdir()
    tls = trust.issue(pool_dir, "u-a-_", None, None)
    files = trust.files_of(pool_dir)

    async def main() -> None:
        eng = Engine("127.0.0.1", tls, "u-a-_")
        reports: list[Any] = []
        await eng.start(lambda addr, started, ended: reports.extend(ended))
        port = int(eng.address.rsplit(":", 1)[1])
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
        await asyncio.sleep(0.5)
        assert len(eng.pending) <= engine_mod.MAX_PENDING
        shed = await _closed_within(idle, 1.0)
        assert shed >= 200 - engine_mod.MAX_PENDING, f"only {shed} of 200 idle connections were shed"
        # one that holds the pool's certificate, says its name, then nothing
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=trust.worker_context(files))
        w.write(b'{"op":"hello","name":"silent"}\n')
        worker = subprocess.Popen(
            [sys.executable, "-I", "-m", "corral.lanes.fast.worker", "--scheduler", eng.address, "--cpus", "1",
             "--memory-mb", "500", "--name", "honest", "--tls-dir", str(files), "--ping-s", "1"],
            cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(CODE_ROOT)})
        try:
            more = [await asyncio.open_connection("127.0.0.1", port) for _ in range(100)]  # while it joins
            deadline = time.monotonic() + 30
            while "honest" not in eng.workers_up():
                assert time.monotonic() < deadline and worker.poll() is None, "the honest worker never joined"
                await asyncio.sleep(0.1)
            spec = {"job_id": 1, "command": "true", "cpus": 1, "memory_mb": 100, "gpus": 0, "walltime_s": 30,
                    "env": {"PATH": "/usr/bin:/bin"}, "dir": str(tmp_path)}
            got = await asyncio.wait_for(eng.send([spec], eng.workers_up()["honest"]), 30)
            assert [o["state"] for o in got + reports] == ["COMPLETED"]
            assert await _closed_within([(r, w)], 5.0) == 1, "a silent worker kept its connection"
            assert "silent" not in eng.workers_up()
            await asyncio.sleep(2 * 1.0 + 0.5)  # pings keep the honest one past IDLE_S
            assert "honest" in eng.workers_up()
            assert await _closed_within(idle + more, 5.0) == 300, "an idle connection outlived HELLO_S"
            for _, x in idle + more:
                x.close()
        finally:
            worker.kill()
            worker.wait()
            await eng.close()

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        runner.run(main())
