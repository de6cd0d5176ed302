"""Containment of jobs: what a sandboxed job can touch, whatever it runs.

A job of a principal whose kind the facility sandboxes (``[sandbox] kinds``; agents by
default, people not) runs inside bubblewrap (``bwrap``, Debian's ``bubblewrap``), which
builds it a private view of the machine from kernel namespaces:

- files: the host read-only; writable only the job's working directory, its output
  directory and a private ``/tmp``; empty: credential locations, corral's own state
  (its database, token key and every other job's output), people's homes other than
  the job's user's own, and what ``[sandbox] hide`` adds;
- network: none (a network namespace of its own with only a loopback) unless
  ``[sandbox] network = true``; with ``[sandbox] allow_hosts``, the hosts on that list
  through corral's egress proxy (corral/sandbox/egress.py), and nothing else;
- processes: its own PID namespace (it sees and signals nothing else, and all of it
  dies with the job's supervisor), a new session, no capabilities, no new privileges,
  at most ``[sandbox] pids_max`` processes (``RLIMIT_NPROC`` set inside a user namespace
  of the job's own, where the kernel counts that job's processes alone: a fork bomb
  stops at the limit and other jobs of the same Unix user keep forking);
- identity: never root. Run by root (the local backend's gateway, a Slurm job of a
  principal without a Unix user, a fast-lane worker), a sandboxed job becomes the
  principal's Unix user, or else ``[sandbox] run_as`` (default ``nobody``), through
  ``setpriv``.

One builder (``Sandbox.wrap``) serves every place a job starts: the local backend's
supervisor, the Slurm batch script and the fast lane. Where a principal's jobs repeat
in one working directory (the local backend, the fast lane), the sandbox is built once
for that key and its jobs are started inside it (corral/sandbox/host.py): the same
profile, ~1 ms per job instead of ~14.

Where bwrap is missing or cannot build a namespace, sandboxed kinds' jobs are refused
(``SandboxUnavailable``) with what the admin must do, unless the admin turned the
sandbox off. The mechanism holds whatever the command is: it does not read it.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from corral.core import proc
from corral.sandbox import binds, door
from corral.sandbox.binds import JOB_DIR, READ_DIR
from corral.sandbox.egress import BRIDGE_NAME
from corral.sandbox.homes import CREDENTIALS, HOME_LINK, OWN_HOME, credentials, home_roots, homes, people_homes
from corral.sandbox.profile import Become, Mount, Profile
from corral.sandbox.seccomp import apply_argv
from corral.core.errors import BackendError, InvalidRequest, SandboxUnavailable

SYSTEM = ("/root", "/etc/munge", "/run/munge", "/var/run/munge", "/var/lib/munge", "/etc/slurm/slurmdbd.conf",
          "/var/spool/slurm", "/var/spool/slurmctld", "/var/lib/slurm", "/etc/shadow", "/etc/gshadow",
          "/etc/ssh", "/var/lib/sss")
"""Machine-wide secrets and scheduler state: made empty where they exist."""
EGRESS_INSIDE = "/tmp/corral-egress.sock"
RELAY_DIR = "corral_relay_dir"
"""A batch shell's variable naming the directory of its egress relay, made as it runs
(corral/lanes/slurm/script.py ``relay_lines``)."""
RELAY_SOCKET = f'"${RELAY_DIR}/proxy.sock"'
"""That relay's socket as a bash word: the one ``Sandbox.egress`` the batch shell expands."""
PORT_INSIDE = 3128
_BRIDGE = (f"(socat TCP-LISTEN:{PORT_INSIDE},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{EGRESS_INSIDE} &); "
           f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{PORT_INSIDE}) 2>/dev/null && break; sleep 0.005; "
           'done; exec "$@"')
"""Inside a job with the egress proxy: the job's loopback port to the proxy's socket,
ready before the job starts. socat is started from a subshell, so it is not a child of
what the job execs: a job sampled under strace (storage/meta.py) would otherwise wait
for it forever (an environment build's install runs with the proxy)."""
@functools.lru_cache(maxsize=1)
def _socat() -> str | None:
    found = shutil.which("socat")
    return os.path.realpath(found) if found else None


