"""The trusted half of an environment build (``python -m corral.storage.build REQUEST``):
a job of corral's ``envbuild`` principal that runs after the requester's own job
(stage.py: resolve, download, install, as the requester, contained) and packs what it
installed into one squashfs image (decision 0025; H4-report F2).

What the requester's job left is read as hostile: it may have planted links, FIFOs, hard
links to files it could not read, setuid bits, and may still be changing it. So:

1. key: the lock (``out/lock.txt``, opened without following links, a plain file of the
   requester's, bounded) with corral's own account of the interpreter and the request's
   *scope* (the identity that installed it): SHA-256. An image of that key already in the
   store is reused; a key is never shared between identities, so no one's environment
   is another's install;
2. copy: ``out/env`` walked one directory descriptor at a time (``O_NOFOLLOW``), into a
   directory only corral can reach: directories, links (as links, never followed) and
   plain files owned by the requester's uid, set-id bits dropped, within ``[storage]
   build_max_mb``; anything else refuses the build, naming it;
3. pack: ``mksquashfs`` of that copy (zstd, owned by root, no xattrs) to a temporary name;
4. publish: checksum, then rename to ``KEY.sqsh`` beside ``KEY.json`` (its metadata),
   and ``requests/DIGEST.json`` naming the key: a reader sees a whole image or none.

A failure prints ``corral-error: ...`` and exits 2; nothing the requester could not
read ever reaches that line (it names paths inside its own environment only).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.core import proc

STEPS = 5
MAX_ENTRIES = 500_000
MAX_DEPTH = 64


class Refused(Exception):
    """What the requester's job left cannot be packed (the message says what, in its terms)."""


def step(n: int, what: str) -> None:
    print(f"corral-progress {n}/{STEPS} {what}", flush=True)


def fail(message: str) -> int:
    print(f"corral-error: {message}", flush=True)
    return 2


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def interpreter(python: str) -> dict[str, str]:
    code = ("import json, platform, sys, sysconfig; print(json.dumps({'version': platform.python_version(), "
            "'platform': sysconfig.get_platform(), 'implementation': sys.implementation.name}))")
    return json.loads(proc.run([python, "-I", "-c", code], timeout=30).stdout)


def open_beneath(path: str) -> int:
    """A directory opened one component at a time without following a link (listable)."""
    from corral.sandbox.opendir import walk

    return walk(path, os.O_RDONLY)


def read_theirs(dir_fd: int, name: str, uid: int, most: int) -> bytes:
    """A small plain file of ``uid``'s in ``dir_fd``: never a link, a FIFO or another's file."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > most:
            raise Refused(f"the build left {name} as something other than its own plain file of at most {most} bytes")
        return os.read(fd, most + 1)[:most]
    finally:
        os.close(fd)


class Copy:
    """``out/env`` of the requester's job, copied where only corral reaches (see the module)."""

    def __init__(self, uid: int, most: int, dev: int | None = None) -> None:
        self.uid, self.most, self.dev = uid, most, dev
        """``dev``: the filesystem of the output; a mount inside it (a FUSE mount of the
        requester's, whose reads it could stall) is refused, never entered."""
        self.bytes = self.entries = 0

    def tree(self, src: int, dst: str, rel: str = "", depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise Refused(f"the environment nests deeper than {MAX_DEPTH} directories at {rel}")
        for name in sorted(os.listdir(src)):
            here = f"{rel}/{name}" if rel else name
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                raise Refused(f"the environment holds more than {MAX_ENTRIES} files")
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            target = os.path.join(dst, name)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=src), target)  # kept as a link, never followed
            elif stat.S_ISDIR(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src)
                try:
                    self._own(os.fstat(fd), here)
                    os.mkdir(target, 0o755)
                    self.tree(fd, target, here, depth + 1)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode):
                self.file(src, name, target, here)
            else:
                raise Refused(f"the environment holds {here}, which is neither a file, a directory nor a link")

    def _own(self, st: os.stat_result, here: str) -> None:
        if self.dev is not None and st.st_dev != self.dev:
            raise Refused(f"{here} in the environment lies on another filesystem (a mount point)")
        if st.st_uid != self.uid:
            raise Refused(f"{here} in the environment is not the build's own (uid {st.st_uid}, not {self.uid}): "
                          "a build may pack only what it installed")

    def file(self, src: int, name: str, target: str, here: str) -> None:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped since it was looked at
                raise Refused(f"{here} changed while the environment was being packed")
            self._own(st, here)
            mode = 0o755 if st.st_mode & 0o111 else 0o644  # no set-id bit, nothing writable by others
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                while chunk := os.read(fd, 1 << 20):
                    self.bytes += len(chunk)
                    if self.bytes > self.most:
                        raise Refused(f"the environment is larger than the facility's {self.most >> 20} MB "
                                      "for one image ([storage] build_max_mb)")
                    os.write(out, chunk)
            finally:
                os.close(out)
        finally:
            os.close(fd)


