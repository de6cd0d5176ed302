"""A job's sandbox as data: what bwrap builds and what runs ahead of the job, rendered to argv.

``Sandbox.profile`` (corral/sandbox/bwrap.py) decides, for one job, which namespaces it
gets, what it sees (mounts, in the order bwrap applies them: a later one covers an
earlier), whom it becomes and which steps run between bwrap and the job (the process
limit, the egress bridge, the system-call filter). This module only renders that
decision, so the decision can be read, printed (``corral sandbox show``) and tested
without parsing an argument list, and the order of the chain is written once.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Mount:
    """One filesystem step of bwrap's: ``op`` is its flag without dashes."""

    op: str
    """ro-bind, bind, bind-fd (``src`` is a descriptor's number), tmpfs, dir, dev, proc."""
    dst: str
    src: str | None = None
    perms: str | None = None
    """The mode of what ``tmpfs`` or ``dir`` makes (bwrap's --perms, which applies to the next step)."""
    size: int | None = None
    """The size of a ``tmpfs``, in bytes."""
    later: bool = False
    """A hidden path decided where and when the job starts (``Profile.shell``): emptied
    as the directory or file it is then, left out if it is gone (bwrap cannot mount on a
    path the read-only root lacks). A batch job is rendered on the gateway and runs on a
    node, later: a home removed in between made bwrap fail there."""
    word: bool = False
    """``src`` is a bash word expanded where and when the job starts (``Profile.shell``): a
    path the batch script makes as it runs (its egress relay's socket, in a directory whose
    name no earlier run and nobody else could know)."""

    def argv(self) -> list[str]:
        out = ["--perms", self.perms] if self.perms else []
        out += ["--size", str(self.size)] if self.size else []
        return out + [f"--{self.op}", *([self.src] if self.src is not None else []), self.dst]


def hiding(flag: str, path: str, *src: str, later: bool = False) -> Mount:
    """A hidden path as ``Sandbox`` lists it (bwrap flag, path[, source]) as a mount."""
    return Mount(flag.removeprefix("--"), path, src[0] if src else None, later=later)


HIDE_LATER = ('corral_hide() { local p=$1 r=${1#/} c=; '
              'case "$1/" in //*|/*//*|/*/./*|/*/../*) p=;; /*) ;; *) p=;; esac; '
              'while [ -n "$p" ] && [ -n "$r" ]; do c=$c/${r%%/*}; [ -L "$c" ] && p=; '
              '[ "$r" = "${r#*/}" ] && break; r=${r#*/}; done; '
              'if [ -z "$p" ]; then p=$(readlink -f -- "$1") || return 0; fi; '
              'if [ -d "$p" ]; then corral_box+=(--tmpfs "$p"); '
              'elif [ -e "$p" ]; then corral_box+=(--ro-bind /dev/null "$p"); fi; }')
"""The shell's half of ``Mount.later``: a directory emptied, a file covered, nothing gone,
each where it really lies (bwrap refuses to mount over a link: a credential directory
that is a link, as dotfiles often are, failed the job). Only reads the path; what is
mounted is in the job's own namespace. A plain absolute path none of whose components is
a link is where it lies already, seen with the shell's own tests; only another (a link on
the way, ``.``, ``..``) is resolved by ``readlink -f``, a process each: sixteen of those
were 60-170 ms of every contained job's start (bench/batch_overhead.py)."""


@dataclass(frozen=True)
class Become:
    """Who the job becomes after bwrap, which root runs: setpriv, then (``own_count``)
    a user namespace of its own in which its process count is its own."""

    uid: int
    gid: int
    init_groups: bool
    """A real user's supplementary (project) groups; False: none."""
    own_count: bool


