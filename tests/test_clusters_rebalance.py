"""Rebalancing, per-cluster policy and data across clusters (issue 52 items 3-5, decision
0053), on the two private Slurm instances (scripts/slurm-up and scripts/slurm-up --second).

With cluster one held by people's work: a pending job that allowed it is moved to cluster
two and runs there once (its Slurm job on one cancelled before it started, its principal
told in its ledger); a gateway killed at each step of a move finishes or undoes it at its
next start, and the job still runs once; a rule forbidding agents cluster two keeps them
off it; a job whose working directory cluster two does not mount is not placed there, and
plan_job says the data would have to move; a sponsor's budget on two keeps a job that would
pass it off two."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, free_port
from .test_clusters_slurm import both_turns, people, slurm, until

pytestmark = [pytest.mark.slurm_turn("none"),  # both instances' turns, taken by both_turns
              pytest.mark.timeout(900)]  # ... after whichever real-Slurm test holds them

FAULT_EXIT = 86  # corral/core/faults.py: the gateway dies at the named point, as a kill -9 would leave it


@contextlib.contextmanager
def gateway(root: Path, one: str, two: str, extra: str = "", **env: str) -> Iterator[Gateway]:
    home = root / "home"
    home.mkdir(exist_ok=True)
    (home / "corral.toml").write_text(f'[slurm]\nclusters = {{one = "{one}", two = "{two}"}}\npoll_s = 2\n'
                                      f'rebalance_margin_s = 60\nrebalance_every_s = 0.5\n{extra}')
    gw = Gateway(home, free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": one, "CORRAL_TICK_S": "0.5",
                                                         **env})
    gw.start()
    try:
        yield gw
    finally:
        gw.kill(signal.SIGTERM)


@contextlib.contextmanager
def people_hold(conf: str) -> Iterator[str]:
    """People's work holds every node of ``conf`` (a plain user's job, 10 minutes long),
    cancelled at the end whatever happens; given time to start behind another's job."""
    jid = slurm(conf, "sbatch", "--parsable", "-p", "batch", "-N4", "--exclusive", "-t10", "-o", "/dev/null",
                "--wrap", "sleep 600", user=65534).strip()
    try:
        until("people's job to hold the cluster",
              lambda: slurm(conf, "squeue", "-h", "-j", jid, "-o", "%T").strip() == "RUNNING", 600)
        yield jid
    finally:
        slurm(conf, "scancel", jid)


def runs(work: Path, name: str) -> int:
    f = work / f"{name}.runs"
    return len(f.read_text().splitlines()) if f.exists() else 0


def never_started(gw: Gateway, conf: str, cluster: str, job_id: int) -> None:
    """Slurm's own record of the job on the cluster it left (its id there, from corral's
    record on disk: job names repeat across gateways): cancelled, never run."""
    first = (gw.home / "slurm" / "jobs" / cluster / str(job_id) / "backend_id").read_text().strip()
    shown = slurm(conf, "squeue", "-h", "-a", "-t", "all", "-j", first, "-o", "%j %T %M").split()
    assert shown[0].startswith(f"corral-{job_id}") and shown[1:] == ["CANCELLED", "0:00"], shown