@dataclass(frozen=True)
class Sandbox:
    kinds: frozenset[str]
    hide: tuple[Path, ...]
    """Paths made empty, the defaults (where they exist) and the admin's (checked to exist)."""
    network: bool = False
    run_as: str | None = None
    """The Unix user sandboxed jobs run as when started by root and their principal has none."""
    pids_max: int = 512
    why_not: str | None = None
    """Why this machine cannot build a sandbox (None: it can)."""
    homes: tuple[Path, ...] = ()
    """People's homes: each hidden from a job whose user it does not belong to."""
    home_roots: tuple[Path, ...] = ()
    """Directories that hold people's homes (``/home``): each emptied whole, and only the
    job's identity's own home bound back, so a home made after the gateway or the job
    started is never seen (an allow-list; ``homes`` elsewhere are hidden by name)."""
    egress: str | None = None
    """The egress proxy's socket (corral/sandbox/egress.py): without the host's network, a job
    reaches the allow-list through it and nothing else. In a batch script (``shell``) it may
    be ``RELAY_SOCKET``, the socket of a relay the script made as it ran."""
    own_count: bool = True
    """Whether a job started by root gets a user namespace of its own, in which the
    process limit counts its processes alone (False where unprivileged user namespaces
    are off: the limit then counts every process of the job's Unix user)."""
    seccomp: str | None = None
    """The system-call filter every contained job runs under, as hex BPF (corral/sandbox/seccomp.py)."""
    file_max: int | None = None
    """The largest file a contained job may write, in bytes (RLIMIT_FSIZE: its output included)."""
    tmp_max: int | None = None
    """The size of a contained job's private /tmp, in bytes."""
    bridge: str | None = None
    """corral's unreadable copy of socat (corral/sandbox/egress.py), bound over the real one:
    the bridge it runs before the filter cannot be traced by the job."""
    relay: str | None = None
    """HOST:PORT where the egress proxy listens for jobs on other machines ([sandbox]
    egress_listen): a Slurm job's script relays its node's own socket there."""
    door: str | None = None  # a Slurm job's shims; its door's socket, a bash word ('': none) (sandbox/door.py)
    starter: str | None = None  # the filter's step by corral's compiled starter (sandbox/starter.py); None: Python

    def applies(self, kind: str) -> bool:
        return kind in self.kinds

    def tmp_size(self, memory_mb: int | None) -> int | None:
        """A job's private /tmp, in bytes: ``tmp_max``, and at most the job's memory, which
        its pages are (docs/decisions/0044-job-space.md): a job without a working directory
        works there too (``JOB_DIR``), never on corral's disk."""
        if not memory_mb:
            return self.tmp_max
        return min(self.tmp_max or memory_mb << 20, memory_mb << 20)

    def require(self, kind: str) -> None:
        """Refuse, before anything is recorded, a job that must be contained and cannot be."""
        if self.applies(kind) and self.why_not:
            raise SandboxUnavailable(
                f"jobs of {kind} principals run in a sandbox, and this gateway cannot build one: {self.why_not}",
                hint="ask the facility's admin to fix what the sentence names (the gateway's log says the same, "
                     "and `corral sandbox show` prints the profile); the job runs once the gateway can build it")

    def owner(self, kind: str, user: str | None = None, root: bool | None = None) -> tuple[int, int] | None:
        """(uid, gid) a contained job of ``kind`` becomes, when started by root (``root``;
        default: whether this process is root): its principal's Unix ``user`` if that is
        not root, else ``run_as``. None: it stays who starts it."""
        if not self.applies(kind) or not (os.geteuid() == 0 if root is None else root):
            return None
        for name in (user, self.run_as):
            try:
                u = pwd.getpwnam(name) if name else None
            except KeyError:
                u = None  # a principal's user unknown on this node: the facility's default
            if u is not None and u.pw_uid != 0:
                return u.pw_uid, u.pw_gid
        raise SandboxUnavailable(f"a contained job would run as root here ([sandbox] run_as = {self.run_as!r})",
                                 hint="set [sandbox] run_as to an unprivileged user that exists on every node")

    def wrap(self, kind: str, argv: Sequence[str], cwd: str, job_dir: str | None = None,
             user: str | None = None, root: bool | None = None, readable: Sequence[str] = (),
             limit: bool = True, ident: tuple[int, int] | None = None, filtered: bool = True,
             cwd_fd: int | None = None, env_fd: int | None = None, venv: tuple[str, int] | None = None,
             memory_mb: int | None = None) -> list[str]:
        """The command that runs ``argv`` contained (itself when ``kind`` is not
        sandboxed): ``profile`` rendered. Writable inside: ``cwd``, ``job_dir`` (the job's
        output) and a private /tmp; ``readable``: files in hidden places it must read (its
        script). ``user``, ``root``: as for ``owner``; the command must be run by whoever
        ``root`` says; ``ident``: the (uid, gid) the job becomes instead (its identity,
        corral/core/identity.py). ``limit=False``: without the process limit (a sandbox host,
        corral/sandbox/host.py, that sets each of its jobs' own); ``filtered=False``:
        without the system-call filter (a host, which installs it in each job);
        ``cwd_fd``: the working directory is bound from this descriptor, which its
        starter opened without following links (the path is where it appears inside);
        ``env_fd``: the job's own environment (JSON) is read from this descriptor by the
        last step, just before the job: the command itself must be started with corral's
        environment, never the job's (seccomp.APPLY says why); ``venv``: (path, descriptor)
        of the submitter's venv under /tmp, bound read-only (``venv_to_bind``). Every program
        of the chain is named by its absolute path, found on the gateway's PATH. ``memory_mb``:
        the job's memory, the most its private /tmp holds (it is memory: ``tmp_size``)."""
        if not self.applies(kind):
            return list(argv)
        profile, argv = self.profile(kind, argv, cwd, job_dir, user, root, readable, limit, ident, filtered, cwd_fd,
                                     env_fd, venv=venv, memory_mb=memory_mb)
        return profile.render(argv)

    def shell(self, kind: str, argv: Sequence[str], cwd: str, prefix: Sequence[str] = (), **how: Any) -> str:
        """``wrap`` (``how``: its other arguments) as bash lines for a batch script, which
        runs later and on another machine: what is hidden is decided there, when the job
        starts (``Mount.later``): a path gone by then is left out, one made since (a
        credential written after submission) is hidden. ``prefix`` runs first."""
        if not self.applies(kind):
            return shlex.join([*prefix, *argv])
        profile, argv = self.profile(kind, argv, cwd, later=True, **how)
        return profile.shell(argv, list(prefix))

    def profile(self, kind: str, argv: Sequence[str], cwd: str, job_dir: str | None = None,
                user: str | None = None, root: bool | None = None, readable: Sequence[str] = (),
                limit: bool = True, ident: tuple[int, int] | None = None, filtered: bool = True,
                cwd_fd: int | None = None, env_fd: int | None = None, later: bool = False,
                venv: tuple[str, int] | None = None, memory_mb: int | None = None) -> tuple[Profile, list[str]]:
        """What ``wrap`` renders, as data (corral/sandbox/profile.py), and ``argv`` as
        the job sees it inside (its own directory and scripts where they are bound);
        ``later``: what is hidden is decided when the job starts (``shell``)."""
        argv = list(argv)
        who = ident if ident is not None and (os.geteuid() == 0 if root is None else root) else self.owner(kind, user, root)
        inner = job_dir
        if who is not None and job_dir is not None:
            # The job's directory lies in corral's state, whose parents its user may not
            # traverse: it is bound at a path of its own under the private /tmp.
            inner = JOB_DIR
            argv, cwd = binds.at_job_dir(argv, cwd, job_dir)
        own = _home_of(who[0]) if who is not None else str(Path.home())
        everything = binds.hidden(self._now_hidden(own), own, later)
        inside = {f: f"{READ_DIR}/{Path(f).name}" for f in readable} if who is not None and readable else {}
        argv = [inside.get(a, a) for a in argv]
        mounts = binds.filesystem(self.tmp_size(memory_mb), everything, readable, inside,
                                  binds.workdir(cwd, cwd_fd, (job_dir, inner), everything))
        mounts += binds.venv(venv, cwd, everything)
        if job_dir is not None and inner is not None:
            mounts.append(Mount("bind", inner, job_dir))
        ahead, env, steps, entry = self._ahead(limit, filtered, env_fd)
        # bwrap builds the namespaces as root (it reads every path it binds), then the job
        # becomes its user with no capability left, and no_new_privs (bwrap's) keeps it so;
        # `unshare --user` gives it the namespace in which its process count is its own.
        become = None if who is None else Become(who[0], who[1], _home_of(who[0]) is not None, self.own_count)
        return Profile(tool("bwrap"), self._namespaces(who is not None), tuple(mounts + ahead), cwd, tuple(env),
                       become, tuple(steps), {"setpriv": tool("setpriv"), "unshare": tool("unshare")},
                       door.SHIM_BIN if entry else None), argv

    def _ahead(self, limit: bool, filtered: bool, env_fd: int | None) -> tuple[
            list[Mount], list[tuple[str, str]], list[tuple[str, ...]], str | None]:
        """What runs between bwrap and the job, in order (the limits, the egress bridge, the
        door's bridge, the filter last), with the mounts and environment it needs, and the
        door's shims (None: no door)."""
        mounts: list[Mount] = []
        env: list[tuple[str, str]] = []
        steps: list[tuple[str, ...]] = []
        if limit:
            fsize = (f"--fsize={self.file_max}:{self.file_max}",) if self.file_max else ()
            steps.append((tool("prlimit"), f"--nproc={self.pids_max}:{self.pids_max}", *fsize, "--"))
        if self.egress and not self.network:
            mounts += self._egress()
            env = [(var, f"http://127.0.0.1:{PORT_INSIDE}") for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")]
            steps.append((tool("bash"), "-c", _BRIDGE, "corral-egress"))
        entry = door.shims() if self.door is not None else None
        if self.door is not None and entry:  # Slurm's commands inside: corral's shims, through the door
            mounts += door.mounts(self.door, entry)
            steps += [(tool("bash"), "-c", door.BRIDGE, "corral-door")] if self.door else []
        if (filtered and self.seccomp) or env_fd is not None:  # last before the job: corral's own setup above is not bound by it
            steps.append(tuple(apply_argv(system_python(), self.seccomp if filtered else None, env_fd, self.starter)))
        return mounts, env, steps, entry

    def _namespaces(self, as_root: bool) -> tuple[str, ...]:
        # Run by root, bwrap needs no user namespace, and the job's user must be one the
        # kernel knows (in a new user namespace only root would be mapped); run by anyone
        # else, the user namespace is what lets bwrap build the rest.
        if as_root:
            return ("--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
                    *(() if self.network else ("--unshare-net",)))
        return ("--unshare-all", *(("--share-net",) if self.network else ()))

    def _egress(self) -> list[Mount]:
        assert self.egress is not None
        out = [Mount("bind", EGRESS_INSIDE, self.egress, word=self.egress == RELAY_SOCKET)]
        real = _socat()
        if real and self.bridge and os.path.exists(self.bridge):  # corral's unreadable copy: not traceable
            out.append(Mount("ro-bind", real, self.bridge))
        return out

    def venv_to_bind(self, kind: str, env: dict[str, str]) -> str | None:
        """The submitter's activated venv (``VIRTUAL_ENV``) when a contained job would not
        see it only because it lies under /tmp, which is the job's own there: bound back
        read-only, so "an activated venv is the job's too" wherever a checkout lives. Opened
        as the job's identity without following links (corral/sandbox/opendir.py): a venv
        it could not read itself, or a link, fails the job; never one under a hidden path
        or corral's own names in the job's /tmp. A venv in another's home or /root stays
        hidden (docs/security.md)."""
        v = env.get("VIRTUAL_ENV") if self.applies(kind) else None
        if not v or not os.path.isabs(v):
            return None
        p = Path(os.path.normpath(v))
        ours = {Path(JOB_DIR), Path(READ_DIR), Path(EGRESS_INSIDE)}  # what the sandbox itself makes in its /tmp
        if not p.is_relative_to("/tmp") or len(p.parts) < 3 or any(p.is_relative_to(o) or o.is_relative_to(p) for o in ours):
            return None
        # Never one in what is hidden (people's homes under /tmp too); nothing is looked at
        # as root here (an is_dir through a link was an oracle of what exists anywhere):
        # one that is missing or not the job's to read fails the job when it is opened.
        if any(p.is_relative_to(h) for h in (*self.hide, *self.homes, *self.home_roots)):
            return None
        return str(p)

    def hidden_from(self, kind: str, user: str | None = None) -> list[Path]:
        """The paths a contained job of ``kind`` (and ``user``) sees empty: what it may not
        reach by another door either (a workspace forked over one of them)."""
        if not self.applies(kind):
            return []
        who = self.owner(kind, user)
        own = _home_of(who[0]) if who is not None else str(Path.home())
        real = Path(os.path.realpath(own)) if own else None  # where its own home is bound back
        out: list[Path] = []
        for t in self._now_hidden(own):
            p = Path(t[1])
            if t[0] in (OWN_HOME, HOME_LINK):
                continue
            if real and real != p and real.is_relative_to(p):  # a root of homes, its own bound back:
                out += [e for e in _entries(p) if not real.is_relative_to(e)]  # the rest, as it is now
            else:
                out.append(p)
        return out

    def _now_hidden(self, own: str | None) -> list[tuple[str, ...]]:
        """``_hiding`` and the credentials under ``own`` as they are now: one made after
        the gateway started (``~/.aws`` written today) is hidden from the next sandbox built."""
        static = self._hiding(own)
        # A path missing when that list was made (scratch a cleaner had removed, made again
        # since) was listed as a file: hidden as the directory it is now, or bwrap fails.
        if any(t[0] == "--ro-bind" and os.path.isdir(t[1]) for t in static):
            static = [("--tmpfs", t[1]) if t[0] == "--ro-bind" and os.path.isdir(t[1]) else t for t in static]
        fresh = [c for c in credentials(own) if c not in static]
        return [*static, *fresh] if fresh else static

    def fresh(self, kind: str, user: str | None, ident: tuple[int, int] | None) -> tuple[tuple[str, ...], ...]:
        """The credentials under the home of whom a job becomes (as ``wrap`` decides it),
        as they are now: a built sandbox made before one of them appeared is not used for
        the next job (corral/lanes/fast/hosts.py keys on it)."""
        root = os.geteuid() == 0
        who = ident if ident is not None and root else self.owner(kind, user, root)
        return credentials(_home_of(who[0]) if who is not None else str(Path.home()))

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a Sandbox is frozen and few are made)
    def _hiding(self, own: str | None) -> list[tuple[str, ...]]:
        """(bwrap flag, path[, source]) that empty ``hide`` and every home but ``own``:
        worked out once per home, not per job (a fast lane starts hundreds a second)."""
        roots = self.home_roots
        # Under a root of homes only the job's own home is there again (read-only), bound where
        # it really lies (a home that is a link, bound by its name, showed its credentials);
        # the rest of the root is an empty tmpfs. Homes elsewhere (/srv/bob) are hidden by name.
        real = os.path.realpath(own) if own else ""
        mine = [real] if real and any(Path(real).is_relative_to(r) and Path(real) != r for r in roots) else []
        gone = [*roots, *(h for h in self.homes if str(h) not in (own, real) and not any(h.is_relative_to(r) for r in roots))]
        out: list[tuple[str, ...]] = [("--tmpfs", str(r)) for r in gone]
        out += [(OWN_HOME, m, m) for m in mine]
        if own and mine and own != real and any(Path(own).is_relative_to(r) for r in roots):  # its name leads there
            out.append((HOME_LINK, own, real))
        out += [("--tmpfs", str(p)) if os.path.isdir(p) else ("--ro-bind", str(p), "/dev/null") for p in self.hide]
        return out

    def dumps(self) -> str:
        """For a process that starts jobs elsewhere (a fast-lane worker): ``loads`` reads it."""
        return json.dumps({"kinds": sorted(self.kinds), "hide": [str(p) for p in self.hide], "network": self.network,
                           "run_as": self.run_as, "pids_max": self.pids_max, "why_not": self.why_not,
                           "homes": [str(h) for h in self.homes], "home_roots": [str(r) for r in self.home_roots],
                           "egress": self.egress,
                           "own_count": self.own_count, "seccomp": self.seccomp, "file_max": self.file_max,
                           "tmp_max": self.tmp_max, "bridge": self.bridge, "relay": self.relay})

    @classmethod
    def loads(cls, text: str) -> "Sandbox":
        d = json.loads(text)
        here = lambda ps: tuple(Path(p) for p in ps if os.path.exists(p))  # noqa: E731 (this node's)
        return cls(frozenset(d["kinds"]), here(d["hide"]), d["network"], d["run_as"], d["pids_max"], d["why_not"],
                   here(d["homes"]), here(d.get("home_roots", [])), d["egress"], d["own_count"], d.get("seccomp"),
                   d.get("file_max"), d.get("tmp_max"), d.get("bridge"), d.get("relay"))


