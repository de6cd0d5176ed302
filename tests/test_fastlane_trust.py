"""The fast lane across privilege (issue 47, decision 0040), attacked as a pool's Unix
user who has read the code: a root gateway, a real pool user, its real pilot.

- what a worker sends is never unpickled by root: a worker that answers a batch with a
  crafted object, and a peer that sends Dask's pickled frame to the pool's address with
  the pool's files, make root run nothing, and the task fails saying why;
- a pilot imports nothing from its working directory, its PYTHONPATH or /tmp;
- the pool user holds its own key, never the CA's, and root writes nothing of the pool's
  trust where that user can put a link;
- the journals root reads back are plain files, read without following links.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from corral.core.paths import CODE_ROOT

from .conftest import Gateway, running, temporary_user

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a root gateway and a pool user of its own")
FAST = {"CORRAL_FASTLANE_CPUS": "2", "CORRAL_FASTLANE_MEMORY_MB": "1024"}


@pytest.fixture
def pool_user() -> Iterator[pwd.struct_passwd]:
    with temporary_user("corralp", kill=True) as u:
        yield u


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the pool user reads (the attacker's programs) and one only root writes
    (where a marker appears only if root ran the attacker's command)."""
    d = Path(tempfile.mkdtemp(prefix="corral-trust-", dir="/tmp"))
    d.chmod(0o755)
    (d / "root-only").mkdir(mode=0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def person(gw: Gateway, user: str) -> str:
    """A person whose fast tasks run in the pool of ``user``: -> its token."""
    with gw.http() as h:
        r = h.post("/v1/principals", json={"name": "dana", "kind": "human", "unix_user": user, "account": "proj"})
        assert r.status_code == 201, r.text
        return h.post("/v1/tokens", json={"for": "dana", "expires": "1h"}).json()["token"]


def fast_task(gw: Gateway, token: str, command: str = "true", timeout: float = 90) -> dict[str, Any]:
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": command, "lane": "fast", "walltime": "1m", "workdir": "/tmp"})
        assert r.status_code == 201, r.text
        return h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": timeout}).json()


def pilot_args(gw: Gateway) -> dict[str, str]:
    """--scheduler and --tls-dir of this gateway's pilot, as anyone reads them in ps."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = [a.decode() for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
        except OSError:
            continue
        if "corral.lanes.fast.worker" in argv and str(gw.home) in " ".join(argv):
            return {k: argv[argv.index(k) + 1] for k in ("--scheduler", "--tls-dir")}
    raise AssertionError("no pilot of this gateway runs")


def as_user(user: pwd.struct_passwd, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--",
                           sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd="/")


# -- nothing a worker sends is unpickled by root ----------------------------------------------

EVIL_WORKER = """
import os, sys
sys.path.insert(0, {root!r})
from corral.lanes.fast import launcher

class Evil:
    def __reduce__(self):
        return (os.system, ({cmd!r},))

def run_batch(*args, **kw):
    return [Evil()]

launcher.run_batch = run_batch
from corral.lanes.fast.worker import main
main()
"""


@ROOT_ONLY
def test_a_worker_answering_with_a_crafted_object_makes_root_run_nothing(tmp_path: Path, shared: Path,
                                                                         pool_user: pwd.struct_passwd) -> None:
    """The pool's user runs its pilot (here through the worker's Python, which the pool's
    user controls on its nodes anyway): its answer to a batch is an object whose
    unpickling runs a command. Before, Dask's client in the root gateway unpickled it and
    root made the marker; now the answer is plain data or nothing, and the task fails
    saying what its worker did."""
    marker = shared / "root-only" / "pwned"
    (shared / "evil.py").write_text(EVIL_WORKER.format(root=str(CODE_ROOT), cmd=f"touch {marker}"))
    evil = shared / "python"  # the worker's Python: whatever comes before the module's name is dropped
    evil.write_text("#!/bin/bash\n"
                    "while [ $# -gt 0 ] && [ \"$1\" != corral.lanes.fast.worker ]; do shift; done; shift\n"
                    f"exec {sys.executable} -I {shared / 'evil.py'} \"$@\"\n")
    evil.chmod(0o755)
    with running(tmp_path, cpus=4, CORRAL_FASTLANE_PYTHON=str(evil), **FAST) as gw:
        job = fast_task(gw, person(gw, pool_user.pw_name), timeout=60)
    assert not marker.exists(), "root ran the worker's command"
    assert job["state"] == "FAILED", job
    assert "worker" in job["reason"] and "Evil" in job["reason"], job["reason"]


DASK_PEER = """
import asyncio, os
from distributed.comm import connect
from distributed.protocol.serialize import ToPickle
from distributed.security import Security

