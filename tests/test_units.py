"""Unit tests: parsing, output paging, the database, configuration."""

from __future__ import annotations

import os
import sqlite3

import pytest
from pydantic import ValidationError

from corral.core.config import load_settings
from corral.core.db import MIGRATIONS, Database
from corral.core.errors import InvalidRequest
from corral.core.jobs import Job, JobSpec, JobState, parse_duration_s, parse_memory_mb
from corral.core.output import read_page, read_tail
from corral.core.principals import Kind, Principal


@pytest.mark.parametrize("text, mb", [("512M", 512), ("4G", 4096), ("4GB", 4096), ("1.5g", 1536), (2048, 2048),
                                      ("1T", 1024 * 1024), ("2048K", 2)])
def test_memory_sizes(text, mb) -> None:
    assert parse_memory_mb(text) == mb


@pytest.mark.parametrize("bad", ["lots", "-1G", "0", "4X", True, ""])
def test_memory_rejects(bad) -> None:
    with pytest.raises(ValueError):
        parse_memory_mb(bad)


@pytest.mark.parametrize("text, s", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("01:30:00", 5400),
                                     ("2-00:00:00", 172800), ("10:00", 600), (600, 600)])
def test_durations(text, s) -> None:
    assert parse_duration_s(text) == s


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "x-01:00:00", "0", "-5m"])
def test_duration_rejects(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(bad)


def test_spec_forbids_unknown_fields_and_needs_one_body() -> None:
    with pytest.raises(ValidationError, match="extra"):
        JobSpec(command="true", nodes=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="exactly one"):
        JobSpec(command="a", script="b")
    spec = JobSpec(command="true", memory="2G", walltime="1h")
    assert spec.memory_mb == 2048 and spec.walltime_s == 3600
    assert JobSpec.model_validate(spec.public()) == spec


def test_spec_sizes_parse_once_and_still_refuse_what_they_refused() -> None:
    """The spec's size fields cache parsed text: a cached answer must never hide an error."""
    for _ in range(2):
        assert JobSpec(command="true", memory="100M", walltime="5m").memory_mb == 100
        assert JobSpec(command="true", memory=1, walltime=1).memory_mb == 1
        for bad in ({"memory": True}, {"memory": [1]}, {"memory": "100Q"}, {"walltime": "soon"}, {"walltime": {}}):
            with pytest.raises(ValidationError):
                JobSpec(command="true", **bad)


def test_a_stored_job_is_the_job_pydantic_would_build() -> None:
    fields = dict(id=7, principal="a", session="s", backend="fast", backend_id="fast:x:7", state=JobState.RUNNING,
                  exit_code=None, reason=None, submit_time=1.0, start_time=2.0, end_time=None,
                  spec=JobSpec(command="true"))
    job, ref = Job.stored(**fields), Job.model_construct(**fields)
    assert job == ref and job.model_dump() == ref.model_dump() and job.to_dict() == ref.to_dict()
    assert job.advice == [] and job.with_advice(["x"]).advice == ["x"] and job.advice == []
    assert job.model_copy(update={"state": JobState.COMPLETED}).state is JobState.COMPLETED
    with pytest.raises(ValidationError):
        job.state = JobState.FAILED  # type: ignore[misc]  # still frozen


def test_states_are_closed() -> None:
    assert {s.value for s in JobState} == {"PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                           "OUT_OF_MEMORY", "UNKNOWN"}
    assert not JobState.UNKNOWN.terminal and JobState.OUT_OF_MEMORY.terminal


def test_read_page_and_tail(tmp_path) -> None:
    f = tmp_path / "out"
    f.write_text("".join(f"line {i}\n" for i in range(1000)))
    page = read_page(f, 0, 14)
    assert page["data"] == "line 0\nline 1\n" and page["next_offset"] == 14 and not page["eof"]
    assert read_page(f, page["size"], 10)["eof"]
    assert read_tail(f, 2)["data"] == "line 998\nline 999\n"
    assert read_tail(f, 2, limit=5)["data"] == " 999\n"  # bounded by limit, not by lines
    f.write_text("no newline at end")
    assert read_tail(f, 1)["data"] == "no newline at end"
    empty = tmp_path / "empty"
    empty.touch()
    assert read_tail(empty, 5)["data"] == "" and read_page(tmp_path / "missing")["data"] == ""


def test_tail_reads_only_the_end_of_a_big_file(tmp_path) -> None:
    f = tmp_path / "big"
    with open(f, "wb") as out:
        out.write(b"x" * (50 * 1024 * 1024) + b"\nlast\n")
    tail = read_tail(f, 1)
    assert tail["data"] == "last\n" and tail["truncated"]


def test_db_migrates_idempotency_and_terminal_states(tmp_path) -> None:
    db = Database(tmp_path / "c.db")
    assert db.version == len(MIGRATIONS)
    db.add_principal(Principal("alice", Kind.HUMAN))
    spec = JobSpec(command="true")
    with db.transaction():
        a, a2 = db.insert_jobs("alice", "s", [("local", spec), ("local", spec)], idem_key="k", digest="d1")
    assert db.find_idempotent("alice", "new", 2) is None
    found = db.find_idempotent("alice", "k", 2)
    assert found is not None and [j.id for j in found[0]] == [a.id, a2.id] and found[1] == "d1"
    with pytest.raises(sqlite3.IntegrityError):  # a key names one request of its principal
        db.insert_jobs("alice", "s", [("local", spec)], idem_key="k")
    db.update_job(a.id, JobState.COMPLETED, exit_code=0, end_time=1.0)
    db.update_job(a.id, JobState.RUNNING)  # a late report never resurrects a finished job
    assert db.get_job(a.id).state is JobState.COMPLETED  # type: ignore[union-attr]
    db.close()
    again = Database(tmp_path / "c.db")
    assert again.version == len(MIGRATIONS) and again.get_job(a.id) is not None
    assert again.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_config_file_env_and_unknown_keys(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("CORRAL_PORT", raising=False)
    home = tmp_path / "h"
    home.mkdir()
    (home / "corral.toml").write_text("port = 9000\ntick_s = 2.0\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    s = load_settings()
    assert s.port == 9000 and s.tick_s == 2.0
    monkeypatch.setenv("CORRAL_PORT", "9100")
    assert load_settings().port == 9100
    assert load_settings(port=9200).port == 9200
    (home / "corral.toml").write_text("prot = 1\n")
    with pytest.raises(InvalidRequest, match="unknown key 'prot': did you mean 'port'"):
        load_settings()
    (home / "corral.toml").write_text("tick_s = -1\n")
    with pytest.raises(InvalidRequest, match="tick_s"):
        load_settings()


def test_usage_sums_cpu_and_gpu_hours(tmp_path) -> None:
    db = Database(tmp_path / "u.db")
    db.add_principal(Principal("a", Kind.HUMAN))
    done = db.insert_job("a", None, "local", JobSpec(command="x", cpus=4, gpus=2, lane="batch"))
    db.update_job(done.id, JobState.COMPLETED, start_time=1000.0, end_time=1000.0 + 1800)
    db.insert_job("a", None, "local", JobSpec(command="never started"))
    u = db.usage(["a"])
    assert (u["jobs_by_state"], u["cpu_hours"], u["gpu_hours"]) == ({"COMPLETED": 1, "PENDING": 1}, 2.0, 1.0)
    assert u["by_lane"] == {"batch": {"cpu_hours": 2.0, "gpu_hours": 1.0, "jobs": 1}}
    assert u["by_session"] == {"-": {"cpu_hours": 2.0, "gpu_hours": 1.0, "jobs": 1}}
    assert db.usage(["nobody"]) == {"jobs_by_state": {}, "cpu_hours": 0.0, "gpu_hours": 0.0,
                                    "measured_cpu_hours": 0.0, "by_lane": {}, "by_session": {}}


def test_shutdown_never_waits_for_a_task_that_ignores_cancellation() -> None:
    """A gateway once hung at exit (loop idle, nothing logged): ``wait_for`` waits until a
    timed-out task has really ended, and one that swallows its cancellation never does."""
    import asyncio
    import time

    from corral.gateway.runtime import settle

    released = False

    async def stubborn() -> None:
        while not released:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # e.g. a close that shields its own work

    async def quick() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> tuple[list[str], float]:
        nonlocal released
        tasks = [asyncio.create_task(stubborn(), name="stubborn"), asyncio.create_task(quick(), name="quick")]
        await asyncio.sleep(0)  # both started
        t = time.monotonic()
        left = await settle(tasks, 0.3)
        took = time.monotonic() - t
        released = True  # let asyncio.run's own clean-up end it
        tasks[0].cancel()
        return left, took

    left, took = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert left == ["stubborn"] and took < 2


def test_settings_are_nested_and_the_flat_spelling_still_works(tmp_path, monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("CORRAL_"):
            monkeypatch.delenv(name)
    home = tmp_path / "h"
    home.mkdir()
    monkeypatch.setenv("CORRAL_HOME", str(home))
    (home / "corral.toml").write_text("fastlane_idle_s = 5\n[fastlane]\ncpus = 4\n[safety]\nrate_api_per_s = 9\n")
    monkeypatch.setenv("CORRAL_FASTLANE__MAX_ALLOCATIONS", "3")
    monkeypatch.setenv("CORRAL_MEMORY", "false")
    s = load_settings()
    assert (s.fastlane.cpus, s.fastlane.idle_s, s.fastlane.max_allocations) == (4, 5.0, 3)
    assert s.safety.rate_api_per_s == 9.0 and not s.memory.enabled and s.home == home.resolve()
    monkeypatch.setenv("CORRAL_FASTLANE_CPUS", "6")  # the environment beats the file, flat or nested
    assert load_settings().fastlane.cpus == 6
    (home / "corral.toml").write_text("[fastlane]\ncpu = 4\n")
    with pytest.raises(InvalidRequest, match=r"unknown key 'fastlane.cpu'"):
        load_settings()


def test_sessions_without_end_never_refill_a_spent_bucket() -> None:
    """The rate buckets were cleared, all of them, once 100,000 existed: an agent that
    sent its calls under ever new session ids (one bucket each) had its own spent bucket
    whole again. Only buckets full again are dropped (attack46)."""
    from corral.safety.limits import Buckets

    b = Buckets()
    now = 1000.0
    while b.take("api:bot", 1, 50, 200, now) == 0:  # the agent's burst, spent
        pass
    for i in range(100_002):  # one new session per call, at the agent's rate
        now += 0.02
        b.take(f"api:bot:s{i}", 1, 50, 200, now)
        b.take("api:bot", 1, 50, 200, now)
    assert b.take("api:bot", 5, 50, 200, now) > 0  # still spent: no burst again