@functools.lru_cache(maxsize=256)
def _home_of(uid: int) -> str | None:
    """Once per uid and process (a fast-lane worker asks on every task)."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


def _entries(d: Path) -> list[Path]:
    try:
        return [d / n for n in os.listdir(d)]
    except OSError:
        return []


@functools.lru_cache(maxsize=16)
def tool(name: str) -> str:
    """A program that corral runs ahead of a job, by its absolute path on the gateway's
    own PATH (the probe found it there): never looked up on a PATH a job chose."""
    return shutil.which(name) or name


def system_python() -> str:
    """The system's Python (the gateway's own may lie in a home the sandbox hides)."""
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"


def build(kinds: Sequence[str], extra_hide: Sequence[Path], network: bool, run_as: str | None,
          state: Sequence[Path], pids_max: int = 512, egress: Path | None = None, *, seccomp: bool = True,
          unix_sockets: bool = False, file_max: int | None = None, tmp_max: int | None = None,
          relay: str | None = None) -> Sandbox:
    """The facility's sandbox, probed once at start-up. ``state``: corral's own
    directories (hidden from every sandboxed job; a job's own directory is bound back).
    Every hidden path is hidden where it really lies: ``/var/run/munge`` is ``/run/munge``
    where ``/var/run`` is a link (bwrap cannot mount over a path through a link)."""
    missing = [p for p in extra_hide if not os.path.lexists(p)]
    if missing:
        raise InvalidRequest(f"[sandbox] hide names {', '.join(map(str, missing))}, which does not exist",
                             hint="fix the path or remove it from corral.toml")
    if os.geteuid() == 0 and run_as:
        try:
            uid = pwd.getpwnam(run_as).pw_uid
        except KeyError:
            raise InvalidRequest(f"[sandbox] run_as names the user {run_as!r}, who does not exist on this machine",
                                 hint="name an unprivileged user that exists (the default is 'nobody')") from None
        if uid == 0:
            raise InvalidRequest(f"[sandbox] run_as names {run_as!r}, who is root: a contained job is never root",
                                 hint="name an unprivileged user (the default is 'nobody')")
    # A path this process cannot even look at (a gateway run by a service account, before
    # root's 0700 home) is beyond its jobs too, who are that account: nothing to hide.
    hide = [Path(p) for p in SYSTEM if os.path.exists(p)]
    hide += [h / c for h in homes() for c in CREDENTIALS if os.path.exists(h / c)]
    hide += [Path(p) for p in (*state, *extra_hide) if os.path.exists(p)]
    hide = [Path(os.path.realpath(p)) for p in hide]
    program = None
    if seccomp and kinds:
        from corral.sandbox.seccomp import program as bpf
        program = bpf(unix_sockets)
    people = [Path(os.path.realpath(h)) for h in people_homes()]
    box = Sandbox(frozenset(kinds), tuple(dict.fromkeys(hide)), network, run_as, pids_max,
                  homes=tuple(people), home_roots=tuple(home_roots(people)), egress=str(egress) if egress else None,
                  seccomp=program, file_max=file_max, tmp_max=tmp_max,
                  bridge=str(egress.parent / BRIDGE_NAME) if egress else None, relay=relay if egress else None)
    if not kinds:
        return box
    why = probe(box)
    if why and os.geteuid() == 0 and run_as:  # unprivileged user namespaces off: a shared count
        lesser = replace(box, own_count=False)
        if probe(lesser) is None:
            return lesser
    return replace(box, why_not=why)


def probe(box: Sandbox) -> str | None:
    """Build one sandbox and run ``true`` in it: -> None if that worked, else why not
    and what to do, in an admin's words."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    for name in ("setpriv", "prlimit", "unshare"):
        if shutil.which(name) is None:
            return f"{name} is not installed (apt-get install util-linux)"
    if box.egress and shutil.which("socat") is None:
        return "socat is not installed (apt-get install socat): [sandbox] allow_hosts needs it"
    try:
        r = proc.run(box.wrap(next(iter(box.kinds)), ["true"], "/tmp"), timeout=20, check=False)
    except SandboxUnavailable as e:
        return str(e)
    except BackendError as e:
        return f"bwrap could not start ({e})"
    if r.returncode != 0:
        err = ((r.stderr or "").strip().splitlines()[-1:] or ["no message"])[0]
        if "seccomp" in err or "system-call filter" in err:
            return f"the sandbox's system-call filter could not be installed ({err}); the kernel needs seccomp (CONFIG_SECCOMP_FILTER)"
        if any(w in err.lower() for w in ("namespace", "uid map")):
            return (f"bwrap could not build a sandbox ({err}); allow unprivileged user namespaces "
                    "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)")
        if "can't mkdir" in err.lower() or "can't mount" in err.lower() or "no such file" in err.lower():
            return (f"bwrap could not build a sandbox ({err}): a path the profile hides or binds cannot be mounted "
                    "here; check [sandbox] hide and corral's home (an absolute path on a local filesystem)")
        return f"bwrap could not build a sandbox ({err})"
    return None
