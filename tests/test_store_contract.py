"""The store's contract, the same on both servers: every test runs on SQLite (a file) and
on PostgreSQL (a fresh database on scripts/postgres-up's server; fails under CI=true
when that server is missing). One test per concern of corral/core/store/."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from corral.core.jobs import JobSpec, JobState
from corral.core.principals import Kind, Principal
from corral.core.store import INTEGRITY_ERRORS, MIGRATIONS, Database, open_store
from corral.core.store.memory import EPISODE_COLS, Viewer
from tests.pg_env import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "corral.db")
    else:
        with fresh_database() as u:
            yield u


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    store = open_store(url)
    store.add_principal(Principal("alice", Kind.HUMAN, account="physics"))
    store.add_principal(Principal("bot", Kind.AGENT, sponsor="alice", account="physics"))
    try:
        yield store
    finally:
        store.close()


def test_migrations_run_once_and_a_reopened_store_keeps_its_rows(url: str) -> None:
    a = open_store(url)
    assert a.version == len(MIGRATIONS)
    a.add_principal(Principal("alice", Kind.HUMAN))
    a.close()
    b = open_store(url)  # nothing runs twice; the rows are there
    assert b.version == len(MIGRATIONS) and b.get_principal("alice") is not None
    b.close()


def test_jobs_insert_read_list_and_change(db: Database) -> None:
    spec = JobSpec(command="x", cpus=4, gpus=1, partition="debug", labels={"corral-tier": "guaranteed"})
    with db.transaction():
        a, b, c = db.insert_jobs("bot", "s1", [("batch", spec), ("batch", spec), ("fast", JobSpec(command="y"))],
                                 token_path="t1/t2")
    assert a.state is JobState.PENDING and a.spec == spec and b.id > a.id and c.backend == "fast"
    assert db.get_job(a.id) == a and db.get_job(10**9) is None
    assert set(db.get_jobs([a.id, c.id, 10**9])) == {a.id, c.id}
    assert db.states([a.id]) == {a.id: ("PENDING", "bot")}
    assert [j.id for j in db.list_jobs(["bot"], session="s1")] == [c.id, b.id, a.id]
    assert db.list_jobs([]) == [] and [j.id for j in db.list_jobs(None, limit=1, offset=1)] == [b.id]
    assert [j.id for j in db.active_jobs(unsent=True)] == [a.id, b.id, c.id]
    db.set_backend_ids([(a.id, "100"), (b.id, "101")])
    assert [j.id for j in db.active_jobs(unsent=True)] == [c.id]
    assert [r.id for r in db.active_runs(["batch"])] == [a.id, b.id]
    assert [j.id for j in db.queued_on("batch", but="nobody")] == [a.id, b.id] and db.queued_on("batch", "bot") == []
    assert db.guaranteed_cpus("debug") == 8 and db.guaranteed_cpus(None) == 0
    db.set_reasons([a.id], "waiting for cores")
    assert db.get_job(a.id).reason == "waiting for cores"  # type: ignore[union-attr]
    assert db.parents([a.id])[a.id].state == "PENDING"
    # Held before it is sent, and only then.
    assert db.set_held(c.id, True, "held") and not db.set_held(a.id, True, "held")
    assert db.active_jobs(unsent=True) == []
    db.mark_running({a.id: 1000.0})
    db.update_job(a.id, JobState.COMPLETED, exit_code=0, start_time=5.0, end_time=1000.0 + 1800, cpu_s=3600.0)
    db.update_job(a.id, JobState.RUNNING)  # a late report never resurrects a finished job
    done = db.get_job(a.id)
    assert done is not None and done.state is JobState.COMPLETED and done.start_time == 1000.0
    db.update_jobs([(b.id, JobState.RUNNING, None, None, 2000.0, None, None, 512.0, "c2")])
    db.update_job(b.id, JobState.RUNNING, requeues=2, lost_s=30.0)
    db.update_job(b.id, JobState.RUNNING, requeues=1)  # the count only grows
    b2 = db.get_job(b.id)
    assert b2 is not None and b2.requeues == 2 and b2.lost_s == 30.0
    assert b2.node == "c2"  # kept by a report that names no node
    db.update_job(b.id, JobState.RUNNING, node="c3")  # its next run, elsewhere
    assert (db.get_job(b.id) or b2).node == "c3"
    assert db.usage_of(b.id) == (None, 512.0)
    db.set_usage(b.id, 12.5, None)
    assert db.usage_of(b.id) == (12.5, 512.0)
    db.clear_backend_id(b.id)
    assert db.get_job(b.id).backend_id is None  # type: ignore[union-attr]
    u = db.usage(["bot"])
    assert u["jobs_by_state"] == {"COMPLETED": 1, "RUNNING": 1, "PENDING": 1}
    assert u["by_session"]["s1"]["jobs"] == 2 and u["measured_cpu_hours"] == pytest.approx((3600 + 12.5) / 3600, 1e-3)
    assert u["by_lane"]["batch"]["cpu_hours"] >= 2.0  # 4 CPUs x 30 min, and b's running time
    assert db.count_jobs() == {"COMPLETED": 1, "RUNNING": 1, "PENDING": 1}


def test_idempotency_keys_name_one_request(db: Database) -> None:
    spec = JobSpec(command="true")
    with db.transaction():
        a, a2 = db.insert_jobs("alice", "s", [("local", spec), ("local", spec)], idem_key="k", digest="d1")
    assert db.find_idempotent("alice", "new", 2) is None
    found = db.find_idempotent("alice", "k", 2)
    assert found is not None and [j.id for j in found[0]] == [a.id, a2.id] and found[1] == "d1"
    with pytest.raises(INTEGRITY_ERRORS):
        with db.transaction():
            db.insert_jobs("alice", "s", [("local", spec)], idem_key="k")
    assert len(db.list_jobs(["alice"])) == 2  # the refused request left nothing behind
    with db.transaction():
        db.insert_jobs("bot", "s", [("local", spec)], idem_key="k")  # keys are per principal


def test_accounts_principals_and_tokens(db: Database) -> None:
    assert db.get_principal("bot") == Principal("bot", Kind.AGENT, "alice", None, "physics", False,
                                                db.get_principal("bot").created)  # type: ignore[union-attr]
    assert [p.name for p in db.list_principals()] == ["alice", "bot"] and db.sponsored_by("alice") == ["bot"]
    with pytest.raises(INTEGRITY_ERRORS):
        db.add_principal(Principal("alice", Kind.HUMAN))
    db.add_token("t1", "alice", "h", None, "laptop")
    db.add_token("t2", "bot", "", time.time() + 60, None)
    assert db.get_token("t1")["hash"] == "h" and db.get_token("nope") is None  # type: ignore[index]
    assert [t["id"] for t in db.list_tokens(["bot"])] == ["t2"] and len(db.list_tokens()) == 2
    assert db.opaque_token_ids() == {"t1"}


def test_events_after_a_cursor(db: Database) -> None:
    assert db.event_bounds() == (0, 0)
    a = db.insert_job("bot", None, "local", JobSpec(command="x"))
    b = db.insert_job("alice", None, "local", JobSpec(command="y"))
    db.update_job(a.id, JobState.RUNNING)
    db.update_job(a.id, JobState.RUNNING)  # not a change: no event
    db.update_job(a.id, JobState.FAILED, exit_code=3)
    ev = db.events(0, None, 100)
    assert [(e[1], e[3], e[4]) for e in ev] == [(a.id, "PENDING", None), (b.id, "PENDING", None),
                                                (a.id, "RUNNING", None), (a.id, "FAILED", 3)]
    assert [e[0] for e in ev] == sorted(e[0] for e in ev) and abs(ev[-1][5] - time.time()) < 60
    assert [e[3] for e in db.events(ev[1][0], ["bot"], 100)] == ["RUNNING", "FAILED"]
    assert db.events(ev[-1][0], None, 100) == [] and len(db.events(0, None, 2)) == 2
    assert db.event_bounds() == (ev[-1][0], ev[0][0] - 1)
    assert db.prune_events(time.time() + 1) == 4
    assert db.event_bounds() == (ev[-1][0], ev[-1][0])  # the last id given is still known


def test_audit_head(db: Database) -> None:
    assert db.audit_head() is None
    db.set_audit_head(1, "m1")
    db.set_audit_head(2, "m2")
    assert db.audit_head() == (2, "m2")


def test_safety_blocks_taint_and_usage(db: Database) -> None:
    s = db.safety
    s.seen_blocks("root", "bot", ("b1", "b2"))
    s.seen_blocks("root", "bot", ("b2",))  # seen again: kept once
    assert sorted(s.blocks_of("root")) == ["b1", "b2"] and s.block_owner("b1") == "bot" and s.block_root("b2") == "root"
    s.revoke("b1", "alice")
    s.revoke("b1", "alice")
    assert s.revoked() == {"b1"} and [b["revoked"] is not None for b in s.blocks(["bot"])].count(True) == 1
    assert s.blocks(["alice"]) == []
    s.taint("k", "bot", "injection")
    s.taint("k", "bot", "again")
    assert s.taints() == {"k": "injection"}
    s.clear_taint("k")
    assert s.taints() == {}
    spec = JobSpec(command="x", cpus=2, walltime="1h")
    live = db.insert_job("bot", None, "local", spec)
    with db.transaction():
        db.insert_jobs("bot", None, [("local", spec)], token_path="root/b1")
        db.insert_jobs("bot", None, [("local", spec)], token_path="root/b1/b3")
        db.insert_jobs("bot", None, [("local", spec)], token_path="root/b10")  # not in root/b1's subtree
    assert s.used("root/b1") == (2 * 2 * 3600.0, 0.0, 2)
    assert s.active("bot") == 4 and live.id


def test_memory_episodes_notes_facts_and_vectors(db: Database) -> None:
    m = db.memory
    j1 = db.insert_job("bot", None, "local", JobSpec(command="x"))
    db.update_job(j1.id, JobState.COMPLETED, start_time=10.0, end_time=70.0)
    row = (j1.id, "bot", "alice", "physics", "fp", "1c", 1024, "COMPLETED", 0, None, None, 0, 70.0, "ck")
    assert len(row) == len(EPISODE_COLS.split(","))
    m.record_episodes([row, row])  # a job already remembered is skipped
    assert m.cached("ck", "bot") == j1.id and m.cached("ck", "alice") is None
    assert m.runtimes("fp", "alice", "1c", 5) == [(j1.id, 60.0)]
    assert [e[0] for e in m.episodes("fp", "alice", None)] == [j1.id] and m.episode(j1.id) == (None, None, 0)
    assert m.episodes_of([j1.id, 999]) == {j1.id: (None, None)}
    assert not m.any_note()
    n1 = m.add_note("the gcc module needs a newer cmake", "user", "bot", "alice", "physics", "s", None, 1.0, None, None)
    n2 = m.add_note("cmake builds fail on login nodes", "facility", "alice", "alice", None, None, None, 2.0, None, None)
    n3 = m.add_note("secret plan", "session", "bot", "alice", "physics", "other", None, 3.0, None, None)
    assert m.any_note() and m.newest_note() == n3 and m.note(n1)[1].startswith("the gcc")  # type: ignore[index]
    hits = m.match(["cmake", "gcc"], 10)
    assert [i for i, _ in hits][0] == n1 and {i for i, _ in hits} == {n1, n2}  # both words rank first
    assert hits[0][1] > hits[1][1]
    assert m.match(["nowhere"], 10) == []
    assert [i for i, _ in m.phrase("login nodes")] == [n2] and m.phrase("nodes login") == []
    assert m.term_docs(["cmake", "gcc", "absent"]) == {"cmake": 2, "gcc": 1}
    carol = Viewer(None, "carol", "carol", None)
    bot = Viewer("physics", "alice", "bot", "s")
    assert m.readable([n1, n2, n3], carol, 10.0) == {n2} and m.readable([n1, n2, n3], bot, 10.0) == {n1, n2}
    assert m.readable([n1, n2, n3], None, 10.0) == {n1, n2, n3} and m.readable([], None, 1.0) == set()
    assert m.promote(n1) and not m.promote(999) and m.readable([n1], carol, 10.0) == {n1}
    m.set_flags(n2, '{"stale": "yes"}')
    assert m.note(n2)[8] == '{"stale": "yes"}'  # type: ignore[index]
    assert [r[0] for r in m.session_notes("bot", "s")] == [n1] and m.session_notes("alice", None)[0][0] == n2
    assert m.facts() is None
    m.add_facts(1, "h1", "{}", "[]", 5.0)
    m.add_facts(2, "h2", '{"a": 1}', "[]", 6.0)
    assert m.facts() == (2, "h2", '{"a": 1}', "[]", 6.0)
    v = np.ones(4, np.float16).tobytes()
    m.put_vectors([(n1, "m1", v), (n2, "m1", v)])
    m.put_vectors([(n1, "m2", v)])  # a note's vector replaced
    assert m.last_embedded() == n2 and m.vectors_after(0, 10) == [(n1, v), (n2, v)]
    assert m.notes_after(n2, 10) == [(n3, "secret plan")] and m.count_notes_after(n1) == 2
    assert m.forget_vectors("m2") == 1 and m.last_embedded() == n1


def test_storage_images_workspaces_and_counts(db: Database) -> None:
    s = db.storage
    job = db.insert_job("bot", "s", "batch", JobSpec(command="x", workdir="/tmp", env={"WS": "1"}))
    s.request_building("d1", job.id, "py", "bot")
    s.request_building("d1", job.id, "py", "bot")  # built again: one request
    assert s.request("d1")["state"] == "building" and s.building_of("py") == "d1"  # type: ignore[index]
    assert s.building() == [("d1", job.id, "py", "bot", "PENDING", None)]
    assert s.job_lane(job.id) == ("batch", None) and s.job_spec(job.id)["command"] == "x"  # type: ignore[index]
    s.image_built("d1", "abcdef0123", {"created": 1.0, "size": 2048}, "bot")
    s.name_image("abcdef0123", "py")
    s.image_built("d2", "abcdef9999", {"created": 2.0, "size": 1024}, "bot")
    s.name_image("abcdef9999", "py")  # a name names one image
    assert s.image_named("py") == "abcdef9999" and s.image("abcdef0123")[1] is None  # type: ignore[index]
    assert s.image_keys() == ["abcdef9999", "abcdef0123"]
    assert sorted(s.images_prefixed("abcdef")) == ["abcdef0123", "abcdef9999"] and s.images_prefixed("abcdef99") == [
        "abcdef9999"]
    assert s.name_owner("py") == "bot" and s.images_summary()[:2] == (2, 3072)
    s.image_used("abcdef9999")
    assert s.images_unused_since(time.time() - 60) == ["abcdef0123"]
    s.image_collected("abcdef0123")
    assert s.image("abcdef0123") is None and s.request("d1")["state"] == "collected"  # type: ignore[index]
    s.request_failed("d2", "no room")
    s.add_workspace("ws-0123456789ab", "bot", "/base", None, "/scratch/w1", "overlay", 1.0, 2.0)
    assert s.workspace("ws-0123456789ab")["state"] == "active" and s.active_workspaces() == [("ws-0123456789ab", "bot")]  # type: ignore[index]
    assert s.expired_workspaces(3.0) == [("ws-0123456789ab", "/scratch/w1")] and s.count_workspaces(["alice"]) == 0
    s.set_workspace_state("ws-0123456789ab", "discarded")
    assert s.count_workspaces(None) == 0
    ws_job = db.insert_job("bot", "s", "batch", JobSpec(command="x", workspace="ws-0123456789ab"))
    assert s.jobs_in_workspace("ws-0123456789ab") == [ws_job.id]
    s.add_ops([(job.id, "bot", "s", 10, 4, {"stat": 10})])
    s.add_ops([(job.id, "bot", "s", 99, 99, {})])  # counted once
    assert s.counted([job.id, ws_job.id]) == {job.id} and s.session_ops("bot", "s") == 4
    assert s.job_ops(job.id) == (10, 4, {"stat": 10}) and s.sessions_ops(None) == [("bot", "s", 1, 4, 10)]


def test_the_read_model(db: Database) -> None:
    r = db.read
    now = time.time()
    a = db.insert_job("bot", "s1", "batch", JobSpec(command="x", cpus=3))
    b = db.insert_job("alice", None, "fast", JobSpec(command="y"))
    db.update_job(b.id, JobState.COMPLETED, exit_code=0, start_time=now - 5, end_time=now)
    assert sorted(r.submitted_since(0)) == [("alice", "fast", 1, b.id), ("bot", "batch", 1, a.id)]
    assert r.submitted_since(b.id) == []
    sessions = r.sessions(now - 60, None, "pilot")
    assert {(x["principal"], x["session"], x["kind"], x["sponsor"], x["active"], x["jobs"]) for x in sessions} == {
        ("bot", "s1", "agent", "alice", 1, 1), ("alice", "-", "human", None, 0, 1)}
    assert [x["principal"] for x in r.sessions(now - 60, ["bot"], "pilot")] == ["bot"]
    assert r.states(now - 60, None, "pilot") == [{"state": "COMPLETED", "lane": "fast", "count": 1},
                                                 {"state": "PENDING", "lane": "batch", "count": 1}]
    assert r.submissions_by_kind(now - 60, None, "pilot") == {"agent": 1, "human": 1}
    spans = r.spans(now - 60, frozenset({"bot"}))
    assert [(s[0], s[1], s[2], s[3], s[7]) for s in spans] == [("bot", "agent", "batch", "PENDING", 3)]
    assert r.live("pilot") == [("PENDING", "batch", 1)] and r.live("bot") == []
    assert r.live_sessions_by_kind("pilot") == [("agent", 1)]
    assert r.kinds() == {"alice": "human", "bot": "agent"} and r.sponsors() == {"alice": None, "bot": "alice"}
    db.add_token("t1", "bot", "h", None, "n")
    assert r.live_tokens(["bot"]) == [("t1", "bot", "alice", "n")] and r.live_tokens(["alice"]) == []
    db.safety.taint("k", "bot", "why")
    assert [t["key"] for t in r.tainted(None)] == ["k"] and r.tainted(["alice"]) == [] and r.taint_count() == 1


def test_a_full_postgresql_disk_is_a_507_naming_the_server() -> None:
    import psycopg.errors

    from corral.core.errors import storage_full

    full = storage_full(psycopg.errors.DiskFull("could not extend file"), "/home")
    assert full is not None and full.status == 507 and "PostgreSQL" in str(full)


def test_a_postgresql_store_connects_again_after_the_server_dropped_it() -> None:
    """Outside a transaction a dropped connection is made again (a server restart);
    inside one the transaction fails whole; an unreachable server is named, password hidden."""
    import psycopg

    from corral.core.store.conn import Conn

    with fresh_database() as url:
        db = open_store(url)
        db.add_principal(Principal("alice", Kind.HUMAN))

        def drop() -> None:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()")

        drop()
        assert db.get_principal("alice") is not None  # connected again, asked again
        with pytest.raises(psycopg.OperationalError):
            with db.transaction():
                db.add_principal(Principal("bob", Kind.HUMAN))
                drop()
                db.add_principal(Principal("carol", Kind.HUMAN))
        assert [p.name for p in db.list_principals()] == ["alice"]  # nothing of it kept
        db.close()
    with pytest.raises(RuntimeError, match=r"cannot reach the PostgreSQL store postgresql://u:\*\*\*@127.0.0.1:1/x"):
        Conn("postgresql://u:secret@127.0.0.1:1/x")