@dataclass(frozen=True)
class Profile:
    bwrap: str
    """bwrap's absolute path."""
    namespaces: tuple[str, ...]
    """bwrap's namespace flags (--unshare-*, --share-net)."""
    mounts: tuple[Mount, ...]
    chdir: str
    env: tuple[tuple[str, str], ...] = ()
    become: Become | None = None
    """None: the job stays who starts bwrap, with every capability dropped."""
    steps: tuple[tuple[str, ...], ...] = ()
    """Programs run in turn between bwrap (or setpriv) and the job, each by absolute path,
    each ending where the next begins (prlimit, the egress bridge, the filter)."""
    tools: dict[str, str] = field(default_factory=dict)
    """Absolute paths of setpriv and unshare."""
    path_first: str | None = None
    """A directory put first on the PATH the job starts with (its Slurm commands: corral/sandbox/door.py)."""

    def render(self, argv: list[str], mark: str | None = None) -> list[str]:
        """The command that runs ``argv`` in this sandbox; ``mark``: each ``later`` or
        ``word`` mount as that one word, in its place (``shell`` fills it in)."""
        base, rest = self.mounts[:4], self.mounts[4:]  # /, /dev, /proc, /tmp: then the namespaces
        out = [self.bwrap, *(a for m in base for a in m.argv()), *self.namespaces, "--die-with-parent", "--new-session"]
        out += [a for m in rest for a in ([mark] if mark is not None and (m.later or m.word) else m.argv())]
        out += ["--chdir", self.chdir]
        for k, v in self.env:
            out += ["--setenv", k, v]
        if self.path_first:  # in a batch script (``mark``), the PATH the node has when the job starts
            out += [mark] if mark is not None else ["--setenv", "PATH", f"{self.path_first}:"
                                                                        f"{os.environ.get('PATH', '/usr/bin:/bin')}"]
        chain = [a for step in self.steps for a in step]
        if self.become is None:
            return [*out, "--cap-drop", "ALL", "--", *chain, *argv]
        b = self.become
        groups = "--init-groups" if b.init_groups else "--clear-groups"
        unshare = [self.tools["unshare"], "--user", "--map-current-user", "--"] if b.own_count else []
        return [*out, "--", self.tools["setpriv"], f"--reuid={b.uid}", f"--regid={b.gid}", groups, "--inh-caps=-all",
                "--bounding-set=-all", "--", *unshare, *chain, *argv]

    def shell(self, argv: list[str], prefix: list[str] | None = None) -> str:
        """``render`` as bash lines for a batch script: the command is built in the array
        ``corral_box``, each ``later`` mount decided as the line runs (on the job's node,
        when it starts), each ``word`` mount's source expanded there, and the last line runs
        it (``prefix`` first), ready for a redirection or ``&`` to be appended."""
        later = [m for m in self.mounts if m.later or m.word]
        if not later and not self.path_first:
            return shlex.join([*(prefix or []), *self.render(argv)])
        mark = "\0later\0"  # no word of an exec's argv can hold a NUL
        out = self.render(argv, mark)
        lines, run = [HIDE_LATER, "corral_box=()"], list[str]()
        for a in out:
            if a == mark:
                m = later.pop(0) if later else Mount("path", self.path_first or "")
                lines.append(f"corral_box+=({shlex.join(run)})" if run else "")
                lines.append(f"corral_hide {shlex.quote(m.dst)}" if m.later else
                             f'corral_box+=(--setenv PATH {shlex.quote(m.dst)}:"$PATH")' if m.op == "path" else
                             f"corral_box+=(--{m.op} {m.src} {shlex.quote(m.dst)})")
                run = []
            else:
                run.append(a)
        lines.append(f"corral_box+=({shlex.join(run)})")
        return "\n".join(x for x in lines if x) + "\n" + shlex.join(prefix or []) + (" " if prefix else "") + '"${corral_box[@]}"'

    def describe(self) -> dict[str, Any]:
        """The profile in words an admin reads (``corral --json sandbox show``'s ``profile``)."""
        return {"namespaces": list(self.namespaces),
                "mounts": [{k: v for k, v in vars(m).items() if v is not None and v is not False} for m in self.mounts],
                "chdir": self.chdir, "env": dict(self.env),
                "becomes": None if self.become is None else {"uid": self.become.uid, "gid": self.become.gid},
                "steps": [s[0] for s in self.steps]}