class Evil:
    def __reduce__(self):
        return (os.system, ({cmd!r},))

async def main():
    d = {tls!r}
    sec = Security(tls_ca_file=d + "/ca.pem", tls_client_cert=d + "/cert.pem", tls_client_key=d + "/key.pem",
                   require_encryption=True)
    try:
        comm = await asyncio.wait_for(connect({addr!r}, timeout=10, **sec.get_connection_args("client")), 20)
        await comm.write({{"op": "identity", "x": ToPickle(Evil())}})
        await asyncio.sleep(2)
        print("sent")
    except Exception as e:
        print("refused:", type(e).__name__, e)

asyncio.run(main())
"""


@ROOT_ONLY
def test_a_peer_sending_a_pickled_frame_with_the_pools_files_makes_root_run_nothing(
        tmp_path: Path, shared: Path, pool_user: pwd.struct_passwd) -> None:
    """The pool's user holds what its workers join with; it connects to the pool's address
    itself and sends Dask's pickled frame (which Dask unpickles on every message, whatever
    its settings). Before, the root gateway's scheduler unpickled it; now that address
    speaks corral's protocol, and the pool goes on working."""
    pytest.importorskip("distributed")
    marker = shared / "root-only" / "pwned"
    with running(tmp_path, cpus=4, **FAST) as gw:
        token = person(gw, pool_user.pw_name)
        assert fast_task(gw, token)["state"] == "COMPLETED"
        args = pilot_args(gw)
        said = as_user(pool_user, DASK_PEER.format(cmd=f"touch {marker}", tls=args["--tls-dir"],
                                                   addr=args["--scheduler"]))
        time.sleep(1)
        assert not marker.exists(), f"root ran the peer's command ({said.stdout} {said.stderr[-500:]})"
        assert fast_task(gw, token)["state"] == "COMPLETED"


# -- a pilot imports nothing from where others write -----------------------------------------

PLANTED = ("corral", "json", "ssl", "argparse", "asyncio", "selectors", "dask", "msgpack", "cryptography")


