"""The program an environment build job runs (``python -m corral.storage.build REQUEST``):
resolve with uv, install into a staging directory, pack into one squashfs image.

Steps, each announced on stdout as ``corral-progress N/5 WHAT`` (the CLI draws them as a
bar, an agent reads them in the build's status):

1. resolve: ``uv pip compile`` (a uv.lock is first exported with ``uv export --frozen``)
   into a fully pinned lock;
2. key: SHA-256 of the lock, the Python version and the platform. An image of that key
   already in the store (another request resolved to the same environment) is reused;
3. install: ``uv venv --relocatable`` and ``uv pip sync`` of the lock, files copied (not
   hard-linked to uv's cache, which the image must not depend on);
4. pack: ``mksquashfs`` (zstd, owned by root, no xattrs) to a temporary name;
5. publish: checksum, then rename to ``KEY.sqsh`` beside ``KEY.json`` (its metadata),
   and ``requests/DIGEST.json`` naming the key: a reader sees a whole image or none.

A resolution that fails prints ``corral-error: ...`` with uv's own account of which
package is at fault, and exits 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import proc

STEPS = 5


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


def _uv() -> str:
    here = Path(sys.executable).with_name("uv")
    return str(here) if here.exists() else (shutil.which("uv") or "uv")


def _uv_message(text: str) -> str:
    """uv's explanation, without its colour codes and hints' boilerplate."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("Using ", "Resolved ", "warning:"))]
    return " ".join(keep)[:800] or "uv gave no reason"


def interpreter(python: str) -> dict[str, str]:
    code = ("import json, platform, sys, sysconfig; print(json.dumps({'version': platform.python_version(), "
            "'platform': sysconfig.get_platform(), 'implementation': sys.implementation.name}))")
    return json.loads(proc.run([python, "-c", code], timeout=30).stdout)


def build(req: dict[str, Any]) -> int:
    store = Path(req["store"])
    python = req["python"]
    # The node's own certificate store: a facility's mirror or proxy is signed by the site's CA.
    env = {"UV_CACHE_DIR": req["uv_cache"], "UV_NO_PROGRESS": "1", "NO_COLOR": "1", "UV_SYSTEM_CERTS": "1",
           **({"UV_INDEX_URL": req["index_url"]} if req.get("index_url") else {})}
    uv = _uv()
    with tempfile.TemporaryDirectory(prefix="corral-envbuild-", dir=req.get("staging")) as tmp:
        t = Path(tmp)
        step(1, "resolving with uv")
        for name, text in req["files"].items():
            (t / name).write_text(text)
        source = req["kind"]
        if source == "uv.lock":
            r = proc.run([uv, "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-header",
                          "--project", str(t), "-o", str(t / "exported.txt")], env=env, timeout=600, check=False)
            if r.returncode != 0:
                return fail("could not read the uv.lock: " + _uv_message(r.stderr))
            source = "exported.txt"
        r = proc.run([uv, "pip", "compile", str(t / source), "--python", python, "--no-header", "--quiet",
                      "-o", str(t / "lock.txt")], env=env, timeout=900, check=False)
        if r.returncode != 0:
            return fail("could not resolve the environment: " + _uv_message(r.stderr))
        lock = "\n".join(ln for ln in (t / "lock.txt").read_text().splitlines()
                         if ln.strip() and not ln.lstrip().startswith("#")) + "\n"
        who = interpreter(python)
        key = hashlib.sha256(json.dumps([lock, who["implementation"], who["version"], who["platform"]])
                             .encode()).hexdigest()[:32]
        step(2, f"environment {key}")
        packages = [ln.split(";")[0].strip() for ln in lock.splitlines() if "==" in ln]
        image, meta = store / f"{key}.sqsh", store / f"{key}.json"
        if image.exists() and meta.exists() and not req.get("rebuild"):
            step(5, "reused the image already built for this lock")
        else:
            step(3, f"installing {len(packages)} packages")
            stage = t / "env"
            proc.run([uv, "venv", "--relocatable", "--python", python, "--quiet", str(stage)], env=env, timeout=300)
            r = proc.run([uv, "pip", "sync", str(t / "lock.txt"), "--python", str(stage / "bin" / "python"),
                          "--link-mode", "copy", "--quiet"], env=env, timeout=3600, check=False)
            if r.returncode != 0:
                return fail("could not install the environment: " + _uv_message(r.stderr))
            (stage / "corral-lock.txt").write_text(lock)
            step(4, "packing into squashfs")
            part = store / f".{key}.{os.getpid()}.part"
            r = proc.run(["mksquashfs", str(stage), str(part), "-noappend", "-comp", "zstd", "-all-root",
                          "-no-xattrs", "-quiet", "-no-progress"], timeout=3600, check=False)
            if r.returncode != 0:
                part.unlink(missing_ok=True)
                return fail("could not pack the image (is the store's disk full?): " + (r.stderr or r.stdout)[-300:])
            step(5, "publishing")
            record = {"key": key, "packages": packages, "size": part.stat().st_size, "sha256": sha256_file(part),
                      "python": who["version"], "implementation": who["implementation"],
                      "platform": who["platform"], "interpreter": python, "built_by": req.get("principal"),
                      "created": time.time(), "lock": lock}
            os.chmod(part, 0o444)
            part.rename(image)
            tmp_meta = meta.with_name(meta.name + ".part")
            tmp_meta.write_text(json.dumps(record))
            tmp_meta.rename(meta)
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


if __name__ == "__main__":
    sys.exit(main())
