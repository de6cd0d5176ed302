"""Workspaces and node-local scratch, attacked as the adversarial review H4 did (findings
F3, F6, F10, F21; docs/decisions/0024-workspace-base-as-its-identity.md).

A real root gateway on the local backend, real agents' tokens, jobs in real bubblewrap
running as their dynamic identities, kernel overlayfs. Each test plants what an agent
(or another local user) could plant and asserts that root never wrote, read or listed
through it, and that the caller is told the rule and what to do."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from .conftest import Gateway, running
from .test_privsep import DYNAMIC, run, tokens
from .test_sandbox import need_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="a root gateway's privilege is what is attacked (CI runs as root)")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    need_bwrap()
    with running(tmp_path) as g:
        yield g


def _dir(mode: int, prefix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(mode)
    return d


@pytest.fixture
def base() -> Iterator[Path]:
    """A project every identity may write, as /tmp/h4/vproj2 (0777)."""
    d = _dir(0o777, "corral-base-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def rootonly() -> Iterator[Path]:
    """root's, 0700: what no agent may read or write."""
    d = _dir(0o700, "corral-rootonly-")
    (d / "names").mkdir()
    (d / "names" / "SECRET-NAME-4411").write_text("x")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def someone() -> Iterator[pwd.struct_passwd]:
    """Another person with a Unix user (cloudsdk in the review), owning a private repository."""
    name = f"crlown{os.getpid() % 100000}"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    yield pwd.getpwnam(name)
    subprocess.run(["userdel", name], capture_output=True)


def _fork(gw: Gateway, token: str, body: dict[str, str]) -> dict[str, object]:
    with gw.http(token) as h:
        r = h.post("/v1/workspaces", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, object] = r.json()
    return out


def _commit(gw: Gateway, token: str, ws: object) -> tuple[int, str]:
    with gw.http(token) as h:
        r = h.post(f"/v1/workspaces/{ws}/commit")
    return r.status_code, r.text


def test_a_link_planted_in_the_base_is_never_written_through(gw: Gateway, base: Path, rootonly: Path) -> None:
    """F3: the trial adds sub/x; meanwhile a job in the base makes sub a link to root's
    0700 directory. The commit must refuse (a link where a directory goes), not write
    root's directory."""
    t = tokens(gw, ("bot1", "alice"))
    ws = _fork(gw, t["bot1"], {"base": str(base)})["workspace"]
    assert run(gw, t["bot1"], {"command": "mkdir sub && echo agent-text > sub/x", "workspace": ws})["state"] == \
        "COMPLETED"
    assert run(gw, t["bot1"], {"command": f"ln -s {rootonly} sub", "workdir": str(base)})["state"] == "COMPLETED"
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 409 and "sub/x" in text and "nothing was written" in text, text
    assert not (rootonly / "x").exists() and sorted(p.name for p in rootonly.iterdir()) == ["names"]


