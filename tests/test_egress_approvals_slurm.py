"""A Slurm job's egress to a host off the allow-list, approved by its sponsor (issue 51
item 3, decision 0067), on the private cluster: the job reaches the proxy through its
node's relay and the TCP front, names itself there by its own credential as on the
local lane, is refused meanwhile saying who must answer, and once approved reaches the
host (a real HTTP server on this machine's address on the nodes' bridge); another job
of the same agent, on whichever node, stays refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.safety.policy import DEFAULT_POLICY

from .conftest import add_people, file_server, free_port, running
from .slurm_env import layout
from .test_approvals import asked
from .test_cluster_slurm import cluster_conf
from .test_egress_approvals import ASK, ended, output, submit, told
from .test_notify import NOTIFY, hook, until

pytestmark = pytest.mark.usefixtures("slurm_turn")


def test_on_slurm_an_approved_egress_reaches_its_host_through_the_nodes_relay(tmp_path: Path, agent_dir: Path) -> None:
    conf = cluster_conf()
    bridge = f"{layout(conf)['NET']}.254"  # this host on the nodes' bridge (scripts/slurm-up)
    policy = tmp_path / "policy.cedar"
    policy.write_text(DEFAULT_POLICY.read_text() + ASK)
    with hook() as h, file_server(tmp_path / "dest", bridge, "from-the-approved-host") as port, \
            running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.5",
                    CORRAL_SANDBOX__ALLOW_HOSTS=f'["{bridge}:1"]',
                    CORRAL_SANDBOX__EGRESS_LISTEN=f"{bridge}:{free_port()}",
                    CORRAL_SAFETY__POLICY_FILE=str(policy), **NOTIFY) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        url = f"http://{bridge}:{port}/ok.txt"
        first = submit(gw, t["bot1"], agent_dir / "a", url, "150")
        aid, _ = asked(h)
        said = until(lambda: "waiting for approval" in (o := output(gw, t["bot1"], first)) and o, within=90)
        assert f"approval #{aid} by alice until" in said, said
        assert until(lambda: [x for x in told(gw, t["bot1"]) if f"#{aid} by alice" in x and f"job {first}" in x])
        gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        state, out = ended(gw, t["bot1"], first)
        assert state == "COMPLETED" and "GOT from-the-approved-host" in out, (state, out)
        other = submit(gw, t["bot1"], agent_dir / "b", url, "5")
        state, out = ended(gw, t["bot1"], other)
        assert "GOT" not in out and "waiting for approval" in out, out
