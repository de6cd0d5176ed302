"""Privilege separation, attacked as someone who has read the code (issue 32;
docs/decisions/0010-privsep.md).

Every job here is an ordinary job that the default policy accepts, run by an agent's
token against a real root gateway on the local backend, in real bubblewrap. Canaries
belong to other identities; each test asserts that nothing outside the job changed,
was read or was signalled, and that the job itself learns why it was refused."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, running
from .test_sandbox import need_bwrap

DYNAMIC = (61184, 65519)
"""[sandbox] dynamic_uids' default (systemd's DynamicUser range)."""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="privilege separation is a root gateway's (CI runs as root)")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    need_bwrap()
    with running(tmp_path, CORRAL_SANDBOX__OUTPUT_MAX=str(4 << 20), CORRAL_SANDBOX__FILE_MAX=str(8 << 20)) as g:
        yield g


def tokens(gw: Gateway, *agents: tuple[str, str]) -> dict[str, str]:
    """Humans and the agents they sponsor (agent, sponsor) -> name: token."""
    with gw.http() as h:
        for name in sorted({s for _, s in agents}):
            assert h.post("/v1/principals", json={"name": name, "kind": "human"}).status_code == 201
        for name, sponsor in agents:
            assert h.post("/v1/principals", json={"name": name, "kind": "agent", "sponsor": sponsor}).status_code == 201
        return {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n, _ in agents}


def submit(gw: Gateway, token: str, body: dict[str, Any]) -> Any:
    with gw.http(token) as h:
        return h.post("/v1/jobs", json={"walltime": "60s", **body})


def finish(gw: Gateway, token: str, job_id: int) -> dict[str, Any]:
    with gw.http(token) as h:
        job = h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 60}).json()
        out = h.get(f"/v1/jobs/{job_id}/output").json()["data"]
        err = h.get(f"/v1/jobs/{job_id}/output", params={"stream": "stderr"}).json()["data"]
    return {**job, "out": out, "err": err}


def run(gw: Gateway, token: str, body: dict[str, Any]) -> dict[str, Any]:
    r = submit(gw, token, body)
    assert r.status_code == 201, r.text
    return finish(gw, token, r.json()["id"])


@pytest.fixture
def project() -> Iterator[Path]:
    """A project any identity may write (the agents here have no Unix user)."""
    d = Path(tempfile.mkdtemp(prefix="corral-proj-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def secret() -> Iterator[Path]:
    """A file of another identity's (root's here), 0600, in a place jobs can name."""
    d = Path(tempfile.mkdtemp(prefix="corral-canary-", dir="/tmp"))
    d.chmod(0o755)
    f = d / "ledger.txt"
    f.write_text("CANARY-SECRET-7f3a\n")
    f.chmod(0o600)
    yield f
    shutil.rmtree(d, ignore_errors=True)


def test_agents_never_share_an_identity_and_own_what_they_write(gw: Gateway, project: Path) -> None:
    t = tokens(gw, ("bot1", "alice"), ("bot2", "carol"), ("bot3", "alice"))
    uids = {}
    for name in ("bot1", "bot2", "bot3"):
        job = run(gw, t[name], {"command": f"id -u; echo hi > {name}.txt", "workdir": str(project)})
        assert job["state"] == "COMPLETED", job
        uids[name] = int(job["out"].split()[0])
        assert (project / f"{name}.txt").stat().st_uid == uids[name]  # what it wrote is its own
    assert len(set(uids.values())) == 3, uids  # no two agents share a uid, nobody is `nobody`
    assert all(DYNAMIC[0] <= u <= DYNAMIC[1] for u in uids.values()), uids
    assert 65534 not in uids.values()
    # Stable across a restart: recorded in corral's private state.
    gw.kill(signal.SIGTERM)
    gw.start()
    again = run(gw, t["bot2"], {"command": "id -u", "workdir": str(project)})
    assert int(again["out"].split()[0]) == uids["bot2"]


def test_an_agent_works_as_its_sponsors_unix_user(gw: Gateway, project: Path) -> None:
    name = f"corralt{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)  # left by an interrupted run
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    try:
        u = pwd.getpwnam(name)
        own = Path(tempfile.mkdtemp(prefix="corral-own-", dir="/tmp"))
        os.chown(own, u.pw_uid, u.pw_gid)
        own.chmod(0o755)
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "dana", "kind": "human", "unix_user": name}).status_code == 201
            assert h.post("/v1/principals", json={"name": "bot9", "kind": "agent", "sponsor": "dana"}).status_code == 201
            tok = h.post("/v1/tokens", json={"for": "bot9", "expires": "1h"}).json()["token"]
        job = run(gw, tok, {"command": "echo result > out.txt; id -un", "workdir": str(own)})
        assert job["state"] == "COMPLETED", job
        assert job["out"].split()[0] == name
        assert (own / "out.txt").stat().st_uid == u.pw_uid  # the human's own file, in the human's project
        # A directory the sponsor cannot write is refused before anything runs, naming who.
        r = submit(gw, tok, {"command": "true", "workdir": str(project.parent / "nonexistent-but-no")})
        assert r.status_code == 400
        closed = Path(tempfile.mkdtemp(prefix="corral-closed-", dir="/tmp"))
        closed.chmod(0o755)
        r = submit(gw, tok, {"command": "touch x", "workdir": str(closed)})
        assert r.status_code == 400 and name in r.json()["error"]["message"], r.text
        shutil.rmtree(own, ignore_errors=True)
        shutil.rmtree(closed, ignore_errors=True)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.mark.parametrize("where", ["/", "/proc", "/proc/1", "/dev/shm", "/var/tmp", "/etc", "/run", "/sys",
                                   "/root", "HOME", "HOME/local", "HOME/local/jobs", "OTHERJOB", "LINK"])
def test_forbidden_working_directories_are_refused_with_the_rule(gw: Gateway, project: Path, where: str) -> None:
    t = tokens(gw, ("bot1", "alice"), ("bot2", "carol"))
    other = run(gw, t["bot2"], {"command": "echo mine"})  # another agent's job and its directory
    home = gw.home.resolve()
    link = project / "innocent"
    link.symlink_to(home)  # a link the agent made, to corral's state
    path = {"HOME": str(home), "HOME/local": str(home / "local"), "HOME/local/jobs": str(home / "local" / "jobs"),
            "OTHERJOB": str(home / "local" / "jobs" / str(other["id"])), "LINK": str(link)}.get(where, where)
    r = submit(gw, t["bot1"], {"command": "touch pwned", "workdir": path})
    assert r.status_code == 400, (where, r.text)
    msg = r.json()["error"]["message"]
    assert "workdir" in msg and ("system directory" in msg or "corral's own state" in msg or "home directory" in msg
                                 or "hides" in msg or "not writable" in msg), msg
    assert r.json()["error"].get("hint"), r.text
    assert not Path(path, "pwned").exists()


def test_a_link_swapped_in_after_the_check_is_never_followed(gw: Gateway, project: Path, secret: Path) -> None:
    """The supervisor opens the working directory one component at a time without
    following a link: an agent that swaps its checked directory for a link before the
    job starts gets a failed job, and the link's target is untouched."""
    t = tokens(gw, ("bot1", "alice"))
    work = project / "w"
    work.mkdir()
    work.chmod(0o777)
    # Both CPU slots taken, so the victim job waits in the queue after its check.
    blocker = submit(gw, t["bot1"], {"command": "sleep 30", "cpus": 2, "workdir": str(project)})
    assert blocker.status_code == 201, blocker.text
    victim = submit(gw, t["bot1"], {"command": "echo owned > pwned; ls", "workdir": str(work)})
    assert victim.status_code == 201, victim.text
    work.rename(project / "moved")
    (project / "w").symlink_to(secret.parent)
    with gw.http(t["bot1"]) as h:
        assert h.post(f"/v1/jobs/{blocker.json()['id']}/cancel").status_code in (200, 202)
    job = finish(gw, t["bot1"], victim.json()["id"])
    assert job["state"] == "FAILED", job
    assert "link" in (job["reason"] or ""), job
    assert not (secret.parent / "pwned").exists()
    assert "ledger.txt" not in job["out"]