def test_a_pilot_imports_nothing_planted_in_its_directory_or_path(tmp_path: Path) -> None:
    """The pilot's command, as the gateway makes it for every lane, run as a pilot job runs
    it (the local backend starts it in /tmp): modules planted in its working directory or
    on a PYTHONPATH someone set are never imported."""
    from corral.core.config import FastLaneSettings
    from corral.lanes.fast.model import PoolKey
    from corral.lanes.fast.pilots import Pilots
    from corral.lanes.fast.model import Shape

    cwd, elsewhere, marks = tmp_path / "cwd", tmp_path / "path", tmp_path / "marks"
    for d in (cwd, elsewhere, marks):
        d.mkdir()
    for name in PLANTED:
        for d in (cwd, elsewhere):
            (d / f"{name}.py").write_text(f"open({str(marks / name)!r} + '-' + {d.name!r}, 'w').close()\n")
    site = SimpleNamespace(key=PoolKey(None, None, None), address="tls://127.0.0.1:9", dir=tmp_path / "pool")
    spec = Pilots(FastLaneSettings(), None, None, None, None).spec(site, Shape(1, 256, 0, 60))  # type: ignore[arg-type]
    env = {"PATH": os.environ["PATH"], **spec.env}
    env["PYTHONPATH"] = f"{elsewhere}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(elsewhere)
    r = subprocess.run(["bash", "-c", f"{spec.command} --help"], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    assert not list(marks.iterdir()), f"imported from a planted module: {sorted(p.name for p in marks.iterdir())}"
    assert r.returncode == 0 and "--scheduler" in r.stdout, r.stderr[-2000:]  # and it still runs corral's worker


def _python_starts(tree: Any) -> Iterator[tuple[int, str]]:
    """(line, text) of each argv list or f-string command in ``tree`` that starts a Python
    with -m or -c: a list holding "-m"/"-c" beside a Python (sys.executable, a name or
    string saying python), or an f-string with " -m "/" -c " after one."""
    import ast

    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            text = ast.unparse(node)
            if {"-m", "-c"} & set(words) and ("executable" in text or "python" in text.lower()):
                yield node.lineno, text
        elif isinstance(node, ast.JoinedStr):
            text = ast.unparse(node)
            if (" -m " in text or " -c " in text) and ("executable" in text or "python" in text.lower()):
                yield node.lineno, text


def test_every_python_corral_starts_is_isolated() -> None:
    """Each place corral starts an interpreter of its own (pilots, workers' relays, the
    egress proxy, the local backend's supervisor, the image build's pack step, the shims'
    helper) says -I: nothing from its working directory or PYTHON* variables. (The
    canary's and red team's strings are commands a job runs, not corral's.)"""
    import ast

    found = []
    for p in sorted((CODE_ROOT / "corral").rglob("*.py")):
        if p.name in ("canary.py", "redteam.py"):
            continue
        for line, text in _python_starts(ast.parse(p.read_text())):
            if "-I" not in text:
                found.append(f"{p.relative_to(CODE_ROOT)}:{line}: {text[:100]}")
    assert not found, "started without -I:\n" + "\n".join(found)
    from corral.edges.shims.helper import LAUNCHER  # the shims' own launchers: the Python one and the compiled one

    assert LAUNCHER.startswith("#!{python} -IS\n")
    assert 'av[k++] = "-I";' in (CODE_ROOT / "corral" / "edges" / "shims" / "launcher.c").read_text()


# -- the pool user holds its own key, never the CA's ---------------------------------------------

FIND_KEYS = """
import os, sys
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key

def pub(k):
    return k.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

tls, home = sys.argv[1], sys.argv[2]
ca = x509.load_pem_x509_certificate(open(tls + "/ca.pem", "rb").read())
mine = x509.load_pem_x509_certificate(open(tls + "/cert.pem", "rb").read())
print("self-signed" if mine.issuer == mine.subject else "issued")
own = load_pem_private_key(open(tls + "/key.pem", "rb").read(), None)
print("own key" if pub(own.public_key()) == pub(mine.public_key()) else "a key not its certificate's")
others = 0
for top in (home, tls, "/tmp"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                data = open(p, "rb").read(1 << 20)
            except OSError:
                continue
            if b"PRIVATE KEY" not in data:
                continue
            try:
                k = load_pem_private_key(data, None)
            except Exception:
                continue
            if pub(k.public_key()) == pub(ca.public_key()):
                print("CA KEY", p)
            # other keys counted in this gateway's places only: /tmp holds clones' venvs
            # (tornado's test key) and other tests' pools
            elif top != "/tmp" and pub(k.public_key()) != pub(own.public_key()):
                others += 1
print("other keys", others)
"""


@ROOT_ONLY
def test_the_pool_user_cannot_read_the_ca_key(tmp_path: Path, pool_user: pwd.struct_passwd) -> None:
    """Before, a pool's one key was its CA's and the pool user's file: whoever held it could
    sign any certificate the pool trusts, or pose as its scheduler. Now the user reads its
    own key and a certificate the CA issued; the CA's key exists nowhere it can read."""
    with running(tmp_path, cpus=4, **FAST) as gw:
        assert fast_task(gw, person(gw, pool_user.pw_name))["state"] == "COMPLETED"
        tls = pilot_args(gw)["--tls-dir"]
        r = subprocess.run(["setpriv", f"--reuid={pool_user.pw_uid}", f"--regid={pool_user.pw_gid}", "--clear-groups",
                            "--", sys.executable, "-I", "-c", FIND_KEYS, tls, str(gw.home)],
                           capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CA KEY" not in r.stdout, r.stdout
    # its own key, on a certificate the CA issued, and no other (the old check counted any key it
    # could read, and passed on tornado's test key in a venv under /tmp, not finding its own)
    assert r.stdout.splitlines()[:2] == ["issued", "own key"] and "other keys 0" in r.stdout, r.stdout


@ROOT_ONLY
def test_root_writes_nothing_of_the_pool_through_its_users_links(tmp_path: Path, shared: Path,
                                                                 pool_user: pwd.struct_passwd) -> None:
    """The pool's directory is its user's. Before, a restarted gateway wrote the pool's TLS
    files there (truncating and chowning through whatever link stood at their names: a
    link to /etc/shadow made it the user's) and its sandbox profile; the user's links
    there now lead root nowhere."""
    canaries = shared / "root-only"
    for name in ("ca.pem", "cert.pem", "key.pem", "sandbox.json"):
        (canaries / name).write_text("CANARY\n")
    with running(tmp_path, cpus=4, **FAST) as gw:
        token = person(gw, pool_user.pw_name)
        assert fast_task(gw, token)["state"] == "COMPLETED"
        pool = gw.home / "fastlane" / f"{pool_user.pw_name}-proj-_"
        assert pool.stat().st_uid == pool_user.pw_uid
        plant = ("import os\n"
                 f"p = {str(pool)!r}\n"
                 "for n in ('tls', 'sandbox.json', 'journals'):\n"
                 "    t = os.path.join(p, n)\n"
                 "    if os.path.isdir(t) and not os.path.islink(t):\n"
                 "        os.rename(t, t + '.old')\n"
                 "    elif os.path.lexists(t):\n"
                 "        os.unlink(t)\n"
                 f"os.symlink({str(canaries)!r}, os.path.join(p, 'tls'))\n"
                 f"os.symlink({str(canaries / 'sandbox.json')!r}, os.path.join(p, 'sandbox.json'))\n"
                 f"os.symlink({str(canaries)!r}, os.path.join(p, 'journals'))\n")
        r = as_user(pool_user, plant)
        assert r.returncode == 0, r.stderr
        gw.kill()
        gw.start()
        assert fast_task(gw, token)["state"] == "COMPLETED"
    for f in canaries.iterdir():
        st = f.lstat()
        assert st.st_uid == 0 and f.read_text() == "CANARY\n", f"root wrote or gave away {f}"


# -- the journals root reads back --------------------------------------------------------------

def test_journals_are_read_as_plain_files_without_following_links(tmp_path: Path) -> None:
    """A lost batch's outcomes are read from its worker's journals, in a directory of the
    pool's user: a FIFO there held the gateway's event loop for ever, a link made root read
    another's file, and a record was believed whatever it held."""
    from corral.lanes.fast.launcher import JOURNALS, read_journals

    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"job_id": 7, "event": "ended", "state": "COMPLETED", "reason": "SECRET"}\n')
    d = tmp_path / "pool" / JOURNALS
    d.mkdir(parents=True)
    os.mkfifo(d / "held.jsonl")
    (d / "link.jsonl").symlink_to(secret)
    (d / "w.jsonl").write_text('{"job_id": 1, "event": "ended", "state": "COMPLETED", "exit_code": 0, "end": 5.0}\n'
                               '{"job_id": 2, "event": "ended", "state": "PWNED"}\n'
                               '{"job_id": [3], "event": "ended", "state": "FAILED"}\n'
                               '{"job_id": 4, "event": "ended", "state": "FAILED", "reason": {"x": 1}}\n'
                               # an int no float holds: OverflowError stopped every read, and the lane's start
                               f'{{"job_id": 5, "event": "ended", "state": "FAILED", "start": {10 ** 400}}}\n'
                               f'{{"job_id": 6, "event": "started", "start": {10 ** 400}}}\n')
    got: list[dict[int, dict[str, Any]]] = []
    t = threading.Thread(target=lambda: got.append(read_journals(tmp_path / "pool")), daemon=True)
    t.start()
    t.join(10)
    assert got, "reading the journals blocked on a FIFO"
    journal = got[0]
    assert 7 not in journal and set(journal) == {1, 4, 5, 6}, journal
    assert journal[5]["start"] is None and journal[6]["start"] is None
    assert journal[1]["state"] == "COMPLETED" and journal[4]["reason"] is None
