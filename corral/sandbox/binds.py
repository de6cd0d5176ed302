"""What a contained job's filesystem is made of, in the order bwrap applies it.

``Sandbox.profile`` (corral/sandbox/bwrap.py) decides who the job becomes and what is
hidden from it; this module turns that into mounts: the read-only host and a private
/tmp, the hidden paths emptied, then the job's own parts bound back over them (the
scripts it must read, its working directory, the submitter's venv under /tmp, its own
directory). A later mount covers an earlier one, so the order is the safety: what is
hidden inside a directory bound back is hidden again after that bind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from corral.sandbox.homes import HOME_LINK, OWN_HOME, candidates, outermost
from corral.sandbox.profile import Mount, hiding

JOB_DIR = "/tmp/corral-job"
"""Where a job that runs as ``run_as`` finds its own directory."""
READ_DIR = "/tmp/corral-in"
"""Where it finds the files it must read from hidden places (its script)."""


def at_job_dir(argv: list[str], cwd: str, job_dir: str) -> tuple[list[str], str]:
    """``argv`` and ``cwd`` as the job sees them when its directory, ``job_dir``, is bound
    at ``JOB_DIR``."""
    argv = [JOB_DIR + a[len(job_dir):] if a == job_dir or a.startswith(job_dir + "/") else a for a in argv]
    return argv, JOB_DIR if cwd == job_dir else cwd


def hidden(now: list[tuple[str, ...]], own: str | None, later: bool) -> list[Mount]:
    """Every hidden path as a mount, ``now`` as ``Sandbox._now_hidden`` lists them;
    ``later``: every credential name under the home ``own``, whichever are there when the
    job starts (``Mount.later``)."""
    if later:
        known = {t[1] for t in now}
        return [*(hiding(*t, later=t[0] not in (OWN_HOME, HOME_LINK)) for t in now),
                *(Mount("tmpfs", p, later=True) for p in candidates(own) if p not in known)]
    # a path gone since the list was made (a home userdel removed) needs no hiding, and bwrap could not mount on it
    return [hiding(*t) for t in now if os.path.lexists(t[1])]


def filesystem(tmp_size: int | None, everything: list[Mount], readable: Sequence[str], inside: dict[str, str],
               workdir: list[Mount]) -> list[Mount]:
    """The host read-only, a private /tmp of ``tmp_size``, what is hidden (``everything``,
    its outermost paths), then what the job must read and its working directory."""
    return [Mount("ro-bind", "/", "/"), Mount("dev", "/dev"), Mount("proc", "/proc"),
            Mount("tmpfs", "/tmp", perms="1777", size=tmp_size),
            *outermost(everything),  # emptied first: the job's own directories are bound back in after
            *_readable(readable, inside), *workdir]


def _readable(readable: Sequence[str], inside: dict[str, str]) -> list[Mount]:
    if inside:  # bwrap made their hidden parents root's, 0700: bound apart
        return [Mount("dir", READ_DIR, perms="0755"), *(Mount("ro-bind", at, f) for f, at in inside.items())]
    return [Mount("ro-bind", f, f) for f in readable]


def workdir(cwd: str, cwd_fd: int | None, own: tuple[str | None, str | None], hidden: list[Mount]) -> list[Mount]:
    """The working directory bound writable, unless it is the job's own directory or /tmp;
    ``JOB_DIR`` unbound: made in the private /tmp, whose size bounds it."""
    if cwd == JOB_DIR and own[0] is None:
        return [Mount("dir", JOB_DIR, perms="0777")]
    if cwd in (*own, "/tmp"):
        return []
    # A working directory inside an emptied one (a workspace under corral's scratch):
    # bwrap would make its parents root's and 0700, which the job's user cannot
    # traverse by absolute path; they are made 0755 first.
    out = [Mount("dir", str(Path(m.dst) / parent), perms="0755")
           for m in hidden if m.op == "tmpfs" and Path(cwd).is_relative_to(m.dst) and cwd != m.dst
           for parent in reversed(Path(cwd).relative_to(m.dst).parents[:-1])]
    out.append(Mount("bind-fd", cwd, str(cwd_fd)) if cwd_fd is not None else Mount("bind", cwd, cwd))
    # What is hidden inside the working directory (corral's home in the project that
    # holds it, a credential directory) is hidden again over the bind, which undid it.
    return out + [m for m in hidden if Path(m.dst).is_relative_to(cwd) and m.dst != cwd]


def venv(venv: tuple[str, int] | None, cwd: str, everything: list[Mount]) -> list[Mount]:
    """The submitter's venv under /tmp (path, descriptor), bound read-only after the
    working directory, which may hold it (then it is not bound again)."""
    if venv is None or cwd == venv[0]:
        return []
    # its parents in the job's own /tmp are made 0755 (bwrap makes them root's, 0700)
    return [*(Mount("dir", str(d), perms="0755") for d in reversed(Path(venv[0]).parents[:-2])),
            Mount("ro-bind-fd", venv[0], str(venv[1])),
            *(m for m in everything if Path(m.dst).is_relative_to(venv[0]) and m.dst != venv[0])]
