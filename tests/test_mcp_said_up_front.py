"""Issue 49 item 6, what the agent is told up front, as the model reads it through the
SDK client: the server's instructions and submit_job's description say where a job runs
without `workdir` and that batch work may be preempted and requeued (with the signal and
grace); and plan_job answers a request with several problems with all of them, and the
nearest request that fits, in one call."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from .conftest import Gateway, running


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
    import pytest

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
