"""The descriptor walks a workspace's base is touched through (corral/storage/basefs.py,
basework.py), attacked directly: the races and odd files an agent can set up between
a check and a write, and a git tree crafted to climb out of its export."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from corral.storage import basefs, basework


def test_a_link_in_any_component_is_refused_never_followed(tmp_path: Path) -> None:
    """A directory swapped for a link after the commit's check: the write's own walk
    (creating what is missing) stops at the link; nothing lands where it points."""
    base, target = tmp_path / "base", tmp_path / "target"
    (base / "a").mkdir(parents=True)
    target.mkdir()
    top = basefs.open_root(str(base))
    try:
        os.rename(base / "a", base / "a.old")
        os.symlink(target, base / "a")
        with pytest.raises(OSError):
            basefs.walk(top, ["a", "b"], create=True)
        with pytest.raises(OSError):
            basefs.lstat_at(top, "a/x")
    finally:
        os.close(top)
    assert list(target.iterdir()) == []
    with pytest.raises(basefs.Refused, match="link"):
        basefs.open_root(str(base / "a"))


def test_a_fifo_is_never_read_and_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    top = basefs.open_root(str(tmp_path))
    done = threading.Event()

    def read() -> None:
        with pytest.raises(basefs.Refused, match="not a regular file"):
            basefs.open_file(top, "pipe")
        done.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert done.wait(10), "opening a FIFO blocked"
    finally:
        os.close(top)


def test_a_git_tree_that_climbs_out_is_refused(tmp_path: Path) -> None:
    """A tree crafted with `git mktree` holding '..' and '.git' entries (which checkout
    would refuse): the export refuses it; nothing is written beside the export."""
    repo, into = tmp_path / "repo", tmp_path / "out" / "tree"
    into.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    blob = subprocess.run([*git, "hash-object", "-w", "--stdin"], input="pwn\n", capture_output=True, text=True,
                          check=True).stdout.strip()
    for names in (["..", "ok"], [".git", "ok"]):
        listing = "".join(f"100644 blob {blob}\t{n}\n" for n in names)
        tree = subprocess.run([*git, "mktree"], input=listing, capture_output=True, text=True, check=True).stdout
        commit = subprocess.run([*git, "commit-tree", tree.strip(), "-m", "x"], capture_output=True, text=True,
                                check=True).stdout.strip()
        for p in into.iterdir():
            p.unlink()
        try:
            basework.export({"repo": str(repo), "rev": commit, "into": str(into)})
        except basefs.Refused as e:
            assert ".." in e.message
        else:
            assert names[0] == ".git" and sorted(p.name for p in into.iterdir()) == ["ok"]
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tree"]


def test_revisions_that_look_like_options_are_refused(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for rev in ("--output=/tmp/x", "-h", "a\nb"):
        with pytest.raises(basefs.Refused, match="not a revision"):
            basework.export({"repo": str(tmp_path), "rev": rev})


def test_manifest_and_listing_never_follow_links(tmp_path: Path) -> None:
    base, elsewhere = tmp_path / "base", tmp_path / "elsewhere"
    base.mkdir()
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "SECRET").write_text("x")
    os.symlink(elsewhere, base / "link")
    (base / "f").write_text("f")
    got = basework.manifest({"base": str(base)})
    assert sorted(got) == ["f", "link"]
    assert "SECRET" not in str(basefs.listing(str(base)))


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="a root mount is what is attacked")
def test_a_slurm_node_never_mounts_in_scratch_someone_else_made(tmp_path: Path) -> None:
    """H4 F10 on a batch node: the job script (root) mounts the image under
    /var/tmp/corral-<hash>/images; another user made that directory first on this node,
    with a link where the mount point goes. Refused, naming it; nothing mounted."""
    import shutil
    import sys

    from corral.storage.mounts import under

    image = tmp_path / "img.sqsh"
    image.write_bytes(b"not mounted")
    scratch = Path(f"/var/tmp/corral-f10node{os.getpid()}")
    mine = "setpriv --reuid=nobody --regid=nogroup --clear-groups".split()
    subprocess.run([*mine, "mkdir", "-p", "-m", "777", str(scratch / "images")], check=True)
    subprocess.run([*mine, "ln", "-s", str(tmp_path), str(scratch / "images" / "KEY")], check=True)
    try:
        r = subprocess.run([sys.executable, "-m", "corral.storage.mounts", "image", str(image),
                            str(scratch / "images" / "KEY")], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        assert r.returncode == 1 and f"node-local scratch {scratch} is owned by nobody" in r.stderr, r.stderr
        assert not under(tmp_path) and not under(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
