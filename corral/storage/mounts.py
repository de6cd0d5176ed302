"""Mounts where a job starts: an environment image read-only, a workspace's overlay.

Images, in order of preference (the first this node allows is taken, and the answer
says which and why):

1. ``kernel``: the kernel's squashfs over a loop device (needs root, or a node whose
   admin mounts for corral): no daemon, the page cache shared by every job on the node;
2. ``squashfuse``: the same image through FUSE (needs ``/dev/fuse`` and the Debian
   package ``squashfuse``), for a gateway or a Slurm job that is not root;
3. ``unpacked``: ``unsquashfs`` once into node-local scratch, the last resort, for a
   node with neither (the files are then local, so the shared filesystem still sees
   none of the imports' metadata calls).

Workspaces: the kernel's overlayfs (root), else ``fuse-overlayfs``. On a cluster a
workspace is mounted by each job's batch script on the node the job runs on
(``workspace``, then ``release`` at its end), over layers on a filesystem the nodes
share: a mount is one kernel's, so one made by the gateway (or another node) is not seen.

Every mount is idempotent: a path already mounted (``/proc/self/mountinfo``) or already
unpacked is used as it is, so concurrent jobs of one image share one mount. Run where
the job starts, outside its sandbox (a sandboxed process may not mount).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from corral.core import proc
from corral.core.errors import BackendError, Conflict, InvalidRequest
from corral.storage import basefs

UNPACKED_MARK = ".corral-unpacked"
LOWER_INO = "lower.ino"
"""In a workspace's directory on the shared layers: the inode of the directory forked."""


@dataclass(frozen=True)
class Mounted:
    path: str
    how: str
    """kernel, squashfuse, unpacked (images); overlay, fuse-overlayfs (workspaces)."""
    why: str


def _points() -> list[str]:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            return [line.split()[4].encode().decode("unicode_escape") for line in f]
    except OSError:
        return []


def mounted(path: Path | str) -> bool:
    """Whether ``path`` is a mount point on this node, as the kernel says."""
    return os.path.realpath(path) in _points()


def _fuse_ok() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    return None


def mount_image(image: Path, at: Path) -> Mounted:
    """``image`` read-only at ``at`` (made if missing). Raises BackendError saying what
    the node lacks when no way works."""
    if mounted(at):
        return Mounted(str(at), "kernel" if os.geteuid() == 0 else "squashfuse", "already mounted on this node")
    if (at / UNPACKED_MARK).exists():
        return Mounted(str(at), "unpacked", "unpacked earlier on this node")
    at.mkdir(parents=True, exist_ok=True)
    tried: list[str] = []
    if os.geteuid() == 0:
        r = proc.run(["mount", "-t", "squashfs", "-o", "loop,ro,nodev,nosuid", str(image), str(at)],
                     timeout=60, check=False)
        if r.returncode == 0:
            return Mounted(str(at), "kernel", "root on this node: the kernel's squashfs over a loop device")
        tried.append(f"kernel mount: {(r.stderr or '').strip()[:200]}")
    else:
        tried.append("kernel mount: not root")
    why_not = _fuse_ok() or (None if shutil.which("squashfuse") else "squashfuse is not installed")
    if why_not is None:
        r = proc.run(["squashfuse", "-o", "ro", str(image), str(at)], timeout=60, check=False)
        if r.returncode == 0:
            return Mounted(str(at), "squashfuse", "; ".join(tried) + " -> FUSE")
        why_not = (r.stderr or "").strip()[:200]
    tried.append(f"squashfuse: {why_not}")
    if shutil.which("unsquashfs") is None:
        raise BackendError("this node can mount no environment image: " + "; ".join(tried),
                           hint="install squashfs-tools (and squashfuse) on the node, or run the gateway as root")
    tmp = at.with_name(at.name + f".unpacking-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    r = proc.run(["unsquashfs", "-q", "-n", "-d", str(tmp), str(image)], timeout=1800, check=False)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackendError(f"could not unpack the image {image.name}: {(r.stdout + r.stderr).strip()[-300:]}",
                           hint="see whether the node's scratch is full (df); the image may be corrupt: "
                                "corral env build FILE --rebuild")
    (tmp / UNPACKED_MARK).write_text("; ".join(tried) + "\n")
    try:  # at the mount point itself: a job's PATH is the same whichever way the node took
        at.rmdir()
        tmp.rename(at)
    except OSError:  # another job unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return Mounted(str(at), "unpacked", "; ".join(tried) + " -> unpacked to node-local scratch")


