"""Who a job runs as: one identity per side of the facility, never a shared one.

A gateway run as root starts every job as someone else (docs/decisions/0010-privsep.md):

- a principal with a Unix user runs as that user (an agent created without one took its
  sponsor's at creation: it works in its human's project, and what it writes there
  belongs to that human);
- a principal with neither gets a **dynamic identity**: a uid of its own from
  ``[sandbox] dynamic_uids`` (as systemd's ``DynamicUser=``), allocated on its first job,
  recorded in corral's private state and never handed to anyone else, so two agents
  never share a uid and none shares ``nobody``;
- an admin with no Unix user, and corral's own service principals (an image build
  writes corral's image store), run as the gateway's own user unless their kind is
  contained;
- nobody runs as root: a principal whose Unix user is root is refused; one whose Unix
  user this node does not know gets a dynamic uid of its own (logged: not synced here
  yet), unless NSS gave that user here before: then the user left the site's directory
  and the principal is refused (decision 0056).

Unix users are looked up through NSS at each job (``getpwnam``): a user of the site's
directory (LDAP through sssd or nslcd) is one as much as a line of /etc/passwd.

A gateway not run as root cannot change identity: every job is the gateway's user
(a researcher's own gateway), kept apart by the sandbox alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import logging
import os
import pwd
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from corral.core.errors import Forbidden, InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_RANGE = (61184, 65519)
"""systemd's range for dynamic users: outside what distributions give people and services."""
REGISTRY = Path("/var/lib/corral/uids")
"""The machine's record of dynamic uids given by every corral install on it (root's,
0600 in a 0700 directory): two gateway homes on one machine never hand out one uid."""
SYSTEMD_DYNAMIC = Path("/run/systemd/dynamic-uid")
"""Where systemd keeps a lock per dynamic uid its services hold now."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    user: str
    """The name the job sees in ``USER`` (its Unix user's, or its principal's)."""
    home: str | None
    """Its Unix user's home, if it has one (a dynamic identity has none)."""
    dynamic: bool = False

    @property
    def pair(self) -> tuple[int, int]:
        return self.uid, self.gid

    def describe(self) -> str:
        if self.dynamic:
            return f"dynamic uid {self.uid} (its principal has no Unix user)"
        return f"Unix user {self.user} (uid {self.uid})"


