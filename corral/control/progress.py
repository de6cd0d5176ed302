"""Where news of jobs lands, whoever brings it (the reconciler's poll of a batch lane,
a lane that reports itself, the sender, a cancel): the jobs table, in one transaction
per report; the long-polls of those jobs; and memory's episodes of the ones that ended.

The one writer of a job's state: nothing else in corral updates it (a test holds the
code to that), so every change is seen by the event stream's triggers, the long-polls
and memory alike."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from corral.core.db import Database
from corral.core.jobs import JobState
from corral.control.watchers import Watchers

log = logging.getLogger(__name__)


class Episodes(Protocol):
    def remember_outcomes(self, job_ids: list[int]) -> None: ...


class Ends(Protocol):
    def ended(self, job_ids: list[int]) -> None: ...


class Progress:
    def __init__(self, db: Database, watchers: Watchers, episodes: Episodes | None = None) -> None:
        self.db, self.watchers, self.episodes = db, watchers, episodes
        self.ends: list[Ends] = []
        """Who else hears of jobs that ended (the storage's metadata accounting)."""

    def write(self, job_id: int, state: JobState, *, exit_code: int | None = None, reason: str | None = None,
              start_time: float | None = None, end_time: float | None = None, requeues: int = 0,
              lost_s: float | None = None, node: str | None = None) -> None:
        """One job's new state, in the caller's transaction; the caller then hands the
        ids it wrote to ``changed`` (a terminal state is never overwritten: db.update_job;
        a job its scheduler requeued stays one job, with its count and the work lost)."""
        self.db.update_job(job_id, state, exit_code=exit_code, reason=reason, start_time=start_time,
                           end_time=end_time, requeues=requeues, lost_s=lost_s, node=node)

    def reopen(self, job_id: int, state: JobState, requeues: int, reason: str | None) -> bool:
        """A job recorded as ended that its scheduler runs again (db.reopen_job); its
        waiters woken (it has not ended: nothing is remembered of it). -> whether it moved."""
        with self.db.transaction():
            moved = self.db.reopen_job(job_id, state, requeues, reason)
        if moved:
            self.watchers.notify([job_id])
        return moved

    def started(self, started: dict[int, float]) -> None:
        """Jobs a lane reports started: RUNNING (only if still PENDING); wake their waiters."""
        with self.db.transaction():
            self.db.mark_running(started)
        self.watchers.notify(list(started))

    def ended(self, results: list[dict[str, Any]]) -> None:
        """Outcomes (job_id, state, exit_code, reason, start, end, cpu_s, max_rss_mb) in one transaction."""
        if not results:
            return
        ids = [int(r["job_id"]) for r in results]
        with self.db.transaction():  # one commit for the outcomes and their episodes
            self.db.update_jobs([(jid, JobState(r["state"]), r.get("exit_code"), r.get("reason"),
                                  r.get("start"), r.get("end"), r.get("cpu_s"), r.get("max_rss_mb"), r.get("node"))
                                 for jid, r in zip(ids, results)])
            self._remember(ids)
        self.watchers.notify(ids)

    def changed(self, job_ids: list[int]) -> None:
        """Jobs whose rows the reconciler already wrote: remember them, then wake their
        waiters (so a wait that returns means memory already knows how the job ended)."""
        self._remember(job_ids)
        self.watchers.notify(job_ids)

    def _remember(self, job_ids: list[int]) -> None:
        for hear in self.ends:
            try:
                hear.ended(job_ids)
            except Exception:
                log.exception("jobs %s ended without their metadata accounting", job_ids[:10])
        if self.episodes is None:
            return
        try:
            self.episodes.remember_outcomes(job_ids)
        except Exception:  # memory only advises: its trouble must not undo an outcome
            log.exception("outcomes of jobs %s recorded without their memory episodes", job_ids[:10])
