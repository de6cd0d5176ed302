"""What a contained job sees of homes is decided by allow-list (issue 46 item 5).

A root of homes (``/home``) is emptied whole and only the job's identity's own home is
bound back: a home or a file made after the gateway, or after the job's built sandbox,
started is never seen; ``/root`` is empty whatever it holds. Real bwrap, real gateway.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from corral.sandbox import bwrap
from corral.sandbox.bwrap import Sandbox, home_roots

from .conftest import running
from .test_sandbox import SECRET, need_bwrap, pair, run_job

LOOK = "ls -A /home | tr '\\n' ' '; echo '|'; ls -A /root | tr '\\n' ' '; echo '|'; cat /home/*/secret 2>&1 | head -1"


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the gateway contains jobs as other identities only when it runs as root")


@pytest.fixture
def late() -> Iterator[dict[str, Path]]:
    """A home and a file in /root, made by the test when it says (after the gateway started)."""
    need_root()  # only root makes a home and writes in /root
    tag = secrets.token_hex(4)
    made = {"home": Path(f"/home/zzlate{tag}"), "root": Path(f"/root/zzlate{tag}")}
    yield made
    shutil.rmtree(made["home"], ignore_errors=True)
    made["root"].unlink(missing_ok=True)


def make_late(made: dict[str, Path]) -> None:
    made["home"].mkdir(parents=True)
    (made["home"] / "secret").write_text(SECRET)
    made["home"].chmod(0o755)
    (made["home"] / "secret").chmod(0o644)
    made["root"].write_text(SECRET)


@pytest.mark.parametrize("lane", ["batch", "fast"])
def test_a_home_made_after_the_sandbox_was_built_is_not_seen(tmp_path, late, lane) -> None:
    """The first job builds the principal's sandbox for its directory (kept for the next
    ones); a home and a file in /root made then are invisible to the next job in it."""
    need_bwrap()
    need_root()
    work = Path(tempfile.mkdtemp(prefix="corral-allow-", dir="/var/tmp"))
    work.chmod(0o777)
    try:
        with running(tmp_path) as gw:
            tokens = pair(gw)
            with gw.http(tokens["bot1"]) as h:
                def look() -> str:
                    r = h.post("/v1/jobs", json={"command": LOOK, "workdir": str(work), "walltime": "30s", "lane": lane})
                    assert r.status_code == 201, r.text
                    job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
                    assert job["state"] == "COMPLETED", job
                    return h.get(f"/v1/jobs/{job['id']}/output").json()["data"]

                before = look()
                make_late(late)
                after = look()
        homes, root, _ = (part.strip() for part in after.split("|"))
        assert late["home"].name not in after and SECRET not in after, after
        assert root == "", (before, after)
        assert homes == "", after  # the agent runs as an identity of its own, with no home under /home
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_job_of_a_user_sees_its_own_home_and_no_other(tmp_path, late) -> None:
    """A job that becomes a Unix user with a home under /home sees that home (read-only,
    its credentials emptied) and nothing else there, existing or made later."""
    need_bwrap()
    need_root()
    name = f"zzown{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    try:
        home = Path(pwd.getpwnam(name).pw_dir)
        (home / "notes.txt").write_text("mine\n")
        (home / ".ssh").mkdir()
        (home / ".ssh" / "id_ed25519").write_text(SECRET)
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        other = Path(f"/home/zzoth{secrets.token_hex(3)}")  # another person's, with a credential hidden by name
        (other / ".ssh").mkdir(parents=True)
        other.chmod(0o755)
        box = Sandbox(frozenset({"agent"}), (other / ".ssh", home / ".ssh"), run_as="nobody", homes=(home, other),
                      home_roots=tuple(home_roots([home, other])))
        lines = box.shell("agent", ["bash", "-c", LOOK.replace("cat /home/*/secret", f"cat {home}/notes.txt") +
                                    f"; ls -A {home}/.ssh | wc -l; id -un"], "/tmp", user=name, root=True)
        make_late(late)  # after the script was written, before it runs (a batch job on its node)
        r = subprocess.run(["bash", "-c", lines], capture_output=True, text=True, timeout=30)
        homes, root, rest = (part.strip() for part in r.stdout.split("|"))
        assert homes == name and root == "", r
        assert rest.split() == ["mine", "0", name], r
        now = box.wrap("agent", ["bash", "-c", "ls -A /home"], "/tmp", user=name, root=True)
        assert subprocess.run(now, capture_output=True, text=True, timeout=30).stdout.split() == [name]
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(f"/home/{other.name}" if "other" in locals() else "/nonexistent", ignore_errors=True)


def test_roots_of_homes_are_never_system_directories(tmp_path) -> None:
    """A home directly under /srv or /opt hides that home by name, never the directory
    that also holds software or projects."""
    roots = home_roots([Path("/srv/alice"), Path("/opt/bob"), tmp_path / "users" / "carol"])
    assert Path("/srv") not in roots and Path("/opt") not in roots and Path("/") not in roots
    assert Path(os.path.realpath(tmp_path / "users")) in roots
    solo = tmp_path / "solo"
    solo.mkdir()
    box = Sandbox(frozenset({"agent"}), (), homes=(solo,), home_roots=(Path("/home"),))
    argv = box.wrap("agent", ["true"], "/tmp", root=False)
    assert argv[argv.index(str(solo)) - 1] == "--tmpfs" and argv[argv.index("/home") - 1] == "--tmpfs"


@pytest.mark.parametrize("lane", ["batch", "fast"])
def test_a_venv_under_tmp_is_bound_and_a_link_there_is_never_followed(tmp_path, late, lane) -> None:
    """The submitter's VIRTUAL_ENV under /tmp is in the job (its private /tmp would hide
    it); one that is a link, swapped in to reach a hidden home, fails the job saying so
    and shows nothing of where it leads (bwrap, run by root, would have followed it)."""
    need_bwrap()
    need_root()
    make_late(late)
    top = Path(tempfile.mkdtemp(prefix="zzvenv-", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="corral-allow-", dir="/var/tmp"))
    try:
        top.chmod(0o755)
        work.chmod(0o777)
        venv = top / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "hello").write_text("#!/bin/sh\necho hello from the venv\n")
        (venv / "bin" / "hello").chmod(0o755)
        (top / "link").symlink_to(late["home"])
        with running(tmp_path) as gw:
            tokens = pair(gw)
            with gw.http(tokens["bot1"]) as h:
                def run(env: dict[str, str], command: str) -> tuple[dict, str]:
                    r = h.post("/v1/jobs", json={"command": command, "workdir": str(work), "walltime": "30s",
                                                 "lane": lane, "env": env})
                    assert r.status_code == 201, r.text
                    job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
                    out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
                    return job, out

                job, out = run({"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"}, "hello")
                assert job["state"] == "COMPLETED" and out == "hello from the venv\n", (job, out)
                link = str(top / "link")
                job, out = run({"VIRTUAL_ENV": link}, f"ls -A {link}; cat {link}/secret")
        assert SECRET not in out and "secret" not in out, out
        assert job["state"] == "FAILED", job
        assert "without following a link" in (job.get("reason") or ""), job
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_a_job_sees_no_home_but_its_own_whoever_runs_the_gateway(tmp_path) -> None:
    """Root's gateway (the agent runs as an identity of its own, with no home) or a plain
    user's (the agent runs as that user): /home shows the job's own home at most, though
    other homes are there, and /root shows nothing."""
    need_bwrap()
    others = [p.name for p in Path("/home").iterdir()] if Path("/home").is_dir() else []
    mine = Path(pwd.getpwuid(os.getuid()).pw_dir)
    expected = [mine.name] if os.getuid() != 0 and mine.parent == Path("/home") else []
    work = Path(tempfile.mkdtemp(prefix="corral-allow-", dir="/var/tmp"))
    work.chmod(0o777)
    try:
        # A plain user's gateway is that person's own, as `make run` starts it (decision 0046).
        with running(tmp_path, **({} if os.getuid() == 0 else {"CORRAL_PERSONAL": "true"})) as gw:
            tokens = pair(gw)
            job = run_job(gw, tokens["bot1"], "ls -A /home; echo '|'; ls -A /root 2>/dev/null", work)
        assert job["state"] == "COMPLETED", job
        homes, root = (part.split() for part in job["out"].split("|"))
        assert homes == expected and root == [], (job["out"], others)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_home_that_is_a_link_is_bound_where_it_lies_with_its_credentials_hidden(tmp_path) -> None:
    """/home/NAME -> /var/tmp/.../users/NAME: its credentials are hidden where they really
    lie, so the home is bound there too (bound by its name, bwrap followed the link and
    the .ssh hidden at the real path was not over it); its name still leads to it."""
    need_bwrap()
    need_root()
    name = f"zzlnk{secrets.token_hex(3)}"
    data = Path(tempfile.mkdtemp(prefix="zzdata-", dir="/var/tmp"))
    real = data / "users" / name
    subprocess.run(["useradd", "--no-create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    try:
        (real / ".ssh").mkdir(parents=True)
        (real / ".ssh" / "id_ed25519").write_text(SECRET)
        (real / "notes.txt").write_text("mine\n")
        for p in (data, data / "users"):
            p.chmod(0o755)
        subprocess.run(["chown", "-R", f"{name}:{name}", str(real)], check=True)
        Path(f"/home/{name}").symlink_to(real)
        bwrap._home_of.cache_clear()  # a uid the test before gave another user (deleted since)
        box = Sandbox(frozenset({"agent"}), (real / ".ssh",), run_as="nobody", homes=(real,),
                      home_roots=tuple(home_roots([real])))
        look = f"cat ~/notes.txt; ls -A ~/.ssh | wc -l; cat {real}/.ssh/id_ed25519 2>/dev/null; ls -A /home"
        for argv in (box.wrap("agent", ["bash", "-c", look], "/tmp", user=name, root=True),
                     ["bash", "-c", box.shell("agent", ["bash", "-c", look], "/tmp", user=name, root=True)]):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"HOME": f"/home/{name}",
                                                                                    "PATH": "/usr/bin:/bin"})
            assert SECRET not in r.stdout + r.stderr, r
            assert r.stdout.split() == ["mine", "0", name], r
    finally:
        Path(f"/home/{name}").unlink(missing_ok=True)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
