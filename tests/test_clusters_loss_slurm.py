"""Issue 52 item 2 on the two private Slurm instances: the preemptible tier's expected
loss, measured from a real preemption in cluster one's slurmdbd, in plan_job's cost and
in where `cluster: auto` puts an agent's job; and a request no cluster takes, refused with
every cluster's reasons and the nearest request that fits each, over HTTP, the CLI and MCP
(decision 0064)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from .conftest import Gateway
from .test_clusters_slurm import both_turns, people, slurm, two_cluster_gateway, until

pytestmark = pytest.mark.slurm_turn("none")  # both instances' turns, taken below

OPPORTUNISTIC = "agents-opportunistic"  # scripts/slurm-up's preemptible QOS (decision 0022)


def preempt(conf: str) -> str:
    """A run of the opportunistic QOS that a person's job preempts: told (URG, decision
    0058), it requeues itself within its grace, which sacct records as REQUEUED."""
    job = slurm(conf, "sbatch", "--parsable", "-p", "debug", "-w", "c2", "-c", "8", f"--qos={OPPORTUNISTIC}",
                "--requeue", "--signal=B:URG@120", "-t", "10", "-o", "/dev/null", "--wrap",
                "trap 'scontrol requeue $SLURM_JOB_ID; exit 0' URG; sleep 600 & wait", user=65534).strip()
    until("the opportunistic job to run", lambda: slurm(conf, "squeue", "-h", "-j", job, "-o", "%T").strip()
          == "RUNNING", 120)
    # History enough (the gateway's preemption_min_hours, 1.08 s) before it is preempted:
    # a run preempted in its first second left one's rate unmeasured ('none').
    until("the opportunistic job to have run 3 s", lambda: _ran_s(conf, job) >= 3, 60)
    person = slurm(conf, "sbatch", "--parsable", "-p", "debug", "-w", "c2", "-c", "8", "-t", "1", "-o", "/dev/null",
                   "--wrap", "sleep 1", user=65534).strip()
    until("slurmdbd to record the preemption", lambda: "REQUEUED" in slurm(
        conf, "sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", "State"), 120)
    slurm(conf, "scancel", job, person)
    return job


def _ran_s(conf: str, job: str) -> int:
    """Seconds the job has run, by Slurm's clock (squeue's %M: [D-][H:]M:SS)."""
    used = slurm(conf, "squeue", "-h", "-j", job, "-o", "%M").strip().replace("-", ":")
    parts = [int(p) for p in used.split(":") if p.isdigit()]
    return sum(v * m for v, m in zip(reversed(parts), (1, 60, 3600, 86400)))


def gateway(root: Path, one: str, two: str) -> contextlib.AbstractContextManager[Gateway]:
    """Two clusters, cheapest first; one charges less per CPU-hour than two. The window
    is the last 10 minutes (the preemption just made is in it; so may other tests' be, on
    either cluster: see below), and a second of runs is history enough."""
    return two_cluster_gateway(root, one, two, settings=(
        'placement = "cheapest"\npoll_s = 2\npreemption_window_s = 600\npreemption_min_hours = 0.0003\n'
        '[slurm.charge]\none = {cpu_hour = 1.0}\ntwo = {cpu_hour = 1.5}\n'))


def test_a_clusters_preemptions_cost_its_expected_loss_and_a_refusal_names_each_clusters_nearest(
        tmp_path: Path, agent_dir: Path) -> None:
    from mcp import Client

    from .test_mcp_said_up_front import _stdio

    with both_turns() as (one, two):
        preempt(one)
        with gateway(tmp_path, one, two) as gw:
            tok = people(gw)
            body = {"command": "true", "cpus": 2, "walltime": "24h", "partition": "batch", "workdir": str(agent_dir)}
            with gw.http(tok["bot1"]) as h:
                plan = h.post("/v1/plan", json=body).json()
                ranked = {c["cluster"]: c for c in plan["clusters"] if c["partition"] == "batch"}
                a, b = ranked["one"], ranked["two"]
                assert a["sus"] == pytest.approx(48.0) and b["sus"] == pytest.approx(72.0), plan  # one is cheaper...
                seen = a["preemption"]
                assert a["tier"] == "opportunistic" and seen["source"] == "measured" and seen["preempted"] >= 1, a
                rate = seen["preempted"] / seen["hours"]
                assert seen["per_hour"] == pytest.approx(rate, rel=1e-3), seen
                x = min(rate * 24, 20.0)
                assert a["expected_loss_sus"] == pytest.approx(48.0 * (math.expm1(x) / x - 1), rel=1e-3), a
                assert a["cost_sus"] == pytest.approx(a["sus"] + a["expected_loss_sus"], rel=1e-4)
                assert b["cost_sus"] == pytest.approx(b["sus"] + b["expected_loss_sus"], rel=1e-4)
                # A preemption another test made on two in the window counts there too: then the
                # cheaper in cost must win all the same (the window cannot be cut to this test's
                # own time: slurmdbd's runs and hours are clipped to it, and a loaded runner's
                # slow start then left one's history under the minimum).
                winner = "two" if b["preemption"]["preempted"] == 0 else min((a, b), key=lambda o: o["cost_sus"])["cluster"]
                if winner == "two":
                    assert b["cost_sus"] < a["cost_sus"], (a, b)  # ...until its preemptions are counted
                assert plan["allowed"] and plan["cluster"] == winner, plan
                job = h.post("/v1/jobs", json=body).json()
                assert h.get(f"/v1/jobs/{job['id']}").json()["cluster"] == winner
                h.post(f"/v1/jobs/{job['id']}/cancel")
            shown = gw.cli("plan", "-p", "batch", "-t", "24h", "--cpus", "2", "--", "true", token=tok["bot1"]).stdout
            assert "one/batch: starts in" in shown and "expected lost to preemption" in shown, shown

            # 40 CPUs for 2 h: no node has 40 CPUs, and debug (the default) runs 1 h at most.
            big = {"command": "true", "cpus": 40, "walltime": "2h", "workdir": str(agent_dir)}
            fix = "(fits there: cpus=32, partition=batch)"
            with gw.http(tok["bot1"]) as h:
                plan = h.post("/v1/plan", json=big).json()
                said = plan["refused"]["message"]
                for c in ("one", "two"):
                    assert (f"cluster {c} partition debug: 40 CPUs asked, its largest node has 32, walltime "
                            f"02:00:00 over its limit 01:00:00 {fix}") in said, said
                assert plan["nearest"] == {"cpus": 32, "partition": "batch", "cluster": "one"}, plan
                assert plan["nearest_allowed"] is True, plan  # checked in the same call
                r = h.post("/v1/jobs", json=big)
                assert r.status_code == 400 and fix in r.json()["error"]["message"], r.text
                assert [c["nearest"] for c in r.json()["error"]["clusters"]] == [
                    {"cluster": c, "cpus": 32, "partition": "batch"} for c in ("one", "two")], r.text
            cp = gw.cli("--json", "submit", "--cpus", "40", "-t", "2h", "--", "true", token=tok["bot1"])
            assert cp.returncode == 2 and fix in json.loads(cp.stdout)["error"]["message"], (cp.stdout, cp.stderr)

            async def mcp() -> Any:
                async with Client(_stdio(gw, tok["bot1"])) as client:
                    return await client.call_tool("submit_job", big)

            told = asyncio.run(mcp())
            assert told.is_error and fix in told.content[0].text and "cluster two" in told.content[0].text, told
