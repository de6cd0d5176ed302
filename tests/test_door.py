"""A contained job's door to the gateway (decision 0057), without Slurm: its credential
(read-only, its principal's own jobs, while the job's record is not terminal, this job
only), the commands its sandbox offers, and the batch script's relays. The whole, on the
private cluster: tests/test_job_slurm_commands.py."""

from __future__ import annotations

from pathlib import Path

import httpx

from corral.core.jobs import JobSpec
from corral.edges.shims import COMMANDS, REFUSED
from corral.lanes.backend import SubmitContext
from corral.lanes.slurm.backend import SlurmBackend
from corral.lanes.slurm.base import Door
from corral.safety.job_credentials import JobCredentials
from corral.safety.tokens import TokenAuthority
from corral.sandbox import door
from corral.sandbox.bwrap import build

from .conftest import Gateway, add_people


def test_the_sandbox_offers_every_command_the_shims_serve_or_refuse() -> None:
    assert sorted(door.NAMES) == sorted((*COMMANDS, *REFUSED))


def _credential(gw: Gateway, job_id: int) -> str:
    return JobCredentials(TokenAuthority(gw.home / "token.key").secret()).of(job_id)


def test_a_jobs_credential_reads_its_principals_jobs_while_it_runs_and_nothing_more(gateway: Gateway,
                                                                                 agent_dir: Path) -> None:
    people = add_people(gateway)
    with gateway.http(people["bot1"]) as h:
        mine = h.post("/v1/jobs", json={"command": "sleep 60", "workdir": str(agent_dir)}).json()["id"]
    with gateway.http(people["bot2"]) as h:  # a sibling agent, same sponsor: still not this job's to see
        theirs = h.post("/v1/jobs", json={"command": "true", "workdir": str(agent_dir)}).json()["id"]
    cred = _credential(gateway, mine)
    with gateway.http(cred) as h:
        assert h.get(f"/v1/jobs/{mine}").status_code == 200
        assert [j["id"] for j in h.get("/v1/jobs").json()["jobs"]] == [mine]
        assert h.get(f"/v1/jobs/{theirs}").status_code == 404
        r = h.post("/v1/jobs", json={"command": "true", "workdir": str(agent_dir)})
        assert r.status_code == 403 and "does not allow this submit" in r.text, r.text
        assert h.post(f"/v1/jobs/{mine}/cancel").status_code == 403
        assert h.post("/v1/tokens", json={"for": "bot1", "expires": "1h"}).status_code == 403
    forged = [f"crj_{theirs}_{cred.rsplit('_', 1)[1]}", cred[:-1] + ("0" if cred[-1] != "0" else "1"),
              JobCredentials(b"another gateway").of(mine)]
    for bad in forged:
        r = httpx.get(f"{gateway.url}/v1/jobs", headers={"Authorization": f"Bearer {bad}"}, timeout=30)
        assert r.status_code == 401, (bad, r.text)
    with gateway.http(people["bot1"]) as h:
        h.post(f"/v1/jobs/{mine}/cancel")
        assert h.get(f"/v1/jobs/{mine}/wait", params={"timeout": 30}).json()["state"] == "CANCELLED"
    r = httpx.get(f"{gateway.url}/v1/jobs", headers={"Authorization": f"Bearer {cred}"}, timeout=30)
    assert r.status_code == 401 and "has ended" in r.text, r.text  # at once, not after a cache's while


def test_an_admins_job_reads_only_its_own_jobs(gateway: Gateway, agent_dir: Path) -> None:
    people = add_people(gateway)
    with gateway.http(people["bot1"]) as h:
        h.post("/v1/jobs", json={"command": "true", "workdir": str(agent_dir)})
    with gateway.http() as h:  # the admin's
        mine = h.post("/v1/jobs", json={"command": "sleep 30", "workdir": str(agent_dir)}).json()["id"]
    try:
        with gateway.http(_credential(gateway, mine)) as h:
            assert [j["id"] for j in h.get("/v1/jobs").json()["jobs"]] == [mine]
    finally:
        with gateway.http() as h:
            h.post(f"/v1/jobs/{mine}/cancel")


def test_a_contained_jobs_script_starts_the_door_and_the_shims(tmp_path: Path) -> None:
    sandbox = build(["agent"], [], False, "nobody", [tmp_path / "state"], 512, None, seccomp=False)
    if sandbox.why_not:
        raise AssertionError(sandbox.why_not)
    b = SlurmBackend(tmp_path / "jobs", None, sandbox=sandbox)
    ctx = SubmitContext(17, "bot", "agent", "alice", "s-1")
    plain = b.render(ctx, JobSpec(command="srun hostname"), tmp_path / "jobs" / "17")
    assert "--symlink" in plain and f"{door.SHIM_BIN}/srun" in plain and door.INSIDE not in plain  # no door: srun only
    b.door = Door("10.0.0.1:8765", lambda j: f"cred-{j}")
    script = b.render(ctx, JobSpec(command="srun hostname"), tmp_path / "jobs" / "17")
    assert "gateway.sock" in script and "TCP:10.0.0.1:8765" in script and door.INSIDE in script
    assert f'--setenv PATH {door.SHIM_BIN}:"$PATH"' in script
    env = b._job_env(ctx, JobSpec(command="x")) | b._door_env(ctx)
    assert env["CORRAL_TOKEN"] == "cred-17" and env["CORRAL_URL"] == door.URL and env["SLURM_JOB_ID"] == "17"
