"""A site's directory for tests: Debian's slapd with a database of its own, and nslcd
(libnss-ldapd) answering NSS for it, seen only inside a private mount namespace.

Nothing of the machine's changes: slapd listens on an ldapi socket in a temporary
directory (no TCP port); a holder process is started with ``unshare -m`` and, in its
namespace alone, an ``nsswitch.conf`` naming ``ldap`` for passwd and group, an
``nslcd.conf`` pointing at that socket and a ``/run/nslcd`` of the test's own are bound
over the machine's. nslcd runs in that namespace; whatever a test starts there (``argv``
prefixes its command with ``nsenter``) resolves the directory's users, every other
process on the machine never sees them. scripts/ldap-up installs the packages.

A user who exists only here: no line in /etc/passwd, uid in USERS_FIRST.. (outside the
distribution's people and corral's dynamic range)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import pytest

SUFFIX = "dc=corral,dc=test"
ROOTDN = f"cn=admin,{SUFFIX}"
SECRET = "directory-secret"  # the test's own database's, on a socket in the test's own directory
USERS_FIRST = 23000
SLAPD, NSLCD = Path("/usr/sbin/slapd"), Path("/usr/sbin/nslcd")


def need_ldap() -> None:
    """The packages, else skip (fail under CI, where make test installs them)."""
    if SLAPD.exists() and NSLCD.exists() and shutil.which("ldapadd") and os.geteuid() == 0:
        return
    why = "needs root and Debian's slapd, nslcd and libnss-ldapd (sudo scripts/ldap-up)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _wait(ok, what: str, within: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {within:.0f} s")


class Directory:
    """slapd + nslcd in a namespace. ``add_user``/``remove_user`` change the directory;
    ``argv`` runs a command in the namespace."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-ldap-", dir="/tmp"))
        self.dir.chmod(0o755)  # nslcd (its own user) reaches the socket through it
        self.socket = self.dir / "ldapi"
        self.uri = "ldapi://" + urllib.parse.quote(str(self.socket), safe="")
        self.slapd: int | None = None
        self.holder: subprocess.Popen[bytes] | None = None
        self._next = USERS_FIRST + os.getpid() % 500 * 4

    # -- slapd ------------------------------------------------------------------------

    def _slapd_conf(self) -> Path:
        (self.dir / "db").mkdir()
        schema = "\n".join(f"include /etc/ldap/schema/{s}.schema" for s in ("core", "cosine", "nis", "inetorgperson"))
        conf = self.dir / "slapd.conf"
        conf.write_text(f"""{schema}
pidfile {self.dir}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 16777216
suffix "{SUFFIX}"
rootdn "{ROOTDN}"
rootpw {SECRET}
directory {self.dir}/db
access to * by * read
""")
        return conf

    def _start_slapd(self) -> None:
        conf = self._slapd_conf()
        subprocess.run([str(SLAPD), "-f", str(conf), "-h", self.uri], check=True, timeout=60)
        _wait(lambda: (self.dir / "slapd.pid").exists() and self.socket.exists(), "slapd did not start")
        self.slapd = int((self.dir / "slapd.pid").read_text())
        self.ldap("ldapadd", f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: corral\ndc: corral\n\n"
                  f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n\n"
                  f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n")

    def ldap(self, tool: str, ldif: str = "", *args: str) -> str:
        cp = subprocess.run([tool, "-x", "-H", self.uri, "-D", ROOTDN, "-w", SECRET, *args], input=ldif,
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, f"{tool}: {cp.stderr}"
        return cp.stdout

    # -- the namespace ----------------------------------------------------------------

    def _start_namespace(self) -> None:
        (self.dir / "nsswitch.conf").write_text(
            "passwd: files ldap\ngroup: files ldap\nshadow: files\nhosts: files dns\n")
        # nslcd's own timeouts: a directory that stops answering fails a lookup in seconds, not forever
        (self.dir / "nslcd.conf").write_text(
            f"uid nslcd\ngid nslcd\nuri {self.uri}\nbase {SUFFIX}\n"
            "bind_timelimit 5\ntimelimit 10\nidle_timelimit 60\nreconnect_sleeptime 1\nreconnect_retrytime 5\n")
        (self.dir / "nslcd.conf").chmod(0o600)
        run = self.dir / "nslcd-run"
        run.mkdir()
        shutil.chown(run, "nslcd", "nslcd")
        Path("/run/nslcd").mkdir(exist_ok=True)  # the mount point (the package's own directory)
        binds = " && ".join(f"mount --bind {self.dir / a} {b}" for a, b in (
            ("nsswitch.conf", "/etc/nsswitch.conf"), ("nslcd.conf", "/etc/nslcd.conf"), ("nslcd-run", "/run/nslcd")))
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"{binds} && {NSLCD} && exec sleep infinity"], stdin=subprocess.DEVNULL, start_new_session=True)
        holder = self.holder
        _wait(lambda: (run / "socket").exists() or holder.poll() is not None, "nslcd did not start in its namespace")
        assert holder.poll() is None, "the namespace's set-up failed (mount or nslcd)"

    def argv(self, *cmd: str) -> list[str]:
        """``cmd`` run in the directory's namespace."""
        assert self.holder is not None
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *cmd]

    # -- users ------------------------------------------------------------------------

    def add_user(self, name: str, gid: int | None = None) -> int:
        """A user (and her group, of the same number) in the directory only: -> her uid.
        ``gid``: her primary group's number instead (her own group is still made)."""
        uid = self._next
        self._next += 1
        home = self.dir / "home" / name
        home.mkdir(parents=True)
        os.chown(home, uid, uid)
        self.ldap("ldapadd", f"dn: cn={name},ou=groups,{SUFFIX}\nobjectClass: posixGroup\ncn: {name}\n"
                  f"gidNumber: {uid}\n\n"
                  f"dn: uid={name},ou=people,{SUFFIX}\nobjectClass: account\nobjectClass: posixAccount\n"
                  f"cn: {name}\nuid: {name}\nuidNumber: {uid}\ngidNumber: {uid if gid is None else gid}\nhomeDirectory: {home}\n"
                  "loginShell: /bin/bash\n")
        return uid

    def remove_user(self, name: str) -> None:
        self.ldap("ldapdelete", "", f"uid={name},ou=people,{SUFFIX}", f"cn={name},ou=groups,{SUFFIX}")

    def getent(self, *key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv("getent", *key), capture_output=True, text=True, timeout=60)

    # -- life -------------------------------------------------------------------------

    def start(self) -> "Directory":
        self._start_slapd()
        self._start_namespace()
        return self

    def stop(self) -> None:
        pid = self.dir / "nslcd-run" / "nslcd.pid"
        if pid.exists():
            _kill(int(pid.read_text()))
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(10)
        if self.slapd is not None:
            _kill(self.slapd)
        shutil.rmtree(self.dir, ignore_errors=True)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
