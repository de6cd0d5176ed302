"""On the Slurm backend, what a job can write is never what root writes, follows or
trusts (issue 32's review: F1, F4, F5, F19; docs/decisions/0010-privsep.md).

A principal with a Unix user has its batch script run as that user (sbatch --uid): the
user writes its job's output and markers. Before, the whole job directory was handed
to the user while the gateway, root, still wrote, created and chowned in it, and read
it back through links: an agent of that user made root overwrite and chown root's files
and read them back as its output, and ended its job early in corral's books. The
directory is now corral's, and the user gets d/out, made whole before it is handed over.
And the batch script no longer carries anything an agent chose as code: a newline in a
working directory, or the job's environment ahead of root's bwrap."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from .conftest import SHARED_TURN, Gateway, free_port
from .slurm_env import slurm_conf
from .test_privsep_env import evil, ran_as_root  # noqa: F401 (a fixture)
from .test_sandbox import need_bwrap

pytestmark = [pytest.mark.usefixtures("slurm_turn"), SHARED_TURN,  # a user and a few jobs of its own
              pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                 reason="a root gateway's (CI runs as root)")]


@pytest.fixture
def site() -> Iterator[tuple[Gateway, Path, str]]:
    """A root gateway on the private Slurm whose home every user can traverse (as a
    site's shared filesystem), a Unix user, and a project that user owns."""
    need_bwrap()
    root = Path(tempfile.mkdtemp(prefix="corral-ps-", dir="/tmp"))
    root.chmod(0o755)
    name = f"corralps{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    u = pwd.getpwnam(name)
    project = root / "project"
    project.mkdir()
    os.chown(project, u.pw_uid, u.pw_gid)
    gw = Gateway(root / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(),
                                                        "CORRAL_TICK_S": "0.5"})
    gw.home.mkdir()
    gw.start()
    try:
        yield gw, project, name
    finally:
        gw.kill(signal.SIGTERM)
        subprocess.run(["pkill", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def as_user(name: str, cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={name}", f"--regid={pwd.getpwnam(name).pw_gid}", "--clear-groups",
                           "bash", "-c", cmd], capture_output=True, text=True)


def agent_of(gw: Gateway, user: str) -> str:
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": "dana", "kind": "human", "unix_user": user}).status_code == 201
        assert h.post("/v1/principals", json={"name": "dbot", "kind": "agent", "sponsor": "dana"}).status_code == 201
        return h.post("/v1/tokens", json={"for": "dbot", "expires": "1h"}).json()["token"]


def test_a_users_job_directory_gives_root_no_link_to_follow(site: tuple[Gateway, Path, str]) -> None:
    gw, project, user = site
    secret = gw.home.parent / "root-only.txt"
    secret.write_text("root-only-canary\n")
    secret.chmod(0o600)
    token = agent_of(gw, user)
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": "echo started; sleep 30; echo finished", "workdir": str(project),
                                     "walltime": "2m"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        running = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 90, "until": "RUNNING"}).json()
        assert running["state"] == "RUNNING", running
    d = gw.home / "slurm" / "jobs" / str(jid)
    # corral's own record is root's, and the user can put nothing beside it
    for name in ("job.sh", "backend_id", "nonce"):
        st = (d / name).stat()
        assert st.st_uid == 0 and st.st_mode & 0o077 == 0, (name, oct(st.st_mode))
    assert d.stat().st_uid == 0 and (d / "out").stat().st_uid == pwd.getpwnam(user).pw_uid
    for target in ("backend_id", "job.sh", "planted"):
        r = as_user(user, f"ln -sfn {secret} {d / target}")
        assert r.returncode != 0, (target, r.stderr)
    assert (d / "backend_id").read_text().strip().isdigit()
    # its own markers: an early 'ended' does not end the job in corral's books (Slurm says when)
    assert as_user(user, f"echo 0 > {d / 'out' / 'ended'}").returncode == 0
    with gw.http(token) as h:
        for _ in range(6):
            time.sleep(0.5)
            assert h.get(f"/v1/jobs/{jid}").json()["state"] == "RUNNING"
        # its output swapped for a link to root's file: corral reads no further than the link
        r = as_user(user, f"rm -f {d / 'out' / 'stdout'} && ln -s {secret} {d / 'out' / 'stdout'}")
        assert r.returncode == 0, r.stderr
        out = h.get(f"/v1/jobs/{jid}/output")
        assert "root-only-canary" not in out.text, out.text
        h.post(f"/v1/jobs/{jid}/cancel")
        done = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 90}).json()
        assert done["state"] == "CANCELLED", done
        assert "root-only-canary" not in h.get(f"/v1/jobs/{jid}/output").text
    assert secret.read_text() == "root-only-canary\n" and secret.stat().st_uid == 0


