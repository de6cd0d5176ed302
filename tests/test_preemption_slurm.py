"""Agents' opportunistic tier on the real Slurm of scripts/slurm-up (issue 38 item 2,
docs/decisions/0022): a person's job preempts an agent's opportunistic job, Slurm
requeues it, it finishes later, and the agent sees one job that ended COMPLETED with
its requeue count, the work lost, and its output as one stream."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from corral.lanes.slurm.backend import SlurmBackend
from corral.lanes.slurm.tiers import Requeues, extend
from corral.core.config import SlurmSettings
from corral.core.errors import Conflict
from corral.core.signals import GRACE_S
from corral.core.jobs import JobSpec, JobState
from corral.lanes.placement import Placer
from corral.core.principals import Kind, Principal

from .conftest import SHARED_TURN, Gateway, add_people, free_port, running
from .slurm_env import slurm_conf, start_requeued_now

# One real-Slurm test at a time, whichever worker runs it (tests/conftest.py::slurm_turn).
on_slurm = pytest.mark.usefixtures("slurm_turn")


def slurm(conf: str, *argv: str) -> str:
    return subprocess.run(argv, env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                          check=True, timeout=30).stdout


def free_cpus(conf: str) -> int:
    """CPUs not allocated on the private Slurm's largest node (it advertises 32; the
    cluster's others 8, decision 0032): a job of that many fits on that node alone."""
    nodes = [dict(t.split("=", 1) for t in line.split() if "=" in t)
             for line in slurm(conf, "scontrol", "show", "node", "-o").splitlines()]
    biggest = max(nodes, key=lambda kv: int(kv["CPUTot"]))
    return int(biggest["CPUTot"]) - int(biggest["CPUAlloc"])


def until(what: str, check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")


def status(gw: Gateway, token: str, job_id: int) -> dict[str, Any]:
    """The job as the agent sees it, through the CLI with its own token."""
    cp = gw.cli("--json", "status", str(job_id), token=token)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


CHECKPOINTING = """#!/bin/bash
if [ -f ckpt ]; then echo "resumed from $(cat ckpt)"; exit 0; fi
trap 'echo "step 7" > ckpt; echo checkpointed; exit 0' USR1
echo begin
: > ready
while :; do sleep 0.2; done
"""
"""An agent's job that checkpoints on USR1 (in its workdir, inside its sandbox) and
resumes from its checkpoint when it runs again."""


def _start(tmp_path: Path) -> tuple[Gateway, dict[str, str]]:
    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(),
                                                            "CORRAL_TICK_S": "0.5", "CORRAL_SLURM__POLL_S": "2"})
    gw.home.mkdir()
    gw.start()
    with gw.http() as h:
        for body in ({"name": "alice", "kind": "human"}, {"name": "bot1", "kind": "agent", "sponsor": "alice"}):
            assert h.post("/v1/principals", json=body).status_code == 201
        return gw, {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("alice", "bot1")}


def _preempt(gw: Gateway, tok: dict[str, str], agent_dir: Path, job: dict[str, Any]) -> tuple[int, str, float]:
    """The agent's ``job`` (all the free CPUs of the largest node) running and ready, a
    person's job that needs those cores -> (the agent's job id and Slurm id, seconds
    until the person's job had run)."""
    conf = slurm_conf()
    cpus = until("free CPUs on the node", lambda: free_cpus(conf) >= 8 and free_cpus(conf), 120)
    with gw.http(tok["bot1"]) as h:
        plan = h.post("/v1/plan", json={**job, "cpus": cpus}).json()
        assert plan["allowed"] and plan["placement"]["tier"] == "opportunistic", plan
        assert "USR1" in plan["placement"]["why"] and f"{GRACE_S} s" in plan["placement"]["why"], plan
        r = h.post("/v1/jobs", json={**job, "cpus": cpus})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    until("the agent's job to be running and ready", lambda: status(gw, tok["bot1"], job_id)["state"] == "RUNNING"
          and (agent_dir / "ready").exists(), 180)
    script = (gw.home / "slurm" / "jobs" / str(job_id) / "job.sh").read_text()
    assert f"#SBATCH --signal=B:URG@{GRACE_S}" in script and "#SBATCH --qos=agents-opportunistic" in script
    t0 = time.monotonic()
    with gw.http(tok["alice"]) as h:
        hers = h.post("/v1/jobs", json={"command": "echo hers", "cpus": cpus, "walltime": "5m",
                                        "workdir": str(agent_dir)}).json()
        end = until("the person's job to end", lambda: (j := h.get(f"/v1/jobs/{hers['id']}/wait",
                                                                  params={"timeout": 30}).json())["state"]
                    not in ("PENDING", "RUNNING") and j, 3 * GRACE_S)
        assert end["state"] == "COMPLETED", end
    return job_id, status(gw, tok["bot1"], job_id)["backend_id"], time.monotonic() - t0