def submit(h: Any, work: Path, name: str, **more: Any) -> dict[str, Any]:
    body = {"command": f"echo ran >> {name}.runs", "walltime": "5m", "workdir": str(work), "name": name,
            "cluster": "one", **more}
    r = h.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_a_pending_job_is_moved_to_the_free_cluster_and_runs_once(tmp_path: Path, agent_dir: Path) -> None:
    with both_turns() as (one, two), gateway(tmp_path, one, two) as gw:
        tok = people(gw)
        with people_hold(one):
            with gw.http(tok["bot1"]) as h:
                stays = submit(h, agent_dir, "stays")  # not movable: it waits on one
                moved = submit(h, agent_dir, "moved", movable=True)
                done = h.get(f"/v1/jobs/{moved['id']}/wait", params={"timeout": 120}).json()
                assert done["state"] == "COMPLETED" and done["cluster"] == "two", done
                assert runs(agent_dir, "moved") == 1
                never_started(gw, one, "one", moved["id"])
                told = h.get("/v1/ledger").json()["unacked"]
                assert any(t["kind"] == "move" and t["job_id"] == moved["id"] and "from cluster one to two"
                           in t["text"] for t in told), told
                left = h.get(f"/v1/jobs/{stays['id']}").json()
                assert left["state"] == "PENDING" and left["cluster"] == "one", left
                time.sleep(2)  # four more rounds: a moved job is never moved again, nor run again
                assert runs(agent_dir, "moved") == 1 and runs(agent_dir, "stays") == 0
                h.post(f"/v1/jobs/{stays['id']}/cancel")


@pytest.mark.parametrize("point", ["move_recorded", "move_held", "move_cancelled", "move_rehomed"])
def test_a_gateway_killed_in_a_move_loses_nothing_and_runs_nothing_twice(tmp_path: Path, agent_dir: Path,
                                                                          point: str) -> None:
    # Started with moves off: the job is sent to one before the gateway that dies in its move starts.
    with both_turns() as (one, two), gateway(tmp_path, one, two, CORRAL_SLURM__REBALANCE_MARGIN_S="0") as gw:
        tok = people(gw)
        with people_hold(one):
            with gw.http(tok["bot1"]) as h:
                job = submit(h, agent_dir, "j", movable=True)  # sent to one, where it waits
            gw.kill(signal.SIGTERM)
            gw.extra_env.update(CORRAL_FAULT=point, CORRAL_SLURM__REBALANCE_MARGIN_S="60")
            with contextlib.suppress(RuntimeError):  # it may die before its first answer
                gw.start()
            assert gw.proc is not None
            assert gw.proc.wait(120) == FAULT_EXIT  # died in the move, at this step
            del gw.extra_env["CORRAL_FAULT"]
            gw.start()
            with gw.http(tok["bot1"]) as h:
                done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
                assert done["state"] == "COMPLETED" and done["cluster"] == "two", done
                time.sleep(2)
                assert runs(agent_dir, "j") == 1
                never_started(gw, one, "one", job["id"])  # its Slurm job there cancelled before it started


def test_a_job_being_moved_is_not_released_between_its_hold_and_its_cancel(tmp_path: Path, agent_dir: Path) -> None:
    """A move holds the job where it waits, then cancels it there. The agent's release
    between the two would let it start there, be killed by the cancel and run again on the
    other cluster: refused (409) while the move is open (held open here by a fault point)."""
    with both_turns() as (one, two), gateway(tmp_path, one, two, CORRAL_FAULT="move_held_stall") as gw:
        tok = people(gw)
        with people_hold(one):
            with gw.http(tok["bot1"]) as h:
                job = submit(h, agent_dir, "m", movable=True)
                first = until("the job in Slurm on one", lambda: (gw.home / "slurm" / "jobs" / "one" / str(job["id"])
                                                                 / "backend_id").exists(), 120)
                assert first
                sid = (gw.home / "slurm" / "jobs" / "one" / str(job["id"]) / "backend_id").read_text().strip()
                until("the move's hold", lambda: "JobHeld" in slurm(one, "squeue", "-h", "-j", sid, "-o", "%r"),
                      120)
                r = h.post(f"/v1/jobs/{job['id']}/control", json={"action": "release"})
                assert r.status_code == 409 and "being moved" in r.text, r.text
                assert "JobHeld" in slurm(one, "squeue", "-h", "-j", sid, "-o", "%r")
                done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 120}).json()
                assert done["state"] == "COMPLETED" and done["cluster"] == "two", done
                assert runs(agent_dir, "m") == 1


