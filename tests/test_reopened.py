"""A requeue Slurm decides after corral recorded a job's end from the job's own marker
reopens corral's record (issue 50 item 3), without Slurm here: the lane's answer from a
job table (Polling.reopened), and the store's one way back from a terminal state. The
whole, on the private cluster with a node's slurmd killed: tests/test_superseded_run.py."""

from __future__ import annotations

from pathlib import Path

from corral.core.jobs import JobSpec, JobState
from corral.lanes.slurm.backend import SlurmBackend
from corral.lanes.slurm.vocab import slurm_epoch


class Table:
    """squeue's job table as the lane asks for it, one answer at a time."""

    def __init__(self) -> None:
        self.rows = ""
        self.asked = 0

    def __call__(self, *argv: str) -> str:
        assert argv[0] == "squeue", argv
        self.asked += 1
        return self.rows


def lane(tmp_path: Path, table: Table, now: list[float]) -> SlurmBackend:
    return SlurmBackend(tmp_path / "jobs", None, poll_s=10.0, clock=lambda: now[0], run=table)


def test_an_end_slurm_has_not_confirmed_is_watched_and_reopened_when_slurm_runs_the_job_again(tmp_path: Path) -> None:
    table, now = Table(), [1000.0]
    b = lane(tmp_path, table, now)
    assert b.reopened() == [] and table.asked == 0  # nothing unconfirmed: Slurm is not asked
    began = slurm_epoch("2026-12-07T10:00:00")  # each run's start by its own marker: Slurm's start
    b._unconfirmed = {"41": (0, now[0], began), "42": (0, now[0], began), "43": (0, now[0], began)}
    # 41: still running in Slurm's eyes (its node not yet noticed lost); 42: ended, as the
    # marker said; 43: Slurm has not heard of it any more
    table.rows = "41|RUNNING|None|2026-12-07T10:00:00|0|c2\n42|COMPLETED|None|2026-12-07T10:00:00|0|c3\n"
    assert b.reopened() == [] and table.asked == 1
    assert set(b._unconfirmed) == {"41"}
    now[0] += 1
    assert b.reopened() == [] and table.asked == 1  # once a poll
    now[0] += 10
    table.rows = "41|PENDING|BeginTime|N/A|1|\n"  # NODE_FAIL, requeued: Slurm will run it again
    (st,) = b.reopened()
    assert (st.backend_id, st.state, st.requeues) == ("41", JobState.PENDING, 1), st
    assert st.reason, st  # Slurm's requeue, in corral's words (Requeues.why)
    assert b._unconfirmed == {}


def test_a_running_again_job_is_reopened_running(tmp_path: Path) -> None:
    table, now = Table(), [1000.0]
    b = lane(tmp_path, table, now)
    b._unconfirmed = {"7": (0, now[0], None)}
    table.rows = "7|RUNNING|None|2026-12-07T10:00:00|2|c4\n"
    (st,) = b.reopened()
    assert (st.state, st.requeues, st.node) == (JobState.RUNNING, 2, "c4") and st.start_time


def test_a_job_a_backup_controller_runs_again_uncounted_is_reopened_and_its_stale_end_dropped(tmp_path: Path) -> None:
    """The primary controller died before it saved the job's start: the backup recovers
    the job as pending and runs it again, its restart count still 0 (seen on the private
    cluster: tests/test_superseded_run.py). corral had the end of the first run from its
    marker; Slurm's truth is a job pending, then running, again: the record reopens, and
    the first run's marker no longer ends it. A run Slurm started at or before the
    marker's own start is the one that wrote it: its end stands."""
    import os

    table, now = Table(), [1000.0]
    b = lane(tmp_path, table, now)
    began = slurm_epoch("2026-12-07T10:00:00")
    assert began is not None
    markers = {}
    for jid in ("8", "9", "10", "11"):
        out = tmp_path / "jobs" / jid / "out"
        out.mkdir(parents=True)
        (out / "ended").write_text("0 0\n")
        os.utime(out / "ended", (began + 5, began + 5))  # the first run's end, 5 s after it began
        b._dirs[jid] = out.parent
        markers[jid] = out / "ended"
    os.utime(markers["11"], (began + 100, began + 100))  # 11's new run already wrote its own end
    b._unconfirmed = {j: (0, now[0], began) for j in markers}
    table.rows = ("8|PENDING|None|N/A|0|\n9|RUNNING|None|2026-12-07T10:01:00|0|c3\n"
                  "10|COMPLETING|None|2026-12-07T10:00:00|0|c2\n11|COMPLETED|None|2026-12-07T10:01:00|0|c3\n")
    got = {st.backend_id: st for st in b.reopened()}
    assert set(got) == {"8", "9", "11"}, got  # 10: the run that wrote its marker, ending as Slurm says
    assert (got["8"].state, got["8"].requeues) == (JobState.PENDING, 0) and got["8"].reason
    assert (got["9"].state, got["9"].node, got["9"].start_time) == (JobState.RUNNING, "c3", began + 60)
    assert got["11"].state is JobState.RUNNING  # its own end, next, from its own marker
    assert not markers["8"].exists() and not markers["9"].exists()  # the superseded run's
    assert markers["10"].exists() and markers["11"].exists()
    assert set(b._unconfirmed) == {"10"}
    st = b.status(["11"])["11"]
    assert st.state is JobState.COMPLETED and st.end_time == began + 100, st


def test_a_job_table_from_before_an_end_was_taken_is_not_read_as_slurm_running_it_again(tmp_path: Path) -> None:
    """The status poll's table is reused within a poll, but never one taken before the
    end it would confirm: that one may show the job still pending from before its run
    (seen on the private cluster: a job reopened 0.2 s after its marker ended it)."""
    table, now = Table(), [1000.0]
    b = lane(tmp_path, table, now)
    b._table = (now[0], "5|PENDING|None|N/A|0|\n")  # polled as the job waited to start
    now[0] += 3  # it ran, and its marker ended it
    b._unconfirmed = {"5": (0, now[0], slurm_epoch("2026-12-07T10:00:00"))}
    table.rows = "5|COMPLETING|None|2026-12-07T10:00:00|0|c1\n"
    assert b.reopened() == [] and table.asked == 1  # Slurm asked now, not the old table


def test_the_store_reopens_only_a_terminal_record(tmp_path: Path) -> None:
    from corral.core.db import Database
    from corral.core.principals import Kind, Principal

    db = Database(tmp_path / "corral.db")
    db.add_principal(Principal("bot", Kind.AGENT))
    jid = db.insert_job("bot", None, "slurm", JobSpec(command="true")).id
    assert not db.reopen_job(jid, JobState.PENDING, 1, "requeued")  # live: untouched
    db.update_job(jid, JobState.COMPLETED, exit_code=0, end_time=5.0)
    assert db.reopen_job(jid, JobState.PENDING, 1, "requeued by Slurm")
    j = db.get_job(jid)
    assert j is not None and (j.state, j.requeues, j.exit_code, j.end_time, j.reason) == (
        JobState.PENDING, 1, None, None, "requeued by Slurm")
    db.update_job(jid, JobState.COMPLETED, exit_code=0, end_time=9.0, requeues=1)
    assert db.get_job(jid).end_time == 9.0  # type: ignore[union-attr]
