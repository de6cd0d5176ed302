"""A workspace forked once and used on two nodes of the private cluster (scripts/slurm-up;
docs/decisions/0036-workspaces-on-nodes.md), through a real gateway on the Slurm backend,
as an agent uses it: a job on c1 writes into the workspace, a job on another node reads
what it wrote and the gateway diffs and commits both. What a site must share, the
workspace's layers ([storage] workspaces), is the one directory both nodes see; what it
must not expect shared is asserted too: the overlay mount is the node's own (the gateway's
machine never sees it mounted), and a workspace runs one job at a time (refused by the
gateway, else stopped by the node's lock), never in the fast lane; a node that does not
see the layers is refused, saying what to share."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.storage import mounts

from .conftest import Gateway, running
from .test_cluster_slurm import cluster_conf, quiet, slurm, until

@pytest.fixture
def layers() -> Iterator[Path]:
    """[storage] workspaces: a directory every node sees (here, as at a site, one the
    gateway makes: it does not exist yet)."""
    d = Path("/var/tmp") / f"corral-wsnodes-{secrets.token_hex(4)}"
    yield d
    mounts.unmount_all(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gw(tmp_path: Path, layers: Path) -> Iterator[Gateway]:
    conf = quiet(cluster_conf())
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.5",
                 CORRAL_STORAGE__WORKSPACES=str(layers)) as g:
        yield g


@pytest.fixture
def project() -> Iterator[Path]:
    """The agent's project, which its jobs (an unprivileged identity) may write."""
    d = Path(tempfile.mkdtemp(prefix="corral-proj-", dir="/tmp"))
    (d / "README").write_text("calc\n")
    (d / "old.txt").write_text("to be removed\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(d)], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def agent(g: Gateway) -> str:
    with g.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
        return str(h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 64}).json()["token"])


def node_of(conf: str, backend_id: str) -> str:
    return slurm(conf, "sacct", "-X", "-n", "-P", "-j", backend_id, "-o", "NodeList").strip()


@pytest.mark.usefixtures("slurm_turn")
def test_a_workspace_written_on_one_node_is_read_on_another(gw: Gateway, project: Path, layers: Path) -> None:
    conf = cluster_conf()
    with gw.http(agent(gw)) as h:
        w = h.post("/v1/workspaces", json={"base": str(project)}).json()
        ws = w["workspace"]
        assert w["how"] == "on-node" and w["path"] == str(layers / "workspaces" / ws / "merged"), w
        # 9 CPUs: only c1 (32) holds it; the small nodes have 8
        first = h.post("/v1/jobs", json={
            "workspace": ws, "cpus": 9, "walltime": "5m",
            "command": "hostname > wrote-on; echo 42 > result.txt; mkdir sub; echo deep > sub/f; rm old.txt; "
                       "sleep 6"})
        assert first.status_code == 201, first.text
        a = first.json()["id"]
        until("the first job's writes in the shared layers",
              lambda: "result.txt" in h.get(f"/v1/workspaces/{ws}/diff").json()["added"], 90)
        # Mounted on its node only: the gateway's machine (this test's mount namespace, the
        # host's) sees a bare mount point, as a node that did not mount it would.
        merged = Path(w["path"])
        assert not mounts.mounted(merged) and os.listdir(merged) == [], os.listdir(merged)

        # One job of a workspace at a time, and never in the fast lane: both say what to do.
        again = h.post("/v1/jobs", json={"workspace": ws, "command": "cat result.txt"})
        assert again.status_code == 400 and str(a) in again.text and "after_any" in again.text, again.text
        fast = h.post("/v1/jobs", json={"workspace": ws, "command": "true", "lane": "fast"})
        assert fast.status_code == 400 and "batch" in fast.json()["error"]["message"], fast.text

        # After it, on a small node (Slurm weighs them first), in the same workspace.
        second = h.post("/v1/jobs", json={
            "workspace": ws, "cpus": 2, "walltime": "5m", "after_any": [a],
            "command": "hostname; cat wrote-on result.txt sub/f; test -e old.txt || echo old-gone; "
                       f"cat README; echo read > read-on-2; ls -A {layers}/workspaces {layers}/trees"})
        assert second.status_code == 201, second.text
        b = second.json()["id"]
        done = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json() for j in (a, b)]
        assert [d["state"] for d in done] == ["COMPLETED"] * 2, [
            (d["state"], d["exit_code"], d["reason"], h.get(f"/v1/jobs/{d['id']}/output", params={"stream": "stderr"})
             .json().get("data")) for d in done]
        out = h.get(f"/v1/jobs/{b}/output").json()["data"].split("\n")
        nodes = [node_of(conf, d["backend_id"]) for d in done]
        assert nodes[0] == "c1" and nodes[1] in {"c2", "c3", "c4"}, nodes
        assert out[:6] == [nodes[1], "c1", "42", "deep", "old-gone", "calc"], out
        # the sandbox hides the layers' directories, its own workspace bound back: no other's, no tree
        assert out[6:] == [f"{layers}/trees:", "", f"{layers}/workspaces:", ws, ""], out

        # Several at once in one submission: refused when they differ; a sweep (one spec
        # repeated) meets the node's lock: one runs, the other stops saying which holds it.
        both = h.post("/v1/jobs/batch", json={"jobs": [{"workspace": ws, "command": f"echo {i}"} for i in (1, 2)]})
        assert both.status_code == 400 and "at once" in both.text and "after_any" in both.text, both.text
        sweep = h.post("/v1/jobs/batch", json={"jobs": [{"workspace": ws, "cpus": 1, "walltime": "5m",
                                                         "command": "echo ran >> sweep.txt; sleep 10"}] * 2})
        assert sweep.status_code == 201, sweep.text
        ids = [j["id"] for j in sweep.json()["jobs"]]
        ended = {j: h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json()["state"] for j in ids}
        assert sorted(ended.values()) == ["COMPLETED", "FAILED"], ended
        ran, stopped = sorted(ids, key=lambda j: ended[j])
        said = h.get(f"/v1/jobs/{stopped}/output", params={"stream": "stderr"}).json()["data"]
        assert f"is in use by job {ran} (Slurm " in said and "after_any" in said, said

        diff = h.get(f"/v1/workspaces/{ws}/diff").json()
        assert sorted(diff["added"]) == ["read-on-2", "result.txt", "sub/f", "sweep.txt", "wrote-on"], diff
        assert diff["deleted"] == ["old.txt"], diff
        c = h.post(f"/v1/workspaces/{ws}/commit")
        assert c.status_code == 200, c.text
    assert (project / "result.txt").read_text() == "42\n" and not (project / "old.txt").exists()
    assert (project / "wrote-on").read_text() == "c1\n" and (project / "sub" / "f").read_text() == "deep\n"
    assert (project / "sweep.txt").read_text() == "ran\n"  # the stopped one never mounted it


