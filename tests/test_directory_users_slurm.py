"""A user known only to the site's directory runs a job on the Slurm lane (decision
0056's "not done"). slurmctld, slurmd and slurmdbd must resolve her as the gateway does,
and the shared private clusters' daemons run outside the directory's namespace (binding
its nsswitch.conf into them would change every other Slurm test's lookups). So this test
starts a Slurm of its own, single-node (scripts/slurm-up, CORRAL_SLURM_LAYOUT=single, its
own directory and ports), inside the directory's mount namespace: every daemon of it
resolves her through nslcd, as a site's nodes resolve its directory."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import Gateway, free_port
from .ldap_env import Directory, need_ldap

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_a_directory_users_job_runs_as_her_on_slurm() -> None:
    need_ldap()
    directory = Directory().start()
    # short: munge's socket path must fit in 107 bytes
    inst = Path(tempfile.mkdtemp(prefix="csl-", dir="/tmp"))
    inst.chmod(0o755)  # slurmstepd runs her batch script from its spool there, as her
    root = Path(tempfile.mkdtemp(prefix="corral-dir-slurm-", dir="/tmp"))
    root.chmod(0o755)  # Slurm opens the job's output as her: the jobs' directory must let her through
    slurm = {**os.environ, "CORRAL_SLURM_DIR": str(inst), "CORRAL_SLURM_LAYOUT": "single",
             "CORRAL_SLURM_PORT": str(free_port()), "CORRAL_SLURM_DB_PORT": str(free_port())}
    gw: Gateway | None = None
    try:
        name = f"dirslurm{os.getpid() % 100000}"
        uid = directory.add_user(name)
        with pytest.raises(KeyError):
            pwd.getpwnam(name)  # only the directory has her
        up = subprocess.run(directory.argv(str(SCRIPTS / "slurm-up")), env=slurm, capture_output=True, text=True,
                            timeout=600)
        assert up.returncode == 0, up.stderr[-3000:]
        conf = str(inst / "etc" / "slurm.conf")
        project = directory.dir / "home" / name / "proj"
        project.mkdir()
        os.chown(project, uid, uid)
        gw = Gateway(root / "home", free_port(), prefix=directory.argv(),
                     extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": conf, "CORRAL_TICK_S": "0.5"})
        gw.home.mkdir()
        gw.start()
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "dora", "kind": "human", "unix_user": name}).status_code == 201
            token = h.post("/v1/tokens", json={"for": "dora", "expires": "1h"}).json()["token"]
        with gw.http(token) as h:
            r = h.post("/v1/jobs", json={"command": "id -un; id -u; echo hers > mine", "workdir": str(project),
                                         "walltime": "60s"})
            assert r.status_code == 201, r.text
            job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 120}).json()
            out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
            err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
        assert job["state"] == "COMPLETED" and job["backend"] == "slurm", (job, out, err)
        assert out.split() == [name, str(uid)], out  # on the node, through the directory
        assert (project / "mine").stat().st_uid == uid
        bid = (gw.home / "slurm" / "jobs" / str(job["id"]) / "backend_id").read_text().strip()
        user, deadline = "", time.time() + 60
        while time.time() < deadline and user != name:  # slurmdbd records the job a moment after it ends
            user = subprocess.run(directory.argv("sacct", "-X", "-n", "-P", "-j", bid, "-o", "User"),
                                  env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True).stdout.strip()
            time.sleep(0.5)
        assert user == name  # Slurm's accounting names her, as the directory does
    finally:
        if gw is not None:
            gw.kill(15)
        subprocess.run(directory.argv(str(SCRIPTS / "slurm-down")), env=slurm, capture_output=True, timeout=300)
        directory.stop()
        shutil.rmtree(inst, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
