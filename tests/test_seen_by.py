"""A job asking about itself with its own credential (its Slurm commands inside, decision
0057) sees itself RUNNING though corral's record, a poll behind, still says PENDING; no
other caller does (the compat corpus's i50_inside_squeue_j failed under load at 22:51)."""

from __future__ import annotations

from corral.core.jobs import Job, JobSpec, JobState
from corral.core.principals import Caller, Kind, Principal
from corral.gateway.service import seen_by


def _job(state: JobState) -> Job:
    return Job(id=41, principal="a1", backend="slurm", state=state, submit_time=0.0, spec=JobSpec(command="true"))


def test_a_job_asking_with_its_own_credential_sees_itself_running() -> None:
    agent = Principal("a1", Kind.AGENT, sponsor="s")
    inside = Caller(agent, None, "job-41", frozenset({"a1"}))
    assert seen_by(inside, _job(JobState.PENDING)).state is JobState.RUNNING
    assert seen_by(inside, _job(JobState.COMPLETED)).state is JobState.COMPLETED  # an end is the record's
    for other in (Caller(agent, None, "t1", frozenset({"a1"})), Caller(agent, None, "job-42", frozenset({"a1"}))):
        assert seen_by(other, _job(JobState.PENDING)).state is JobState.PENDING
