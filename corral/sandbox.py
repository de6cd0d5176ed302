"""Containment of jobs: what a sandboxed job can touch, whatever it runs.

A job of a principal whose kind the facility sandboxes (``[sandbox] kinds``; agents by
default, people not) runs inside bubblewrap (``bwrap``, Debian's ``bubblewrap``), which
builds it a private view of the machine from kernel namespaces:

- files: the host read-only; writable only the job's working directory, its output
  directory and a private ``/tmp``; empty: credential locations, corral's own state
  (its database, token key and every other job's output) and what ``[sandbox] hide``
  adds;
- network: none (a network namespace of its own with only a loopback) unless
  ``[sandbox] network = true``;
- processes: its own PID namespace (it sees and signals nothing else, and all of it
  dies with the job's supervisor), a new session, no capabilities, no new privileges;
- identity: never root. A gateway run as root starts sandboxed jobs as ``[sandbox]
  run_as`` (default ``nobody``) through ``setpriv``.

Where bwrap is missing or cannot build a namespace, sandboxed kinds' jobs are refused
(``SandboxUnavailable``) with what the admin must do, unless the admin turned the
sandbox off. The mechanism holds whatever the command is: it does not read it.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from . import proc
from .errors import BackendError, InvalidRequest, SandboxUnavailable

CREDENTIALS = (".ssh", ".aws", ".azure", ".config/gcloud", ".config/gh", ".netrc", ".docker", ".kube", ".gnupg",
               ".local/share/keyrings", ".password-store", ".git-credentials", ".pypirc", ".config/hub",
               ".terraform.d", ".oci", ".boto", ".s3cfg")
"""Under every home the job could otherwise read: made empty."""
SYSTEM = ("/root", "/etc/munge", "/run/munge", "/var/run/munge", "/var/lib/munge", "/etc/slurm/slurmdbd.conf",
          "/var/spool/slurm", "/var/spool/slurmctld", "/var/lib/slurm", "/etc/shadow", "/etc/gshadow",
          "/etc/ssh", "/var/lib/sss")
"""Machine-wide secrets and scheduler state: made empty where they exist."""
JOB_DIR = "/tmp/corral-job"
"""Where a job that runs as ``run_as`` finds its own directory."""


@dataclass(frozen=True)
class Sandbox:
    kinds: frozenset[str]
    hide: tuple[Path, ...]
    """Paths made empty, the defaults (where they exist) and the admin's (checked to exist)."""
    network: bool = False
    run_as: str | None = None
    """The Unix user sandboxed jobs run as when the gateway is root."""
    why_not: str | None = None
    """Why this machine cannot build a sandbox (None: it can)."""

    def applies(self, kind: str) -> bool:
        return kind in self.kinds

    def require(self, kind: str) -> None:
        """Refuse, before anything is recorded, a job that must be contained and cannot be."""
        if self.applies(kind) and self.why_not:
            raise SandboxUnavailable(
                f"jobs of {kind} principals run in a sandbox, and this gateway cannot build one: {self.why_not}",
                hint="ask the facility's admin (the gateway's log says the same); the admin may also turn the "
                     "sandbox off for this kind with [sandbox] kinds in corral.toml")

    def owner(self, kind: str) -> tuple[int, int] | None:
        """(uid, gid) a contained job of ``kind`` runs as, when not the gateway's own: its
        job directory must be given to it."""
        if not self.applies(kind) or os.geteuid() != 0 or not self.run_as:
            return None
        u = pwd.getpwnam(self.run_as)
        return u.pw_uid, u.pw_gid

    def wrap(self, kind: str, argv: Sequence[str], cwd: str, job_dir: str) -> list[str]:
        """The command that runs ``argv`` contained (itself when ``kind`` is not
        sandboxed). Writable inside: ``cwd`` and ``job_dir`` (the job's output)."""
        if not self.applies(kind):
            return list(argv)
        who = self.owner(kind)
        inner = job_dir
        if who is not None:
            # The job's directory lies in corral's state, whose parents its user may not
            # traverse: it is bound at a path of its own under the private /tmp.
            inner = JOB_DIR
            argv = [inner + a[len(job_dir):] if a == job_dir or a.startswith(job_dir + "/") else a for a in argv]
            cwd = inner if cwd == job_dir else cwd
        # Run by root, bwrap needs no user namespace, and the job's user must be one the
        # kernel knows (in a new user namespace only root would be mapped); run by anyone
        # else, the user namespace is what lets bwrap build the rest.
        spaces = (["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
                  + ([] if self.network else ["--unshare-net"])) if who is not None else \
            ["--unshare-all", *(["--share-net"] if self.network else [])]
        out = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
               *spaces,
               "--die-with-parent", "--new-session"]
        for p in self.hide:  # emptied first: the job's own directories are bound back in after
            out += ["--tmpfs", str(p)] if p.is_dir() else ["--ro-bind", "/dev/null", str(p)]
        if cwd not in (job_dir, inner):
            out += ["--bind", cwd, cwd]
        out += ["--bind", job_dir, inner]
        out += ["--chdir", cwd, "--"]
        if who is None:
            return [*out[:-2], "--cap-drop", "ALL", *out[-2:], *argv]
        # bwrap builds the namespaces as root (it reads every path it binds), then the job
        # becomes its user with no capability left, and no_new_privs (bwrap's) keeps it so.
        return [*out, "setpriv", f"--reuid={who[0]}", f"--regid={who[1]}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--", *argv]


