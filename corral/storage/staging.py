"""Where an environment build's two jobs meet (decision 0025; H4-report F2).

A build is two jobs: the requester's own (stage.py: resolve, download, install, as its
identity, in its sandbox) and, after it, corral's (build.py: copy without following
links, pack, publish). They share one directory on node-local scratch:

    SCRATCH/envbuild/                 corral's, 0711, hidden from every sandbox (its scope bound back)
      SCOPE/                          corral's, 0711: the requester's job works here
        cache/                        the identity's, 0700: its uv cache (never another's)
        b-DIGEST-NONCE/               corral's, 0755: stage.py and request.json, read-only to the job
          out/                        the identity's, 0700: lock.txt and env/, what it installed

Everything corral writes lies in directories only corral writes, so no link the
requester plants is ever followed by corral; what the requester writes (``cache``,
``out``) corral only reads, by descriptor, in build.py.

A *scope* is the identity a build installs as (its uid; a principal's name where jobs do
not change identity): images are shared within a scope and never across, since what one
identity installed is only as trustworthy as that identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.core.errors import BackendError
from corral.core.identity import Identity
from corral.storage.scratch import prepare

STAGE_PROGRAM = Path(__file__).with_name("stage.py")
KEEP_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
            "no_proxy", "NO_PROXY")
"""What the requester's job passes on to uv: certificates, and the sandbox's proxy to the index."""


def scope_of(principal: str, ident: Identity | None) -> str:
    if ident is not None:
        return f"u{ident.uid}"
    return "p-" + hashlib.sha256(principal.encode()).hexdigest()[:16]


def _dir(path: Path, uid: int, gid: int, mode: int) -> None:
    """``path`` a real directory of ``uid`` with ``mode``, made if missing. Its parent is
    corral's alone, so nobody else can have put anything at that name unless it was made
    before the parent was corral's: then it is refused, never used."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, os.geteuid()):
        raise BackendError(f"{path} is not a directory of corral's or of the build's identity; an environment "
                           "build will not use it", hint="the facility's admin removes it; builds then make it again")
    if st.st_uid != uid or st.st_gid != gid:
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


@dataclass(frozen=True)
class Stage:
    scope: str
    workdir: Path
    """SCRATCH/envbuild/SCOPE: the requester's job's working directory."""
    where: Path
    """The build's own directory (b-DIGEST-NONCE) inside it."""
    uid: int

    @property
    def out(self) -> Path:
        return self.where / "out"

    def command(self, python: str) -> str:
        rel = self.where.name  # relative: the job starts in its working directory, however it got there
        return f"exec {python} -I -S {rel}/stage.py {rel}"


def _uv_copy(uv: Path, workdir: Path) -> Path:
    """The gateway's uv, copied once into the scope's directory (corral's, 0711, the build
    job's working directory): the gateway's own may lie where the requester's sandbox
    cannot see it (a home, or /tmp, which every sandbox replaces with its own)."""
    dest = workdir / "uv"
    try:
        src = os.stat(uv)
        have = os.lstat(dest)
        if have.st_size == src.st_size and have.st_mtime_ns >= src.st_mtime_ns and have.st_uid == os.geteuid():
            return dest
    except FileNotFoundError:
        pass
    except OSError:
        return uv
    tmp = workdir / f".uv-{secrets.token_hex(4)}"
    try:
        shutil.copyfile(uv, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return uv
    return dest


def make(scratch: Path, principal: str, ident: Identity | None, digest: str, req: dict[str, Any]) -> Stage:
    """The directories of one build, and its request written where only corral writes."""
    me, gid_me = os.geteuid(), os.getegid()
    uid, gid = (ident.uid, ident.gid) if ident is not None else (me, gid_me)
    scope = scope_of(principal, ident)
    root = prepare(scratch, ["envbuild"]) / "envbuild"  # scratch.py: made or checked as corral's own
    workdir = root / scope
    _dir(workdir, me, gid_me, 0o711)
    _dir(workdir / "cache", uid, gid, 0o700)
    where = workdir / f"b-{digest[:16]}-{secrets.token_hex(4)}"
    os.mkdir(where, 0o755)
    shutil.copyfile(STAGE_PROGRAM, where / "stage.py")
    os.chmod(where / "stage.py", 0o644)
    body = {**req, "uv_cache": str(workdir / "cache"), "keep_env": list(KEEP_ENV)}
    if req.get("uv") and os.path.isabs(req["uv"]):
        body["uv"] = str(_uv_copy(Path(req["uv"]), workdir))
    fd = os.open(where / "request.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)
    _dir(where / "out", uid, gid, 0o700)
    return Stage(scope, workdir, where, uid)


def drop(scratch: Path, requests: Path, digest: str) -> None:
    """A failed build's directories and corral's request for it (the pack job, which
    removes them once it ran, never did). rmtree works by descriptor: a link the
    requester left inside is removed, never followed."""
    for where in (scratch / "envbuild").glob(f"*/b-{digest[:16]}-*"):
        shutil.rmtree(where, ignore_errors=True)
    for req in requests.glob(f"{digest}-*.json"):
        req.unlink(missing_ok=True)