def test_a_rule_naming_a_cluster_keeps_agents_off_it(tmp_path: Path, agent_dir: Path) -> None:
    """Cedar's context names the cluster: a rule forbidding agents cluster two keeps their
    jobs on one though two would start them sooner; naming two is refused."""
    policy = tmp_path / "policy.cedar"
    default = Path(__file__).resolve().parent.parent / "corral/safety/policy/default.cedar"
    policy.write_text(default.read_text() + '\n@id("agents-not-on-two")\nforbid (principal is Corral::Agent, '
                      'action == Corral::Action::"submit", resource) when { context.cluster == "two" };\n')
    with both_turns() as (one, two), gateway(tmp_path, one, two,
                                             f'[safety]\npolicy_file = "{policy}"\n') as gw:
        tok = people(gw)
        with people_hold(one):
            body = {"command": "echo hi", "walltime": "5m", "workdir": str(agent_dir)}
            with gw.http(tok["bot1"]) as h:
                plan = h.post("/v1/plan", json=body).json()
                assert plan["allowed"] and plan["cluster"] == "one", plan  # two would start sooner: forbidden
                on_two = [c for c in plan["clusters"] if c["cluster"] == "two"]
                assert on_two and all("agents-not-on-two" in " ".join(c["reasons"]) for c in on_two), on_two
                r = h.post("/v1/jobs", json={**body, "cluster": "two"})
                assert r.status_code == 403 and "agents-not-on-two" in r.json()["error"]["message"], r.text
                job = h.post("/v1/jobs", json=body).json()
                assert h.get(f"/v1/jobs/{job['id']}").json()["cluster"] == "one"
                h.post(f"/v1/jobs/{job['id']}/cancel")


def test_data_a_cluster_does_not_mount_keeps_a_job_off_it(tmp_path: Path, agent_dir: Path) -> None:
    """Cluster two mounts /nowhere only: the job's working directory is not there, so the
    plan says the data would have to move and naming two is refused with why."""
    with both_turns() as (one, two), gateway(tmp_path, one, two, 'filesystems = {two = ["/nowhere"]}\n') as gw:
        tok = people(gw)["bot1"]
        body = {"command": "echo hi", "walltime": "5m", "workdir": str(agent_dir)}
        with gw.http(tok) as h:
            plan = h.post("/v1/plan", json=body).json()
            on_two = [c for c in plan["clusters"] if c["cluster"] == "two"]
            assert plan["cluster"] == "one" and on_two, plan
            assert all(f"needs data moved: its workdir {agent_dir}" in " ".join(c["reasons"]) for c in on_two), on_two
            r = h.post("/v1/jobs", json={**body, "cluster": "two"})
            assert r.status_code == 400 and "needs data moved" in r.json()["error"]["message"], r.text


def test_a_sponsors_budget_on_a_cluster_keeps_a_job_that_would_pass_it_off(tmp_path: Path, agent_dir: Path) -> None:
    """alice's family may reserve 0.05 CPU-hours on cluster two ([safety] cluster_budgets)."""
    with both_turns() as (one, two), gateway(tmp_path, one, two, '[safety]\ncluster_budgets = '
                                             '{two = {cpu_hours = 0.05}}\n') as gw:
        body = {"command": "echo hi", "workdir": str(agent_dir)}
        with gw.http(people(gw)["bot1"]) as h:
            plan = h.post("/v1/plan", json={**body, "walltime": "5m"}).json()  # 0.083 CPU-hours
            on_two = " ".join(r for c in plan["clusters"] if c["cluster"] == "two" for r in c["reasons"])
            assert plan["cluster"] == "one" and "alice's CPU-hour budget on cluster two" in on_two, plan
            plan = h.post("/v1/plan", json={**body, "walltime": "2m"}).json()  # 0.033: within it
            assert all(c["fits"] for c in plan["clusters"] if c["cluster"] == "two" and c["submit_would_use"]), plan