@on_slurm
def test_a_preempted_agents_job_checkpoints_on_usr1_in_its_sandbox_and_resumes(tmp_path: Path,
                                                                                agent_dir: Path) -> None:
    """Issue 49 item 6: a person's job preempts an agent's opportunistic job; Slurm tells
    corral's batch shell (--signal=B:URG@120, preempt_send_user_signal), which passes USR1
    into the sandbox; the job's trap writes its checkpoint and exits, and corral requeues
    it at once (Slurm would have counted the run COMPLETED: it ended within its grace). It
    runs again, from its checkpoint. Before: Slurm's TERM reached bwrap with the job, the
    sandbox ended at once and nothing was written."""
    gw, tok = _start(tmp_path)
    try:
        job = {"script": CHECKPOINTING, "walltime": "10m", "workdir": str(agent_dir)}
        job_id, backend_id, took = _preempt(gw, tok, agent_dir, job)
        assert (agent_dir / "ckpt").read_text() == "step 7\n"  # written inside the sandbox, at the notice
        assert took < GRACE_S, took  # the cores came back when the job had checkpointed, not at the grace's end
        again = until("the agent's job requeued", lambda: (j := status(gw, tok["bot1"], job_id))["requeues"] >= 1
                      and j, 60)
        assert again["state"] in ("PENDING", "RUNNING"), again  # one live job, never FAILED or COMPLETED
        # Slurm holds a requeued job until its BeginTime (~2 min on 22.05): as Slurm's admin the
        # test lets it start now, which only shortens the wait.
        conf = slurm_conf()
        until("the earlier run to be cleaned up", lambda: slurm(conf, "squeue", "-h", "-j", backend_id, "-o", "%T")
              .strip() == "PENDING", 60)
        start_requeued_now(conf, backend_id)
        until("the agent's job to end", lambda: status(gw, tok["bot1"], job_id)["state"] not in ("PENDING", "RUNNING"),
              400)
        done = status(gw, tok["bot1"], job_id)
        assert done["state"] == "COMPLETED" and done["requeues"] >= 1, done
        with gw.http(tok["bot1"]) as h:
            out = h.get(f"/v1/jobs/{job_id}/output").json()["data"]
            err = h.get(f"/v1/jobs/{job_id}/output", params={"stream": "stderr"}).json()["data"]
        runs = out.split("corral: Slurm requeued this job")
        assert runs[0] == "begin\ncheckpointed\n", out
        assert runs[-1].rstrip().endswith("resumed from step 7"), out
        assert "corral: preempted (sent USR1); the job ended within its grace, so it is requeued now" in err, err
        rows = slurm(conf, "sacct", "-D", "-X", "-n", "-P", "-j", backend_id, "-o", "State").split()
        assert rows[0] == "REQUEUED" and rows[-1] == "COMPLETED", rows  # requeued by corral, then done
    finally:
        gw.kill(signal.SIGTERM)


@on_slurm
def test_a_preempted_job_that_does_not_handle_usr1_runs_on_in_its_grace(tmp_path: Path, agent_dir: Path) -> None:
    """The default notice is passed on only to a job that handles USR1 (its default action
    is to die): one that does not runs on through its grace, here to its end, and is
    COMPLETED once, not killed by a signal it never asked for nor run again."""
    gw, tok = _start(tmp_path)
    try:
        job = {"command": "echo begin; : > ready; sleep 8; echo finished", "walltime": "10m",
               "workdir": str(agent_dir)}
        job_id, _, took = _preempt(gw, tok, agent_dir, job)
        assert took < GRACE_S, took  # the person's job ran once the agent's had finished in its grace
        with gw.http(tok["bot1"]) as h:
            done = h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 30}).json()
            assert done["state"] == "COMPLETED" and not done.get("requeues"), done
            assert h.get(f"/v1/jobs/{job_id}/output").json()["data"] == "begin\nfinished\n"
    finally:
        gw.kill(signal.SIGTERM)