def test_state_the_job_could_forge_is_not_corrals(gw: Gateway, project: Path, secret: Path) -> None:
    """A job writes what corral's files look like, where it can: in its working directory
    and its own directory. corral's state lies where no job can reach, so the job's real
    end stands, and a pid planted for a later cancel is never signalled."""
    t = tokens(gw, ("bot1", "alice"))
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        forged = json.dumps({"state": "COMPLETED", "exit_code": 0, "reason": "FORGED", "pid": sleeper.pid,
                             "start_time": 1, "end_time": 2})
        cmd = (f"for d in . /tmp/corral-job ..; do for f in result.json running.json spawned launch.json cancel; do "
               f"echo '{forged}' > $d/$f 2>/dev/null; ln -sf {secret} $d/stdout 2>/dev/null; done; done; "
               "ls /proc/self/fd/; exit 3")
        job = run(gw, t["bot1"], {"command": cmd})
        assert job["state"] == "FAILED" and job["exit_code"] == 3 and "FORGED" not in (job["reason"] or ""), job
        job = run(gw, t["bot1"], {"command": cmd, "workdir": str(project)})
        assert job["state"] == "FAILED" and job["exit_code"] == 3 and "FORGED" not in (job["reason"] or ""), job
        # The job saw its three streams and its script's descriptor at most: nothing of corral's.
        assert set(job["out"].split()) <= {"0", "1", "2", "3"}, job["out"]
        # A long job plants the pid, the gateway restarts, and the job is cancelled.
        r = submit(gw, t["bot1"], {"command": f"{cmd.replace('exit 3', 'sleep 60')}", "workdir": str(project)})
        jid = r.json()["id"]
        with gw.http(t["bot1"]) as h:
            for _ in range(100):
                if h.get(f"/v1/jobs/{jid}").json()["state"] == "RUNNING":
                    break
                time.sleep(0.1)
        gw.kill(signal.SIGKILL)
        gw.start()
        with gw.http(t["bot1"]) as h:
            assert h.post(f"/v1/jobs/{jid}/cancel").status_code in (200, 202)
        end = finish(gw, t["bot1"], jid)
        assert end["state"] == "CANCELLED", end
        assert sleeper.poll() is None  # the planted pid was never signalled
        assert "CANARY-SECRET" not in end["out"]
    finally:
        sleeper.kill()