def mount_overlay(lower: Path, upper: Path, work: Path, at: Path, ino: int | None = None) -> Mounted:
    """``lower`` read-only under ``upper`` (the trial's changes) at ``at``. ``lower`` (an
    agent's directory, or a tree of scratch) is opened without following a link in any
    component and given to the mount by descriptor: a link swapped in since it was
    checked is refused (Conflict), never mounted as the lower layer; so is, given its
    inode (``ino``, recorded at the fork), another directory moved to its path."""
    if mounted(at):
        return Mounted(str(at), "overlay", "already mounted on this node")
    low = _open_base(lower, "discard the workspace and fork the directory itself again")
    try:
        if ino is not None and os.fstat(low).st_ino != ino:
            raise Conflict(f"the base of this workspace, {lower}, is not the directory that was forked (it was "
                           "moved or replaced since); discard the workspace and fork the directory again")
        return _mount_overlay(low, upper, work, at)
    finally:
        os.close(low)


def _open_base(lower: Path, advice: str) -> int:
    """``lower`` opened without following a link in any component (basefs.open_root);
    Conflict, with ``advice``, when it cannot be."""
    try:
        return basefs.open_root(str(lower))
    except basefs.Refused as e:
        raise Conflict(f"the base of this workspace cannot be mounted: {e.message}; {advice}") from None


def on_nodes(lower: Path, d: Path) -> Mounted:
    """A workspace's layers made in ``d`` over ``lower`` (opened as ``mount_overlay``
    would), mounted by no one here: each job mounts it on its own node (``workspace``)."""
    low = _open_base(lower, "fork the directory itself again")
    try:
        _layers(low, d / "upper", d / "work", d / "merged")
        # Which directory was forked, for the nodes: root mounts it there by its path, later,
        # and a directory moved to that path since (one the identity may not read, say) is not it.
        fd = os.open(d / LOWER_INO, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "w") as f:
            f.write(str(os.fstat(low).st_ino))
    finally:
        os.close(low)
    return Mounted(str(d / "merged"), "on-node", "mounted by each job on the node it runs on, over layers the "
                   "nodes share; one job of the workspace at a time")


def _layers(low: int, upper: Path, work: Path, at: Path) -> None:
    fresh = not upper.exists()
    for d in (upper, work, at):
        d.mkdir(parents=True, exist_ok=True)
    if fresh:  # the merged root shows the upper root's owner and mode: the base's, not root's 0755
        st = os.fstat(low)
        if os.geteuid() == 0:
            os.chown(upper, st.st_uid, st.st_gid)
        os.chmod(upper, stat.S_IMODE(st.st_mode))


def _mount_overlay(low: int, upper: Path, work: Path, at: Path) -> Mounted:
    _layers(low, upper, work, at)
    opts = f"lowerdir=/proc/self/fd/{low},upperdir={upper},workdir={work}"
    tried = []
    if os.geteuid() == 0:
        r = proc.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(at)], timeout=60, check=False,
                     pass_fds=(low,))
        if r.returncode == 0:
            return Mounted(str(at), "overlay", "root on this node: the kernel's overlayfs")
        tried.append(f"kernel overlay: {(r.stderr or '').strip()[:200]}")
    else:
        tried.append("kernel overlay: not root")
    if _fuse_ok() is None and shutil.which("fuse-overlayfs"):
        r = proc.run(["fuse-overlayfs", "-o", opts, str(at)], timeout=60, check=False, pass_fds=(low,))
        if r.returncode == 0:
            return Mounted(str(at), "fuse-overlayfs", "; ".join(tried) + " -> FUSE")
        tried.append(f"fuse-overlayfs: {(r.stderr or '').strip()[:200]}")
    raise BackendError("this node can mount no workspace: " + "; ".join(tried),
                       hint="run the gateway as root, or install fuse-overlayfs (apt-get install fuse-overlayfs)")


