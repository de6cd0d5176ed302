"""Facility facts, harvested from the backend and this host, versioned.

What is harvested: partitions with their limits, GPUs and default (from the backend,
which reads slurm.conf for Slurm); on Slurm also node types (CPUs, memory, gres,
features, counted) and QOS limits (from slurmdbd); the modules the site's Lmod or
Environment Modules offers, when either is installed; and the filesystems and quotas
an admin configures (``facility_paths``, ``facility_quotas``), with each path's size
(not its free space, which changes by the minute and would make every harvest a new
version). Every harvest is hashed; a new hash is a new version, and what changed is
listed. Notes that name a changed partition, path or module are marked stale with the
change, never left silently wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any

from corral.lanes.backend import Backend
from corral.core.db import Database
from corral.core.proc import run

log = logging.getLogger("corral.memory")


def harvest(backend: Backend, paths: dict[str, str], quotas: dict[str, str] | None = None) -> dict[str, Any]:
    """The facts as one JSON-ready dict (may call the scheduler once)."""
    facts: dict[str, Any] = {"backend": backend.name}
    facts["partitions"] = {p.name: {"max_cpus": p.max_cpus, "max_memory_mb": p.max_memory_mb, "max_gpus": p.max_gpus,
                                    "max_walltime_s": p.max_walltime_s, "default": p.default}
                           for p in backend.partitions()}
    extra = getattr(backend, "facts", None)
    facts.update(extra() if extra else {})
    facts["modules"] = _modules()
    fs = {}
    for name, path in sorted(paths.items()):
        try:
            st = os.statvfs(path)
            fs[name] = {"path": path, "size_gb": round(st.f_blocks * st.f_frsize / 1e9, 1)}
        except OSError:
            fs[name] = {"path": path, "missing": True}
    for name, quota in (quotas or {}).items():
        fs.setdefault(name, {})["quota"] = quota
    facts["filesystems"] = fs
    return facts


def _modules() -> list[str] | None:
    """`module -t avail` through a login shell, when Lmod or Environment Modules is there."""
    if not (os.environ.get("LMOD_CMD") or os.environ.get("MODULESHOME") or shutil.which("modulecmd")):
        return None
    try:
        out = run(["bash", "-lc", "module -t avail 2>&1"], timeout=30, check=False).stdout
    except Exception as e:  # a broken module system must not stop the gateway
        log.warning("module avail failed: %s", e)
        return None
    return sorted({ln.strip() for ln in out.splitlines() if ln.strip() and not ln.strip().endswith(":")})


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """(subject, what changed): subjects are partition names and filesystem paths."""
    out: list[tuple[str, str]] = []
    op, np = old.get("partitions", {}), new.get("partitions", {})
    for name in sorted(set(op) | set(np)):
        if op.get(name) != np.get(name):
            if name not in np:
                out.append((name, f"partition {name} was removed"))
            elif name not in op:
                out.append((name, f"partition {name} was added"))
            else:
                diff = ", ".join(f"{k} {op[name].get(k)} -> {np[name].get(k)}" for k in np[name]
                                 if op[name].get(k) != np[name].get(k))
                out.append((name, f"partition {name} changed: {diff}"))
    ofs, nfs = old.get("filesystems", {}), new.get("filesystems", {})
    for name in sorted(set(ofs) | set(nfs)):
        if (ofs.get(name) or {}).get("path") != (nfs.get(name) or {}).get("path"):
            subject = (ofs.get(name) or nfs.get(name) or {}).get("path", name)
            out.append((subject, f"filesystem {name} moved or was removed"))
    if old.get("modules") != new.get("modules") and old.get("modules") is not None:
        gone = sorted(set(old["modules"]) - set(new.get("modules") or []))
        out += [(m.split("/")[0], f"module {m} is no longer offered") for m in gone]
    return out


class Facts:
    def __init__(self, db: Database) -> None:
        self.db = db

    def current(self) -> dict[str, Any]:
        r = self.db.memory.facts()
        if r is None:
            return {"version": 0, "facts": {}, "changes": [], "updated": None}
        return {"version": r[0], "hash": r[1], "facts": json.loads(r[2]), "changes": json.loads(r[3]), "updated": r[4]}

    def update(self, facts: dict[str, Any]) -> dict[str, Any]:
        """Record a harvest; a different hash is a new version, and notes naming what
        changed are marked stale."""
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
        cur = self.current()
        if cur.get("hash") == digest:
            return cur
        changes = _changes(cur["facts"], facts) if cur["version"] else []
        version = cur["version"] + 1
        with self.db.transaction():
            self.db.memory.add_facts(version, digest, json.dumps(facts), json.dumps([c for _, c in changes]), time.time())
            for subject, what in changes:
                self._stale(subject, f"{what} (facility version {version}); this note may be out of date")
        if changes:
            log.info("facility changed (version %s): %s", version, "; ".join(c for _, c in changes))
        return self.current()

    def _stale(self, subject: str, why: str) -> None:
        for nid, flags in self.db.memory.phrase(subject):
            f = json.loads(flags) if flags else {}
            f["stale"] = why
            self.db.memory.set_flags(nid, json.dumps(f))