@on_slurm
@SHARED_TURN  # one 1-CPU job at a time: never preempted beside another shared test
def test_walltime_tightened_from_memory_and_given_back(tmp_path: Path, agent_dir: Path) -> None:
    """An agent's script that completed twice asks Slurm for its runtimes x 2 (here at
    least 1 min), shown by plan_job and kept in the record beside the agent's own; once
    it runs near that limit the gateway gives it the agent's walltime back."""
    conf = slurm_conf()
    gw = Gateway(tmp_path / "home", free_port(), extra_env={
        "CORRAL_BACKEND": "slurm", "SLURM_CONF": conf, "CORRAL_TICK_S": "0.5", "CORRAL_SLURM__POLL_S": "2",
        "CORRAL_SLURM__WALLTIME_MIN_S": "60"})
    gw.home.mkdir()
    gw.start()
    try:
        with gw.http() as h:
            for body in ({"name": "alice", "kind": "human"}, {"name": "bot1", "kind": "agent", "sponsor": "alice"}):
                assert h.post("/v1/principals", json=body).status_code == 201
            tok = h.post("/v1/tokens", json={"for": "bot1", "expires": "1h"}).json()["token"]
        spec = {"command": "sleep ${SECS:-1}; echo step", "walltime": "10m", "workdir": str(agent_dir)}
        with gw.http(tok) as h:
            first = h.post("/v1/plan", json=spec).json()["placement"]
            assert first["tier"] == "opportunistic" and first["walltime_s"] == first["asked_walltime_s"] == 600
            for _ in range(2):  # two runs for memory to go by
                job = h.post("/v1/jobs", json=spec).json()
                done = until("a run to end", lambda: (j := h.get(f"/v1/jobs/{job['id']}/wait",  # noqa: B023
                                                                 params={"timeout": 30}).json())["state"]
                             not in ("PENDING", "RUNNING") and j, 300)
                assert done["state"] == "COMPLETED", done
            plan = h.post("/v1/plan", json=spec).json()["placement"]
            assert plan["walltime_s"] == 60 and plan["asked_walltime_s"] == 600, plan
            assert "the last 2 runs of this script took at most" in plan["why"], plan
            other = h.post("/v1/plan", json={**spec, "command": "sleep 2; echo step"}).json()["placement"]
            assert other["walltime_s"] == 600, other  # another script: nothing to go by
            # The same script (the environment is not part of it), running long enough to be seen running.
            job = h.post("/v1/jobs", json={**spec, "env": {"SECS": "30"}}).json()
            assert job["spec"]["walltime"] == 600 and job["spec"]["labels"]["corral-walltime-s"] == "60", job
            assert "x2" in job["spec"]["labels"]["corral-walltime-why"]
        script = (gw.home / "slurm" / "jobs" / str(job["id"]) / "job.sh").read_text()
        assert "#SBATCH --time=00:01:00" in script, script
        backend_id = (gw.home / "slurm" / "jobs" / str(job["id"]) / "backend_id").read_text().strip()

        def limit() -> str:
            return re.search(r"TimeLimit=(\S+)", slurm(conf, "scontrol", "show", "job", backend_id)).group(1)

        # Within 2 minutes of its tightened limit from the start: given back at the first poll that sees it run.
        assert until("its walltime given back", lambda: limit() == "00:10:00", 300)
        with gw.http(tok) as h:  # done with it: the cores go back
            h.post(f"/v1/jobs/{job['id']}/cancel")
    finally:
        gw.kill(signal.SIGTERM)


# -- no Slurm needed: the placement, and Slurm's answers about requeued jobs ----------------

class _Lane:
    def partition_cpus(self, partition: str | None) -> int:
        return 32


class _Db:
    held = 0

    def guaranteed_cpus(self, partition: str | None) -> int:
        return self.held


BOT = Principal("bot1", Kind.AGENT, "alice")
ALICE = Principal("alice", Kind.HUMAN)


