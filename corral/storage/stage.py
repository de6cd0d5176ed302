"""The untrusted half of an environment build: resolve, download and install, run as the
REQUESTER's job (its identity, its sandbox: only what its jobs may reach, the index
through the facility's egress allow-list), never as corral (H4-report F2; decision 0025).

Resolving and installing can run a package's own code (an sdist's build backend), so it
runs where that code can do no more than the requester's own jobs. Standard library only:
the gateway copies this file into the build's directory and the job runs it with the
facility's Python (``[storage] python``), from its working directory:

    python3 -I -S STAGE/stage.py STAGE

``STAGE/request.json`` (corral's, read-only to the job) says what to build; the job
writes only ``STAGE/out/`` (``lock.txt``, ``env/``) and the uv cache of its identity.
Packing ``out/env`` into an image and publishing it is corral's (build.py), which reads
it without following links and keeps only the requester's own files.

Progress: ``corral-progress N/5 WHAT`` on stdout; a failure: ``corral-error: WHY``, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

STEPS = 5


def step(n: int, what: str) -> None:
    print(f"corral-progress {n}/{STEPS} {what}", flush=True)


def fail(message: str) -> int:
    print(f"corral-error: {message}", flush=True)
    return 2


def uv_message(text: str) -> str:
    """uv's explanation, without its colour codes and hints' boilerplate."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("Using ", "Resolved ", "warning:"))]
    return " ".join(keep)[:800] or "uv gave no reason"


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stage(where: str) -> int:
    with open(os.path.join(where, "request.json"), encoding="utf-8") as f:
        req = json.load(f)
    out = os.path.join(where, "out")
    uv, python = req["uv"], req["python"]
    env = {k: v for k, v in os.environ.items() if k in req["keep_env"]}
    env.update({"UV_CACHE_DIR": req["uv_cache"], "UV_NO_PROGRESS": "1", "NO_COLOR": "1", "UV_SYSTEM_CERTS": "1",
                "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "HOME": out, "PATH": "/usr/bin:/bin",
                **({"UV_INDEX_URL": req["index_url"]} if req.get("index_url") else {})})
    if not os.access(uv, os.X_OK):
        return fail(f"this job cannot run uv ({uv}); the facility's admin installs uv where jobs may run it")
    step(1, "resolving with uv")
    files = os.path.join(out, "request")
    os.makedirs(files, exist_ok=True)
    for name, text in req["files"].items():
        with open(os.path.join(files, name), "w", encoding="utf-8") as f:
            f.write(text)
    source = req["kind"]
    if source == "uv.lock":
        r = run([uv, "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-header", "--project", files,
                 "-o", os.path.join(files, "exported.txt")], env, 600)
        if r.returncode != 0:
            return fail("could not read the uv.lock: " + uv_message(r.stderr))
        source = "exported.txt"
    lock = os.path.join(out, "lock.txt")
    r = run([uv, "pip", "compile", os.path.join(files, source), "--python", python, "--no-header", "--quiet",
             "-o", lock], env, 900)
    if r.returncode != 0:
        return fail("could not resolve the environment: " + uv_message(r.stderr))
    with open(lock, encoding="utf-8") as f:
        pins = [ln for ln in f.read().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    step(2, f"resolved {len(pins)} packages")
    step(3, f"installing {len(pins)} packages")
    stage_env = os.path.join(out, "env")
    r = run([uv, "venv", "--relocatable", "--python", python, "--quiet", stage_env], env, 300)
    if r.returncode != 0:
        return fail("could not make the environment: " + uv_message(r.stderr))
    r = run([uv, "pip", "sync", lock, "--python", os.path.join(stage_env, "bin", "python"), "--link-mode", "copy",
             "--quiet"], env, 3600)
    if r.returncode != 0:
        return fail("could not install the environment: " + uv_message(r.stderr))
    print("corral-staged", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -I -S stage.py STAGE_DIR", file=sys.stderr)
        return 2
    try:
        return stage(argv[0])
    except Exception as e:  # the build's log is what the requester reads: one line, no trace
        return fail(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