def test_a_directory_swapped_for_a_link_after_the_fork_is_refused(gw: Gateway, base: Path, rootonly: Path) -> None:
    """Variants of F3 on a directory the fork saw: modified and deleted files under it,
    and the whole directory deleted, once it is a link to root's directory; and the diff
    never lists what lies behind a link (names in a directory only root may read)."""
    t = tokens(gw, ("bot1", "alice"))
    for d in ("sub", "a/names"):
        (base / d).mkdir(parents=True)
        (base / d / "f").write_text("base\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(base)], check=True)
    ws = _fork(gw, t["bot1"], {"base": str(base)})["workspace"]
    assert run(gw, t["bot1"], {"command": "echo trial > sub/f; echo new > sub/g; rm -r a/names",
                               "workspace": ws})["state"] == "COMPLETED"
    swap = f"mv sub sub.old && ln -s {rootonly} sub && mv a a.old && ln -s {rootonly} a"
    assert run(gw, t["bot1"], {"command": swap, "workdir": str(base)})["state"] == "COMPLETED"
    with gw.http(t["bot1"]) as h:
        diff = h.get(f"/v1/workspaces/{ws}/diff")
    assert diff.status_code == 200 and "SECRET-NAME" not in diff.text, diff.text
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 409 and "sub/f" in text and "sub/g" in text, text
    assert sorted(p.name for p in rootonly.iterdir()) == ["names"]
    assert (rootonly / "names" / "SECRET-NAME-4411").exists()


def test_the_base_itself_swapped_for_a_link_is_neither_written_nor_mounted(gw: Gateway, rootonly: Path) -> None:
    """The base's own parent is writable by the agent (not sticky): it renames the base
    and puts a link to root's directory in its place. The commit refuses; a remount (as
    after a reboot) refuses too, rather than mount root's directory as the lower layer."""
    t = tokens(gw, ("bot1", "alice"))
    outer = _dir(0o777, "corral-outer-")
    try:
        base = outer / "proj"
        base.mkdir(mode=0o777)
        base.chmod(0o777)
        ws = _fork(gw, t["bot1"], {"base": str(base)})
        assert run(gw, t["bot1"], {"command": "echo x > x", "workspace": ws["workspace"]})["state"] == "COMPLETED"
        swap = f"mv proj proj.old && ln -s {rootonly} proj"
        assert run(gw, t["bot1"], {"command": swap, "workdir": str(outer)})["state"] == "COMPLETED"
        code, text = _commit(gw, t["bot1"], ws["workspace"])
        assert code == 409 and "link" in text, text
        subprocess.run(["umount", "-l", str(ws["path"])], check=True)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "ls", "workspace": ws["workspace"], "walltime": "60s"})
        assert r.status_code == 409 and "link" in r.text, r.text
        assert sorted(p.name for p in rootonly.iterdir()) == ["names"]
    finally:
        subprocess.run(["umount", "-l", str(outer / "proj")], capture_output=True)
        shutil.rmtree(outer, ignore_errors=True)


def test_a_fifo_or_a_device_in_the_trial_is_refused_not_read(gw: Gateway, base: Path) -> None:
    """A FIFO left in the workspace: the commit names it and writes nothing (nothing
    blocks on it); a plain file and a link beside it are written once it is gone, the
    link as a link."""
    t = tokens(gw, ("bot1", "alice"))
    ws = _fork(gw, t["bot1"], {"base": str(base)})["workspace"]
    assert run(gw, t["bot1"], {"command": "mkfifo pipe; echo ok > kept.txt; ln -s /etc/hostname host",
                               "workspace": ws})["state"] == "COMPLETED"
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 400 and "pipe" in text and "nothing was written" in text, text
    assert not (base / "kept.txt").exists()
    assert run(gw, t["bot1"], {"command": "rm pipe", "workspace": ws})["state"] == "COMPLETED"
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 200, text
    assert (base / "kept.txt").read_text() == "ok\n" and os.readlink(base / "host") == "/etc/hostname"
    uid = (base / "kept.txt").stat().st_uid
    assert DYNAMIC[0] <= uid <= DYNAMIC[1], uid  # written by the agent's identity, not by root


def test_a_commit_the_callers_identity_may_not_write_is_refused(gw: Gateway, base: Path) -> None:
    """F6, commit: the base stopped being writable by the agent's identity after the fork;
    root could still write it, the agent's identity cannot: refused, nothing written."""
    t = tokens(gw, ("bot1", "alice"))
    ws = _fork(gw, t["bot1"], {"base": str(base)})["workspace"]
    assert run(gw, t["bot1"], {"command": "echo new > new.txt", "workspace": ws})["state"] == "COMPLETED"
    base.chmod(0o755)
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 403 and "may not write" in text and "commits a workspace as that identity" in text, text
    assert "dynamic uid" in text and "nothing was written" in text, text
    assert not (base / "new.txt").exists()