def test_placement_tiers_and_labels_are_the_placements_alone() -> None:
    db = _Db()
    placer = Placer(SlurmSettings(), db, lambda p, s, n: [])  # type: ignore[arg-type]
    forged = JobSpec(command="x", labels={"corral-tier": "guaranteed", "corral-walltime-s": "1", "mine": "y"})
    spec, placed = placer.place(BOT, forged, _Lane(), "agents-opportunistic")
    assert placed is not None and placed.tier == "opportunistic" and placed.qos == "agents-opportunistic"
    assert spec.labels == {"mine": "y", "corral-tier": "opportunistic"} and spec.walltime_s == forged.walltime_s
    spec, placed = placer.place(ALICE, forged, _Lane(), "agents-opportunistic")  # a person: not placed
    assert placed is None and spec.labels == {"mine": "y"}
    spec, placed = placer.place(BOT, forged, None, "agents-opportunistic")  # another lane (the fast lane)
    assert placed is None and spec.labels == {"mine": "y"}
    _, placed = placer.place(BOT, forged, _Lane(), None)  # a Slurm without the QOS: as before
    assert placed is not None and placed.tier == "guaranteed" and placed.qos is None
    shared = Placer(SlurmSettings(agent_guarantee=0.25), db, lambda p, s, n: [])  # type: ignore[arg-type]
    _, placed = shared.place(BOT, JobSpec(command="x", cpus=8), _Lane(), "q")
    assert placed is not None and placed.tier == "guaranteed"  # 8 of 32 x 0.25
    db.held = 4
    _, placed = shared.place(BOT, JobSpec(command="x", cpus=8), _Lane(), "q")
    assert placed is not None and placed.tier == "opportunistic"


def test_an_agent_asks_for_a_tier_and_a_full_share_refuses_guaranteed_with_the_nearest() -> None:
    """Issue 49 item 6: `tier` asks for one. 'opportunistic' leaves the share to others;
    'guaranteed' is granted while agents' share has room, else refused with what holds
    it and the nearest request that runs (fewer CPUs, else the opportunistic tier)."""
    db = _Db()
    shared = Placer(SlurmSettings(agent_guarantee=0.25), db, lambda p, s, n: [])  # type: ignore[arg-type]
    _, placed = shared.place(BOT, JobSpec(command="x", cpus=2, tier="opportunistic"), _Lane(), "q")
    assert placed is not None and placed.tier == "opportunistic" and placed.why.startswith("asked: QOS q")
    _, placed = shared.place(BOT, JobSpec(command="x", cpus=8, tier="guaranteed"), _Lane(), "q")
    assert placed is not None and placed.tier == "guaranteed"
    db.held = 6
    with pytest.raises(Conflict) as e:
        shared.place(BOT, JobSpec(command="x", cpus=8, tier="guaranteed"), _Lane(), "q")
    assert e.value.nearest == {"cpus": 2} and e.value.rule == "tier", e.value.nearest
    assert "holds 6 CPUs of agents' jobs, this one asks 8" in e.value.message, e.value.message
    assert "tier='opportunistic'" in (e.value.hint or "") and "cpus <= 2" in (e.value.hint or "")
    db.held = 8
    with pytest.raises(Conflict) as e:
        shared.place(BOT, JobSpec(command="x", cpus=1, tier="guaranteed"), _Lane(), "q")
    assert e.value.nearest == {"tier": "opportunistic"}
    none = Placer(SlurmSettings(), _Db(), lambda p, s, n: [])  # type: ignore[arg-type]
    with pytest.raises(Conflict) as e:  # no share at all: said so, not as a full one
        none.place(BOT, JobSpec(command="x", tier="guaranteed"), _Lane(), "q")
    assert "not offered to agents here" in e.value.message and e.value.nearest == {"tier": "opportunistic"}
    _, placed = none.place(BOT, JobSpec(command="x", tier="guaranteed"), _Lane(), None)  # no preemptible QOS
    assert placed is not None and placed.tier == "guaranteed"


