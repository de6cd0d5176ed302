"""The store's former name: ``Database`` and its records now live in corral/core/store/,
where all of corral's SQL is. Kept so that ``from corral.core.db import Database`` reads
as before."""

from corral.core.store import HELD_REASON, MIGRATIONS, Database, Run, open_store

__all__ = ["Database", "Run", "HELD_REASON", "MIGRATIONS", "open_store"]
