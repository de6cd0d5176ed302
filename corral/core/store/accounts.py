"""The accounts concern of the store: principals (people, agents, services), their
opaque tokens, and what the safety layer remembers of capability tokens (blocks seen,
revocations) and of tainted sessions."""

from __future__ import annotations

import time
from typing import Any, Iterable

from corral.core.principals import Kind, Principal
from corral.core.store.conn import Conn


def _row_to_principal(row: tuple[Any, ...]) -> Principal:
    name, kind, sponsor, unix_user, account, is_admin, created = row
    return Principal(name, Kind(kind), sponsor, unix_user, account, bool(is_admin), created)


class Accounts:
    """Principals and tokens; mixed into ``Database`` (``db.get_principal``...)."""

    conn: Conn

    def add_principal(self, p: Principal) -> Principal:
        created = p.created or time.time()
        self.conn.execute(
            "INSERT INTO principals (name, kind, sponsor, unix_user, account, is_admin, created) VALUES (?,?,?,?,?,?,?)",
            (p.name, p.kind.value, p.sponsor, p.unix_user, p.account, int(p.is_admin), created),
        )
        return self.get_principal(p.name)  # type: ignore[return-value]

    def reshape_principal(self, p: Principal) -> None:
        """Give the principal named ``p.name`` the rest of ``p`` (its kind, sponsor, Unix
        user, account, admin right); its name and its creation time stay."""
        self.conn.execute("UPDATE principals SET kind=?, sponsor=?, unix_user=?, account=?, is_admin=? WHERE name=?",
                          (p.kind.value, p.sponsor, p.unix_user, p.account, int(p.is_admin), p.name))

    def get_principal(self, name: str) -> Principal | None:
        row = self.conn.execute(
            "SELECT name, kind, sponsor, unix_user, account, is_admin, created FROM principals WHERE name=?", (name,)
        ).fetchone()
        return _row_to_principal(row) if row else None

    def list_principals(self) -> list[Principal]:
        rows = self.conn.execute(
            "SELECT name, kind, sponsor, unix_user, account, is_admin, created FROM principals ORDER BY name"
        ).fetchall()
        return [_row_to_principal(r) for r in rows]

    def sponsored_by(self, sponsor: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT name FROM principals WHERE sponsor=?", (sponsor,))]

    def add_token(self, token_id: str, principal: str, hash_: str, expires: float | None, note: str | None) -> None:
        self.conn.execute(
            "INSERT INTO tokens (id, principal, hash, created, expires, note) VALUES (?,?,?,?,?,?)",
            (token_id, principal, hash_, time.time(), expires, note),
        )

    def get_token(self, token_id: str) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT id, principal, hash, created, expires, revoked, note FROM tokens WHERE id=?", (token_id,)
        ).fetchone()
        if not row:
            return None
        keys = ("id", "principal", "hash", "created", "expires", "revoked", "note")
        return dict(zip(keys, row))

    def list_tokens(self, principals: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, principal, created, expires, revoked, note FROM tokens"
        args: list[Any] = []
        if principals is not None:
            names = list(principals)
            sql += f" WHERE principal IN ({self.conn.marks(len(names))})"
            args = names
        keys = ("id", "principal", "created", "expires", "revoked", "note")
        return [dict(zip(keys, r)) for r in self.conn.execute(sql + " ORDER BY created", args)]

    def opaque_token_ids(self) -> set[str]:
        """Tokens minted as opaque secrets (a hash kept), not capability tokens."""
        return {r[0] for r in self.conn.execute("SELECT id FROM tokens WHERE hash != ''")}
