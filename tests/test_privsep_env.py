"""A job's environment reaches the job, never the privileged steps that start it (issue
32's review, F1 and F16; docs/decisions/0010-privsep.md).

An agent chooses its job's ``env``. Before, that environment was the one root's bwrap
ran with: a ``PATH`` that named the agent's own ``bwrap`` first, or an ``LD_PRELOAD`` of
the agent's library, ran the agent's code as root (on the local backend and in Slurm's
batch script alike), and an ``LD_PRELOAD`` ran before the system-call filter. Every step
ahead of the job now runs by absolute path with corral's environment; the job's own is
applied by the last step, after the filter. Each test plants the attacker's tools in a
directory the agent can write and asserts that nothing of them ran as root, while the
job still sees the environment it asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, running
from .test_privsep import run, tokens
from .test_sandbox import need_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="the attack is on a root gateway (CI runs as root)")

PRELOAD = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void corral_test_preload(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "euid=%%d exe=", (int)geteuid()); char b[256]; ssize_t n = readlink("/proc/self/exe", b, 255);
             if (n > 0) { b[n] = 0; fprintf(f, "%%s", b); } fprintf(f, "\n"); fclose(f); }
}
"""


@pytest.fixture
def evil() -> Iterator[Path]:
    """What an agent can plant: its own bwrap, setpriv, prlimit, unshare, python3, bash
    and socat on a PATH it names, each logging who ran it before passing on to the real
    one, and a preload library that logs its effective uid."""
    # not under /tmp, which every sandbox replaces with its own: the job must see it too
    Path("/srv").mkdir(exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="corral-evil-", dir="/srv"))
    d.chmod(0o777)
    log = d / "ran.log"
    log.touch()
    log.chmod(0o666)
    for tool in ("bwrap", "setpriv", "prlimit", "unshare", "python3", "bash", "socat", "strace"):
        real = shutil.which(tool)
        if real is None:
            continue
        f = d / tool
        f.write_text(f"#!/bin/sh\necho \"{tool} uid=$(id -u)\" >> {log}\nexec {real} \"$@\"\n")
        f.chmod(0o755)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: the preload library of this attack cannot be built (scripts/sandbox-up installs gcc)")
    (d / "p.c").write_text(PRELOAD % log)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "p.so"), str(d / "p.c")], check=True)
    (d / "p.so").chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def ran_as_root(log: Path) -> list[str]:
    lines = log.read_text().splitlines()
    return [ln for ln in lines if "uid=0 " in ln + " " or ln.startswith("euid=0 ")]


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    need_bwrap()
    with running(tmp_path) as g:
        yield g


@pytest.mark.parametrize("where", ["own directory", "a project"])
def test_a_jobs_path_and_preload_never_reach_roots_steps(gw: Gateway, evil: Path, where: str) -> None:
    t = tokens(gw, ("bot1", "alice"))
    log = evil / "ran.log"
    body: dict[str, Any] = {"command": "echo path=$PATH; echo mine=$MINE; id -u",
                            "env": {"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": str(evil / "p.so"), "MINE": "kept"}}
    if where == "a project":  # the built sandbox's path (a host per directory)
        body["workdir"] = str(evil)
    job = run(gw, t["bot1"], body)
    assert job["state"] == "COMPLETED", job
    # The job has the environment it asked for ...
    assert f"path={evil}:/usr/bin:/bin" in job["out"] and "mine=kept" in job["out"], job
    uid = int(job["out"].split()[-1])
    assert uid != 0, job
    # ... and nothing it planted ran as root: not its bwrap, not its setpriv, not its library.
    assert ran_as_root(log) == [], log.read_text()
    if where == "a project":  # writable inside: the preload did load in the job's own processes, as the job
        assert f"euid={uid}" in log.read_text(), log.read_text()


def test_the_preload_runs_after_the_filter(gw: Gateway, evil: Path) -> None:
    """F16: the library a job preloads loads in the job's own program, never in the
    sandbox's setup ahead of the filter (prlimit, the filter's own Python)."""
    t = tokens(gw, ("bot1", "alice"))
    log = evil / "ran.log"
    job = run(gw, t["bot1"], {"command": "true", "env": {"LD_PRELOAD": str(evil / "p.so")}})
    assert job["state"] == "COMPLETED", job
    # (the job's own processes cannot write the log from inside: / is read-only there)
    exes = [ln.split("exe=", 1)[1] for ln in log.read_text().splitlines() if "exe=" in ln]
    for exe in exes:  # only the job's bash (and what it runs) loaded it
        assert Path(exe).name not in ("bwrap", "setpriv", "prlimit", "unshare") and "python" not in Path(exe).name, exes


@pytest.mark.parametrize("workdir", ["/tmp/x\n#SBATCH --nice=-5000\ntrue", "/tmp/x\rid", "/tmp/\x1bx", "/tmp/x\x7f"])
def test_a_control_character_in_a_path_is_refused_before_anything_runs(gw: Gateway, workdir: str) -> None:
    """F5: a newline in a working directory became lines of root's batch script on
    Slurm; no path with a control character is accepted, in any field that holds one."""
    t = tokens(gw, ("bot1", "alice"))
    with gw.http(t["bot1"]) as h:
        for body in ({"command": "true", "workdir": workdir}, {"command": "true", "inputs": [workdir]}):
            r = h.post("/v1/jobs", json=body)
            assert r.status_code == 400 and "control character" in r.text, r.text
        assert h.get("/v1/jobs").json()["jobs"] == [], "nothing was recorded"


def test_an_agent_run_as_the_gateways_user_never_becomes_its_admin(gateway: Gateway, people: dict[str, str],
                                                                   agent_dir: Path) -> None:
    """F12: the agent runs as the user who runs the gateway (README's tour). Its own token
    unset, the CLI fell back to the gateway's admin token (found through the pointer the
    gateway leaves, from any directory), and the agent minted itself tokens. Inside the
    fence no gateway home or pointer is visible, and the CLI never falls back in an agent
    session, fenced or not."""
    from .test_sandbox import need_bwrap
    from .test_shims import agent_run

    need_bwrap()
    admin = (gateway.home / "admin.token").read_text().strip()
    script = ("corral whoami; echo rc=$?; env -u CORRAL_TOKEN -u CORRAL_HOME corral whoami; echo rc=$?; "
              f"cat {gateway.home}/admin.token; echo rc=$?; ls {gateway.home} | wc -l; "
              "cat ${XDG_STATE_HOME:-$HOME/.local/state}/corral/gateways/* 2>/dev/null | wc -l")
    for flags in ((), ("--no-fence",)):
        r = agent_run(gateway, people["bot1"], script, agent_dir, *flags)
        said = r.stdout.split("rc=")
        assert "bot1" in said[0] and said[1].startswith("0"), (flags, r.stdout, r.stderr)
        assert said[2].startswith("2") and "admin (human" not in r.stdout, (flags, r.stdout)  # no fallback
        if not flags:  # fenced: the homes and pointers are not there to read
            assert admin not in r.stdout and r.stdout.split()[-2:] == ["0", "0"], r.stdout
        # (unfenced, the agent is its user and reads what that user may: run the gateway as
        # another account, root or a service account, as README says)