def test_a_jobs_environment_never_reaches_roots_batch_steps(site: tuple[Gateway, Path, str], evil: Path) -> None:  # noqa: F811
    """An agent with no Unix user: the batch script is root's, and its bwrap must not be
    the agent's (F1) nor load the agent's library (F16), on Slurm as locally."""
    gw, _, _ = site
    from .test_sandbox import pair

    t = pair(gw)
    with gw.http(t["bot1"]) as h:
        r = h.post("/v1/jobs", json={"command": "echo mine=$MINE; id -u", "walltime": "60s", "workdir": str(evil),
                                     "env": {"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": str(evil / "p.so"),
                                             "MINE": "kept"}})
        assert r.status_code == 201, r.text
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
        out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
    assert job["state"] == "COMPLETED", job
    assert "mine=kept" in out and out.split()[-1] != "0", out
    assert ran_as_root(evil / "ran.log") == [], (evil / "ran.log").read_text()
    script = next((gw.home / "slurm" / "jobs").glob("*/job.sh")).read_text()
    assert "kept" not in script and "LD_PRELOAD" not in script and str(evil) + ":" not in script, script


def test_a_workdir_swapped_for_a_link_after_the_check_is_refused_on_slurm(site: tuple[Gateway, Path, str]) -> None:
    """F8 on Slurm: the batch script's bwrap bound the working directory by path, so a
    component swapped for a link while the job waited was followed by root. It is now
    opened one component at a time without following links and bound by descriptor."""
    gw, _, _ = site
    from .test_sandbox import pair

    pub = gw.home.parent / "pub"
    (pub / "proj").mkdir(parents=True)
    for p in (pub, pub / "proj"):
        p.chmod(0o777)
    hidden = gw.home.parent / "elsewhere"
    hidden.mkdir()
    (hidden / "not-yours.txt").write_text("elsewhere-canary")
    hidden.chmod(0o777)
    t = pair(gw)
    with gw.http(t["bot1"]) as h:
        first = h.post("/v1/jobs", json={"command": "sleep 6", "walltime": "60s"}).json()
        r = h.post("/v1/jobs", json={"command": "ls; cat not-yours.txt; echo ran > here.txt", "walltime": "60s",
                                     "workdir": str(pub / "proj"), "after_ok": [first["id"]]})
        assert r.status_code == 201, r.text
        (pub / "proj").rename(pub / "proj.was")
        (pub / "proj").symlink_to(hidden)
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 120}).json()
        out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
        err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
    assert job["state"] == "FAILED", (job, out, err)
    assert "elsewhere-canary" not in out and not (hidden / "here.txt").exists(), out
    assert "changed since it was checked" in err, err


def test_a_person_without_a_unix_user_runs_a_script_as_its_own_identity(site: tuple[Gateway, Path, str]) -> None:
    """Root runs the batch script; the person's work becomes its dynamic identity (never
    root) and still reads its script, which lies in corral's own out/."""
    gw, _, _ = site
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": "pat", "kind": "human"}).status_code == 201
        tok = h.post("/v1/tokens", json={"for": "pat", "expires": "1h"}).json()["token"]
    with gw.http(tok) as h:
        for script in ("#!/bin/bash\necho script-ran; id -u\n", "echo plain-ran; id -u\n"):
            r = h.post("/v1/jobs", json={"script": script, "walltime": "60s", "env": {"K": "v"}})
            assert r.status_code == 201, r.text
            job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
            out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
            err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
            assert job["state"] == "COMPLETED", (job, out, err)
            assert "ran" in out and out.split()[-1] != "0", out


