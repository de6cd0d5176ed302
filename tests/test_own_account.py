"""Nobody's job runs as the gateway's own account (issue 47 item 7; corral/gateway/own_account.py,
docs/decisions/0046-no-job-as-the-gateway.md), attacked as the review did: a real gateway
run by a plain Unix user, a person's and an agent's tokens, jobs that try to read the
gateway's secrets, in real bubblewrap, on the local backend and on the private Slurm.
Before: a person's job on such a gateway ran uncontained as its account, and
`cat admin.token | base64 | rev` printed the admin token past the output guard."""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import drop_scratch, free_port
from .test_sandbox import need_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="a gateway run by another, plain Unix user (CI runs as root)")


@pytest.fixture
def account() -> Iterator[pwd.struct_passwd]:
    """A plain Unix user with a home of its own, as people have: the gateway's account."""
    name = f"corralsvc{os.getpid() % 100000}"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    u = pwd.getpwnam(name)
    drop_scratch(Path(u.pw_dir) / "state")  # a former run's (same pid, same name, a deleted uid)
    try:
        yield u
    finally:
        subprocess.run(["pkill", "-u", name], capture_output=True)
        time.sleep(0.5)
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(f"/home/{name}", ignore_errors=True)
        drop_scratch(Path(f"/home/{name}") / "state")


def start(u: pwd.struct_passwd, port: int, **extra: str) -> subprocess.Popen[bytes]:
    """`corral serve` as ``u``, from the system's Python with the project's packages (the
    venv's interpreter lies in root's home here, which another account cannot enter)."""
    site = next(Path(".venv/lib").glob("python3*/site-packages")).resolve()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": u.pw_dir, "CORRAL_HOME": f"{u.pw_dir}/state",
           "PYTHONPATH": f"{site}:{Path.cwd()}", "USER": u.pw_name, **extra}
    log = open(Path(u.pw_dir) / "gateway.log", "ab")
    return subprocess.Popen(["/usr/bin/python3", "-m", "corral.edges.cli.main", "serve", "--port", str(port),
                             "--tick", "0.2", "--cpus", "2"], env=env, stdout=log, stderr=log, cwd=u.pw_dir,
                            user=u.pw_uid, group=u.pw_gid, extra_groups=[])


def up(proc: subprocess.Popen[bytes], u: pwd.struct_passwd, url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (Path(u.pw_dir) / "gateway.log").read_text()
        time.sleep(0.1)
    raise AssertionError("the gateway did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.parametrize("backend,extra,why", [
    ("local", {}, "no way to run a job as anyone else"),
    ("slurm", {}, "no way to run a job as anyone else"),
    ("slurm", {"CORRAL_SLURM__SUBMITTER": "/usr/local/libexec/corral-submit"}, "the fast lane's workers would run as"),
])
def test_a_gateway_that_would_run_jobs_as_its_own_account_refuses_to_start(account: pwd.struct_passwd, backend: str,
                                                                           extra: dict[str, str], why: str) -> None:
    """Before, each of these started and ran every job as its account."""
    conf = os.environ.get("SLURM_CONF", "/tmp/corral-slurm/etc/slurm.conf")
    proc = start(account, free_port(), CORRAL_BACKEND=backend, SLURM_CONF=conf, **extra)
    assert proc.wait(60) == 2
    said = (Path(account.pw_dir) / "gateway.log").read_text()
    assert f"refusing to start: this gateway runs as the unprivileged account '{account.pw_name}'" in said, said
    assert why in said and "Traceback" not in said, said
    # and what to configure instead
    assert "run the gateway as root" in said and "[slurm] submitter" in said and "personal = true" in said, said
    assert not (Path(account.pw_dir) / "state" / "admin.token").exists()


def _job(url: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Submitted and waited for: (status of the submission, the job with its output) or
    (status, the refusal)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=90) as h:
        r = h.post("/v1/jobs", json={"walltime": "60s", **body})
        if r.status_code != 201:
            return r.status_code, r.json()["error"]
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
        job["out"] = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
        job["err"] = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
        return 201, job


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_a_personal_gateway_keeps_its_secrets_from_jobs_and_serves_no_one_else(account: pwd.struct_passwd,
                                                                               backend: str) -> None:
    """One person's own gateway (personal = true, as `make run` by a plain user): her
    agents' jobs run as her account, contained, and read none of the gateway's secrets
    (hidden, not redacted); a person whose Unix user is someone else is refused, in plan
    as in submit, before anything runs as the gateway."""
    need_bwrap()
    extra = {"CORRAL_PERSONAL": "true"}
    if backend == "slurm":
        from .slurm_env import slurm_conf

        extra.update(CORRAL_BACKEND="slurm", SLURM_CONF=slurm_conf())
    home = Path(account.pw_dir) / "state"
    project = Path(account.pw_dir) / "project"
    project.mkdir()
    os.chown(project, account.pw_uid, account.pw_gid)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(account, port, **extra)
    try:
        up(proc, account, url)
        admin = (home / "admin.token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as h:
            for body in ({"name": "alice", "kind": "human"}, {"name": "bot1", "kind": "agent", "sponsor": "alice"},
                         {"name": "carol", "kind": "human", "unix_user": "nobody"}):
                assert h.post("/v1/principals", json=body).status_code == 201
            tok = {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("bot1", "carol")}
        steal = (f"id -u; cat {home}/admin.token | base64 | rev; cat {home}/token.key | base64 | rev; "
                 f"wc -c < {home}/corral.db; echo made > made.txt; "
                 "python3 -c \"import socket; socket.socket(socket.AF_UNIX)\" || echo filtered")
        status, job = _job(url, tok["bot1"], {"command": steal, "workdir": str(project)})
        assert status == 201 and job["state"] == "COMPLETED" and job["backend"] == backend, job
        # corral's own lines aside (under load the batch script may say it set the sandbox up again)
        said = [line for line in job["out"].splitlines() if not line.startswith("corral: ")]
        assert said and said[0] == str(account.pw_uid) and "filtered" in job["out"], job
        leaked = base64.b64encode((admin + "\n").encode()).decode()[::-1]
        assert leaked not in job["out"] and admin not in job["out"], job["out"]
        assert job["err"].count("No such file or directory") == 3, job["err"]  # corral's home is not there at all
        assert (project / "made.txt").stat().st_uid == account.pw_uid
        # carol is someone else: on this gateway her job would run as its account
        status, err = _job(url, tok["carol"], {"command": f"cat {home}/admin.token | base64 | rev",
                                               "workdir": str(project)})
        assert status == 403 and f"this gateway is {account.pw_name}'s own" in err["message"], err
        assert "Unix user nobody" in err["message"] and err.get("hint"), err
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok['carol']}"}, timeout=30) as h:
            plan = h.post("/v1/plan", json={"command": f"cat {home}/corral.db", "workdir": str(project)})
        assert "this gateway is" in plan.text and f"{account.pw_name}'s own" in plan.text, plan.text
        assert home.stat().st_mode & 0o077 in (0o011, 0)
        for secret in ("admin.token", "token.key", "corral.db"):
            st = (home / secret).stat()
            assert st.st_uid == account.pw_uid and st.st_mode & 0o077 == 0, secret
    finally:
        stop(proc)
