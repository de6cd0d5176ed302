"""The gateway in front of a real Slurm: the same API, and it survives slurmctld
going away in the middle of a run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from .conftest import SHARED_TURN, Gateway, ended, free_port, running
from .slurm_env import restore, slurm_conf, stop_controllers

# Real-Slurm tests take turns (tests/conftest.py::slurm_turn): these share theirs, except
# the ones that stop slurmctld.
pytestmark = [pytest.mark.usefixtures("slurm_turn"), SHARED_TURN]


def start_slurm_gateway(root: Path, conf: str, **env: str) -> Gateway:
    """A gateway on the Slurm backend with its home in ``root`` (``env``: more CORRAL_*
    settings), started (the caller stops it)."""
    gw = Gateway(root / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": conf,
                                                        "CORRAL_TICK_S": "0.5", **env})
    gw.home.mkdir()
    gw.start()
    return gw


@pytest.fixture
def slurm_gateway(tmp_path):
    gw = start_slurm_gateway(tmp_path, slurm_conf())
    yield gw
    gw.kill(signal.SIGTERM)


def test_full_loop_on_slurm(slurm_gateway: Gateway, tmp_path) -> None:
    with slurm_gateway.http(session="s-slurm") as h:
        job = h.post("/v1/jobs", json={"command": "echo on-slurm; exit 4", "workdir": str(tmp_path)}).json()
        done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
        assert done["state"] == "FAILED" and done["exit_code"] == 4 and done["backend"] == "slurm"
        assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "on-slurm\n"
        r = h.post("/v1/jobs", json={"command": "true", "partition": "debug", "walltime": "5h"})
        assert r.status_code == 400 and "batch" in r.json()["error"]["message"]
        parts = {p["name"] for p in h.get("/v1/facility").json()["partitions"]}
        assert parts == {"debug", "batch", "gpu"}
    # the facility facts, harvested from Slurm at start: node types and QOS
    conn = sqlite3.connect(slurm_gateway.home / "corral.db")
    for _ in range(100):
        row = conn.execute("SELECT facts FROM facts ORDER BY version DESC LIMIT 1").fetchone()
        if row:
            break
        time.sleep(0.1)
    facts = json.loads(row[0])
    assert facts["node_types"][0]["cpus"] == 32 and "gpu" in facts["node_types"][0]["gres"]
    assert "agents" in {q["name"] for q in facts["qos"]}
    assert facts["partitions"]["debug"]["max_walltime_s"] == 3600


@pytest.mark.slurm_turn("alone")  # stops slurmctld
def test_slurmctld_restart_mid_run(slurm_gateway: Gateway, tmp_path) -> None:
    conf = slurm_conf()
    with slurm_gateway.http() as h:
        ids = [h.post("/v1/jobs", json={"command": f"sleep 4; echo {i}", "workdir": str(tmp_path)}).json()["id"]
               for i in range(4)]
        h.get(f"/v1/jobs/{ids[0]}/wait", params={"timeout": 60, "until": "RUNNING"})
        pids = stop_controllers(conf)
        try:
            for pid in pids:
                ended(pid)  # really gone (it lingers as a zombie here)
            # The gateway keeps answering from its own state, and takes new work.
            late = h.post("/v1/jobs", json={"command": "echo late", "workdir": str(tmp_path)})
            assert late.status_code == 201
            ids.append(late.json()["id"])
            for j in ids:
                assert h.get(f"/v1/jobs/{j}").status_code == 200
            deadline = time.time() + 30
            while time.time() < deadline and httpx.get(f"{slurm_gateway.url}/healthz").json()["ok"]:
                time.sleep(0.5)
            health = httpx.get(f"{slurm_gateway.url}/healthz").json()
            assert health["ok"] is False and health["degraded"]
        finally:
            restore(conf)
        final = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json() for j in ids]
        assert [j["state"] for j in final] == ["COMPLETED"] * 5, final
        assert httpx.get(f"{slurm_gateway.url}/healthz").json()["ok"] is True
        outputs = [h.get(f"/v1/jobs/{j}/output").json()["data"] for j in ids]
        assert outputs == ["0\n", "1\n", "2\n", "3\n", "late\n"]


def test_gateway_kill_9_with_slurm_jobs_running(slurm_gateway: Gateway, tmp_path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    body = lambda i: {"command": f"echo run >> {ledger}/{i}; sleep 3", "workdir": str(tmp_path)}  # noqa: E731
    with slurm_gateway.http() as h:
        ids = [h.post("/v1/jobs", json=body(i), headers={"Idempotency-Key": f"k{i}"}).json()["id"] for i in range(4)]
        h.get(f"/v1/jobs/{ids[0]}/wait", params={"timeout": 60, "until": "RUNNING"})
    slurm_gateway.kill(signal.SIGKILL)
    slurm_gateway.start()
    with slurm_gateway.http() as h:
        again = [h.post("/v1/jobs", json=body(i), headers={"Idempotency-Key": f"k{i}"}).json()["id"] for i in range(4)]
        assert again == ids  # retried submissions after the crash: the same jobs
        final = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json()["state"] for j in ids]
    assert final == ["COMPLETED"] * 4
    assert [(ledger / str(i)).read_text() for i in range(4)] == ["run\n"] * 4  # each ran exactly once


@pytest.mark.slurm_turn("alone")  # stops slurmctld
def test_first_submission_while_slurmctld_is_down(tmp_path) -> None:
    """A fresh gateway has no cached limits yet: with the controller away it still takes
    the job (recorded, deferred) and the job runs once slurmctld is back."""
    conf = slurm_conf()
    pids = stop_controllers(conf)
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": conf})
    gw.home.mkdir()
    try:
        for pid in pids:
            ended(pid)
        gw.start()
        with gw.http() as h:
            r = h.post("/v1/jobs", json={"command": "echo deferred", "workdir": str(tmp_path)})
            assert r.status_code == 201, r.text
            job = r.json()
            assert job["state"] == "PENDING" and "waiting for the scheduler" in (job["reason"] or "")
            assert h.get("/healthz").status_code == 200  # the gateway kept answering
    finally:
        restore(conf)
    try:
        with gw.http() as h:
            done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
            assert done["state"] == "COMPLETED", done
            assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "deferred\n"
    finally:
        gw.kill(signal.SIGTERM)


def test_fast_lane_on_slurm(tmp_path) -> None:
    """Tiny tasks through one warm Slurm allocation: a single Slurm job for many tasks,
    carrying corral's provenance; scancel of the allocation mid-task fails the task
    with the reason, or reruns it when it is idempotent."""
    conf = slurm_conf()
    env = {**os.environ, "SLURM_CONF": conf}
    # one allocation at most: twenty 1-CPU tasks on 4 CPUs would otherwise ask for a second
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.3", CORRAL_FASTLANE_CPUS="4",
                 CORRAL_FASTLANE_MEMORY_MB="4000", CORRAL_FASTLANE_MAX_ALLOCATIONS="1") as gw:
        with gw.http() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "bot", "expires": "1h"}).json()["token"]
        with gw.http(token, session="slurm-fast") as h:
            r = h.post("/v1/jobs/batch", json={"jobs": [{"command": f"echo task-{i}", "lane": "fast"} for i in range(20)]})
            ids = [j["id"] for j in r.json()["jobs"]]
            done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 120}).json()
            assert done["reached"] and {j["state"] for j in done["jobs"]} == {"COMPLETED"}, done
            assert h.get(f"/v1/jobs/{ids[3]}/output").json()["data"] == "task-3\n"
            usage = h.get("/v1/facility").json()["you"]["usage"]
            assert usage["by_lane"]["fast"]["jobs"] == 20 and usage["by_session"]["slurm-fast"]["jobs"] == 20
        with gw.http() as h:
            pilots = h.get("/v1/jobs", params={"principal": "fastlane"}).json()["jobs"]
        assert len(pilots) == 1  # twenty tasks, one Slurm job
        with gw.http() as h:
            slurm_id = h.get(f"/v1/jobs/{pilots[0]['id']}").json()["backend_id"]
        # running: the controller has it (sacct stores the comment when the job ends)
        comment = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%k"], env=env, capture_output=True,
                                 text=True).stdout
        assert "principal=fastlane kind=service" in comment and "session=pool:" in comment

        with gw.http(token) as h:
            once = h.post("/v1/jobs", json={"command": "sleep 30", "lane": "fast", "walltime": "2m"}).json()
            again = h.post("/v1/jobs", json={"command": "sleep 2; echo again", "lane": "fast", "walltime": "2m",
                                             "idempotent": True}).json()
            for j in (once, again):
                assert h.get(f"/v1/jobs/{j['id']}/wait", params={"timeout": 60, "until": "RUNNING"}).json()["state"] == "RUNNING"
            subprocess.run(["scancel", slurm_id], env=env, check=True)
            failed = h.get(f"/v1/jobs/{once['id']}/wait", params={"timeout": 60}).json()
            assert failed["state"] == "FAILED" and "allocation was lost" in failed["reason"], failed
            rerun = h.get(f"/v1/jobs/{again['id']}/wait", params={"timeout": 120}).json()
            assert rerun["state"] == "COMPLETED", rerun
            assert h.get(f"/v1/jobs/{again['id']}/output").json()["data"] == "again\n"


def test_what_is_hidden_is_decided_when_the_batch_job_starts(tmp_path, agent_dir) -> None:
    """A batch script is written at submission and runs later, on a node. A hidden path
    removed while the job waited (a home userdel took) made bwrap fail there ("Can't
    mkdir"): now the job runs, and a hidden file that became a directory of secrets
    since is emptied as the directory it is when the job starts."""
    from .test_sandbox import SECRET, need_bwrap, pair

    import shutil
    import tempfile

    need_bwrap()
    # Not under /tmp, which the sandbox replaces with its own (bwrap can make anything there).
    top = Path(tempfile.mkdtemp(prefix="corral-hidden-", dir="/var/tmp"))
    gone, changed = top / "gone-home", top / "changed"
    gone.mkdir()
    changed.write_text("a file when the job was submitted")
    for p in (top, gone, changed):
        p.chmod(0o755)
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=slurm_conf(), CORRAL_TICK_S="0.5",
                 CORRAL_SANDBOX__HIDE=json.dumps([str(gone), str(changed)])) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            first = h.post("/v1/jobs", json={"command": "sleep 5", "walltime": "60s"}).json()
            r = h.post("/v1/jobs", json={"command": f"ls {changed}; cat {changed}/key; echo ran", "walltime": "60s",
                                         "workdir": str(agent_dir), "after_ok": [first["id"]]})
            assert r.status_code == 201, r.text
            job = r.json()
            script = next(p for p in (gw.home / "slurm" / "jobs").glob("*/job.sh") if "bwrap" in p.read_text())
            assert str(gone) in script.read_text()
            gone.rmdir()
            changed.unlink()
            changed.mkdir()
            (changed / "key").write_text(SECRET)
            (changed / "key").chmod(0o644)
            changed.chmod(0o755)
            done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
            out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
            err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
        shutil.rmtree(top)
        assert done["state"] == "COMPLETED" and out.endswith("ran\n"), (done, out, err)
        assert SECRET not in out + err, (out, err)
        assert "No such file" in err, err  # an empty directory


def test_a_hidden_path_gone_as_the_sandbox_is_set_up_costs_a_try_not_the_job(tmp_path, agent_dir) -> None:
    """The script looks at each hidden path as the job starts, then bwrap mounts over it:
    a home that userdel removed between the two made bwrap fail ("Can't mkdir ...:
    Read-only file system") and the job with it, before any of it ran (seen in CI: another
    test's user deleted as an agent's jobs started). Here the home goes at that very moment,
    every time: bwrap is reached through a wrapper that removes it (as userdel would), on the
    job's first try only, then runs the real bwrap, which fails for real. The sandbox is set
    up again and the job runs, once; a job whose own work fails is not run again."""
    from .test_sandbox import need_bwrap, pair

    import shutil
    import tempfile

    need_bwrap()
    top = Path(tempfile.mkdtemp(prefix="corral-vanish-", dir="/var/tmp"))  # not /tmp: the sandbox's own
    homes = [top / "home-a", top / "home-b"]
    tools = top / "bin"
    for d in (*homes, tools):
        d.mkdir()
    for p in (top, *homes, tools):
        p.chmod(0o755)
    real = shutil.which("bwrap")
    (tools / "bwrap").write_text(
        "#!/bin/sh\n"
        f'if [ -n "$SLURM_JOB_ID" ] && [ ! -e {top}/tried-$SLURM_JOB_ID ]; then\n'
        f"  : > {top}/tried-$SLURM_JOB_ID\n"
        f"  for h in {' '.join(map(str, homes))}; do [ -d $h ] && rmdir $h && break; done\n"
        "fi\n"
        f'exec {real} "$@"\n')
    (tools / "bwrap").chmod(0o755)
    try:
        with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=slurm_conf(), CORRAL_TICK_S="0.5",
                     CORRAL_SANDBOX__HIDE=json.dumps([str(h) for h in homes]),
                     PATH=f"{tools}:{os.environ['PATH']}") as gw:
            t = pair(gw)
            with gw.http(t["bot1"]) as h:
                runs = []
                for command in ("echo ran >> runs-ok; echo ok", "echo ran >> runs-bad; exit 3"):
                    job = h.post("/v1/jobs", json={"command": command, "workdir": str(agent_dir),
                                                   "walltime": "60s"}).json()
                    done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
                    err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
                    runs.append((done, err))
            script = next(p for p in (gw.home / "slurm" / "jobs").glob("*/job.sh") if "bwrap" in p.read_text())
            assert str(tools / "bwrap") in script.read_text()  # the wrapper is what the job ran
        (ok, ok_err), (bad, bad_err) = runs
        assert ok["state"] == "COMPLETED", (ok, ok_err)
        assert "Can't mkdir" in ok_err and "trying again" in ok_err, ok_err  # the real bwrap's failure, then the try
        assert (agent_dir / "runs-ok").read_text() == "ran\n"
        assert bad["state"] == "FAILED" and bad["exit_code"] == 3, (bad, bad_err)
        assert bad_err.count("trying again") == 1, bad_err  # its setup, not its own failure
        assert (agent_dir / "runs-bad").read_text() == "ran\n"  # its work ran once
        assert not any(h.exists() for h in homes)
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("step", ["compiled", "python"])
def test_agents_work_runs_contained_inside_the_batch_script(tmp_path, agent_dir, step: str) -> None:
    """On Slurm the generated batch script runs an agent's work in the same sandbox as on
    the local backend: credentials under the gateway's home unreadable, the host
    read-only, never root; a person's job is not contained. Its steps around bwrap (the
    working directory's walk, the filter and environment) by corral's compiled starter,
    and by Python where none is built (CORRAL_JOBSTART_COMPILED=0, as where no compiler is)."""
    from corral.sandbox import starter

    from .test_sandbox import SECRET, need_bwrap, pair

    need_bwrap()
    home = tmp_path / "canary-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    victim = tmp_path / "victim.txt"
    victim.write_text("intact")
    victim.chmod(0o666)
    if step == "compiled" and starter.compiled() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("a C compiler is required under CI; scripts/sandbox-up installs gcc")
        pytest.skip("no C compiler here: run scripts/sandbox-up (as root)")
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(),
                                                            "CORRAL_TICK_S": "0.5", "HOME": str(home),
                                                            "CORRAL_JOBSTART_COMPILED": "0" if step == "python" else "1"})
    gw.home.mkdir()
    gw.start()
    try:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            # disguised as the policy's parser cannot see through: the sandbox is what holds
            cmd = (f"D={home}/.s; cat $D'sh'/id_*; F={victim}; echo gone > $F; echo x > /etc/corral-canary; "
                   "id -u; echo own > mine.txt && cat mine.txt")
            r = h.post("/v1/jobs", json={"command": cmd, "workdir": str(agent_dir), "walltime": "60s"})
            assert r.status_code == 201, r.text
            job = r.json()
            done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 90}).json()
            out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
            err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
        assert done["backend"] == "slurm" and done["state"] == "COMPLETED", (done, err)
        assert SECRET not in out + err and victim.read_text() == "intact"
        assert not Path("/etc/corral-canary").exists()
        uid, own = out.split()[-2:]
        assert own == "own" and uid != "0", out
        scripts = list((gw.home / "slurm" / "jobs").glob("*/job.sh"))
        assert any("bwrap" in s.read_text() for s in scripts)
        compiled = [s for s in scripts if "/dev/fd/8 opendir" in s.read_text() and "/dev/fd/8 apply" in s.read_text()]
        # neither Python step (the filter's APPLY, opendir's source) is in a script the starter runs
        python_steps = [s for s in scripts if "import ctypes, os, sys" in s.read_text() or "def walk(" in s.read_text()]
        assert bool(compiled) == (step == "compiled") and not set(compiled) & set(python_steps)
        assert bool(python_steps) == (step == "python")
        with gw.http(t["alice"]) as h:  # a person: the work as written, not contained
            # (a person without a Unix user runs as a dynamic uid of hers: a directory she may enter)
            job = h.post("/v1/jobs", json={"command": f"echo hers > {agent_dir / 'hers.txt'}",
                                           "workdir": str(agent_dir)}).json()
            assert h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 90}).json()["state"] == "COMPLETED"
        assert (agent_dir / "hers.txt").read_text() == "hers\n"
    finally:
        gw.kill(signal.SIGTERM)


def test_a_dynamic_uid_agents_job_is_its_own_in_slurm(tmp_path, agent_dir) -> None:
    """An agent with no Unix user (nor a sponsor with one) runs as a dynamic uid of its own.
    A root gateway writes that uid for NSS (libnss-extrausers' files, which scripts/slurm-up
    installs and names in nsswitch.conf): Slurm starts the job as it, sacct names it, and
    corral reads what it wrote (decision 0063). Before, the job was submitted as root and
    sacct said User=root."""
    import pwd
    import secrets
    import shutil
    import tempfile

    from corral.core import nss_users

    if os.geteuid() != 0:
        pytest.skip("dynamic uids are a root gateway's")
    assert "extrausers" in Path("/etc/nsswitch.conf").read_text(), "scripts/slurm-up names extrausers in nsswitch.conf"
    conf, agent = slurm_conf(), f"bot-{secrets.token_hex(3)}"  # a name no other test process publishes
    # Slurm opens the job's output as its uid: the gateway's home is one others may pass through
    # (pytest's tmp_path is 0700), as a site's jobs_dir is
    root = Path(tempfile.mkdtemp(prefix="corral-dyn-", dir="/tmp"))
    root.chmod(0o755)
    gw = start_slurm_gateway(root, conf, CORRAL_SANDBOX__NSS_USERS=str(nss_users.DEFAULT_DIR))
    uids: set[int] = set()
    try:
        with gw.http() as h:
            for body in ({"name": "alice", "kind": "human"}, {"name": agent, "kind": "agent", "sponsor": "alice"}):
                assert h.post("/v1/principals", json=body).status_code == 201
            token = h.post("/v1/tokens", json={"for": agent, "expires": "1h"}).json()["token"]
        with gw.http(token) as h:
            r = h.post("/v1/jobs", json={"command": "id -u; id -un; echo own > mine.txt", "workdir": str(agent_dir),
                                         "walltime": "60s"})
            assert r.status_code == 201, r.text
            done = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
            out = h.get(f"/v1/jobs/{done['id']}/output").json()["data"]
            err = h.get(f"/v1/jobs/{done['id']}/output", params={"stream": "stderr"}).json()["data"]
        uids = set(json.loads((gw.home / "identities.json").read_text())["uids"].values())
        uid = json.loads((gw.home / "identities.json").read_text())["uids"][agent]
        assert done["state"] == "COMPLETED", (done, out, err)
        assert pwd.getpwuid(uid).pw_name == agent  # published under the agent's own name
        assert out.split()[-2:] == [str(uid), agent], out  # the job itself, as its uid and name
        assert (agent_dir / "mine.txt").stat().st_uid == uid
        job_sh = (gw.home / "slurm" / "jobs" / str(done["id"]) / "job.sh").read_text()
        assert "setpriv" not in job_sh  # Slurm started it as the uid: no root shell dropping to it
        bid = (gw.home / "slurm" / "jobs" / str(done["id"]) / "backend_id").read_text().strip()
        env = {**os.environ, "SLURM_CONF": conf}
        user, deadline = "", time.time() + 60
        while time.time() < deadline and user != agent:  # slurmdbd records the job a moment after it ends
            user = subprocess.run(["sacct", "-X", "-n", "-P", "-j", bid, "-o", "User"], env=env,
                                  capture_output=True, text=True).stdout.strip()
            time.sleep(0.5)
        assert user == agent
    finally:
        gw.kill(signal.SIGTERM)
        if uids:
            nss_users.remove(nss_users.DEFAULT_DIR, uids)  # a throwaway record's uids: the range is kept for others
        shutil.rmtree(root, ignore_errors=True)