def test_a_node_that_does_not_see_the_layers_is_refused_saying_what_to_share(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a node whose layers are node-local (a site's /var/tmp) runs before the job:
    it stops there, naming the setting, instead of running the job in an empty directory."""
    missing = tmp_path / "workspaces" / "ws-000000000000"
    assert mounts.main(["workspace", str(missing), str(tmp_path)]) == 1 and not missing.exists()
    assert "[storage] workspaces must be a directory the nodes share" in capsys.readouterr().err


HOLD = ("import fcntl, sys, time\n"
        "try:\n    f = open(sys.argv[1])\nexcept OSError as e:\n    print('refused', e.errno, flush=True); sys.exit()\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\nprint('holding', flush=True)\ntime.sleep(600)\n")
"""Another user of the nodes holding a workspace's lock: it needs only to open the file."""


@pytest.mark.usefixtures("slurm_turn")
def test_nobody_else_can_hold_a_workspaces_lock(gw: Gateway, project: Path, layers: Path) -> None:
    """The lock that keeps one job of a workspace at a time (the batch shell's flock) was
    made by root's shell with the default mode, 0644, in the workspace's 0711 directory on
    the layers every node shares; its path is the workspace's, which Slurm shows every user
    (a job's WorkDir). flock needs no more than an open file, so any user of any node (or
    a principal's uncontained job) could hold it and stop every job of that workspace:
    "in use". Now it is root's alone, 0600 (attack46)."""
    with gw.http(agent(gw)) as h:
        ws = h.post("/v1/workspaces", json={"base": str(project)}).json()["workspace"]
        first = h.post("/v1/jobs", json={"workspace": ws, "walltime": "5m", "command": "echo 1 > one"}).json()
        assert h.get(f"/v1/jobs/{first['id']}/wait", params={"timeout": 120}).json()["state"] == "COMPLETED"
        lock = layers / "workspaces" / ws / "lock"
        holder = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                   sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
        try:
            said = holder.stdout.readline().strip() if holder.stdout else ""
            second = h.post("/v1/jobs", json={"workspace": ws, "walltime": "5m", "after_any": [first["id"]],
                                              "command": "cat one"}).json()
            done = h.get(f"/v1/jobs/{second['id']}/wait", params={"timeout": 120}).json()
            err = h.get(f"/v1/jobs/{second['id']}/output", params={"stream": "stderr"}).json()["data"]
        finally:
            holder.kill()
            holder.wait()
        assert done["state"] == "COMPLETED", (said, done["state"], err)
        assert said == "refused 13" and stat.S_IMODE(os.stat(lock).st_mode) == 0o600, said
