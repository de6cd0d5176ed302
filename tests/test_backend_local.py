"""The backend contract on the local backend, plus what only the local backend does."""

from __future__ import annotations

import json
import time

import pytest

from corral.lanes.local import LocalBackend
from corral.core.jobs import JobSpec, JobState

from .backend_contract import *  # noqa: F401,F403
from .backend_contract import check_free_counts_what_runs, ctx, wait_all


@pytest.fixture
def backend(tmp_path):
    return LocalBackend(tmp_path / "local", cpus=4, memory_mb=2048, max_walltime_s=3600)


def test_queue_survives_a_new_backend_instance(tmp_path) -> None:
    root = tmp_path / "local"
    first = LocalBackend(root, cpus=1, memory_mb=2048)
    a = first.submit(ctx(), JobSpec(command="sleep 1", workdir=str(tmp_path)))
    b = first.submit(ctx(), JobSpec(command="echo b", workdir=str(tmp_path)))
    assert first.status([b])[b].state is JobState.PENDING
    # A gateway restart: a new instance over the same directory, jobs still there.
    second = LocalBackend(root, cpus=1, memory_mb=2048)
    st = wait_all(second, [a, b], 30)
    assert st[a].state is JobState.COMPLETED and st[b].state is JobState.COMPLETED
    assert second.output_paths(b).stdout.read_text() == "b\n"


def test_vanished_supervisor_is_reported_with_a_reason(tmp_path) -> None:
    import os
    import signal

    from .backend_contract import wait_state

    b = LocalBackend(tmp_path / "local", cpus=1, memory_mb=2048)
    bid = b.submit(ctx(), JobSpec(command="sleep 30", workdir=str(tmp_path)))
    wait_state(b, bid, JobState.RUNNING)
    running = json.loads((tmp_path / "local" / "jobs" / bid / "running.json").read_text())
    os.kill(running["pid"], signal.SIGKILL)
    os.killpg(running["child"], signal.SIGKILL)
    st = wait_all(b, [bid], 30)[bid]
    assert st.state is JobState.FAILED
    assert "vanished" in (st.reason or "")


def test_job_environment_hides_gateway_secrets(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORRAL_TOKEN", "crl_secret_value")
    b = LocalBackend(tmp_path / "local", cpus=1, memory_mb=2048)
    bid = b.submit(ctx(), JobSpec(command="env", workdir=str(tmp_path)))
    wait_all(b, [bid])
    env = b.output_paths(bid).stdout.read_text()
    assert "crl_secret_value" not in env
    assert f"CORRAL_JOB_ID={bid}" in env
    launch = json.loads((tmp_path / "local" / "jobs" / bid / "launch.json").read_text())
    assert launch["session"] == "sess-1"


def test_relative_state_directory_works(tmp_path, monkeypatch) -> None:
    """The default CORRAL_HOME is the relative '.corral'; supervisors run elsewhere."""
    monkeypatch.chdir(tmp_path)
    b = LocalBackend(tmp_path.relative_to(tmp_path) / ".corral" / "local", cpus=1, memory_mb=2048)
    bid = b.submit(ctx(), JobSpec(command="echo relative"))
    assert wait_all(b, [bid])[bid].state is JobState.COMPLETED
    assert b.output_paths(bid).stdout.read_text() == "relative\n"


def test_free_counts_what_runs_now(backend, tmp_path) -> None:
    check_free_counts_what_runs(backend, tmp_path)


def test_a_start_estimate_follows_the_queue(backend, tmp_path) -> None:
    """The four slots held by 10-minute jobs, a fifth queued for 5: a new one-slot job
    would start when they end (at their walltimes), the queued one first; a four-slot
    job only once the queued one has ended too."""
    for _ in range(4):
        backend.submit(ctx(), JobSpec(command="sleep 60", workdir=str(tmp_path), walltime="10m"))
    backend.submit(ctx(), JobSpec(command="sleep 60", workdir=str(tmp_path), walltime="5m"))
    now = time.time()
    start = backend.estimate_start(JobSpec(command="true", workdir=str(tmp_path), walltime="1m"))
    assert start is not None and now + 590 < start < now + 620, start - now
    assert backend.estimate_start(JobSpec(command="true", cpus=4, workdir=str(tmp_path))) > start + 290


def test_ended_jobs_directories_are_collected_after_their_retention(tmp_path) -> None:
    """Retention (issue 39): the directories of jobs that ended before the cutoff go; a
    running job's and a recent one's stay, and recovery then reads only what is left."""
    root = tmp_path / "local"
    be = LocalBackend(root, cpus=2, memory_mb=2048)
    old = be.submit(ctx(1), JobSpec(command="echo old", workdir=str(tmp_path)))
    wait_all(be, [old], 30)
    cutoff = json.loads((root / "jobs" / old / "result.json").read_text())["end_time"] + 1e-3
    recent = be.submit(ctx(2), JobSpec(command="echo recent", workdir=str(tmp_path)))
    running = be.submit(ctx(3), JobSpec(command="sleep 30", workdir=str(tmp_path)))
    wait_all(be, [recent], 30)
    assert be.collect(cutoff) == 1
    assert not (root / "jobs" / old).exists()
    assert (root / "jobs" / recent / "stdout").read_text() == "recent\n"
    assert be.status([running])[running].state in (JobState.RUNNING, JobState.PENDING)
    be.cancel([running])
    assert LocalBackend(root, cpus=2, memory_mb=2048).status([old]) == {}  # gone for a restart too
