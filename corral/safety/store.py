"""What the safety layer keeps in the gateway's database: token blocks seen and revoked,
tainted sessions, and the usage that budgets and concurrency caps are checked against."""

from __future__ import annotations

from typing import Any

from corral.core.db import Database


class SafetyStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.limits_seen: dict[str, tuple[str, dict[str, int]]] = {}
        """Token subtree path -> (principal, its block's limits), for every limited block
        presented since start: what the dashboard shows budgets against. In memory (the
        limits live in the token, not here); an agent's next call fills it again."""

    def saw_limits(self, principal: str, block_ids: tuple[str, ...], limits: tuple[dict[str, int], ...]) -> None:
        for i, block in enumerate(limits):
            if block:
                path = "/".join(block_ids[: i + 1])
                if path not in self.limits_seen:
                    if len(self.limits_seen) >= 10_000:  # bounded: the oldest go first
                        self.limits_seen.pop(next(iter(self.limits_seen)))
                    self.limits_seen[path] = (principal, dict(block))

    # -- tokens, taint and usage: kept in the store (corral/core/store/safety.py) -----------

    def revoked(self) -> set[str]:
        return self.db.safety.revoked()

    def revoke(self, block_id: str, by: str) -> None:
        self.db.safety.revoke(block_id, by)

    def seen_blocks(self, root: str, principal: str, block_ids: tuple[str, ...]) -> None:
        """Remember the blocks a holder added, so their ids can be listed and revoked."""
        self.db.safety.seen_blocks(root, principal, block_ids[1:])

    def block_owner(self, block_id: str) -> str | None:
        return self.db.safety.block_owner(block_id)

    def block_root(self, block_id: str) -> str | None:
        return self.db.safety.block_root(block_id)

    def blocks_of(self, root: str) -> list[str]:
        return self.db.safety.blocks_of(root)

    def blocks(self, principals: list[str] | None) -> list[dict[str, Any]]:
        return self.db.safety.blocks(principals)

    def taints(self) -> dict[str, str]:
        return self.db.safety.taints()

    def clear_taint(self, key: str) -> None:
        self.db.safety.clear_taint(key)

    def taint(self, key: str, principal: str, reason: str) -> None:
        self.db.safety.taint(key, principal, reason)

    def used(self, block_path: str) -> tuple[float, float, int]:
        """CPU-seconds and GPU-seconds charged to a token subtree, and its active jobs.
        A finished job is charged what it ran; a live one what it may still run (its walltime)."""
        return self.db.safety.used(block_path)

    def active(self, principal: str) -> int:
        return self.db.safety.active(principal)

    def hold(self, principal: str) -> None:
        """In the store's transaction: this principal's admissions take turns, on every replica."""
        self.db.safety.hold(principal)

    def buckets(self, keys: list[str]) -> dict[str, tuple[float, float]]:
        return self.db.safety.buckets(keys)

    def set_buckets(self, rows: list[tuple[str, float, float]], forget_before: float | None = None) -> None:
        self.db.safety.set_buckets(rows, forget_before)