def unmount(path: Path | str) -> None:
    """Unmount ``path`` if mounted (lazily: a job still reading keeps its view), or remove
    the image unpacked there. A mount is asked of the kernel first: what a mount shows is
    no mark of corral's (a workspace's view is the agent's to write, an image its
    requester's to fill), so ``UNPACKED_MARK`` is believed only where nothing is mounted."""
    if not mounted(path):
        if (Path(path) / UNPACKED_MARK).exists():
            shutil.rmtree(path, ignore_errors=True)
        return
    r = proc.run(["umount", "-l", str(path)], timeout=60, check=False)
    fuse = shutil.which("fusermount3") or shutil.which("fusermount")
    if r.returncode != 0 and fuse:  # a FUSE mount of a user who is not root
        proc.run([fuse, "-u", "-z", str(path)], timeout=60, check=False)


def under(root: Path | str) -> list[str]:
    """Mount points at or below ``root`` on this node, deepest first."""
    top = os.path.realpath(root)
    return sorted({p for p in _points() if p == top or p.startswith(top + "/")}, key=len, reverse=True)


def unmount_all(root: Path | str) -> None:
    """Every image and workspace mounted under ``root`` (a scratch directory being removed)."""
    for point in under(root):
        unmount(point)


def workspace(d: Path, lower: Path) -> Mounted:
    """Workspace ``d`` (its layers) mounted at ``d/merged`` on this node, afresh: a mount
    left here by an earlier job that was killed before its ``release`` predates what
    jobs on other nodes wrote since (the layers changed under it), so it is dropped first.
    Refused, saying what to share, when this node does not see the layers."""
    try:
        st = os.lstat(d / "upper")
    except FileNotFoundError:
        raise InvalidRequest(f"the workspace's layers {d} are not on this node ({os.uname().nodename}): a "
                             "workspace is used on every node its jobs run on, so [storage] workspaces must be a "
                             "directory the nodes share (node-local scratch is not); ask the admin") from None
    owner = os.lstat(d).st_uid
    if stat.S_ISLNK(os.lstat(d).st_mode) or owner != os.geteuid() or not stat.S_ISDIR(st.st_mode):
        raise InvalidRequest(f"{d} is not a workspace corral made (a link, or not its own); nothing was mounted")
    unmount(d / "merged")
    try:  # (a workspace forked before it was recorded has none)
        with open(os.open(d / LOWER_INO, os.O_RDONLY | os.O_NOFOLLOW)) as f:
            ino: int | None = int(f.read(32))
    except FileNotFoundError:
        ino = None
    return mount_overlay(lower, d / "upper", d / "work", d / "merged", ino)


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.storage.mounts image IMAGE AT`` | ``workspace DIR LOWER`` |
    ``release DIR`` | ``scratch ROOT SUB...``: what a Slurm job script runs on its node
    before its work (prints the path to use), and after it."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["scratch"] and len(args) > 1:  # made, or checked as its own, never through a link
        from corral.storage import scratch

        try:
            scratch.prepare(Path(args[1]), args[2:], {"uv-cache": 0o755})
        except InvalidRequest as e:
            print(f"corral: on {os.uname().nodename}: {e.message}" + (f"; {e.hint}" if e.hint else ""), file=sys.stderr)
            return 1
        return 0
    ap = argparse.ArgumentParser(prog="corral.storage.mounts")
    ap.add_argument("what", choices=["image", "workspace", "release"])
    ap.add_argument("image", type=Path, help="the image, or the workspace's directory")
    ap.add_argument("at", type=Path, nargs="?", help="where the image goes, or the workspace's lower layer")
    a = ap.parse_args(argv)
    if a.what != "release" and a.at is None:
        ap.error(f"{a.what} needs two paths")
    if a.what == "release":
        unmount(a.image / "merged")
        return 0
    try:
        if a.what == "workspace":
            print(workspace(a.image, a.at).path)
            return 0
        if not a.image.is_file():
            raise InvalidRequest(f"the environment image {a.image} is not on this node's filesystem")
        if os.geteuid() == 0:  # root mounts only in this node's scratch as root made it, never in another's
            from corral.storage import scratch

            scratch.prepare(a.at.parent.parent, [a.at.parent.name])
        m = mount_image(a.image, a.at)
    except (BackendError, InvalidRequest, Conflict) as e:
        print(f"corral: {e.message}", file=sys.stderr)
        return 1
    print(m.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