def test_a_sticky_base_keeps_others_files_from_the_commit(gw: Gateway, base: Path) -> None:
    """A sticky, world-writable base (as a shared drop directory): the agent may add files
    but not replace root's; the commit names root's file and writes nothing, rather than
    writing half of it."""
    t = tokens(gw, ("bot1", "alice"))
    (base / "shared.txt").write_text("root's\n")
    (base / "shared.txt").chmod(0o666)
    base.chmod(0o1777)
    ws = _fork(gw, t["bot1"], {"base": str(base)})["workspace"]
    assert run(gw, t["bot1"], {"command": "echo a > a.txt; echo mine > shared.txt",
                               "workspace": ws})["state"] == "COMPLETED"
    code, text = _commit(gw, t["bot1"], ws)
    assert code == 403 and "shared.txt" in text and "a.txt" not in text and "nothing was written" in text, text
    assert not (base / "a.txt").exists() and (base / "shared.txt").read_text() == "root's\n"


def test_a_private_repository_is_not_exported_for_another_identity(gw: Gateway, someone: pwd.struct_passwd) -> None:
    """F6 and F21: another person's 0700 repository (and a 0700 directory) cannot be
    forked by an agent whose identity may not read it, at a revision or in place; what is
    exported for one identity is not readable by anyone else."""
    t = tokens(gw, ("bot1", "alice"))
    repo = _dir(0o700, "corral-private-repo-")
    try:
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / "secret.txt").write_text("BOB-SECRET-99\n")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "private"], check=True)
        subprocess.run(["chown", "-R", f"{someone.pw_uid}:{someone.pw_gid}", str(repo)], check=True)
        for body in ({"base": str(repo), "rev": "HEAD"}, {"base": str(repo)}):
            with gw.http(t["bot1"]) as h:
                r = h.post("/v1/workspaces", json=body)
            msg = r.json()["error"]["message"]
            assert r.status_code == 403 and "cannot be read by dynamic uid" in msg, r.text
            assert "identity your jobs run as" in msg and "SECRET" not in r.text
        scratch = _scratch(gw)
        assert not any("BOB-SECRET" in p.read_text(errors="replace") for p in scratch.rglob("*")
                       if p.is_file() and not p.is_symlink())
        # readable to the agent: exported as its own, 0700, and its manifest is corral's alone
        repo.chmod(0o755)
        ws = _fork(gw, t["bot1"], {"base": str(repo), "rev": "HEAD"})
        trees = [p for p in (scratch / "trees").iterdir()]
        assert len(trees) == 1 and stat.S_IMODE(trees[0].stat().st_mode) == 0o700, trees
        assert DYNAMIC[0] <= trees[0].stat().st_uid <= DYNAMIC[1]
        inplace = _fork(gw, t["bot1"], {"base": str(repo)})
        d = scratch / "workspaces" / str(inplace["workspace"])
        assert stat.S_IMODE((d / "fork.json").stat().st_mode) == 0o600
        for private in (d, scratch / "workspaces", scratch):
            assert stat.S_IMODE(private.stat().st_mode) == 0o711, private
        nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c",
                                 f"cat {trees[0]}/secret.txt; ls {scratch}/workspaces; cat {d}/fork.json"],
                                capture_output=True, text=True)
        assert "BOB-SECRET" not in nobody.stdout and "ws-" not in nobody.stdout and "secret" not in nobody.stdout
        assert ws["workspace"]
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def test_a_repositorys_own_filters_never_run(gw: Gateway, base: Path) -> None:
    """F6 variant: `git archive` applies smudge filters from the repository's own config,
    and ran as root with safe.directory=*; an export runs none (plumbing only)."""
    t = tokens(gw, ("bot1", "alice"))
    marker = Path(tempfile.gettempdir()) / f"corral-smudged-{os.getpid()}"
    git = ["git", "-C", str(base), "-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run(["git", "init", "-q", str(base)], check=True)
    (base / "a.txt").write_text("plain\n")
    (base / ".gitattributes").write_text("* filter=evil\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "config", "filter.evil.smudge", f"sh -c 'id -u >> {marker}; cat'"], check=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(base)], check=True)
    try:
        ws = _fork(gw, t["bot1"], {"base": str(base), "rev": "HEAD"})["workspace"]
        assert not marker.exists(), marker.read_text()
        assert run(gw, t["bot1"], {"command": "cat a.txt", "workspace": ws})["out"] == "plain\n"
    finally:
        marker.unlink(missing_ok=True)


def _scratch(gw: Gateway) -> Path:
    return Path("/var/tmp") / f"corral-{hashlib.sha256(str(gw.home).encode()).hexdigest()[:10]}"


def test_scratch_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    """F10: another local user makes the predictable scratch directory before the gateway
    starts: the gateway refuses to start, naming it and what to do."""
    need_bwrap()
    home = tmp_path / "home"
    scratch = Path("/var/tmp") / f"corral-{hashlib.sha256(str(home).encode()).hexdigest()[:10]}"
    mine = "setpriv --reuid=nobody --regid=nogroup --clear-groups".split()
    subprocess.run([*mine, "mkdir", "-m", "777", str(scratch)], check=True)
    # a file in it: other test sessions' tidying removes empty scratch directories they did not see before
    subprocess.run([*mine, "touch", str(scratch / "planted")], check=True)
    try:
        with pytest.raises(RuntimeError) as e:
            with running(tmp_path):
                pass
        assert f"node-local scratch {scratch} is owned by nobody" in str(e.value), e.value
        assert "rm -r" in str(e.value) and [p.name for p in scratch.iterdir()] == ["planted"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_scratch_remade_after_a_cleaner_is_never_someone_elses(gw: Gateway, base: Path) -> None:
    """F10, after start: a cleaner removed scratch and another user made it again (with a
    world-writable workspaces/ in it). A fork is refused saying why, a job's send does not
    adopt it, and nothing of the victim's lands in it."""
    t = tokens(gw, ("bot1", "alice"))
    scratch = _scratch(gw)
    shutil.rmtree(scratch, ignore_errors=True)  # (other sessions' tidying may have removed it, empty, already)
    mine = "setpriv --reuid=nobody --regid=nogroup --clear-groups".split()
    subprocess.run([*mine, "mkdir", "-m", "755", str(scratch)], check=True)
    subprocess.run([*mine, "mkdir", "-m", "777", str(scratch / "workspaces")], check=True)
    subprocess.run([*mine, "touch", str(scratch / "planted")], check=True)  # kept by other sessions' tidying
    with gw.http(t["bot1"]) as h:
        r = h.post("/v1/workspaces", json={"base": str(base)})
    assert r.status_code == 400 and f"node-local scratch {scratch} is owned by nobody" in r.text, r.text
    job = run(gw, t["bot1"], {"command": "echo results > results.txt", "workdir": str(base)})
    assert job["state"] == "COMPLETED", job
    assert sorted(p.name for p in scratch.iterdir()) == ["planted", "workspaces"]
    assert not any((scratch / "workspaces").iterdir())
    log = (gw.home / "gateway.log").read_text()
    assert f"node-local scratch {scratch} is owned by nobody" in log
    shutil.rmtree(scratch)
    ws = _fork(gw, t["bot1"], {"base": str(base)})  # made again, as the gateway's own
    st = scratch.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o711 and ws["workspace"]
    assert json.dumps(ws).count(str(scratch)) >= 1


def test_the_node_releases_a_workspace_whatever_its_view_holds() -> None:
    """On a cluster's node, root's batch script releases a workspace's view after the work
    (``corral.storage.mounts release``, decision 0036). It asked first whether the view
    held ``.corral-unpacked`` (the mark of an image unpacked in scratch), and the view is
    the agent's to write: that one file made root remove every file the view showed (a
    whiteout in the trial for each, files the agent may not delete too) and leave the
    overlay mounted on the node. A mark is believed only where nothing is mounted (attack46)."""
    from corral.storage import mounts

    agent = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="corral-release-", dir="/var/tmp"))  # takes an overlay's upper layer
    try:
        base = top / "base"
        (base / "kept").mkdir(parents=True)
        (base / "kept" / "file").write_text("root's\n")  # in root's 0755 directory: the agent may not delete it
        os.chown(base, agent.pw_uid, agent.pw_gid)  # the agent's project
        top.chmod(0o755)
        d = top / "ws-1"
        d.mkdir(mode=0o711)
        mounts.on_nodes(base, d)
        assert mounts.main(["workspace", str(d), str(base)]) == 0
        merged = d / "merged"
        work = subprocess.run(["setpriv", f"--reuid={agent.pw_uid}", f"--regid={agent.pw_gid}", "--clear-groups",
                               "sh", "-c", f"echo > {merged}/.corral-unpacked; echo mine > {merged}/made; "
                               f"rm -f {merged}/kept/file || echo not-mine"], capture_output=True, text=True)
        assert work.stdout == "not-mine\n", work
        assert mounts.main(["release", str(d)]) == 0
        assert not mounts.mounted(merged) and os.listdir(merged) == []
        assert not os.path.lexists(d / "upper" / "kept" / "file")  # no whiteout: root deleted nothing
        assert mounts.main(["workspace", str(d), str(base)]) == 0
        assert (merged / "kept" / "file").read_text() == "root's\n" and (merged / "made").read_text() == "mine\n"
    finally:
        mounts.unmount_all(top)
        shutil.rmtree(top, ignore_errors=True)


def test_a_node_mounts_only_the_directory_that_was_forked() -> None:
    """Root mounts a workspace's lower layer on each job's node by its path, when the job
    starts (decision 0036): opened without following links, but as root, whom no
    permission stops. A directory moved to that path since the fork (one the agent's
    identity may not read: another user's, in a project the agent may write) was mounted,
    and the view's root is the trial's own: its names and readable files were the
    agent's to see. The node now mounts only the directory forked (its inode, recorded
    at the fork), else refuses (attack46)."""
    from corral.storage import mounts

    agent, other = pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    top = Path(tempfile.mkdtemp(prefix="corral-lower-", dir="/var/tmp"))
    try:
        top.chmod(0o777)  # a project its agent and others write in
        base, theirs = top / "base", top / "theirs"
        base.mkdir()
        os.chown(base, agent.pw_uid, agent.pw_gid)
        theirs.mkdir(mode=0o700)
        (theirs / "PRIVATE-NAME").write_text("readable, in a closed directory\n")
        (theirs / "PRIVATE-NAME").chmod(0o644)
        os.chown(theirs, other.pw_uid, other.pw_gid)
        d = top / "ws-1"
        d.mkdir(mode=0o711)
        mounts.on_nodes(base, d)
        moved = subprocess.run(["setpriv", f"--reuid={agent.pw_uid}", f"--regid={agent.pw_gid}", "--clear-groups",
                                "sh", "-c", f"mv {base} {top}/was && mv {theirs} {base}"], capture_output=True, text=True)
        assert moved.returncode == 0, moved.stderr
        assert mounts.main(["workspace", str(d), str(base)]) == 1
        assert not mounts.mounted(d / "merged")
        seen = subprocess.run(["setpriv", f"--reuid={agent.pw_uid}", f"--regid={agent.pw_gid}", "--clear-groups",
                               "sh", "-c", f"ls {d}/merged; cat {d}/merged/PRIVATE-NAME"], capture_output=True, text=True)
        assert "PRIVATE-NAME" not in seen.stdout and "closed directory" not in seen.stdout, seen
    finally:
        mounts.unmount_all(top)
        shutil.rmtree(top, ignore_errors=True)