def homes() -> list[Path]:
    """Every home directory a job could read: the gateway user's and the password file's."""
    seen = {Path.home()}
    for u in pwd.getpwall():
        if u.pw_dir and u.pw_dir not in ("/", "/nonexistent") and Path(u.pw_dir).is_dir():
            seen.add(Path(u.pw_dir))
    return sorted(seen)


def build(kinds: Sequence[str], extra_hide: Sequence[Path], network: bool, run_as: str | None,
          state: Sequence[Path]) -> Sandbox:
    """The facility's sandbox, probed once at start-up. ``state``: corral's own
    directories (hidden from every sandboxed job; a job's own directory is bound back)."""
    missing = [p for p in extra_hide if not p.exists()]
    if missing:
        raise InvalidRequest(f"[sandbox] hide names {', '.join(map(str, missing))}, which does not exist",
                             hint="fix the path or remove it from corral.toml")
    if os.geteuid() == 0 and run_as:
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            raise InvalidRequest(f"[sandbox] run_as names the user {run_as!r}, who does not exist on this machine",
                                 hint="name an unprivileged user that exists (the default is 'nobody')") from None
    hide = [Path(p) for p in SYSTEM if Path(p).exists()]
    hide += [h / c for h in homes() for c in CREDENTIALS if (h / c).exists()]
    hide += [Path(p) for p in (*state, *extra_hide)]
    box = Sandbox(frozenset(kinds), tuple(dict.fromkeys(hide)), network, run_as)
    return replace(box, why_not=probe(box)) if kinds else box


def probe(box: Sandbox) -> str | None:
    """Build one sandbox and run ``true`` in it: -> None if that worked, else why not
    and what to do, in an admin's words."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if os.geteuid() == 0 and box.run_as and shutil.which("setpriv") is None:
        return "setpriv is not installed (apt-get install util-linux)"
    argv = box.wrap(next(iter(box.kinds)), ["true"], "/tmp", "/tmp")
    try:
        r = proc.run(argv, timeout=20, check=False)
    except BackendError as e:
        return f"bwrap could not start ({e})"
    if r.returncode != 0:
        err = (r.stderr or "").strip().splitlines()[-1:] or ["no message"]
        return (f"bwrap could not build a sandbox ({err[0]}); allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)")
    return None
