"""The backend contract: every Backend must pass these unchanged.

A test module for a backend imports ``*`` from here and provides a ``backend``
fixture (and may override ``job_ids`` to keep ids unique across runs)."""

from __future__ import annotations

import itertools
import time
from typing import Sequence

import pytest

from corral.lanes.backend import Backend, BackendStatus, SubmitContext
from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec, JobState

_ids = itertools.count(int(time.time() * 1000) % 10_000_000)


def ctx(job_id: int | None = None) -> SubmitContext:
    return SubmitContext(job_id if job_id is not None else next(_ids), "alice", "agent", "bob", "sess-1")


def wait_all(backend: Backend, ids: Sequence[str], timeout: float = 60.0) -> dict[str, BackendStatus]:
    deadline = time.monotonic() + timeout
    while True:
        st = backend.status(ids)
        if len(st) == len(ids) and all(s.state.terminal for s in st.values()):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs did not finish in {timeout}s: {st}")
        time.sleep(0.2)


def wait_state(backend: Backend, bid: str, state: JobState, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while backend.status([bid]).get(bid, None) is None or backend.status([bid])[bid].state is not state:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {bid} never reached {state}: {backend.status([bid])}")
        time.sleep(0.1)


def test_completed_job_and_its_output(backend: Backend, tmp_path) -> None:
    bid = backend.submit(ctx(), JobSpec(command="echo out; echo err >&2", workdir=str(tmp_path)))
    st = wait_all(backend, [bid])[bid]
    assert st.state is JobState.COMPLETED
    assert st.exit_code == 0
    paths = backend.output_paths(bid)
    assert paths.stdout.read_text() == "out\n"
    assert paths.stderr.read_text() == "err\n"


def test_failed_job_keeps_exit_code(backend: Backend, tmp_path) -> None:
    bid = backend.submit(ctx(), JobSpec(command="exit 7", workdir=str(tmp_path)))
    st = wait_all(backend, [bid])[bid]
    assert st.state is JobState.FAILED
    assert st.exit_code == 7


def test_script_workdir_and_env(backend: Backend, tmp_path) -> None:
    script = "#!/bin/bash\npwd\necho \"$GREETING\"\n"
    bid = backend.submit(ctx(), JobSpec(script=script, workdir=str(tmp_path), env={"GREETING": "hi there"}))
    assert wait_all(backend, [bid])[bid].state is JobState.COMPLETED
    assert backend.output_paths(bid).stdout.read_text() == f"{tmp_path}\nhi there\n"


def test_status_of_many_in_one_call_omits_unknown(backend: Backend, tmp_path) -> None:
    ids = [backend.submit(ctx(), JobSpec(command=f"echo {i}", workdir=str(tmp_path))) for i in range(4)]
    st = wait_all(backend, ids)
    assert set(st) == set(ids)
    assert set(backend.status([*ids, "999999999"])) == set(ids)


def test_submit_is_idempotent_per_job_id(backend: Backend, tmp_path) -> None:
    c = ctx()
    marker = tmp_path / "runs"
    spec = JobSpec(command=f"echo x >> {marker}", workdir=str(tmp_path))
    first = backend.submit(c, spec)
    second = backend.submit(c, spec)
    assert first == second
    wait_all(backend, [first])
    assert marker.read_text() == "x\n"


def test_cancel_running_and_finished(backend: Backend, tmp_path) -> None:
    bid = backend.submit(ctx(), JobSpec(command="sleep 60", workdir=str(tmp_path)))
    wait_state(backend, bid, JobState.RUNNING)
    backend.cancel([bid])
    ended = wait_all(backend, [bid], 30)[bid]
    # One rule on every backend: a cancelled job has no exit code (local said 143, Slurm 0).
    assert ended.state is JobState.CANCELLED and ended.exit_code is None
    backend.cancel([bid])  # cancelling a finished job is not an error
    assert backend.status([bid])[bid].state is JobState.CANCELLED


def test_walltime_is_enforced(backend: Backend, tmp_path) -> None:
    bid = backend.submit(ctx(), JobSpec(command="sleep 300", walltime=2, workdir=str(tmp_path)))
    # A bound, not a timing claim: Slurm rounds the limit up to a minute and checks
    # limits every ~30 s, then waits KillWait before the kill.
    assert wait_all(backend, [bid], 180)[bid].state is JobState.TIMEOUT


def test_memory_is_enforced(backend: Backend, tmp_path) -> None:
    hog = "python3 -c 'import time; x = bytearray(400 * 1024 * 1024); time.sleep(30)'"
    bid = backend.submit(ctx(), JobSpec(command=hog, memory="100M", workdir=str(tmp_path)))
    assert wait_all(backend, [bid], 60)[bid].state is JobState.OUT_OF_MEMORY


@pytest.mark.slurm_turn("alone")  # fills the node: on Slurm, no other test's jobs beside it
def test_jobs_beyond_capacity_queue_then_run(backend: Backend, tmp_path) -> None:
    slots = max(p.max_cpus for p in backend.partitions())
    n = min(slots + 2, 40)
    ids = [backend.submit(ctx(), JobSpec(command="sleep 1", workdir=str(tmp_path))) for _ in range(n)]
    st = wait_all(backend, ids, 120)
    assert all(s.state is JobState.COMPLETED for s in st.values())


def test_impossible_request_is_refused_naming_the_limit(backend: Backend, tmp_path) -> None:
    biggest = max(p.max_cpus for p in backend.partitions())
    with pytest.raises(InvalidRequest, match=str(biggest)):
        backend.submit(ctx(), JobSpec(command="true", cpus=biggest + 1, workdir=str(tmp_path)))
    with pytest.raises(InvalidRequest, match="partition"):
        backend.submit(ctx(), JobSpec(command="true", partition="nosuchpartition", workdir=str(tmp_path)))


def test_a_start_estimate_is_the_schedulers_own(backend: Backend, tmp_path) -> None:
    """sbatch --test-only on Slurm (other tests' jobs may hold its nodes: some time from
    now), the queue here (idle: now)."""
    start = backend.estimate_start(JobSpec(command="true", workdir=str(tmp_path), walltime="2m"))
    assert start is not None and start > time.time() - 120, start
    if backend.name == "local":
        assert start < time.time() + 5


def test_partitions_describe_the_facility(backend: Backend) -> None:
    parts = backend.partitions()
    assert parts and sum(p.default for p in parts) == 1
    assert all(p.max_cpus >= 1 and p.max_walltime_s > 0 for p in parts)


__all__ = [n for n in dir() if n.startswith("test_")] + ["ctx", "wait_all", "wait_state"]


def check_free_counts_what_runs(backend: Backend, tmp_path, partition: str | None = None) -> None:
    """Not a contract test (the fake Slurm keeps no node allocations): the backends that
    know their nodes' allocations call it. The fast lane sizes allocations to it. free()
    is the roomiest node's room: on a cluster, ``partition`` is one of one node."""
    before = backend.free(partition)
    assert before is not None and before[0] >= 3
    bid = backend.submit(ctx(), JobSpec(command="sleep 60", cpus=2, memory="256M", workdir=str(tmp_path),
                                        partition=partition))
    try:
        wait_state(backend, bid, JobState.RUNNING)
        assert backend.free(partition) == (before[0] - 2, before[1] - 256)
    finally:
        backend.cancel([bid])
    assert wait_all(backend, [bid], 60)[bid].state is JobState.CANCELLED