def key_of(lock: str, who: dict[str, str], scope: str) -> str:
    return hashlib.sha256(json.dumps([lock, who["implementation"], who["version"], who["platform"], scope])
                          .encode()).hexdigest()[:32]


def build(req: dict[str, Any]) -> int:
    store = Path(req["store"])
    python, uid, rebuild = req["python"], int(req["uid"]), bool(req.get("rebuild"))
    step(4, "checking what the build installed")
    try:
        out = open_beneath(req["out"])
    except OSError as e:
        return fail(f"the build's install step left no environment ({e.strerror})")
    try:
        st = os.fstat(out)
        if st.st_uid != uid:
            return fail("the build's output directory is not the build's own")
        lock_text = read_theirs(out, "lock.txt", uid, 4 * 1024 * 1024).decode("utf-8", "replace")
        lock = "\n".join(ln for ln in lock_text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")) + "\n"
        who = interpreter(python)
        key = key_of(lock, who, req["scope"])
        packages = [ln.split(";")[0].strip() for ln in lock.splitlines() if "==" in ln]
        image, meta = store / f"{key}.sqsh", store / f"{key}.json"
        if image.exists() and meta.exists() and not rebuild:
            step(5, f"reused the image {key} already built for this lock")
        else:
            with tempfile.TemporaryDirectory(prefix=".copy-", dir=store) as tmp:  # 0700, corral's
                env = os.open("env", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=out)
                try:
                    Copy(uid, int(req["max_bytes"]), st.st_dev).tree(env, tmp)
                finally:
                    os.close(env)
                with open(os.path.join(tmp, "corral-lock.txt"), "w", encoding="utf-8") as f:
                    f.write(lock)
                os.chmod(tmp, 0o755)
                step(4, f"packing {len(packages)} packages into squashfs")
                part = store / f".{key}.{os.getpid()}.part"
                r = proc.run(["mksquashfs", tmp, str(part), "-noappend", "-comp", "zstd", "-all-root", "-no-xattrs",
                              "-quiet", "-no-progress", "-processors", str(req.get("cpus") or 2)],
                             timeout=3600, check=False)
                if r.returncode != 0:
                    part.unlink(missing_ok=True)
                    return fail("could not pack the image (is the store's disk full?): " + (r.stderr or r.stdout)[-300:])
            step(5, "publishing")
            record = {"key": key, "packages": packages, "size": part.stat().st_size, "sha256": sha256_file(part),
                      "python": who["version"], "implementation": who["implementation"],
                      "platform": who["platform"], "interpreter": python, "built_by": req.get("principal"),
                      "scope": req["scope"], "created": time.time(), "lock": lock}
            os.chmod(part, 0o444)
            part.rename(image)
            tmp_meta = meta.with_name(meta.name + ".part")
            tmp_meta.write_text(json.dumps(record))
            tmp_meta.rename(meta)
    except Refused as e:
        return fail(str(e))
    except OSError as e:  # a name inside the requester's own environment at most, never a file's content
        return fail(f"could not read what the build installed: {e.strerror} ({os.path.basename(e.filename or '')})")
    finally:
        os.close(out)
    requests = store / "requests"
    requests.mkdir(exist_ok=True)
    (requests / f"{req['digest']}.json").write_text(json.dumps({"key": key}))
    print(f"corral-image {key}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m corral.storage.build REQUEST.json", file=sys.stderr)
        return 2
    req = json.loads(Path(args[0]).read_text())
    try:
        return build(req)
    except Exception as e:  # the build's log is what the requester reads: one line, no trace
        return fail(f"{type(e).__name__}: {e}")
    finally:
        if req.get("stage"):  # the requester's staging, gone once packed or refused (rmtree: by descriptor)
            shutil.rmtree(req["stage"], ignore_errors=True)
        Path(args[0]).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