@on_slurm
@SHARED_TURN  # 1-CPU jobs of a few seconds
def test_the_guaranteed_tier_asked_through_http_mcp_and_the_sbatch_shim(tmp_path: Path, agent_dir: Path) -> None:
    """On the private Slurm with agents' guaranteed share at 2% (2 of the default
    partition's 128 CPUs, as corral counts them: 4 nodes x the largest's 32): plan_job says the tier a request gets; 4 CPUs asked guaranteed
    are refused with the nearest request (2 CPUs) over HTTP and MCP, and by the sbatch
    shim (--qos=guaranteed); --qos=opportunistic is taken, another QOS name refused in
    words."""
    from mcp import Client

    from .test_mcp_said_up_front import _stdio
    from .test_shims import agent_run

    gw = Gateway(tmp_path / "home", free_port(), extra_env={
        "CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(), "CORRAL_TICK_S": "0.5",
        "CORRAL_SLURM__AGENT_GUARANTEE": "0.02"})
    gw.home.mkdir()
    gw.start()
    try:
        tok = add_people(gw)["bot1"]
        asked = {"command": "true", "cpus": 4, "tier": "guaranteed", "workdir": str(agent_dir)}
        with gw.http(tok) as h:
            small = h.post("/v1/plan", json={**asked, "cpus": 1}).json()
            assert small["allowed"] and small["placement"]["tier"] == "guaranteed", small
            plan = h.post("/v1/plan", json=asked).json()
            assert not plan["allowed"] and plan["rule"] == "tier", plan
            assert plan["nearest"] == {"cpus": 2} and plan["nearest_allowed"] is True, plan
            r = h.post("/v1/jobs", json=asked)
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert "guaranteed tier is not free" in err["message"] and "tier='opportunistic'" in err["hint"], err
            assert h.post("/v1/plan", json={**asked, "tier": None}).json()["placement"]["tier"] == "opportunistic"

        async def mcp() -> tuple[Any, Any]:
            async with Client(_stdio(gw, tok)) as client:
                return await client.call_tool("plan_job", asked), await client.call_tool("submit_job", asked)

        planned, submitted = asyncio.run(mcp())
        assert "Nearest request that fits: cpus=2" in planned.content[0].text, planned.content[0].text
        assert submitted.is_error and "guaranteed tier is not free" in submitted.content[0].text, submitted

        script = ("sbatch --qos=guaranteed -c 4 --wrap true; echo rc=$?; sbatch -q normal --wrap true; echo rc=$?; "
                  "sbatch --parsable --qos=opportunistic --wrap true")
        cp = agent_run(gw, tok, script, agent_dir, "--no-fence", "--quiet")
        said = cp.stdout.split()
        assert said[:2] == ["rc=1", "rc=1"] and said[2].isdigit(), cp.stdout + cp.stderr
        assert "guaranteed tier is not free" in cp.stderr and "--qos=opportunistic" in cp.stderr, cp.stderr
        assert "does not support --qos=normal" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
        with gw.http(tok) as h:
            assert h.get(f"/v1/jobs/{said[2]}").json()["spec"]["labels"]["corral-tier"] == "opportunistic"
    finally:
        gw.kill(signal.SIGTERM)


@on_slurm
@SHARED_TURN  # one 1-CPU job
def test_a_signal_the_job_chose_with_the_sbatch_shim_reaches_its_script_in_the_sandbox(tmp_path: Path,
                                                                                     agent_dir: Path) -> None:
    """An agent's own `#SBATCH --signal=B:USR2@100` (as Slurm takes it): corral asks Slurm
    for its notice 100 s before the walltime (2 min), and the script, contained, gets
    USR2 from its batch shell, whether it handles it or not (asked: sent as Slurm sends
    it). Before, the shim refused --signal ('use corral control ID signal')."""
    from .test_shims import agent_run

    gw = Gateway(tmp_path / "home", free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(),
                                                            "CORRAL_TICK_S": "0.5"})
    gw.home.mkdir()
    gw.start()
    try:
        tok = add_people(gw)["bot1"]
        script = ("printf '#!/bin/bash\\n#SBATCH --signal=B:USR2@100\\ntrap \"echo told; exit 0\" USR2\\n"
                  "echo waiting\\nfor i in $(seq 900); do sleep 0.2; done\\n' > job.sh; "
                  "ID=$(sbatch --parsable -t 2 job.sh); while squeue -h -j $ID | grep -q .; do sleep 0.5; done; "
                  "cat slurm-$ID.out; sacct -X -n -P -j $ID -o State")
        cp = agent_run(gw, tok, script, agent_dir, "--no-fence", "--quiet")
        assert cp.stdout.split() == ["waiting", "told", "COMPLETED"], cp.stdout + cp.stderr
        with gw.http(tok) as h:
            job = h.get("/v1/jobs").json()["jobs"][0]
            assert h.get(f"/v1/jobs/{job['id']}").json()["spec"]["signal"] == "USR2@100"
        assert "#SBATCH --signal=B:URG@100" in (gw.home / "slurm" / "jobs" / str(job["id"]) / "job.sh").read_text()
    finally:
        gw.kill(signal.SIGTERM)


