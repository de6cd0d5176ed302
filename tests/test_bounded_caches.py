"""Issue 46, item 8: the gateway's caches are bounded by size, not by history. Each
structure that kept something of every job (a parsed spec, a decision, a lane's answer,
a lock, a recall term) is fed many more entries than its bound, with real objects, and
stays within the bound; what fell out is still answered (from the store, the job's
directory, the policy)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from corral.core.clock import ManualClock
from corral.core.config import SafetySettings
from corral.core.db import Database
from corral.core.jobs import JobSpec, JobState
from corral.core.lru import LRU
from corral.core.principals import Caller, Kind, Principal
from corral.core.store import jobs as store_jobs
from corral.lanes.backend import SubmitContext
from corral.lanes import local
from corral.lanes.local import LocalBackend
from corral.memory import store as memory_store
from corral.memory.store import Memory
from corral.safety import gate as gate_module
from corral.safety.gate import Gate, job_resource
from corral.safety.output_guard import OutputGuard


def test_an_lru_keeps_the_last_used_within_its_size_and_budget() -> None:
    lru: LRU[int, str] = LRU(100, budget=1000, weigh=lambda _, v: len(v))
    for i in range(10_000):
        lru.put(i, "x" * 5)
        if i % 7 == 0:
            lru.get(0)  # used again: kept
    assert len(lru) == 100 and 0 in lru and 9_999 in lru and 5_000 not in lru
    for i in range(1000):
        lru.put(-i, "y" * 40)  # heavier: the budget binds before the size
    assert len(lru) == 25 and lru.weight == 1000
    lru.put("big", "z" * 5000)  # type: ignore[arg-type]  # heavier than the budget alone: kept until the next
    assert len(lru) == 1 and lru.get("big") == "z" * 5000  # type: ignore[arg-type]
    assert lru.pop("big") is not None and lru.weight == 0  # type: ignore[arg-type]


def test_parsed_specs_stay_within_their_count_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each distinct job read was kept (50,000, ~1.7 KB each, before a clear); the store
    still answers the first job's spec once its parse has fallen out."""
    specs: LRU[str, JobSpec] = LRU(64, 64 * 1024, lambda text, _: len(text))
    monkeypatch.setattr(store_jobs, "_SPECS", specs)
    db = Database(tmp_path / "c.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    ids = [db.insert_job("a", None, "local", JobSpec(command=f"echo soak {i}")).id for i in range(400)]
    for jid in ids:
        assert db.get_job(jid).spec.command == f"echo soak {jid - ids[0]}"  # type: ignore[union-attr]
    assert len(specs) == 64
    big = [db.insert_job("a", None, "local", JobSpec(script="#!/bin/sh\n" + f"# {i}\n" * 3000 + "true\n")).id
           for i in range(40)]
    for jid in big:
        db.get_job(jid)
    assert specs.weight <= 64 * 1024 and len(specs) < 64
    assert db.get_job(ids[0]).spec.command == "echo soak 0"  # type: ignore[union-attr]
    # The module's own bound, as the gateway has it.
    assert store_jobs.SPECS_KEPT == 4096 and store_jobs.SPECS_TEXT_KEPT == 8 * 2**20


def test_decisions_stay_within_their_bound_and_expire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of a job's output was a decision kept until 10,000 of them (then all
    dropped); now at most DECISIONS_KEPT, and those older than their second go first.
    (The bound made small here: each decision costs the policy ~1 ms.)"""
    assert gate_module.DECISIONS_KEPT == 4096
    monkeypatch.setattr(gate_module, "DECISIONS_KEPT", DECISIONS_KEPT := 64)
    clock = ManualClock()
    db = Database(tmp_path / "c.db")
    gate = Gate(SafetySettings(), tmp_path, db, clock)
    agent = Caller(Principal("a1", Kind.AGENT, sponsor="s"), None, "t1", frozenset({"a1"}))
    spec = JobSpec(command="true")
    for job_id in range(DECISIONS_KEPT * 2 + 100):
        gate.check(agent, "read_output", "Job", {"id": job_id, **job_resource(spec, "a1")})
    assert len(gate._decisions) == DECISIONS_KEPT
    # The same facts within the second: answered from the cache, the same decision.
    assert gate.check(agent, "read_output", "Job", {"id": DECISIONS_KEPT * 2 + 99, **job_resource(spec, "a1")})
    clock.advance(1.5)
    gate.check(agent, "read_output", "Job", {"id": -1, **job_resource(spec, "a1")})
    assert len(gate._decisions) == 1  # the expired went with the next one kept


def test_the_local_lane_lets_go_of_ended_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ended job's answer was kept for the gateway's life; ``forget`` (the reconciler
    calls it once the end is recorded) lets it go, and the directory still answers."""
    assert local.DONE_KEPT == 4096
    monkeypatch.setattr(local, "DONE_KEPT", DONE_KEPT := 50)
    b = LocalBackend(tmp_path / "local", cpus=4, memory_mb=2048, max_walltime_s=3600)
    bids = [b.submit(SubmitContext(i, "a", "human"), JobSpec(command="true")) for i in range(1, 4)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(s.state.terminal for s in b.status(bids).values()):
        time.sleep(0.1)
    assert {s.state for s in b.status(bids).values()} == {JobState.COMPLETED}
    assert set(bids) <= b.remembered()
    b.forget(bids)
    assert b.remembered() == set()
    assert b.status(bids[:1])[bids[0]].state is JobState.COMPLETED
    # Ended jobs asked about and never forgotten (a lane's answers read by someone else):
    # at most DONE_KEPT are kept. Their directories are real, as a restart finds them.
    for i in range(100, 100 + DONE_KEPT * 3):
        d = b.jobs_dir / str(i)
        d.mkdir()
        (d / "launch.json").write_text("{}")
        (d / "result.json").write_text(json.dumps({"state": "COMPLETED", "exit_code": 0, "reason": None,
                                                   "start_time": 1.0, "end_time": 2.0}))
    asked = [str(i) for i in range(100, 100 + DONE_KEPT * 3)]
    assert len(b.status(asked)) == len(asked)
    assert len(b.remembered()) == DONE_KEPT
    assert b.status(["100"])["100"].exit_code == 0  # fallen out, read again


def test_output_locks_last_only_while_reads_are_in_progress(tmp_path: Path) -> None:
    """One lock per (job, stream) ever read was kept; now one per read in progress."""
    g = OutputGuard(tmp_path / "guarded")
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(100):
        (raw / str(i)).write_text(f"line {i}\n")

    def reader(lo: int) -> None:
        for i in range(lo, 100, 4):
            for stream in ("stdout", "stderr"):
                page = g.read(f"{i}.{stream}", raw / str(i), True, 0, 1000, None).page
                assert page["data"] == f"line {i}\n"

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert g._locks == {}


def test_recall_terms_stay_within_their_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every distinct word of every recall query was kept; now the last TERMS_KEPT."""
    monkeypatch.setattr(memory_store, "TERMS_KEPT", 200)
    db = Database(tmp_path / "c.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    m = Memory(db)
    caller = Caller(Principal("a", Kind.HUMAN), None, "t", frozenset({"a"}))
    for i in range(1001):  # past the size at which recall weighs its terms
        m.remember(caller, f"note {i} about gcc modules")
    assert len(m._df) == 0
    for q in range(120):
        m.recall(caller, " ".join(f"word{q}x{k}" for k in range(5)) + " gcc")
    assert len(m._df) == 200
    assert m.recall(caller, "gcc modules")  # the common terms still find the notes
