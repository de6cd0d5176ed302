"""Environment images: built once per identity, read-only, mounted by any job that names one.

A request (a requirements.txt, a pyproject.toml, or a uv.lock with its pyproject.toml)
names packages of the facility's index only (requirements.py), and is known by its
*digest*: the files, the target Python, the index and the *scope* (the identity that
installs it: staging.py). A request seen before in that scope whose image exists is
answered at once; else a build is recorded as two jobs (each with its allow record, by the
pipeline: control/intake.py) and sent through the batch lane
like any job (queued, bounded by ``[storage] build_*``, polled, audited by the verb that
asked): the requester's own job, which resolves and installs as its identity and in its
sandbox (stage.py), and after it a job of the ``envbuild`` service principal, which
copies what was installed without following links and packs it (build.py; decision
0025). The image is named by the *key* of what it resolved, so two requests of one
scope that resolve alike share one image.

The store (``[storage] images_dir``) holds ``KEY.sqsh`` and ``KEY.json``; the database
holds who built which, the names, and when each was last used (``env gc`` reads that).
A job naming an image (``image`` or ``env: NAME``) has it checked against its checksum
the first time this gateway mounts it, then mounted under node-local scratch
(mounts.py) and its ``bin`` put first on PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral.core.config import StorageSettings
from corral.core.errors import Conflict, InvalidRequest, NotFound, SandboxUnavailable
from corral.core.jobs import JobSpec, JobState
from corral.core.output import read_tail
from corral.core.principals import BUILD_PRINCIPAL, Caller
from corral.core.lane_names import BATCH
from corral.core.text import NAME
from corral.storage import mounts, requirements, scratch, staging
from corral.storage.build import sha256_file

from corral.control.intake import SERVICE_RULE
from corral.control.sender import context
from corral.core import interp

if TYPE_CHECKING:
    from corral.control.intake import Intake
    from corral.core.db import Database
    from corral.core.identity import Identity
    from corral.lanes.registry import Lanes
    from corral.sandbox.bwrap import Sandbox
    from corral.core.store.storage import StorageRecords

KINDS = ("requirements.txt", "pyproject.toml", "uv.lock")
MAX_FILE = 1024 * 1024
TLS_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY")
"""The gateway's TLS and proxy settings, which an uncontained build job needs to reach the
index (a contained one has only its sandbox's way out, and keeps the certificates)."""
_NAME = re.compile(NAME)
_PROGRESS = re.compile(r"^corral-progress (\d+)/(\d+) (.*)$", re.M)
_ERROR = re.compile(r"^corral-error: (.*)$", re.M)


def _uv() -> str:
    here = Path(sys.executable).with_name("uv")
    return str(here) if here.exists() else (shutil.which("uv") or "uv")


def default_python() -> str:
    from corral.core.safe_read import base_python

    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else base_python()


def request_kind(files: dict[str, str]) -> str:
    """Which of the three inputs ``files`` is; raises InvalidRequest saying what to send."""
    names = set(files)
    if not names or not names <= {*KINDS}:
        raise InvalidRequest(f"an environment is built from one of {', '.join(KINDS)} (a uv.lock with its "
                             f"pyproject.toml); got {', '.join(sorted(names)) or 'no file'}")
    for name, text in files.items():
        if len(text.encode()) > MAX_FILE or "\x00" in text:
            raise InvalidRequest(f"{name} must be text of at most 1 MiB")
    if "uv.lock" in names:
        if "pyproject.toml" not in names or "requirements.txt" in names:
            raise InvalidRequest("a uv.lock is built with the pyproject.toml beside it (send both, nothing else)")
        return "uv.lock"
    if len(names) != 1:
        raise InvalidRequest("send one requirements.txt or one pyproject.toml")
    kind = names.pop()
    if not files[kind].strip():
        raise InvalidRequest(f"{kind} is empty; name at least one package")
    return kind


KEYLIKE = re.compile(r"[0-9a-f]{8,32}")
"""A key's prefix, as a job may name an image: no image name may read as one."""


def _being_built(ref: str, digest: str) -> Conflict:
    return Conflict(f"the image {ref!r} is still being built; wait for it (corral env status {digest}) and submit again")


def own_name(owner: str, name: str) -> str:
    """An image's name as stored: its owner's, so one principal's name is never another's
    (issue 47 item 9, decision 0051: names were global, a name could be squatted and
    ``env: torch`` ran whoever's image had it)."""
    return f"{owner}/{name}"


def checked_kind(files: dict[str, str]) -> str:
    """``request_kind``, and every requirement one of the index's (requirements.py)."""
    kind = request_kind(files)
    requirements.check(files)
    return kind


class Images:
    def __init__(self, settings: StorageSettings, home: Path, scratch: Path, db: "Database", store: "StorageRecords",
                 lanes: "Lanes", intake: "Intake", owner: "Callable[[Caller], Identity | None] | None" = None,
                 sandbox: "Sandbox | None" = None,
                 admit: "Callable[[Caller, list[JobSpec]], None] | None" = None) -> None:
        self.settings, self.db, self.store, self.lanes, self.intake = settings, db, store, lanes, intake
        self.admit = admit or (lambda c, specs: None)
        """Admission of the requester's install job (Gate.admit: rates, budgets, caps)."""
        self.owner = owner or (lambda c: None)
        """The identity a caller's jobs run as: its build installs as that identity."""
        self.sandbox = sandbox
        self.scratch = scratch
        """``db``: the loop's (a build job's record); ``store``: storage's own tables, from any thread."""
        self.images_dir = settings.images_dir or home / "images"
        self.requests_dir = home / "envbuild"
        self.mounts = scratch / "images"
        self.uv_cache = scratch / "uv-cache"
        self.python = settings.python or default_python()
        self._verified: dict[str, tuple[int, float, int]] = {}
        self.mounted: dict[str, mounts.Mounted] = {}
        """How each image was last mounted on this gateway's node, and why that way."""
        self._lock = threading.Lock()
        self.where: "Callable[[str], list[str]] | None" = None
        """Several clusters: the ones whose filesystems hold a path (lanes/clusters.py)."""

    # -- building ------------------------------------------------------------------

    def digest(self, files: dict[str, str], scope: str) -> str:
        return hashlib.sha256(json.dumps([sorted(files.items()), self.python, self.settings.index_url, scope])
                              .encode()).hexdigest()[:32]

    def _contained(self, caller: Caller) -> bool:
        """Whether ``caller``'s build job runs in the sandbox; refuses one that could not
        reach the index from there (before anything is recorded)."""
        box, kind = self.sandbox, caller.principal.kind.value
        if box is None or not box.applies(kind):
            return False
        if not box.network and not box.egress:
            raise SandboxUnavailable(
                f"an environment build runs as your own job, in the sandbox of {kind} principals, and that sandbox "
                "reaches no network: it cannot download from the package index",
                hint="ask the facility's admin to put the index's hosts on [sandbox] allow_hosts (for PyPI: "
                     "pypi.org, files.pythonhosted.org; or the facility's mirror), which the sandbox reaches "
                     "through corral's egress proxy")
        return True

    async def request(self, caller: Caller, files: dict[str, str], name: str | None = None,
                      rebuild: bool = False, rule: str = "env.build") -> dict[str, Any]:
        """An image for these files: the existing one of the caller's scope at once, or a
        build started (the caller's job, then corral's). ``rule``: what allowed the request
        (the install job's allow record names it)."""
        kind = checked_kind(files)
        if name is not None and not _NAME.fullmatch(name):
            raise InvalidRequest(f"image name {name[:80]!r}: letters, digits, '_', '.', '-', at most 64")
        if name is not None and KEYLIKE.fullmatch(name):  # a job naming it would reach another's key prefix
            raise InvalidRequest(f"image name {name!r} reads as an image key; give a name with a letter past 'f' "
                                 "or a '-' (torch-2, cuda12)", hint="build it again with such a name: --name torch-2")
        if name is not None:  # the caller's own name for it, never one another principal uses (squatting)
            name = own_name(caller.principal.name, name)
        ident = self.owner(caller)
        scope = staging.scope_of(caller.principal.name, ident)
        digest = self.digest(files, scope)
        self.refresh()
        row = self._request_row(digest)
        if row is not None and not rebuild:
            if row["state"] == "ready" and row["key"] and (self.images_dir / f"{row['key']}.sqsh").exists():
                if name:
                    self._name(row["key"], name)
                return {**self.describe(row["key"]), "state": "ready", "digest": digest, "reused": True}
            if row["state"] == "building":
                return self.status_of(digest)
        contained = self._contained(caller)
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.requests_dir, 0o700)  # what corral's half reads: nobody else's to read or change
        uv = _uv()
        stage = staging.make(self.scratch, caller.principal.name, ident, digest, {
            "files": files, "kind": kind, "python": self.python, "index_url": self.settings.index_url, "uv": uv})
        s = self.settings
        env = {k: os.environ[k] for k in (TLS_ENV[:2] if contained else TLS_ENV) if k in os.environ}
        first = JobSpec(command=stage.command(self.python), cpus=s.build_cpus, memory=s.build_memory_mb,
                        walltime=s.build_walltime_s, lane=BATCH, workdir=str(stage.workdir),
                        name=f"envbuild-{digest[:12]}-install", labels={"corral-envbuild-stage": digest}, env=env)
        req = {"store": str(self.images_dir), "python": self.python, "digest": digest, "scope": scope,
               "uid": stage.uid, "out": str(stage.out), "stage": str(stage.where), "principal": caller.principal.name,
               "rebuild": rebuild, "max_bytes": s.build_max_mb << 20, "cpus": s.build_cpus}
        path = self.requests_dir / f"{digest}-{stage.where.name[-8:]}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(req, f)
        me = self.intake.service(BUILD_PRINCIPAL, f"envbuild:{caller.principal.name}")
        # Both recorded by the pipeline with their allow records, in one transaction: the
        # install as the requester's (allowed by the env.build verb's decision), the pack as corral's.
        with self.db.transaction():
            self.admit(caller, [first])  # the install is the requester's job: its rates, budgets and caps
            staged = self.intake.record(caller, [(self.lanes.batch.name, first)], rule)[0]
            # Isolated (-I), for a program run as root: nothing from its working directory or
            # PYTHON* variables; this gateway's own corral, named in argv (core/interp.py).
            pack = JobSpec(command=f"exec {interp.module_command('corral.storage.build', str(path))}",
                           cpus=s.build_cpus, memory=s.build_memory_mb, walltime=s.build_walltime_s, lane=BATCH,
                           name=f"envbuild-{digest[:12]}", labels={"corral-envbuild": digest}, after_ok=[staged.id])
            job = self.intake.record(me, [(self.lanes.batch.name, pack)], SERVICE_RULE)[0]
        self.store.request_building(digest, job.id, name, caller.principal.name)
        await self.intake.send([(staged, context(staged, caller.principal)), (job, context(job, me.principal))])
        return self.status_of(digest)

    def _request_row(self, digest: str) -> dict[str, Any] | None:
        return self.store.request(digest)

    def _one_output(self, job_id: int) -> str:
        job = self.store.job_lane(job_id)
        if job is None or not job[1]:
            return ""
        try:  # the build's last lines: its progress and any error are at the end
            return str(read_tail(self.lanes[job[0]].output_paths(job[1]).stdout, 1000, 64 * 1024)["data"])
        except (OSError, KeyError):
            return ""

    def _build_output(self, job_id: int) -> str:
        """What the build said: its install job's (the requester's) lines, then its pack job's."""
        spec = self.store.job_spec(job_id)
        first = (spec.get("after_ok") or [None])[0] if spec else None
        return (self._one_output(int(first)) if first is not None else "") + "\n" + self._one_output(job_id)

    def refresh(self) -> None:
        """Builds that ended since last asked: their images registered, or their failure kept."""
        rows = self.store.building()
        for digest, job_id, name, principal, state, reason in rows:
            if not JobState(state).terminal:
                continue
            done = self.images_dir / "requests" / f"{digest}.json"
            if state == JobState.COMPLETED.value and done.exists():
                key = json.loads(done.read_text())["key"]
                record = json.loads((self.images_dir / f"{key}.json").read_text())
                self.store.image_built(digest, key, record, principal)
                if name:
                    self._name(key, name)
                continue
            errors = _ERROR.findall(self._build_output(job_id))
            why = errors[-1] if errors else f"the build job {job_id} ended {state}: {reason or 'no reason given'}"
            self.store.request_failed(digest, why)
            staging.drop(self.scratch, self.requests_dir, digest)  # the pack that removes them never ran

    def status_of(self, digest: str) -> dict[str, Any]:
        """A request as its requester sees it: building (with progress), ready, or failed (why),
        as of the last ``refresh``."""
        row = self._request_row(digest)
        if row is None:
            raise NotFound(f"no environment request {digest}; corral env build FILE starts one")
        out: dict[str, Any] = {"digest": digest, "state": row["state"], "job": row["job_id"]}
        if row["state"] == "building":
            steps = _PROGRESS.findall(self._build_output(row["job_id"]))
            n, total, what = steps[-1] if steps else ("0", "5", "queued")
            out["progress"] = {"step": int(n), "of": int(total), "doing": what}
        elif row["state"] == "ready":
            out.update(self.describe(row["key"]))
        else:
            out["error"] = row["reason"]
        return out

    # -- names and listing -----------------------------------------------------------

    def _name(self, key: str, name: str) -> None:
        self.store.name_image(key, name)

    def describe(self, key: str) -> dict[str, Any]:
        r = self.store.image(key)
        if r is None:
            raise NotFound(f"no environment image {key}; corral env list shows them")
        rec = r[2]
        m = self.mounted.get(key)
        return {"image": r[0], "name": r[1], "packages": rec["packages"], "size": rec["size"],
                "python": rec["python"], "platform": rec["platform"], "built_by": r[3], "created": r[4],
                "last_used": r[5], "mount": {"path": m.path, "how": m.how, "why": m.why} if m else None,
                **({"clusters": self.where(str(self.images_dir / f"{key}.sqsh"))} if self.where else {})}

    def listing(self) -> list[dict[str, Any]]:
        self.refresh()
        keys = self.store.image_keys()
        return [self.describe(k) for k in keys]

    def find(self, ref: str, caller: Caller | None = None) -> str:
        """A name, a key or a key's prefix (8 characters or more) -> the key. A bare name is
        ``caller``'s own (``own_name``): alice's ``torch`` and bob's are two images, and
        another principal's is reached only by naming it, OWNER/NAME or its key (whether
        the caller may use it is StorageVerbs.resolve's to decide). Without a caller (an
        admin's gc), a bare name is whichever owner's has it, if only one has."""
        self.refresh()
        named = ref if "/" in ref or caller is None else own_name(caller.principal.name, ref)
        r = self.store.image_named(named)
        if r is None and caller is None and "/" not in ref:  # the admin's gc: whoever's it is, if one owner's
            some = self.store.images_named_by_anyone(ref)
            if len(some) > 1:
                raise InvalidRequest(f"{len(some)} images are named {ref!r} ({', '.join(n for _, n in some)}); "
                                     "give the key of the one you mean (corral env list)")
            r = some[0][0] if some else None
        if r is None and caller is not None and "/" not in ref:  # named before names were per owner: its builder's
            old = self.store.image_named(ref)
            row = self.store.image(old) if old is not None else None
            r = old if row is not None and row[3] == caller.principal.name else None
        building = self.store.building_of(named) if r is None else None
        if building and caller is not None:  # its own, first: never another's key
            raise _being_built(ref, building)
        if r is None and KEYLIKE.fullmatch(ref):
            rows = self.store.images_prefixed(ref)
            if len(rows) > 1:
                raise InvalidRequest(f"image {ref!r} is the prefix of {len(rows)} images; give more of its key")
            r = rows[0] if rows else None
        if r is None:
            building = building or self.store.building_of(ref)
            if building:
                raise _being_built(ref, building)
            raise NotFound(f"no environment image {ref!r}; build it with corral env build FILE --name {ref}, "
                           "or list the images with corral env list")
        return r

    # -- use -----------------------------------------------------------------------------

    def attach(self, key: str) -> mounts.Mounted:
        """The image mounted on this node, checked whole the first time (a corrupt image
        is refused, never mounted). Blocking: called off the event loop."""
        image = self.images_dir / f"{key}.sqsh"
        row = self.store.image(key)
        if row is None:
            raise NotFound(f"no environment image {key}; corral env list shows them")
        rec = row[2]
        try:
            st = image.stat()
        except OSError:
            raise NotFound(f"the image {key} is registered but its file is gone from the store; rebuild it with "
                           "corral env build FILE --rebuild") from None
        at = self.mounts / key
        with self._lock:
            if self._verified.get(key) != (st.st_ino, st.st_mtime, st.st_size):
                if st.st_size != rec["size"] or sha256_file(image) != rec["sha256"]:
                    raise Conflict(f"the image {key} is corrupt (its checksum no longer matches); it is not used. "
                                   "Rebuild it: corral env build FILE --rebuild",
                                   hint="the facility's admin may also remove it with corral env gc --image KEY")
                # A file new to this gateway (rebuilt): a mount of the one it replaced goes
                # (lazily: jobs still reading the old one keep their view).
                mounts.unmount(at)
                self._verified[key] = (st.st_ino, st.st_mtime, st.st_size)
            # Mounted as root at a path of scratch: never inside a directory someone else made (scratch.py).
            scratch.prepare(self.mounts.parent, [self.mounts.name])
            m = mounts.mount_image(image, at)
        self.store.image_used(key)
        self.mounted[key] = m
        return m

    def gc(self, older_than_s: float | None = None, only: str | None = None, dry_run: bool = False) -> list[str]:
        """Images unused for ``older_than_s`` (default ``image_keep_days``), or ``only``:
        unmounted here, their files and records removed. -> their keys."""
        cutoff = time.time() - (older_than_s if older_than_s is not None else self.settings.image_keep_days * 86400)
        if only is not None:
            keys = [self.find(only)]
        else:
            keys = self.store.images_unused_since(cutoff)
        if dry_run:
            return keys
        for part in self.images_dir.glob(".*.part"):  # a build killed while packing left its half
            try:
                if part.stat().st_mtime < time.time() - 86400:
                    part.unlink()
            except OSError:
                pass
        for key in keys:
            mounts.unmount(self.mounts / key)
            for p in (self.images_dir / f"{key}.sqsh", self.images_dir / f"{key}.json"):
                p.unlink(missing_ok=True)
            self.store.image_collected(key)
        return keys