def test_a_users_start_marker_is_not_the_start_corral_records(site: tuple[Gateway, Path, str]) -> None:
    """Where the batch script runs as the job's own Unix user, its markers are that user's
    claims. Its end was already Slurm's word, not the marker's; its start was not: a
    ``started`` written while the job waited made the gateway record it RUNNING from that
    moment, and the first start recorded is the one kept. A start a day ahead made every
    finished job of the user's token cost nothing of its CPU-hour budget (ran = end -
    start, at least 0), and the job showed as running before it ran (attack46)."""
    gw, project, user = site
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": "dana", "kind": "human", "unix_user": user}).status_code == 201
        token = h.post("/v1/tokens", json={"for": "dana", "expires": "1h", "cpu_hours": 10}).json()["token"]
    with gw.http(token) as h:
        first = h.post("/v1/jobs", json={"command": "sleep 15", "workdir": str(project), "walltime": "2m"}).json()
        r = h.post("/v1/jobs", json={"command": "sleep 3", "workdir": str(project), "walltime": "2m",
                                     "after_ok": [first["id"]]})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        out = gw.home / "slurm" / "jobs" / str(jid) / "out"
        deadline = time.monotonic() + 60
        while not (out / "started").parent.is_dir() or h.get(f"/v1/jobs/{jid}").json()["backend_id"] is None:
            assert time.monotonic() < deadline, "the job was never sent"
            time.sleep(0.2)
        forged = int(time.time()) + 86400
        assert as_user(user, f"echo '{forged} 0 c9' > {out / 'started'}").returncode == 0
        time.sleep(3)  # several of the gateway's ticks while it waits
        waiting = h.get(f"/v1/jobs/{jid}").json()
        done = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 120}).json()
    assert waiting["state"] == "PENDING" and waiting["start_time"] is None, waiting
    assert done["state"] == "COMPLETED", done
    assert done["start_time"] < forged and done["end_time"] - done["start_time"] >= 3, done


def test_a_nodes_scratch_made_first_by_another_is_never_written_through(site: tuple[Gateway, Path, str]) -> None:
    """A contained job's batch script, as root, made the node's scratch directories again
    where a cleaner had removed them (``mkdir -p``). Scratch's name is predictable
    (/var/tmp/corral-<hash of the home>), in a directory everyone may write: a link put
    there by any user of the node made root make its directories wherever the link
    pointed. Now the script makes or checks them as the gateway does (storage/scratch.py)
    and stops, naming the path, at one it did not make (attack46)."""
    import hashlib

    gw, _, _ = site
    scratch = Path("/var/tmp") / f"corral-{hashlib.sha256(str(gw.home).encode()).hexdigest()[:10]}"
    assert scratch.is_dir(), scratch
    elsewhere = Path(tempfile.mkdtemp(prefix="corral-elsewhere-", dir="/var/tmp"))
    elsewhere.chmod(0o755)
    try:
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "pat", "kind": "human"}).status_code == 201
            assert h.post("/v1/principals", json={"name": "pbot", "kind": "agent", "sponsor": "pat"}).status_code == 201
            tok = h.post("/v1/tokens", json={"for": "pbot", "expires": "1h"}).json()["token"]
        shutil.rmtree(scratch)  # a cleaner's age rule
        planted = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                  "ln", "-s", str(elsewhere), str(scratch)], capture_output=True, text=True)
        assert planted.returncode == 0, planted.stderr
        with gw.http(tok) as h:
            r = h.post("/v1/jobs", json={"command": "echo ran", "walltime": "60s"})
            assert r.status_code == 201, r.text
            job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
            err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
        assert os.listdir(elsewhere) == [], os.listdir(elsewhere)
        assert job["state"] == "FAILED" and str(scratch) in err, (job["state"], err)
    finally:
        if scratch.is_symlink():
            scratch.unlink()
        shutil.rmtree(elsewhere, ignore_errors=True)
