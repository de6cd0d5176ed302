"""The second fence, inside Slurm: `corral slurm plugin`'s job_submit.lua installed on
the private Slurm (scripts/slurm-up --job-submit). An agent's user, or anyone charging
an agent account, is refused at sbatch with the plugin's message; the same user's job
sent by corral's gateway is accepted; other people are untouched."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .slurm_env import slurm_conf
from .test_gateway_slurm import start_slurm_gateway

ROOT = Path(__file__).resolve().parent.parent
AGENT_USER = "corral-alice"
PERSON = "corral-carol"

pytestmark = pytest.mark.usefixtures("slurm_turn")


def _user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", name], check=True)


def _sbatch_as(user: str, conf: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["su", user, "-c", " ".join(["cd /tmp && SLURM_CONF=" + conf, "sbatch", "-o", "/dev/null",
                                                       *args, "--wrap", "true"])],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def plugin(tmp_path: Path):
    conf = slurm_conf()
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            raise AssertionError("the plugin test needs root (useradd, su, slurm-up)")
        pytest.skip("needs root")
    for u in (AGENT_USER, PERSON):
        _user(u)
    lua = tmp_path / "job_submit.lua"
    r = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "slurm", "plugin", "--agent-user", AGENT_USER,
                        "--agent-account", "agents", "--out", str(lua)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "SLURM_CONF": conf}
    r = subprocess.run([str(ROOT / "scripts" / "slurm-up"), "--job-submit", str(lua)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        yield conf
    finally:
        subprocess.run([str(ROOT / "scripts" / "slurm-up"), "--no-job-submit"], env=env, capture_output=True,
                       timeout=120, check=True)


def test_agents_reach_slurm_through_corral_only(plugin: str) -> None:
    conf = plugin
    refused = _sbatch_as(AGENT_USER, conf)
    assert refused.returncode != 0 and "belongs to a coding agent: submit through corral" in refused.stderr
    charged = _sbatch_as(PERSON, conf, "-A", "agents")
    assert charged.returncode != 0 and "submit through corral" in charged.stderr
    fine = _sbatch_as(PERSON, conf)
    assert fine.returncode == 0 and "Submitted batch job" in fine.stdout
    # the agent user's job, sent by corral's gateway (sbatch --uid, from corral's own uid)
    home = Path(tempfile.mkdtemp(prefix="corral-plugin-"))
    home.chmod(0o755)
    gw = start_slurm_gateway(home, conf)
    try:
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "alice", "kind": "human",
                                                  "unix_user": AGENT_USER}).status_code == 201
            token = h.post("/v1/tokens", json={"for": "alice", "expires": "1h"}).json()["token"]
        with gw.http(token) as h:
            job = h.post("/v1/jobs", json={"command": "id -un"}).json()
            done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 90}).json()
            assert done["state"] == "COMPLETED", done
            assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == f"{AGENT_USER}\n"
    finally:
        gw.kill(signal.SIGTERM)


@pytest.mark.slurm_turn("none")  # a rule of the CLI, in-process: Slurm is not asked
def test_the_plugin_refuses_to_be_written_without_agents() -> None:
    from click.testing import CliRunner

    from corral.edges.cli.main import cli

    r = CliRunner().invoke(cli, ["slurm", "plugin"])
    assert r.exit_code == 2 and "name the agents' users or accounts" in r.stderr
    r = CliRunner().invoke(cli, ["slurm", "plugin", "--agent-user", "no-such-user-x"])
    assert r.exit_code == 2 and "no Unix user 'no-such-user-x'" in r.stderr
