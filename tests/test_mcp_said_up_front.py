"""Issue 49 item 6, what the agent is told up front, as the model reads it through the
SDK client: the server's instructions and submit_job's description say where a job runs
without `workdir` and that batch work may be preempted and requeued (with the signal and
grace, and how to ask for the guaranteed tier); and plan_job answers a request with several problems with all of them, and the
nearest request that fits, in one call."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from corral.core.signals import GRACE_S

from .conftest import SHARED_TURN, Gateway, running


def _agent(gateway: Gateway) -> str:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "claude", "kind": "agent", "sponsor": "alice"})
        return h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()["token"]


def _stdio(gateway: Gateway, token: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "corral.entry", "mcp"],
                                 env=gateway.env(token, CORRAL_SESSION="upfront-1"))


def test_a_plan_with_three_problems_is_answered_in_one_call(tmp_path: Path, agent_dir: Path) -> None:
    """24 h... here 60 h, 8 CPUs, 64 GB and a GPU on a 2-CPU, 4 GB machine without GPUs
    (the policy lets an agent ask 48 h at most): before, plan_job named the CPUs alone,
    then the memory, then the GPUs, then the walltime (one problem per round). Now one
    call names all four, and the nearest request, checked to pass the same checks."""
    with running(tmp_path, CORRAL_LOCAL_MEMORY_MB="4096", CORRAL_LOCAL_MAX_WALLTIME_S=str(72 * 3600)) as gw:
        token = _agent(gw)

        async def scenario() -> tuple[Any, Any]:
            async with Client(_stdio(gw, token)) as client:
                asked = {"command": "python train.py", "workdir": str(agent_dir), "walltime": "60h", "cpus": 8,
                         "memory": "64G", "gpus": 1}
                first = await client.call_tool("plan_job", asked)
                again = await client.call_tool("plan_job", {**asked, **first.structured_content["nearest"]})
                return first, again

        first, again = asyncio.run(scenario())
    plan, text = first.structured_content, first.content[0].text
    assert not first.is_error and plan["allowed"] is False
    assert plan["nearest"] == {"walltime": "48:00:00", "memory": "4G", "cpus": 2, "gpus": 0}, plan
    assert plan["nearest_allowed"] is True and len(plan["problems"]) == 2, plan["problems"]  # the lane's, the policy's
    for said in ("8 CPUs asked", "65536M of memory asked", "1 GPUs asked", "walltime 60h asked",
                 "Nearest request that fits: walltime=48:00:00, memory=4G, cpus=2, gpus=0"):
        assert said in text, (said, text)
    assert again.structured_content["allowed"] is True, again.structured_content  # the nearest one passes


def test_the_lanes_limits_are_said_at_once_in_the_partition_with_the_gpus() -> None:
    """Slurm's partitions (no Slurm asked): GPUs only in 'gpu', so the job goes there and
    its CPUs and walltime are judged there, all in one refusal with its nearest request."""
    from corral.core.errors import InvalidRequest
    from corral.core.jobs import JobSpec
    from corral.lanes.backend import Partition
    from corral.lanes.fits import refuse_misfits

    parts = [Partition("cpu", 64, 256000, 0, 3600, default=True), Partition("gpu", 32, 512000, 8, 86400)]
    with pytest.raises(InvalidRequest) as e:
        refuse_misfits(JobSpec(command="true", gpus=2, cpus=64, walltime="30h"), parts)
    assert e.value.nearest == {"partition": "gpu", "cpus": 32, "walltime_s": 86400}
    for said in ("use partition 'gpu'", "ask for cpus <= 32", "ask for walltime <= 24:00:00"):
        assert said in e.value.message, e.value.message


def test_the_model_is_told_where_a_job_runs_and_that_batch_work_may_be_requeued() -> None:
    """What the SDK client hands the model: the server's instructions and submit_job's
    description say the private /tmp without workdir and the requeue, plan_job's that a
    refusal lists every problem and the nearest request."""
    from corral.edges.mcp.server import build_mcp

    async def listed() -> tuple[str, dict[str, str]]:
        async with Client(build_mcp(lambda ctx: None, lambda: None)) as c:  # type: ignore[arg-type,return-value]
            tools = {t.name: t.description or "" for t in (await c.list_tools()).tools}
            return c.instructions or "", tools

    instructions, tools = asyncio.run(listed())
    for said in ("/tmp/corral-job", "workdir", "SIGUSR1", f"--signal=B:USR1@{GRACE_S}", f"{GRACE_S} s grace",
                 "from the start", "checkpoint", "tier='guaranteed'", "nearest request"):
        assert said in instructions, (said, instructions)
    assert "checkpoint as it goes" not in instructions  # the advice of before, with no signal to act on
    for said in ("/tmp/corral-job", "requeued", "SIGUSR1", f"grace of {GRACE_S} s", f"--signal=B:USR1@{GRACE_S}",
                 "`tier`='guaranteed'"):
        assert said in " ".join(tools["submit_job"].split()), (said, tools["submit_job"])
    assert "every problem at once" in tools["plan_job"] and "nearest" in tools["plan_job"]
    assert f"SIGUSR1 and {GRACE_S} s grace" in " ".join(tools["plan_job"].split()), tools["plan_job"]


def test_the_agent_run_banner_is_short_and_says_what_a_job_does(gateway: Gateway, tmp_path: Path,
                                                               agent_dir: Path) -> None:
    """`corral agent run`'s banner with 60 gateway homes recorded (as test gateways leave
    them): before, each was listed (thousands of characters, other checkouts' paths
    too); now their count, and where a job runs and that it may be requeued."""
    state = tmp_path / "state"
    (state / "corral" / "gateways").mkdir(parents=True)
    for i in range(60):
        home = tmp_path / f"some-gateway-home-{i}"
        home.mkdir()
        (state / "corral" / "gateways" / str(9000 + i)).write_text(str(home))
    token = _agent(gateway)
    cp = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "agent", "run", "--", "sh", "-c", "true"],
                        env={**gateway.env(token), "XDG_STATE_HOME": str(state)}, cwd=agent_dir,  # its identity may write there: no line on working elsewhere
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "some-gateway-home" not in cp.stderr and len(cp.stderr) < 700, (len(cp.stderr), cp.stderr)
    assert "62 corral gateway homes" in cp.stderr, cp.stderr  # the 60, the pointer directory, CORRAL_HOME
    for said in ("/tmp/corral-job", "workdir", "preemptible", "requeued", "from the start", "SIGUSR1",
                 f"--signal=B:USR1@{GRACE_S}", f"{GRACE_S} s grace", "tier=guaranteed"):
        assert said in cp.stderr, (said, cp.stderr)


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_the_issues_request_on_slurm_is_planned_in_one_call(tmp_path: Path) -> None:
    """The private Slurm (debug by default, 1 h; batch 48 h; every node has GPUs and
    64,000 MB): 30 h, 8 CPUs, 100 GB and a GPU. One plan names the memory and the
    walltime, its nearest request keeps the 30 h in partition batch (not the default's
    1 h: the agent asked for the time), and that request is allowed when asked as is."""
    from .slurm_env import slurm_conf
    from .test_gateway_slurm import start_slurm_gateway

    gw = start_slurm_gateway(tmp_path, slurm_conf())
    try:
        token = _agent(gw)
        asked = {"command": "python train.py", "walltime": "30h", "cpus": 8, "memory": "100G", "gpus": 1}
        with gw.http(token) as h:
            plan = h.post("/v1/plan", json=asked).json()
            again = h.post("/v1/plan", json={**asked, **(plan.get("nearest") or {})}).json()
    finally:
        gw.kill(signal.SIGTERM)
    said = " ".join(p["message"] for p in plan["problems"])
    for words in ("102400M of memory asked", "walltime 30:00:00 is over the limit", "or use partition 'batch'"):
        assert words in said, (words, plan)
    assert plan["nearest"] == {"memory": "64000M", "partition": "batch"}, plan
    assert plan["nearest_allowed"] is True and again["allowed"] is True, (plan, again)
