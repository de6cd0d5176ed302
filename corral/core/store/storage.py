"""The storage concern of the store: environment images and the requests that build
them, trial workspaces, and jobs' metadata operations on shared paths (corral/storage/).

The storage verbs run in worker threads (they mount, walk and copy), and a connection
shared with the event loop would let a thread's write land inside, or commit, a
transaction the loop holds open. So storage has a connection of its own
(``Conn.again``), each call whole under one lock; the server serializes it with the
loop's writes, and each side reads what the other committed.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterable

from corral.core.store.conn import Conn
from corral.core.store.jobs import ACTIVE

WORKSPACE_COLS = ("id", "principal", "base", "rev", "dir", "how", "created", "expires", "state")
REQUEST_COLS = ("digest", "job_id", "key", "name", "principal", "at", "state", "reason")


class StorageRecords:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.lock = threading.RLock()

    def close(self) -> None:
        self.conn.close()

    def _one(self, sql: str, args: Iterable[Any] = ()) -> Any:
        with self.lock:
            return self.conn.one(sql, list(args))

    def _all(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with self.lock:
            return self.conn.all(sql, list(args))

    # -- jobs, as storage reads them ----------------------------------------------------------

    def job_lane(self, job_id: int) -> tuple[str, str | None] | None:
        """(lane, backend id) of a job."""
        r = self._one("SELECT backend, backend_id FROM jobs WHERE id=?", (job_id,))
        return (r[0], r[1]) if r else None

    def job_spec(self, job_id: int) -> dict[str, Any] | None:
        r = self._one("SELECT spec FROM jobs WHERE id=?", (job_id,))
        return json.loads(r[0]) if r else None

    def jobs_in_workspace(self, ws_id: str) -> list[int]:
        """Live jobs that run in a workspace."""
        return [r[0] for r in self._all(
            f"SELECT id FROM jobs WHERE {ACTIVE} AND {self.conn.json('spec', 'workspace')} = ? ORDER BY id", (ws_id,))]

    # -- image requests -----------------------------------------------------------------------

    def request_building(self, digest: str, job_id: int, name: str | None, principal: str) -> None:
        """A build started (again) for ``digest``."""
        with self.lock, self.conn.transaction():
            self.conn.execute("DELETE FROM env_requests WHERE digest=?", (digest,))
            self.conn.execute("INSERT INTO env_requests (digest, job_id, key, name, principal, at, state, reason) "
                              "VALUES (?, ?, NULL, ?, ?, ?, 'building', NULL)",
                              (digest, job_id, name, principal, time.time()))

    def request(self, digest: str) -> dict[str, Any] | None:
        r = self._one(f"SELECT {', '.join(REQUEST_COLS)} FROM env_requests WHERE digest=?", (digest,))
        return dict(zip(REQUEST_COLS, r)) if r else None

    def building(self) -> list[tuple[str, int, str | None, str, str, str | None]]:
        """Requests still building: (digest, job id, name, principal, job state, job reason)."""
        return [tuple(r) for r in self._all(
            "SELECT r.digest, r.job_id, r.name, r.principal, j.state, j.reason FROM "
            "env_requests r JOIN jobs j ON j.id = r.job_id WHERE r.state='building'")]

    def building_of(self, ref: str) -> str | None:
        """The digest of a request named or digested ``ref`` that is still building."""
        r = self._one("SELECT digest FROM env_requests WHERE (name=? OR digest=?) AND state='building'", (ref, ref))
        return r[0] if r else None

    def request_failed(self, digest: str, why: str) -> None:
        with self.lock:
            self.conn.execute("UPDATE env_requests SET state='failed', reason=? WHERE digest=?", (why, digest))

    def name_owner(self, name: str) -> str | None:
        """Who first asked for an image of this name, else who built the one that has it."""
        owner = self._one("SELECT principal FROM env_requests WHERE name=? ORDER BY at LIMIT 1", (name,))
        builder = self._one("SELECT builder FROM env_images WHERE name=?", (name,))
        return (owner[0] if owner else None) or (builder[0] if builder else None)

    # -- images -------------------------------------------------------------------------------

    def image_built(self, digest: str, key: str, record: dict[str, Any], builder: str) -> None:
        """A request's image is registered (or its record refreshed), and the request ready."""
        with self.lock, self.conn.transaction():
            self.conn.execute(
                "INSERT INTO env_images (key, name, record, builder, created, last_used) VALUES (?, ?, ?, ?, ?, NULL) "
                "ON CONFLICT(key) DO UPDATE SET record=excluded.record",
                (key, None, json.dumps(record), builder, record["created"]))
            self.conn.execute("UPDATE env_requests SET state='ready', key=? WHERE digest=?", (key, digest))

    def name_image(self, key: str, name: str) -> None:
        """``name`` now names this image, and no other."""
        with self.lock, self.conn.transaction():
            self.conn.execute("UPDATE env_images SET name=NULL WHERE name=? AND key<>?", (name, key))
            self.conn.execute("UPDATE env_images SET name=? WHERE key=?", (name, key))

    def image(self, key: str) -> tuple[str, str | None, dict[str, Any], str | None, float, float | None] | None:
        """(key, name, record, builder, created, last used)."""
        r = self._one("SELECT key, name, record, builder, created, last_used FROM env_images WHERE key=?", (key,))
        return (r[0], r[1], json.loads(r[2]), r[3], r[4], r[5]) if r else None

    def image_keys(self) -> list[str]:
        """Every image's key, newest first."""
        return [r[0] for r in self._all("SELECT key FROM env_images ORDER BY created DESC")]

    def image_named(self, name: str) -> str | None:
        r = self._one("SELECT key FROM env_images WHERE name=?", (name,))
        return r[0] if r else None

    def images_named_by_anyone(self, name: str) -> list[tuple[str, str]]:
        """(key, OWNER/NAME) of each image some owner calls ``name``."""
        rows = self._all("SELECT key, name FROM env_images WHERE name LIKE ?", ("%/" + name,))
        return [(r[0], r[1]) for r in rows if r[1].split("/", 1)[-1] == name]

    def images_prefixed(self, prefix: str) -> list[str]:
        return [r[0] for r in self._all("SELECT key FROM env_images WHERE key LIKE ?", (prefix + "%",))]

    def image_used(self, key: str) -> None:
        with self.lock:
            self.conn.execute("UPDATE env_images SET last_used=? WHERE key=?", (time.time(), key))

    def images_unused_since(self, cutoff: float) -> list[str]:
        return [r[0] for r in self._all("SELECT key FROM env_images WHERE COALESCE(last_used, created) < ?",
                                        (cutoff,))]

    def image_collected(self, key: str) -> None:
        with self.lock, self.conn.transaction():
            self.conn.execute("DELETE FROM env_images WHERE key=?", (key,))
            self.conn.execute("UPDATE env_requests SET state='collected' WHERE key=?", (key,))

    def images_summary(self) -> tuple[int, float, float | None]:
        """(images, their bytes, the last use of any)."""
        r = self._one(f"SELECT COUNT(*), COALESCE(SUM({self.conn.json('record', 'size', num=True)}), 0), "
                      "MAX(last_used) FROM env_images")
        return (int(r[0]), r[1], r[2]) if r else (0, 0, None)

    # -- workspaces ---------------------------------------------------------------------------

    def workspace(self, ws_id: str) -> dict[str, Any] | None:
        r = self._one(f"SELECT {', '.join(WORKSPACE_COLS)} FROM workspaces WHERE id=?", (ws_id,))
        return dict(zip(WORKSPACE_COLS, r)) if r else None

    def add_workspace(self, ws_id: str, principal: str, base: str, rev: str | None, dir_: str, how: str,
                      created: float, expires: float) -> None:
        with self.lock:
            self.conn.execute(f"INSERT INTO workspaces ({', '.join(WORKSPACE_COLS)}) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active')",
                              (ws_id, principal, base, rev, dir_, how, created, expires))

    def active_workspaces(self) -> list[tuple[str, str]]:
        """(id, principal) of the active workspaces, oldest first."""
        return [(r[0], r[1]) for r in self._all(
            "SELECT id, principal FROM workspaces WHERE state='active' ORDER BY created")]

    def expired_workspaces(self, now: float) -> list[tuple[str, str]]:
        """(id, dir) of active workspaces past their time."""
        return [(r[0], r[1]) for r in self._all(
            "SELECT id, dir FROM workspaces WHERE state='active' AND expires < ?", (now,))]

    def set_workspace_state(self, ws_id: str, state: str) -> None:
        with self.lock:
            self.conn.execute("UPDATE workspaces SET state=? WHERE id=?", (state, ws_id))

    def count_workspaces(self, principals: list[str] | None) -> int:
        where, args = ("", []) if principals is None else (
            f" AND principal IN ({self.conn.marks(len(principals))})", principals)
        return int(self._one(f"SELECT COUNT(*) FROM workspaces WHERE state='active'{where}", args)[0])

    # -- metadata operations ------------------------------------------------------------------

    def session_ops(self, principal: str, session: str) -> int:
        r = self._one("SELECT COALESCE(SUM(shared_ops), 0) FROM job_meta WHERE principal=? AND session=?",
                      (principal, session))
        return int(r[0]) if r else 0

    def job_ops(self, job_id: int) -> tuple[int, int, dict[str, Any]] | None:
        """(operations, those on shared paths, by call) counted for a job."""
        r = self._one("SELECT ops, shared_ops, by_call FROM job_meta WHERE job_id=?", (job_id,))
        return (r[0], r[1], json.loads(r[2])) if r else None

    def counted(self, job_ids: list[int]) -> set[int]:
        """Which of these jobs have their operations counted."""
        if not job_ids:
            return set()
        return {r[0] for r in self._all(f"SELECT job_id FROM job_meta WHERE job_id IN ({self.conn.marks(len(job_ids))})",
                                        job_ids)}

    def add_ops(self, rows: list[tuple[int, str, str | None, int, int, dict[str, int]]]) -> None:
        """(job id, principal, session, operations, on shared paths, by call) each; counted once."""
        with self.lock, self.conn.transaction():
            self.conn.executemany(
                self.conn.insert_ignore("job_meta", "job_id, principal, session, ops, shared_ops, by_call, at", 7),
                [(jid, p, s, t, sh, json.dumps(by), time.time()) for jid, p, s, t, sh, by in rows])

    def sessions_ops(self, principals: list[str] | None, limit: int = 10) -> list[tuple[Any, ...]]:
        """(principal, session, jobs, shared ops, ops) of the sessions with most shared operations."""
        where, args = ("", []) if principals is None else (
            f" AND principal IN ({self.conn.marks(len(principals))})", principals)
        return [(p, s, int(n), int(sh or 0), int(ops or 0)) for p, s, n, sh, ops in self._all(
            f"SELECT principal, COALESCE(session, '-'), COUNT(*), SUM(shared_ops), SUM(ops) FROM job_meta "
            f"WHERE 1=1{where} GROUP BY principal, session ORDER BY SUM(shared_ops) DESC LIMIT ?", [*args, limit])]