def test_walltime_from_the_last_runs_with_its_margin_floor_and_ceiling() -> None:
    runs: list[tuple[int, float]] = []
    placer = Placer(SlurmSettings(), _Db(), lambda p, s, n: runs[:n])  # type: ignore[arg-type]
    spec = JobSpec(command="x", walltime="2h")

    def applied() -> tuple[int, dict[str, str]]:
        placed_spec, placed = placer.place(BOT, spec, _Lane(), "q")
        assert placed is not None and placed.asked_walltime_s == 7200 and placed_spec.walltime_s == 7200
        return placed.walltime_s, placed_spec.labels

    runs[:] = [(7, 400.0)]
    assert applied() == (7200, {"corral-tier": "opportunistic"})  # one run is not enough to go by
    runs[:] = [(9, 400.0), (8, 610.0), (7, 30.0), (6, 5000.0)]  # the last 3: at most 610 s, x2, whole minutes
    limit, labels = applied()
    assert limit == 1260 and labels["corral-walltime-s"] == "1260" and "jobs 9, 8, 7" in labels["corral-walltime-why"]
    runs[:] = [(9, 10.0), (8, 20.0)]
    assert applied()[0] == 300  # at least walltime_min_s
    runs[:] = [(9, 4000.0), (8, 20.0)]
    assert applied() == (7200, {"corral-tier": "opportunistic"})  # never above what was asked
    guaranteed = Placer(SlurmSettings(), _Db(), lambda p, s, n: [(1, 10.0), (2, 10.0)])  # type: ignore[arg-type]
    _, placed = guaranteed.place(BOT, spec, _Lane(), None)
    assert placed is not None and placed.walltime_s == 7200  # a guaranteed job keeps the agent's


def test_a_requeued_job_is_pending_with_its_count_and_the_work_it_lost(tmp_path: Path) -> None:
    """Slurm's own words for a job being requeued (squeue: COMPLETING, RestartCnt 1) read
    as PENDING, never as an end; the work lost comes from sacct -D's earlier runs."""
    said = {"squeue": "41|COMPLETING|None|2026-12-03T07:41:24|1\n42|PREEMPTED|None|N/A|0\n",
            "sacct": ("41|PREEMPTED|2026-12-03T07:41:24|2026-12-03T07:41:28\n41|PENDING|Unknown|Unknown\n"
                      "42|PREEMPTED|2026-12-03T07:40:00|2026-12-03T07:40:30\n")}
    asked: list[tuple[str, ...]] = []

    def run(*argv: str) -> str:
        asked.append(argv)
        return said[argv[0]]

    b = SlurmBackend(tmp_path / "jobs", None, poll_s=0, run=run)
    got = b.status(["41", "42"])
    assert got["41"].state is JobState.PENDING and got["41"].requeues == 1 and got["41"].lost_s == 4.0
    # A job Slurm no longer holds (gone from squeue's live states) that accounting says was
    # PREEMPTED was not requeued: that is its end.
    assert got["42"].state is JobState.FAILED
    assert [a[:2] for a in asked].count(("sacct", "-D")) == 1
    said["squeue"] = "41|PENDING|BeginTime|2026-12-03T07:43:28|1\n"
    again = b.status(["41"])["41"]
    assert again.state is JobState.PENDING and again.reason is not None and again.reason.startswith("requeued by Slurm 1x")
    assert again.lost_s == 4.0 and [a[:2] for a in asked].count(("sacct", "-D")) == 1  # measured once


def test_requeues_wait_for_accounting_to_have_every_earlier_run() -> None:
    text = {"t": "5|PENDING|Unknown|Unknown\n"}
    r = Requeues(lambda *a: text["t"])
    r.note("5", 1)
    r.measure(["5"])
    assert r.count("5") == 1 and r.lost("5") is None  # slurmdbd has not the preempted run yet
    text["t"] = "5|PREEMPTED|2026-12-03T07:00:00|2026-12-03T07:01:40\n5|RUNNING|2026-12-03T07:03:40|Unknown\n"
    r.measure(["5"])
    assert r.lost("5") == 100.0
    assert "preempted on" in r.why("5", 1)
    text["t"] = "6|NODE_FAIL|2026-12-03T07:00:00|2026-12-03T07:01:00|c2\n6|PENDING|Unknown|Unknown|None assigned\n"
    r.note("6", 1)
    r.measure(["6"])  # a node that died under it is said so, naming the node (the private cluster)
    assert r.why("6", 1).startswith("requeued by Slurm 1x: the node it ran on (c2) failed (NODE_FAIL)")