def test_the_output_corral_returns_is_the_jobs_own(gw: Gateway, secret: Path) -> None:
    """Output files are descriptors opened by corral before the job starts: a job that
    links its 'stdout' to someone's secret has the link land in its own directory, and
    what corral returns is what it printed."""
    t = tokens(gw, ("bot1", "alice"))
    job = run(gw, t["bot1"], {"command": f"echo visible; ln -sf {secret} stdout; ln -sf {secret} /tmp/corral-job/stdout;"
                                         f" ln -sf {secret} ../stdout; true"})
    assert job["state"] == "COMPLETED", job
    assert "CANARY-SECRET" not in job["out"] and "visible" in job["out"]
    assert secret.read_text() == "CANARY-SECRET-7f3a\n"


def test_no_unix_socket_vsock_or_user_namespace_from_inside(gw: Gateway, project: Path) -> None:
    t = tokens(gw, ("bot1", "alice"))
    path = project / "host.sock"
    heard: list[bytes] = []
    listeners = []
    for addr in (str(path), "\0corral-canary-abstract"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(addr)
        s.listen(4)
        s.settimeout(0.5)
        listeners.append(s)
    path.chmod(0o777)
    stop = threading.Event()

    def accept(s: socket.socket) -> None:
        while not stop.is_set():
            try:
                c, _ = s.accept()
                heard.append(c.recv(10) or b"(connected)")
                c.close()
            except OSError:
                continue

    for s in listeners:
        threading.Thread(target=accept, args=(s,), daemon=True).start()
    try:
        probes = {
            "unix": f"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{path}'); s.send(b'x')",
            "abstract": "import socket; s=socket.socket(socket.AF_UNIX); s.connect('\\0corral-canary-abstract'); s.send(b'x')",
            "vsock": "import socket; socket.socket(40, socket.SOCK_STREAM)",
            "userns": "import ctypes; c=ctypes.CDLL(None, use_errno=True); r=c.unshare(0x10000000); "
                      "raise SystemExit(0 if r == 0 else 'Operation not permitted (%d)' % ctypes.get_errno())",
        }
        for name, code in probes.items():
            job = run(gw, t["bot1"], {"command": f"python3 -c \"{code}\" && echo ESCAPED-{name}", "workdir": str(project)})
            assert f"ESCAPED-{name}" not in job["out"], (name, job)
            assert "Operation not permitted" in job["err"] or "Permission" in job["err"], (name, job)
        job = run(gw, t["bot1"], {"command": "unshare -U true && echo ESCAPED", "workdir": str(project)})
        assert "ESCAPED" not in job["out"], job
        # And what must keep working: pipes and socketpairs between its own processes.
        ok = run(gw, t["bot1"], {"command": "python3 -c 'import socket; a,b=socket.socketpair(); a.send(b\"ok\"); "
                                            "print(b.recv(2).decode())' | cat", "workdir": str(project)})
        assert ok["state"] == "COMPLETED" and ok["out"].strip() == "ok", ok
    finally:
        stop.set()
        for s in listeners:
            s.close()
    assert heard == []


def test_corrals_state_is_private(gw: Gateway) -> None:
    t = tokens(gw, ("bot1", "alice"))
    run(gw, t["bot1"], {"command": "true"})
    home = gw.home.resolve()
    assert home.stat().st_mode & 0o077 in (0o011, 0o000), oct(home.stat().st_mode)  # nothing in it can be listed
    for name in ("corral.db", "admin.token", "token.key", "audit.key", "identities.json"):
        p = home / name
        if p.exists():
            assert p.stat().st_mode & 0o077 == 0, (name, oct(p.stat().st_mode))
    for sub in ("local", "guarded"):
        p = home / sub
        if p.exists():
            assert p.stat().st_mode & 0o077 == 0, (sub, oct(p.stat().st_mode))
    assert (home / "local" / "jobs" / "1").stat().st_mode & 0o077 == 0


def test_a_job_that_floods_its_output_or_a_file_fails_alone(gw: Gateway, project: Path) -> None:
    t = tokens(gw, ("bot1", "alice"))
    calm = submit(gw, t["bot1"], {"command": "sleep 3; echo calm", "workdir": str(project)})
    flood = run(gw, t["bot1"], {"command": "yes flood", "workdir": str(project)})  # fast: one file's limit
    assert flood["state"] == "FAILED" and "limit" in flood["reason"], flood
    steady = run(gw, t["bot1"], {"command": "while true; do head -c 500000 /dev/zero | tr '\\0' x; echo; sleep 0.1; done",
                                 "workdir": str(project)})  # steady: the output's limit, checked as it grows
    assert steady["state"] == "FAILED" and "output" in steady["reason"] and "limit" in steady["reason"], steady
    big = run(gw, t["bot1"], {"command": "head -c 20000000 /dev/zero > big.bin", "workdir": str(project)})
    assert big["state"] == "FAILED" and "size limit" in big["reason"], big
    assert (project / "big.bin").stat().st_size <= 8 << 20
    end = finish(gw, t["bot1"], calm.json()["id"])
    assert end["state"] == "COMPLETED" and end["out"].strip() == "calm", end


def test_var_run_as_a_link_and_munge_present_still_build(tmp_path: Path) -> None:
    """Where /var/run links to /run and /run/munge exists (a common layout), the sandbox
    is built: each hidden path is hidden where it really lies."""
    need_bwrap()
    from corral.sandbox.bwrap import build

    made = not Path("/run/munge").exists()
    if made:
        Path("/run/munge").mkdir()
    try:
        assert Path("/var/run").is_symlink() or Path("/var/run").resolve() == Path("/var/run")
        box = build(["agent"], [], False, "nobody", [tmp_path])
        assert box.why_not is None, box.why_not
        assert Path("/var/run/munge") not in box.hide or not Path("/var/run").is_symlink()
    finally:
        if made:
            Path("/run/munge").rmdir()


def test_an_agents_job_writes_its_trial_workspace(gw: Gateway, project: Path) -> None:
    """A workspace forked by an agent is written by the agent's jobs (as the agent's
    identity), and its diff shows the writes; another agent's job cannot use it."""
    t = tokens(gw, ("bot1", "alice"), ("bot2", "carol"))
    (project / "README").write_text("base\n")
    (project / "README").chmod(0o666)  # the project's files are the agent's to write, as in its project
    (project / "locked").write_text("root's\n")  # and this one is not, in the workspace as in the project
    with gw.http(t["bot1"]) as h:
        r = h.post("/v1/workspaces", json={"base": str(project)})
        assert r.status_code == 201, r.text
        ws = r.json()["workspace"]
    job = run(gw, t["bot1"], {"command": "id -u; echo new > made.txt; echo more >> README; stat -c %u made.txt; "
                                         "echo no >> locked || echo LOCKED", "workspace": ws})
    assert job["state"] == "COMPLETED", (job["reason"], job["out"], job["err"])
    uid, owner, locked = job["out"].split()
    assert uid == owner and DYNAMIC[0] <= int(uid) <= DYNAMIC[1] and locked == "LOCKED", job["out"]
    with gw.http(t["bot1"]) as h:
        diff = h.get(f"/v1/workspaces/{ws}/diff").json()
    changed = json.dumps(diff)
    assert "made.txt" in changed and "README" in changed, diff
    assert (project / "README").read_text() == "base\n"  # the base is untouched until a commit
    other = submit(gw, t["bot2"], {"command": "echo x > stolen.txt", "workspace": ws})
    assert other.status_code in (400, 403, 404), other.text


def test_an_agent_writes_a_workspace_forked_at_a_git_revision(gw: Gateway, project: Path) -> None:
    """A revision's tree is extracted by corral (root): it belongs to the trial's identity,
    so the agent's job writes it as its own checkout."""
    t = tokens(gw, ("bot1", "alice"))
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    with gw.http(t["bot1"]) as h:
        r = h.post("/v1/workspaces", json={"base": str(project), "rev": "HEAD"})
        assert r.status_code == 201, r.text
        ws = r.json()["workspace"]
    job = run(gw, t["bot1"], {"command": "echo 'print(2)' > src/main.py && echo new > src/extra.py && id -u",
                              "workspace": ws})
    assert job["state"] == "COMPLETED", (job["reason"], job["out"], job["err"])
    with gw.http(t["bot1"]) as h:
        changed = json.dumps(h.get(f"/v1/workspaces/{ws}/diff").json())
    assert "src/main.py" in changed and "src/extra.py" in changed, changed
    assert (project / "src" / "main.py").read_text() == "print(1)\n"


def test_no_principal_runs_as_root(gw: Gateway) -> None:
    """Not even an admin can make a principal whose jobs would run as root: refused when
    the principal is added (400, saying why), never later inside a lane."""
    with gw.http() as h:
        for body in ({"name": "rooty", "kind": "human", "unix_user": "root"},
                     {"name": "svc", "kind": "service", "unix_user": "root"}):
            r = h.post("/v1/principals", json=body)
            assert r.status_code == 400 and "never runs a job as root" in r.json()["error"]["message"], r.text
        assert h.post("/v1/principals", json={"name": "dana", "kind": "human"}).status_code == 201
        r = h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "dana", "unix_user": "root"})
        assert r.status_code == 400, r.text
