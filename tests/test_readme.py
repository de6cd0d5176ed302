"""README executed: its five-minute tour and its "Run your agent through corral" block,
taken from README.md as written (not copied here), run by bash against a gateway started
as `make run` starts it (`.venv/bin/corral serve` in the checkout, the relative home
`.corral`, no CORRAL_HOME), as root and as an ordinary user. A documented command that
fails, or prints what README does not lead a reader to expect, fails the test.

Two things differ from a reader's terminal, each because a test must: the gateway's port
(CORRAL_PORT, and CORRAL_URL for the commands, so the test clashes with no gateway on
8765) and `claude`, which is not installed here: a stand-in on PATH does what an agent
does by habit (sbatch a script, poll squeue, read the output file)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from .conftest import drop_scratch, free_port
from .test_sandbox import need_bwrap

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
USER = "corral-newcomer"
"""The ordinary user who follows README in the second run (created when missing)."""


def block(section: str) -> str:
    """The first ```sh block under the README heading that starts with ``section``."""
    text = README.read_text()
    at = re.search(rf"^## {re.escape(section)}.*$", text, re.M)
    assert at, f"README has no section '## {section}'"
    body = text[at.end():]
    body = body[:m.start()] if (m := re.search(r"^## ", body, re.M)) else body
    code = re.search(r"^```sh\n(.*?)^```", body, re.M | re.S)
    assert code, f"README's '{section}' has no sh block"
    return code.group(1)


def commands(text: str) -> list[tuple[str, str]]:
    """(command, its comment) per logical line: continuations joined, blank lines dropped."""
    out: list[tuple[str, str]] = []
    for line in re.sub(r"\\\n\s*", "", text).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(.*?)\s{2,}#\s?(.*)$", line)
        out.append((m.group(1).strip(), m.group(2)) if m else (line.strip(), ""))
    return out


def script(cmds: list[tuple[str, str]]) -> str:
    """bash that stops at the first failing command and marks where each one's output starts.
    `export X=$(cmd)` is run as `X=$(cmd); export X`: the assignment carries cmd's status."""
    lines = ["set -eo pipefail"]
    for i, (cmd, _) in enumerate(cmds):
        m = re.match(r"^export (\w+)=(\$\(.*\))$", cmd)
        lines += [f"echo '@@@ {i}'", f"{m.group(1)}={m.group(2)}; export {m.group(1)}" if m else cmd]
    return "\n".join(lines + ["echo '@@@ end'"]) + "\n"


def outputs(text: str, n: int) -> list[str]:
    parts = re.split(r"^@@@ (\d+|end)\n", text, flags=re.M)
    got = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return [got.get(str(i), "") for i in range(n)]


FAKE_CLAUDE = """#!/bin/bash
# What an agent does by habit, in the directory it was started in (no directory of its own
# made first), through whatever sbatch and squeue are first on PATH.
set -e
pwd
printf '#!/bin/bash\\n#SBATCH --time=1\\necho "hello from the agent job"\\n' > job.sh
id=$(sbatch --parsable job.sh)
while squeue -h -j "$id" | grep -q .; do sleep 1; done
sacct -j "$id" -n -o State -P | head -1
cat "slurm-$id.out"
"""


class Newcomer:
    """A checkout as a new user has it after `make run`: the venv, and the gateway
    started in the checkout, run as ``user`` (None: whoever runs the tests)."""

    def __init__(self, user: str | None) -> None:
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix="corral-readme-", dir="/tmp"))
        self.checkout = self.dir / "corral"
        self.checkout.mkdir()
        (self.checkout / ".venv").symlink_to(self._venv() if user else Path(sys.prefix))
        bindir = self.dir / "bin"
        bindir.mkdir()
        (bindir / "claude").write_text(FAKE_CLAUDE)
        (bindir / "claude").chmod(0o755)
        self.port = free_port()
        pw = pwd.getpwnam(user) if user else pwd.getpwuid(os.getuid())
        self.env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": pw.pw_dir, "USER": pw.pw_name,
                    "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(self.dir / "state"),
                    "CORRAL_PORT": str(self.port), "CORRAL_URL": f"http://127.0.0.1:{self.port}"}
        self.prefix: list[str] = []
        if user:
            self.env["CORRAL_PERSONAL"] = "true"  # as `make run` by a plain user: her own gateway
            self.prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]
            self.dir.chmod(0o755)
            for p in self.dir.rglob("*"):
                os.lchown(p, pw.pw_uid, pw.pw_gid)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        else:
            self.dir.chmod(0o755)  # an agent's job runs as nobody under a root gateway: it must enter
        self.gateway: subprocess.Popen[bytes] | None = None
        self.made: list[Path] = []
        """Directories made elsewhere for the run (an agent's own, under a root gateway)."""

    def _venv(self) -> Path:
        """A venv of the system's python over the test venv's packages: the test venv's own
        interpreter may lie where an ordinary user cannot run it (a root-only pyenv)."""
        venv = self.dir / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "test-venv.pth").write_text(next(Path(sys.prefix, "lib").glob("python3*/site-packages")).as_posix()
                                            + "\n")
        for script, module in (("corral", "corral.edges.cli.main"), ("corral-slurm", "corral.edges.shims")):  # pyproject's scripts
            (venv / "bin" / script).write_text(f"#!{venv}/bin/python\nfrom {module} import main\nmain()\n")
            (venv / "bin" / script).chmod(0o755)
        return venv

    def serve(self) -> None:
        log = open(self.dir / "gateway.out", "wb")
        self.gateway = subprocess.Popen([*self.prefix, str(self.checkout / ".venv" / "bin" / "python"), "-m",
                                         "corral.edges.cli.main", "serve"], cwd=self.checkout, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90  # a loaded machine (tests/conftest.py waits as long)
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.env['CORRAL_URL']}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.gateway.poll() is None, (self.dir / "gateway.out").read_text()
            time.sleep(0.2)
        raise AssertionError("the gateway did not answer within 90 s")

    def run(self, section: str, activated: bool = False) -> list[tuple[str, str, str]]:
        """README's block under ``section``, in a new terminal in the checkout (the venv
        activated first, as the tour has a reader do, when ``activated``) -> (command,
        README's comment on it, its output) for each command."""
        cmds = commands(block(section))
        first = "source .venv/bin/activate\n" if activated else ""
        cp = subprocess.run([*self.prefix, "bash", "-c", first + script(cmds)], cwd=self.checkout, env=self.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        outs = outputs(cp.stdout, len(cmds))
        done = [(c, note, o) for (c, note), o in zip(cmds, outs)]
        if cp.returncode != 0:
            last = max(i for i, o in enumerate(outs) if f"@@@ {i}\n" in cp.stdout or o)
            raise AssertionError(f"README ({section}): `{cmds[last][0]}` failed ({cp.returncode}):\n{outs[last]}"
                                 f"\ngateway: {(self.dir / 'gateway.out').read_text()[-1500:]}")
        return done

    def close(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.send_signal(signal.SIGTERM)
            try:
                self.gateway.wait(20)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
        drop_scratch(self.checkout / ".corral")
        shutil.rmtree(self.dir, ignore_errors=True)
        for d in self.made:
            shutil.rmtree(d, ignore_errors=True)


def ordinary_user() -> str:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    return USER


@pytest.fixture(params=["root", "user"])
def newcomer(request: pytest.FixtureRequest) -> Iterator[Newcomer]:
    need_bwrap()
    if os.geteuid() != 0:
        if request.param == "user":
            pytest.skip("already an ordinary user: the other run is this one")
        nc = Newcomer(None)
    else:
        nc = Newcomer(ordinary_user() if request.param == "user" else None)
    try:
        nc.serve()
        yield nc
    finally:
        nc.close()


def said(done: list[tuple[str, str, str]], command: str) -> list[str]:
    return [o for c, _, o in done if c == command]


def test_readme_tour_and_agent_block_work_as_written(newcomer: Newcomer) -> None:
    tour = newcomer.run("A five-minute tour")
    for cmd, note, out in tour:
        assert "error:" not in out and "Traceback" not in out, f"`{cmd}` printed:\n{out}"
        if cmd == "corral whoami":  # README says what it answers: "admin: ...", "claude-1 (agent), ..."
            assert out.startswith(note.split(":")[0]), f"`{cmd}`: README says '{note}', it printed {out!r}"
    assert said(tour, "corral logs 1")[0].startswith("hello from "), tour
    assert re.search(r"job 2: CANCELLED", said(tour, "corral wait 2")[0]), tour
    listing = said(tour, "corral jobs")[0]
    assert "COMPLETED" in listing and "CANCELLED" in listing and "tour-1" in listing

    agent = newcomer.run("Run your agent through corral", activated=True)
    for cmd, _, out in agent:
        assert "error:" not in out and "Traceback" not in out, f"`{cmd}` printed:\n{out}"
    session = [o for c, _, o in agent if c.startswith("corral agent run")][0]
    assert "COMPLETED" in session and "hello from the agent job" in session, session
    if newcomer.user is None and os.geteuid() == 0:
        # A root gateway, the block typed as root: the agent's jobs run as a uid of its own,
        # never root, so the agent works in a directory of that uid's, said in one line
        # (decision 0056); its output file is there, its own.
        said_where = re.search(r"^corral: my-agent's jobs run as dynamic uid (\d+) .*, never as root, and may not "
                               r"write (\S+): the agent works in (\S+), a directory of its own\.", session, re.M)
        assert said_where and said_where[2] == str(newcomer.checkout), session
        own = Path(said_where[3])
        newcomer.made.append(own)
        assert f"\n{own}\n" in session, session  # the agent's pwd
        assert own.stat().st_uid == int(said_where[1])
        assert [p.stat().st_uid for p in own.glob("slurm-*.out")] == [int(said_where[1])], list(own.iterdir())
    else:  # the agent's jobs are the person's own: it works where it was started
        assert f"\n{newcomer.checkout}\n" in session, session