def test_a_tightened_walltime_is_given_back_once_near_its_limit(tmp_path: Path) -> None:
    record = tmp_path / "77"
    record.write_text("600 3600")
    asked: list[tuple[str, ...]] = []
    extend(record, "77", time.time(), 10.0, lambda *a: asked.append(a) or "")
    assert asked == [] and record.exists()  # 10 minutes left: not yet
    extend(record, "77", time.time() - 500, 10.0, lambda *a: asked.append(a) or "")
    assert asked == [("scontrol", "update", "JobId=77", "TimeLimit=01:00:00")] and not record.exists()
    extend(record, "77", time.time() - 590, 10.0, lambda *a: asked.append(a) or "")
    assert len(asked) == 1  # asked once


def test_the_tier_is_used_only_where_slurm_preempts_its_qos() -> None:
    said = {"config": "PreemptType             = preempt/none\n", "qos": "normal\nagents\n"}
    asked: list[str] = []

    def run(*argv: str) -> str:
        asked.append(argv[0])
        return said["config"] if argv[0] == "scontrol" else said["qos"]

    from corral.lanes.slurm.tiers import Tiers

    conf = ["a"]
    tiers = Tiers("agents-opportunistic", run, lambda: conf[0])
    assert tiers.offered() is None and tiers.offered() is None and asked == ["scontrol"]  # once per slurm.conf
    said["config"] = "PreemptType             = preempt/qos\n"
    conf[0] = "b"
    assert tiers.offered() is None and asked[-1] == "sacctmgr"  # no such QOS yet
    said["qos"] += "agents-opportunistic\n"
    conf[0] = "c"
    assert tiers.offered() == "agents-opportunistic"
    assert Tiers("", run, lambda: "c").offered() is None  # turned off


def test_an_agent_over_mcp_sees_the_requeues_and_the_work_lost() -> None:
    from corral.edges.mcp.tools import compact

    job = {"id": 3, "name": None, "state": "COMPLETED", "exit_code": 0, "reason": None, "start_time": 10.0,
           "end_time": 40.0, "requeues": 1, "lost_s": 4.0}
    assert compact(job) == {"id": 3, "state": "COMPLETED", "exit_code": 0, "ran_s": 30.0, "requeues": 1, "lost_s": 4.0}
    assert "requeues" not in compact({**job, "requeues": 0, "lost_s": None})


@on_slurm
@SHARED_TURN
def test_opportunistic_jobs_queue_smallest_first(tmp_path: Path, agent_dir: Path) -> None:
    """Two of an agent's opportunistic jobs wait in Slurm (each after one still running):
    the smaller, sent second, has the higher priority, by its nice of core-minutes
    (decision 0023's order), and both keep people's precedence (agent_nice beneath)."""
    conf = slurm_conf()
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.5") as gw:
        bot = add_people(gw)["bot1"]
        with gw.http(bot) as h:
            first = h.post("/v1/jobs", json={"command": "sleep 120", "workdir": str(agent_dir)}).json()
            jobs = [h.post("/v1/jobs", json={"command": "true", "cpus": cpus, "walltime": walltime, "after_ok": [first["id"]],
                                             "workdir": str(agent_dir)}).json() for cpus, walltime in ((8, "50m"), (1, "5m"))]
            sent = [until("sent to Slurm", lambda j=j: h.get(f"/v1/jobs/{j['id']}").json()["backend_id"], 60)
                    for j in jobs]
            rows = {line.split()[0]: line.split()[1:] for line in
                    slurm(conf, "squeue", "-h", "-j", ",".join(sent), "-o", "%i %Q %y").splitlines()}
            (big_prio, big_nice), (small_prio, small_nice) = ((int(p), int(n)) for p, n in (rows[b] for b in sent))
            assert big_nice - small_nice == 8 * 50 - 1 * 5, rows  # core-minutes each
            assert small_nice > 100  # above agent_nice: people first, whatever the size
            assert small_prio > big_prio, rows  # Slurm's own order: the smaller first, though sent later
            h.post("/v1/jobs/cancel", json={"ids": [first["id"], *(j["id"] for j in jobs)]})
