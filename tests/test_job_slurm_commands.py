"""Slurm's commands inside an agent's contained job (issue 50 item 2, decision 0057), on
the private cluster (scripts/slurm-up: nodes c1..c4, each a namespace of its own): ``srun``
runs the step's tasks in the job's allocation, ``scontrol show job $SLURM_JOB_ID``,
``squeue --me`` and ``sacct -j`` answer about the job, on every node, through the job's
door to the gateway (corral's shims, the job's own read-only credential). Another
principal's jobs stay invisible; the job cannot submit, and its credential is worth
nothing once it has ended or for another job. Before: the job's PATH had Slurm's own
commands, which stalled 60 s on the hidden slurm.conf and failed; ``srun hostname`` ran
no task."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Gateway, free_port
from .slurm_env import layout
from .test_cluster_slurm import cluster_conf, quiet
from .test_shims import agent_run

pytestmark = pytest.mark.usefixtures("slurm_turn")

INSIDE = (
    "srun hostname; "
    'echo "SHOW=$(scontrol show job $SLURM_JOB_ID -o | tr " " "\\n" | grep -E "^(JobId|JobState)=" | tr "\\n" " ")"; '
    'echo "ME=$(squeue --me -h -o "%i %T" | tr "\\n" ",")"; '
    'echo "ACCT=$(sacct -X -n -P -j $SLURM_JOB_ID -o JobID,State)"; '
    'echo "OTHER=$(scontrol show job {other} 2>&1)"; '
    'echo "SUB=$(sbatch --wrap true 2>&1 | head -1)"; '
    'echo "WHERE=$(command -v squeue)"; echo "TOKEN=$CORRAL_TOKEN"; sleep 4')


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    """A Slurm gateway that the cluster's nodes reach on their bridge ([slurm] gateway_address)."""
    conf = quiet(cluster_conf())
    port = free_port()
    g = Gateway(tmp_path / "home", port, extra_env={
        "CORRAL_BACKEND": "slurm", "SLURM_CONF": conf, "CORRAL_TICK_S": "0.5", "CORRAL_HOST": "0.0.0.0",
        "CORRAL_INSECURE": "true", "CORRAL_SLURM__GATEWAY_ADDRESS": f"{layout(conf)['NET']}.254:{port}"})
    g.home.mkdir()
    g.start()
    try:
        yield g
    finally:
        g.kill(signal.SIGTERM)


def tokens(g: Gateway) -> tuple[str, str]:
    with g.http() as h:
        for name in ("bot", "eve"):
            assert h.post("/v1/principals", json={"name": name, "kind": "agent", "sponsor": "admin"}).status_code == 201
        return tuple(h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("bot", "eve"))


def test_slurms_commands_inside_a_job_answer_about_it_on_every_node(gw: Gateway, agent_dir: Path) -> None:
    bot, eve = tokens(gw)
    with gw.http(eve) as h:  # another principal's job, running while bot's jobs ask
        other = h.post("/v1/jobs", json={"command": "sleep 300", "walltime": "10m", "workdir": str(agent_dir)}).json()
        try:
            assert h.get(f"/v1/jobs/{other['id']}/wait", params={"timeout": 120, "until": "RUNNING"}).json()["state"] \
                == "RUNNING"
            asked_inside(gw, bot, other["id"], agent_dir)
        finally:
            h.post(f"/v1/jobs/{other['id']}/cancel")


def asked_inside(gw: Gateway, bot: str, other: int, agent_dir: Path) -> None:
    # four jobs of 6 CPUs at once: one on each node (c2..c4 have 8 CPUs, c1 32 and a higher weight)
    wrap = INSIDE.format(other=other).replace("'", "'\\''")
    script = (f"for i in 1 2 3 4; do sbatch --parsable -n2 -c3 -t 5 -o job$i.out --wrap '{wrap}' >> ids; done; "
              "for id in $(cat ids); do while squeue -h -j $id | grep -q .; do sleep 0.5; done; done; "
              "sacct -X -n -P -o JobID,State,Elapsed -j $(paste -sd, ids)")
    started = time.monotonic()
    r = agent_run(gw, bot, script, agent_dir, "--no-fence")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - started < 150, r.stdout  # no command stalled on Slurm's own timeout (60 s)
    ids = (agent_dir / "ids").read_text().split()
    states = {line.split("|")[0]: line.split("|")[1] for line in r.stdout.split()}
    assert states == {i: "COMPLETED" for i in ids}, r.stdout + r.stderr
    nodes = []
    for n, jid in enumerate(ids, 1):
        lines = (agent_dir / f"job{n}.out").read_text().splitlines()
        got = {k: v for k, v in (x.split("=", 1) for x in lines if "=" in x and x.split("=", 1)[0].isupper())}
        with gw.http() as h:
            node = h.get(f"/v1/jobs/{jid}").json()["node"]
        nodes.append(node)
        assert lines[:2] == [node, node], lines  # srun -n2 hostname: two tasks, in the job's allocation on its node
        assert got["SHOW"].split() == [f"JobId={jid}", "JobState=RUNNING"], got
        assert f"{jid} RUNNING," in got["ME"] and str(other) not in [x.split()[0] for x in got["ME"].split(",") if x]
        assert got["ACCT"] == f"{jid}|RUNNING", got
        assert got["OTHER"] == "slurm_load_jobs error: Invalid job id specified", got  # eve's: invisible
        assert "does not allow this submit" in got["SUB"], got  # read-only: no submission from inside
        assert got["WHERE"] == "/tmp/.corral-slurm/squeue", got
        token = got["TOKEN"]
        assert token.startswith("crj_")
        # ... worth nothing now its job has ended, nor for another job
        r2 = httpx.get(f"{gw.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r2.status_code == 401 and "has ended" in r2.text, r2.text
        forged = f"crj_{other}_{token.rsplit('_', 1)[1]}"
        r3 = httpx.get(f"{gw.url}/v1/jobs", headers={"Authorization": f"Bearer {forged}"}, timeout=30)
        assert r3.status_code == 401, r3.text
    assert sorted(nodes) == ["c1", "c2", "c3", "c4"], nodes