class Identities:
    """The facility's identities, as this gateway assigns them. ``path``: the record of
    dynamic uids (corral's private state, 0600)."""

    def __init__(self, path: Path, first: int = DEFAULT_RANGE[0], last: int = DEFAULT_RANGE[1],
                 root: bool | None = None, registry: Path = REGISTRY, nss: Path | None = None) -> None:
        self.path = Path(path)
        self.nss = nss
        """Where dynamic identities are published for NSS (corral/core/nss_users.py), or None."""
        self._resolved: set[int] = set()
        self._unresolved: dict[tuple[int, int, str], float] = {}
        """(uid, gid, name) -> until when NSS's "no" is believed (monotonic): asked again after."""
        self.registry = Path(registry)
        """The machine-wide record (``REGISTRY``), shared with every other install here."""
        self.install = os.path.realpath(self.path.parent)
        """This install, as the machine's record names it (its home)."""
        self.first, self.last = first, last
        self.root = os.geteuid() == 0 if root is None else root
        self._lock = threading.Lock()
        self._cache: dict[str, int] = {}
        """Uids already read or given: a record that only grows needs no second read."""
        self._users: dict[str, tuple[str, int]] = {}
        """Principals' Unix users as NSS last gave them (recorded in ``path``: see _saw)."""

    def of(self, principal: str, unix_user: str | None, admin: bool = False, contained: bool = False,
           service: bool = False) -> Identity | None:
        """The identity ``principal``'s jobs run as; None: the gateway's own (it is not
        root, or this is an admin's or corral's own service principals' uncontained work:
        an image build writes corral's image store)."""
        if not self.root:
            return None
        if unix_user:
            try:
                u = pwd.getpwnam(unix_user)  # through NSS: files, or the site's directory (sssd, nslcd)
            except KeyError:
                if service and not contained:  # corral's own work (a fast-lane pool's worker) for a user
                    return None                # this node does not know: as before, the gateway's
                self._refuse_if_gone(principal, unix_user)
                # Unknown on this node (users not synced here yet): a uid of the principal's
                # own, never the gateway's and never one shared with another principal.
                log.warning("principal %r names the Unix user %r, unknown on this machine: its jobs run as a "
                            "dynamic uid of its own", principal, unix_user)
                uid = self._dynamic(principal)
                return Identity(uid, uid, principal, None, dynamic=True)
            if u.pw_uid == 0:
                raise InvalidRequest(f"principal {principal!r} names the Unix user {unix_user!r}, who is root: corral "
                                     "never runs a job as root", hint="give the principal an unprivileged Unix user")
            if u.pw_gid == 0:  # root's group: its files (/etc/shadow's group on some, /root, ...) are the job's
                raise Forbidden(f"principal {principal!r} names the Unix user {unix_user!r}, whose primary group is "
                                "gid 0 (root's group): corral never runs a job in root's group",
                                hint=f"give {unix_user} another primary group in the site's directory (getent "
                                     f"passwd {unix_user} shows it), or give the principal another Unix user")
            self._saw(principal, unix_user, u.pw_uid)
            return Identity(u.pw_uid, u.pw_gid, u.pw_name, u.pw_dir)
        if (admin or service) and not contained:
            return None
        uid = self._dynamic(principal)
        return Identity(uid, uid, principal, None, dynamic=True)

    def _saw(self, principal: str, unix_user: str, uid: int) -> None:
        """Record that NSS gave ``principal``'s Unix user (once per principal, user and uid):
        a name that resolved here once and no longer does was removed from the site's
        directory, not merely not synced yet (decision 0056)."""
        if self._users.get(principal) == (unix_user, uid):
            return
        with self._lock, self._record() as data:
            data.setdefault("users", {})[principal] = [unix_user, uid]
        self._users[principal] = (unix_user, uid)

    def _refuse_if_gone(self, principal: str, unix_user: str) -> None:
        """A Unix user this gateway ran ``principal``'s jobs as, now unknown to NSS, is
        refused: the person left the site's directory (or the directory does not answer),
        and a uid of the principal's own would run a departed person's work regardless."""
        try:
            seen = json.loads(self.path.read_text()).get("users", {}).get(principal)
        except (FileNotFoundError, ValueError):
            seen = None
        if seen and seen[0] == unix_user:
            self._users.pop(principal, None)
            raise Forbidden(f"principal {principal!r}'s Unix user {unix_user!r} (uid {seen[1]}) is no longer known "
                            f"to this machine's user database (NSS: {nss_sources('passwd')}): removed from the "
                            "site's directory, or the directory does not answer; corral runs no job of it",
                            hint=f"restore {unix_user!r} in the directory (check it with: getent passwd "
                                 f"{unix_user}), or the admin revokes the principal's tokens or gives it "
                                 "another Unix user", rule="unix-user-gone")

    @contextlib.contextmanager
    def _record(self) -> Iterator[dict[str, Any]]:
        """This install's record (``path``), locked (flock) while held, written back
        atomically if changed (a principal's uid already there costs no write)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                data = json.loads(self.path.read_text())
            except FileNotFoundError:
                data = {"next": self.first, "uids": {}}
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                _write(self.path, data)
        finally:
            os.close(fd)

    def known(self) -> dict[str, int]:
        """principal -> dynamic uid, as recorded."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): int(v) for k, v in data.get("uids", {}).items()}

    def _dynamic(self, principal: str) -> int:
        """Its uid, allocated once: the lowest never given out on this machine (by any
        corral install: the machine's record, ``registry``) and known to no user or group
        database (nss-systemd included). A uid is never handed out twice (the records
        only grow), so files a former principal, or another install's, left behind never
        become another's."""
        if principal in self._cache:  # every later job of it: no file read on the submit path
            return self._cache[principal]
        with self._lock, self._record() as data:
            uids: dict[str, int] = data.setdefault("uids", {})
            if principal in uids:
                # Recorded here before the machine's record existed (or by a copy of this
                # home): claimed there now, refused if another install holds it.
                uid = int(uids[principal])
                with self._machine() as machine:
                    self._claim(machine, uid, principal)
                self._publish(principal, uid)
            else:
                uid = self._allocate(principal, uids)
                uids[principal] = uid
                data["next"] = uid + 1
        self._cache[principal] = uid
        return uid

    def _allocate(self, principal: str, uids: dict[str, int]) -> int:
        """A new uid for ``principal``, claimed in the machine's record and published, under
        its lock (another install's allocation sees it taken); ``uids``: this home's."""
        with self._machine() as machine:
            for p, u in uids.items():  # this home's earlier uids, claimed before a new one
                self._claim(machine, int(u), p, strict=False)
            mine = [int(u) for u, h in machine.items()  # claimed, and this record lost (a crash between)
                    if h.get("home") == self.install and h.get("principal") == principal]
            uid = mine[0] if mine else self._free(machine, set(map(int, uids.values())))
            if uid is None:
                raise InvalidRequest(f"no dynamic uid is left in {self.first}-{self.last} for {principal!r}",
                                     hint="the admin must widen [sandbox] dynamic_uids or give principals Unix users")
            self._claim(machine, uid, principal)
            self._publish(principal, uid)  # named before another install can take the uid
        return uid

    def _publish(self, principal: str, uid: int) -> None:
        """``uid`` written where NSS reads it (``nss``), so Slurm's daemons resolve it and a
        Slurm job runs as it (decision 0063). Not published (a directory not root's, a uid
        another source names): logged, and its Slurm jobs run as before (root drops to it)."""
        if self.nss is None:
            return
        from corral.core import nss_users

        try:
            nss_users.publish(self.nss, uid, principal, self.first, self.last)
        except (InvalidRequest, OSError) as e:
            log.warning("dynamic uid %d of %r not published for NSS in %s: %s", uid, principal, self.nss, e)

    def resolves(self, ident: Identity) -> bool:
        """Whether NSS gives a dynamic ``ident`` the name corral published for it (its
        principal's or ``corral-UID``), its own group and a uid of the range: then Slurm
        may start its jobs as it (``sbatch --uid``). A uid NSS names otherwise is not used."""
        if ident.uid in self._resolved:
            return True
        if time.monotonic() < self._unresolved.get(ident.pair + (ident.user,), 0.0):
            return False  # asked lately: a site's NSS may ask its directory, for each step of each submission
        from corral.core import nss_users

        ok = ident.dynamic and self.first <= ident.uid <= self.last and \
            nss_users.resolves(ident.uid, ident.gid, (ident.user, f"corral-{ident.uid}"))
        if ok:
            self._resolved.add(ident.uid)
        else:
            self._unresolved[ident.pair + (ident.user,)] = time.monotonic() + 30.0
        return ok

    # -- the machine's record ---------------------------------------------------------

    @contextlib.contextmanager
    def _machine(self) -> Iterator[dict[str, dict[str, str]]]:
        """The machine's record of dynamic uids, locked (flock) while held, written back
        atomically if changed. Its directory must be root's and closed to others: a
        record someone else could write would let them decide who a job runs as."""
        d = self.registry.parent
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise InvalidRequest(f"the machine's record of dynamic uids lies in {d}, which is not a directory "
                                 "only this gateway's user (root) may write",
                                 hint=f"the admin must make {d} root's and mode 0700, or set [sandbox] uid_registry")
        fd = os.open(d / (self.registry.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with open(os.open(self.registry, os.O_RDONLY | os.O_NOFOLLOW)) as f:
                    machine: dict[str, dict[str, str]] = json.load(f).get("uids", {})
            except FileNotFoundError:
                machine = {}
            before = json.dumps(machine, sort_keys=True)
            yield machine
            if json.dumps(machine, sort_keys=True) != before:
                tmp = self.registry.with_name(self.registry.name + ".tmp")
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
                    json.dump({"uids": machine}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.registry)
        finally:
            os.close(fd)

    def _claim(self, machine: dict[str, dict[str, str]], uid: int, principal: str, strict: bool = True) -> None:
        """Record ``uid`` as this install's ``principal``'s; one another install holds is
        refused (``strict``) or left alone (its principal is refused when it next runs)."""
        held = machine.get(str(uid))
        if held is None:
            machine[str(uid)] = {"home": self.install, "principal": principal}
        elif held.get("home") != self.install or held.get("principal") != principal:
            if strict:
                raise InvalidRequest(
                    f"principal {principal!r}'s dynamic uid {uid} is also given to {held.get('principal')!r} of the "
                    f"corral install at {held.get('home')}: two installs on this machine must never share a uid",
                    hint=f"the admin must remove {principal!r} from {self.path} (it gets a new uid on its next job, "
                         "and files it left keep the old one) or retire the other install's record")

    def _free(self, machine: dict[str, dict[str, str]], ours: set[int]) -> int | None:
        """The lowest uid of the range that nobody has: not in the password or group
        database (files, and nss-systemd's services of the moment, through getpwuid), not
        held by systemd's DynamicUser, not given by any corral install on this machine."""
        listed = {u.pw_uid for u in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
        for uid in range(self.first, self.last + 1):
            if uid in listed or uid in ours or str(uid) in machine or (SYSTEMD_DYNAMIC / str(uid)).exists():
                continue
            try:
                pwd.getpwuid(uid)
                continue
            except KeyError:
                pass
            try:
                grp.getgrgid(uid)
                continue
            except KeyError:
                pass
            return uid
        return None


def _write(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def nss_sources(database: str, conf: Path = Path("/etc/nsswitch.conf")) -> str:
    """What nsswitch.conf names for ``database`` (``files ldap``), as this process's NSS reads it."""
    try:
        for line in conf.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key.strip() == database:
                return " ".join(rest.split("#")[0].split()) or "files"
    except OSError:
        pass
    return "files"
