"""The jobs concern of the store: a job's record from submission to its end, the
idempotency keys that make a retried submission one job, and the sums usage is read from.

A terminal state is never overwritten: a late report cannot undo an end.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, NamedTuple

from corral.core.jobs import Parent
from corral.core.jobs import Job, JobSpec, JobState, TERMINAL_STATES
from corral.core.lru import LRU
from corral.core.store.conn import Conn

_JOB_COLS = (
    "id, principal, session, backend, backend_id, state, exit_code, reason, "
    "submit_time, start_time, end_time, spec, requeues, lost_s, node"
)
_TERMINAL = tuple(s.value for s in TERMINAL_STATES)
ACTIVE = "state IN ('PENDING', 'RUNNING', 'UNKNOWN')"
"""Written as the partial index jobs_active is, so the server can use it."""
assert {"PENDING", "RUNNING", "UNKNOWN"} == {s.value for s in JobState} - set(_TERMINAL)
HELD_REASON = "held by request; release it to let it run"
"""A job held before it was sent (job_control's hold, a held submission)."""

SPECS_KEPT = 4096
SPECS_TEXT_KEPT = 8 * 2**20
_SPECS: LRU[str, JobSpec] = LRU(SPECS_KEPT, SPECS_TEXT_KEPT, lambda text, _: len(text))
"""Parsed specs by their stored text: the last 4,096 read, and at most 8 MiB of their text
(a spec may be 256 KiB). Before issue 46 it held up to 50,000, ~1.7 KB each for a short
command: it grew with every distinct job read, to ~80 MB before it was cleared."""


class Run(NamedTuple):
    """A job as the reconciler compares it with its lane's answer: no spec (a spec may
    be 256 KiB, and every active job is read every tick)."""

    id: int
    backend: str
    backend_id: str
    state: JobState
    exit_code: int | None
    reason: str | None
    start_time: float | None
    requeues: int = 0
    lost_s: float | None = None
    node: str | None = None


def _parse_spec(text: str) -> JobSpec:
    """Specs never change once stored: parse each distinct one once (a status read is hot)."""
    spec = _SPECS.get(text)
    if spec is None:
        spec = JobSpec.model_validate(json.loads(text))
        _SPECS.put(text, spec)
    return spec


def _row_to_job(row: tuple[Any, ...]) -> Job:
    (id_, principal, session, backend, backend_id, state, exit_code, reason, st, bt, et, spec, requeues, lost_s,
     node) = row
    return Job.stored(
        id=id_,
        principal=principal,
        session=session,
        backend=backend,
        backend_id=backend_id,
        state=JobState(state),
        exit_code=exit_code,
        reason=reason,
        submit_time=st,
        start_time=bt,
        end_time=et,
        spec=_parse_spec(spec),
        requeues=requeues,
        lost_s=lost_s,
        node=node,
    )


def _idem_keys(key: str | None, n: int) -> list[str | None]:
    if key is None:
        return [None] * n
    return [key if i == 0 else f"{key}/{i}" for i in range(n)]


def _update_sql(conn: Conn) -> str:
    """One job's new facts; a terminal state is never overwritten. A requeued job keeps
    its first start; its requeue count only grows."""
    return f"""UPDATE jobs SET state=?, exit_code=?, reason=?,
    start_time=COALESCE(start_time, ?), end_time=COALESCE(end_time, ?),
    cpu_s=COALESCE(?, cpu_s), max_rss_mb=COALESCE(?, max_rss_mb), requeues={conn.greatest('requeues', '?')},
    lost_s=COALESCE(?, lost_s), node=COALESCE(?, node) WHERE id=? AND state NOT IN ({conn.marks(len(_TERMINAL))})"""


class Jobs:
    """Jobs' records. Mixed into ``Database`` (``db.get_job``...): the service core's
    interface to them, over ``self.conn``."""

    conn: Conn

    def transaction(self) -> Any:
        """Many writes, one commit: a batch of 100 jobs costs one fsync, not 100."""
        return self.conn.transaction()

    def insert_job(self, principal: str, session: str | None, backend: str, spec: JobSpec) -> Job:
        """One PENDING job (corral's own, such as a fast-lane allocation)."""
        with self.transaction():
            return self.insert_jobs(principal, session, [(backend, spec)])[0]

    def insert_jobs(self, principal: str, session: str | None, items: list[tuple[str, JobSpec]],
                    token_path: str | None = None, idem_key: str | None = None, digest: str | None = None,
                    held: bool = False) -> list[Job]:
        """PENDING jobs, (lane, spec) each, in one statement per 500. With ``idem_key``
        the jobs take the keys ``KEY``, ``KEY/1``, ``KEY/2`` ... and ``digest`` (see
        ``find_idempotent``). ``held``: recorded held (``set_held``), so that no Sender
        sends them before a release (sbatch -H). Call inside ``transaction()``."""
        now = time.time()
        dumped: dict[int, str] = {}  # a batch's jobs often share one spec object: dump it once
        texts = [dumped.get(id(spec)) or dumped.setdefault(id(spec), spec.model_dump_json(by_alias=True, exclude_none=True))
                 for _, spec in items]
        keys = _idem_keys(idem_key, len(items))
        reason = HELD_REASON if held else None
        jobs: list[Job] = []
        for i in range(0, len(items), 500):  # 11 parameters a row, under SQLite's limit
            chunk = items[i: i + 500]
            rows = ",".join("(?,?,?,?,?,?,?,?,?,?,?)" for _ in chunk)
            args: list[Any] = []
            for k, (backend, _) in enumerate(chunk):
                args += [principal, session, keys[i + k], digest if keys[i + k] else None, backend,
                         JobState.PENDING.value, now, texts[i + k], token_path, int(held), reason]
            ids = [r[0] for r in self.conn.execute(
                f"INSERT INTO jobs (principal, session, idem_key, idem_digest, backend, state, submit_time, spec, "
                f"token_path, held, reason) VALUES {rows} RETURNING id", args).fetchall()]
            # Built from what was written: no read back (a batch of 1,000 inserts is hot).
            jobs += [_row_to_job((jid, principal, session, backend, None, JobState.PENDING.value, None, reason, now,
                                  None, None, text, 0, None, None)) for jid, (backend, _), text in zip(ids, chunk, texts[i: i + 500])]
        return jobs

    def update_jobs(self, updates: list[tuple[int, JobState, int | None, str | None, float | None, float | None,
                                               float | None, float | None, str | None]]) -> None:
        """``update_job`` for many: (id, state, exit code, reason, start, end, cpu s, peak MB, node); one statement."""
        self.conn.executemany(_update_sql(self.conn), [(st.value, code, reason, start, end, cpu, rss, 0, None, node, jid,
                                                        *_TERMINAL)
                                                       for jid, st, code, reason, start, end, cpu, rss, node in updates])

    def find_idempotent(self, principal: str, idem_key: str, n: int) -> tuple[list[Job], str | None] | None:
        """The ``n`` jobs a request with this key made, and that request's digest; None if
        the key is new. A request that made a different number of jobs is returned whole
        (its digest then differs from any request of ``n``)."""
        first = self.conn.execute("SELECT id, idem_digest FROM jobs WHERE principal=? AND idem_key=?",
                                  (principal, idem_key)).fetchone()
        if first is None:
            return None
        keys = _idem_keys(idem_key, max(n, 1))
        rows = self.conn.execute(
            f"SELECT {_JOB_COLS} FROM jobs WHERE principal=? AND idem_key IN ({self.conn.marks(len(keys))}) ORDER BY id",
            (principal, *keys)).fetchall()
        return [_row_to_job(r) for r in rows], first[1]

    def set_backend_ids(self, pairs: list[tuple[int, str]]) -> None:
        if pairs:
            self.conn.executemany("UPDATE jobs SET backend_id = ? WHERE id = ?", [(b, j) for j, b in pairs])


    def reopen_job(self, job_id: int, state: JobState, requeues: int, reason: str | None) -> bool:
        """A job corral had recorded as ended that its scheduler runs again (a requeue it
        decided after the job's own end marker: a node lost, a controller's recovery): live
        again with the scheduler's state and count, its end and exit code cleared (the one
        way a terminal record moves; issue 50). -> whether it was terminal."""
        cur = self.conn.execute(
            f"UPDATE jobs SET state=?, requeues={self.conn.greatest('requeues', '?')}, reason=?, exit_code=NULL, "
            f"end_time=NULL WHERE id=? AND state IN ({self.conn.marks(len(_TERMINAL))})",
            (state.value, requeues, reason, job_id, *_TERMINAL))
        return bool(cur.rowcount)

    def job_of_backend(self, backend: str, backend_id: str) -> int | None:
        """corral's job that a lane knows by ``backend_id``."""
        row = self.conn.execute("SELECT id FROM jobs WHERE backend=? AND backend_id=? ORDER BY id DESC LIMIT 1",
                                (backend, backend_id)).fetchone()
        return int(row[0]) if row else None

    def get_job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _row_to_job(row) if row else None

    def get_jobs(self, job_ids: list[int]) -> dict[int, Job]:
        """Many jobs in one query -> id: job (missing ids are absent)."""
        out: dict[int, Job] = {}
        for i in range(0, len(job_ids), 900):  # the bound-parameter limit
            chunk = job_ids[i: i + 900]
            rows = self.conn.execute(
                f"SELECT {_JOB_COLS} FROM jobs WHERE id IN ({self.conn.marks(len(chunk))})", chunk).fetchall()
            out.update((r[0], _row_to_job(r)) for r in rows)
        return out

    def states(self, job_ids: list[int]) -> dict[int, tuple[str, str]]:
        """-> id: (state, principal), without parsing specs: cheap enough to ask often."""
        out: dict[int, tuple[str, str]] = {}
        for i in range(0, len(job_ids), 900):
            chunk = job_ids[i: i + 900]
            out.update((r[0], (r[1], r[2])) for r in self.conn.execute(
                f"SELECT id, state, principal FROM jobs WHERE id IN ({self.conn.marks(len(chunk))})", chunk))
        return out

    def active_jobs(self, *, unsent: bool = False) -> list[Job]:
        """Jobs not yet ended; ``unsent``: only those never handed to a lane."""
        where = ACTIVE + (" AND backend_id IS NULL AND held = 0" if unsent else "")
        rows = self.conn.execute(f"SELECT {_JOB_COLS} FROM jobs WHERE {where} ORDER BY id").fetchall()
        return [_row_to_job(r) for r in rows]

    def parents(self, job_ids: list[int]) -> dict[int, Parent]:
        """-> id: (state, lane, backend id, principal) of the jobs others wait for
        (control/dependencies.py)."""
        out: dict[int, Parent] = {}
        ids = list(dict.fromkeys(job_ids))
        for i in range(0, len(ids), 900):
            chunk = ids[i: i + 900]
            out.update((r[0], Parent(*r[1:])) for r in self.conn.execute(
                f"SELECT id, state, backend, backend_id, principal FROM jobs WHERE id IN ({self.conn.marks(len(chunk))})",
                chunk))
        return out

    def queued_on(self, backend: str, but: str, limit: int = 500) -> list[Job]:
        """Jobs sent to ``backend`` that are still PENDING, but ``but``'s, oldest first
        (the fast lane asks which batch jobs wait for cores, each tick)."""
        rows = self.conn.execute(
            f"SELECT {_JOB_COLS} FROM jobs WHERE state='PENDING' AND backend=? AND backend_id IS NOT NULL "
            "AND principal != ? ORDER BY id LIMIT ?", (backend, but, limit)).fetchall()
        return [_row_to_job(r) for r in rows]

    def set_reasons(self, job_ids: list[int], reason: str) -> None:
        """What these jobs wait for, while they are still PENDING (the fast lane's pools)."""
        for i in range(0, len(job_ids), 900):
            chunk = job_ids[i: i + 900]
            self.conn.execute(f"UPDATE jobs SET reason=? WHERE state='PENDING' AND id IN ({self.conn.marks(len(chunk))})",
                              [reason, *chunk])

    def set_held(self, job_id: int, held: bool, reason: str) -> bool:
        """Hold (or release) a job not yet sent to a lane; -> whether it was such a job."""
        return self.conn.execute(
            f"UPDATE jobs SET held=?, reason=? WHERE id=? AND backend_id IS NULL AND {ACTIVE}",
            (int(held), reason, job_id)).rowcount == 1

    def usage_of(self, job_id: int) -> tuple[float | None, float | None]:
        """-> (CPU seconds, peak memory MB) recorded for a job, each None if not measured."""
        r = self.conn.execute("SELECT cpu_s, max_rss_mb FROM jobs WHERE id=?", (job_id,)).fetchone()
        return (r[0], r[1]) if r else (None, None)

    def set_usage(self, job_id: int, cpu_s: float | None, max_rss_mb: float | None) -> None:
        self.conn.execute("UPDATE jobs SET cpu_s=COALESCE(?, cpu_s), max_rss_mb=COALESCE(?, max_rss_mb) WHERE id=?",
                          (cpu_s, max_rss_mb, job_id))

    def guaranteed_cpus(self, partition: str | None) -> int:
        """CPUs of agents' unfinished jobs placed in the guaranteed tier of a partition
        (None: sent without one, to the default). Only read when a guaranteed share is set."""
        rows = self.conn.execute(
            f"""SELECT {self.conn.json('spec', 'cpus', num=True)} FROM jobs WHERE {ACTIVE}
                AND {self.conn.json('spec', 'labels', 'corral-tier')} = 'guaranteed'
                AND {self.conn.is_(self.conn.json('spec', 'partition'))}""", (partition,)).fetchall()
        return sum(int(r[0] or 1) for r in rows)

    def active_runs(self, lanes: Iterable[str]) -> list[Run]:
        """Jobs not yet ended that were sent to these lanes (the ones the reconciler polls)."""
        names = list(lanes)
        rows = self.conn.execute(
            f"SELECT id, backend, backend_id, state, exit_code, reason, start_time, requeues, lost_s, node FROM jobs "
            f"WHERE {ACTIVE} AND backend_id IS NOT NULL AND backend IN ({self.conn.marks(len(names))}) ORDER BY id",
            names)
        return [Run(i, b, bid, JobState(s), c, r, t, q, lost, n) for i, b, bid, s, c, r, t, q, lost, n in rows]

    def list_jobs(
        self,
        principals: Iterable[str] | None,
        states: Iterable[JobState] | None = None,
        session: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Job]:
        where: list[str] = []
        args: list[Any] = []
        if principals is not None:
            names = list(principals)
            where.append(f"principal IN ({self.conn.marks(len(names))})")
            args.extend(names)
        if states:
            vals = [s.value for s in states]
            where.append(f"state IN ({self.conn.marks(len(vals))})")
            args.extend(vals)
        if session:
            where.append("session=?")
            args.append(session)
        sql = f"SELECT {_JOB_COLS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ? OFFSET ?"
        args.extend([limit, offset])
        return [_row_to_job(r) for r in self.conn.execute(sql, args)]

    def update_job(
        self,
        job_id: int,
        state: JobState,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        cpu_s: float | None = None,
        requeues: int = 0,
        lost_s: float | None = None,
        node: str | None = None,
    ) -> None:
        """Record what the backend reported. A terminal state is never overwritten."""
        self.conn.execute(_update_sql(self.conn), (state.value, exit_code, reason, start_time, end_time, cpu_s, None,
                                                   requeues, lost_s, node, job_id, *_TERMINAL))

    def mark_running(self, started: dict[int, float]) -> None:
        """Jobs still PENDING that started (id -> start time): one statement for many."""
        self.conn.executemany("UPDATE jobs SET state='RUNNING', start_time=? WHERE id=? AND state='PENDING'",
                              [(t, jid) for jid, t in started.items()])

    def clear_backend_id(self, job_id: int) -> None:
        """Mark a job as not yet sent: the reconciler sends it again."""
        self.conn.execute("UPDATE jobs SET backend_id=NULL WHERE id=?", (job_id,))

    def usage(self, principals: Iterable[str]) -> dict[str, Any]:
        """Jobs by state and CPU/GPU-hours (allocated CPUs x elapsed) of finished and
        running jobs, in total, by lane and by session; summed by the server: a
        principal's history can be long. ``measured_cpu_hours`` is what the fast lane
        read from its tasks' rusage."""
        names, c = list(principals), self.conn
        marks = c.marks(len(names))
        by_state = {s: n for s, n in self.conn.execute(
            f"SELECT state, COUNT(*) FROM jobs WHERE principal IN ({marks}) GROUP BY state", names)}
        rows = self.conn.execute(
            f"""SELECT COALESCE({c.json('spec', 'lane')}, 'batch'), session,
                       SUM({c.json('spec', 'cpus', num=True)} * {c.greatest('0', 'COALESCE(end_time, ?) - start_time')}),
                       SUM({c.json('spec', 'gpus', num=True)} * {c.greatest('0', 'COALESCE(end_time, ?) - start_time')}),
                       SUM(cpu_s), COUNT(*)
                FROM jobs WHERE principal IN ({marks}) AND start_time IS NOT NULL GROUP BY 1, session""",
            (time.time(), time.time(), *names)).fetchall()
        lanes: dict[str, dict[str, float]] = {}
        sessions: dict[str, dict[str, float]] = {}
        total = {"cpu": 0.0, "gpu": 0.0, "measured": 0.0}
        for lane, session, cpu, gpu, measured, n in rows:
            for bucket in (lanes.setdefault(lane, {}),
                           sessions.setdefault(session or "-", {})):
                bucket["cpu_hours"] = bucket.get("cpu_hours", 0.0) + (cpu or 0) / 3600
                bucket["gpu_hours"] = bucket.get("gpu_hours", 0.0) + (gpu or 0) / 3600
                bucket["jobs"] = bucket.get("jobs", 0) + n
            total["cpu"] += cpu or 0
            total["gpu"] += gpu or 0
            total["measured"] += measured or 0

        def r(d: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
            return {k: {m: round(v, 4) for m, v in x.items()} for k, x in sorted(d.items())}

        return {"jobs_by_state": by_state, "cpu_hours": round(total["cpu"] / 3600, 4),
                "gpu_hours": round(total["gpu"] / 3600, 4), "measured_cpu_hours": round(total["measured"] / 3600, 6),
                "by_lane": r(lanes), "by_session": r(sessions)}

    def count_jobs(self) -> dict[str, int]:
        return {s: n for s, n in self.conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}
