"""A job's ``signal`` (Slurm's --signal, decision 0058) on the local lane, and `corral submit`'s
--signal and --tier: a real gateway, its local lane, the CLI as a user runs it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from .conftest import Gateway, running

TRAP = """#!/bin/bash
trap 'echo noticed > "{out}"; exit 0' USR1
while true; do sleep 1; done
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for all: none of these disturbs the next (one each took 16 s to start)."""
    with running(tmp_path_factory.mktemp("notice")) as gw:
        yield gw


def test_a_local_job_is_sent_its_signal_before_its_walltime(gateway: Gateway, tmp_path: Path) -> None:
    """Asked USR1 30 s before a 40 s walltime: its trap runs ~10 s in, writes its file and the
    job completes (before: nothing was sent, killed TIMEOUT at 40 s)."""
    out = tmp_path / "noticed"
    job = gateway.cli_json("submit", "-t", "40s", "--signal", "USR1@30", "--workdir", str(tmp_path),
                           "--script", str(_script(tmp_path, TRAP.format(out=out))))
    assert job["spec"]["signal"] == "USR1@30"
    done = gateway.cli_json("wait", str(job["id"]), "--timeout", "120")
    assert done["state"] == "COMPLETED", done
    assert out.read_text() == "noticed\n"
    assert done["end_time"] - done["start_time"] < 38  # before its walltime, not at it


def test_an_agents_contained_job_is_sent_its_signal_in_its_sandbox(
        gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    """The same through an agent's built sandbox (corral/sandbox/host.py), over HTTP."""
    with gateway.http(people["bot1"]) as h:
        r = h.post("/v1/jobs", json={"command": "trap 'echo got-usr1; exit 0' USR1; while true; do sleep 0.1; done",
                                     "walltime": 40, "signal": "B:USR1@30", "workdir": str(agent_dir)})
        assert r.status_code in (200, 201), r.text
        jid = r.json()["id"]
        until = time.monotonic() + 120
        while (job := h.get(f"/v1/jobs/{jid}").json())["end_time"] is None and time.monotonic() < until:
            time.sleep(0.5)
        assert job["state"] == "COMPLETED", job
        assert h.get(f"/v1/jobs/{jid}/output").json()["data"] == "got-usr1\n"


def test_submit_refuses_a_bad_signal_with_exit_2_and_json(gateway: Gateway) -> None:
    cp = gateway.cli("--json", "submit", "--signal", "bad", "--", "true")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    err = json.loads(cp.stdout)["error"]
    assert err["code"] == "invalid_request" and "USR1@120" in err["message"]
    assert "Traceback" not in cp.stderr


def test_submit_tier_reaches_the_spec_and_is_checked(gateway: Gateway) -> None:
    """--tier as HTTP takes it: on the local lane (no tiers) recorded and never preempted."""
    job = gateway.cli_json("submit", "--tier", "guaranteed", "--", "true")
    assert job["spec"]["tier"] == "guaranteed"
    assert gateway.cli_json("wait", str(job["id"]))["state"] == "COMPLETED"
    cp = gateway.cli("--json", "submit", "--tier", "gold", "--", "true")
    assert cp.returncode == 2 and "tier" in json.loads(cp.stdout)["error"]["message"]


def test_the_fast_lane_refuses_a_signal_it_cannot_send(gateway: Gateway) -> None:
    cp = gateway.cli("--json", "submit", "--lane", "fast", "-t", "1m", "--signal", "USR1@10", "--", "true")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert "a fast-lane task is sent no signal" in json.loads(cp.stdout)["error"]["message"]


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(text)
    return path
