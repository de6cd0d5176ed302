"""What only happens on a cluster, on the private one of scripts/slurm-up (nodes c1..c4,
each a slurmd in a network and UTS namespace of its own; controllers ctl1 and backup
ctl2; docs/decisions/0032-private-cluster.md), through a real gateway on the Slurm
backend: jobs spread over nodes; an agent's jobs contained on each node; a node that dies under its jobs (Slurm requeues one
and ends the other NODE_FAIL, and the agent is told which); the primary controller
killed (the backup takes over, and the gateway keeps answering and sends again); the
egress proxy reached from every node through the node's own relay; a fast-lane pool
whose allocations run on two nodes at once."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Gateway, file_server, free_port, running
from .slurm_env import kill_host, layout, restore, slurm_conf, start_requeued_now
from .test_gateway_slurm import start_slurm_gateway

pytestmark = pytest.mark.usefixtures("slurm_turn")


def cluster_conf() -> str:
    """The private Slurm, which must be the cluster layout (fails under CI, else skips)."""
    conf = slurm_conf()
    if layout(conf)["LAYOUT"] != "cluster":
        why = (f"the private Slurm at {conf} is the single-node layout of an older scripts/slurm-up: "
               "scripts/slurm-down, then scripts/slurm-up, makes the cluster")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return conf


def slurm(conf: str, *argv: str) -> str:
    return subprocess.run(argv, env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                          check=True, timeout=30).stdout


def until(what: str, check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")


def quiet(conf: str) -> str:
    """The cluster once no node has a CPU allocated: a test whose jobs must spread over
    nodes would otherwise find the light ones still held by the last test's jobs, which
    Slurm is still completing after corral recorded their ends (seen in CI: all on c1)."""
    def idle() -> bool:
        return all(int(line.split("/")[0]) == 0 for line in slurm(conf, "sinfo", "-h", "-N", "-o", "%C").split())

    # Up to minutes: after a controller's failover and handback the last test's jobs can
    # stay COMPLETING on their nodes until those report again (seen once at 90 s, under load).
    until("every node of the cluster free (the jobs of the test before ended in Slurm)", idle, 240)
    return conf


@pytest.fixture
def cluster() -> str:
    return quiet(cluster_conf())


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    conf = quiet(cluster_conf())
    g = start_slurm_gateway(tmp_path, conf)
    try:
        yield g
    finally:
        g.kill(signal.SIGTERM)


def job(g: Gateway, job_id: int) -> dict[str, Any]:
    with g.http() as h:
        r = h.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


def test_jobs_spread_over_nodes(gw: Gateway, agent_dir: Path) -> None:
    """Six 4-CPU jobs: more than one node holds (the small nodes have 8 CPUs), so Slurm
    places them on several; each ran where accounting says, under that node's hostname."""
    conf = slurm_conf()
    with gw.http() as h:
        ids = [h.post("/v1/jobs", json={"command": "hostname; sleep 3", "cpus": 4, "walltime": "5m",
                                        "workdir": str(agent_dir)}).json()["id"] for _ in range(6)]
        done = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json() for j in ids]
        assert [d["state"] for d in done] == ["COMPLETED"] * 6, done
        ran_on = [h.get(f"/v1/jobs/{j}/output").json()["data"].strip() for j in ids]
    nodes = [slurm(conf, "sacct", "-X", "-n", "-P", "-j", d["backend_id"], "-o", "NodeList").strip() for d in done]
    assert ran_on == nodes, (ran_on, nodes)  # the job's own hostname is its node's
    assert len(set(nodes)) >= 3 and set(nodes) <= {"c1", "c2", "c3", "c4"}, nodes
    assert [d["node"] for d in done] == nodes  # the job's record names Slurm's node
    # ... and so do Slurm's commands as an agent types them (the shims), each job its own node
    shim = subprocess.run([sys.executable, "-m", "corral.edges.shims", "sacct", "-X", "-n", "-P", "-o", "JobID,NodeList",
                           "-j", ",".join(str(j) for j in ids)], env=gw.env(gw.admin_token), capture_output=True,
                          text=True, timeout=60)
    assert shim.returncode == 0, shim.stderr
    assert dict(line.split("|") for line in shim.stdout.split()) == {str(j): n for j, n in zip(ids, nodes)}, shim.stdout


def node_state(conf: str, node: str) -> str:
    kv = dict(t.split("=", 1) for t in slurm(conf, "scontrol", "show", "node", node, "-o").split() if "=" in t)
    return kv["State"]


def test_a_node_dies_under_its_jobs(gw: Gateway, agent_dir: Path) -> None:
    """Every process of the node the jobs run on is killed (slurmd, slurmstepd, the
    tasks): Slurm marks the node DOWN; the job it may requeue (its default) waits to run
    again, the one it may not ends NODE_FAIL; corral tells the agent which, naming the
    node, and gives the failed one no exit code of its own."""
    conf = slurm_conf()
    work = "echo begin; sleep 300; echo finished"
    try:
        with gw.http() as h:
            ids = [h.post("/v1/jobs", json={"command": work, "cpus": 4, "walltime": "10m",
                                            "workdir": str(agent_dir)}).json()["id"] for _ in range(2)]
            running = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120, "until": "RUNNING"}).json() for j in ids]
        assert [r["state"] for r in running] == ["RUNNING"] * 2, running
        again, once = (r["backend_id"] for r in running)
        slurm(conf, "scontrol", "update", f"JobId={once}", "Requeue=0")
        nodes = {b: slurm(conf, "squeue", "-h", "-j", b, "-o", "%N").strip() for b in (again, once)}
        for node in set(nodes.values()):
            assert kill_host(conf, node), f"nothing ran on {node}"
        for node in set(nodes.values()):  # SlurmdTimeout=15 s, pings every 5 s
            until(f"Slurm to mark {node} down", lambda n=node: "DOWN" in node_state(conf, n), 90)

        requeued = until("the requeued job's report", lambda: (j := job(gw, ids[0]))["requeues"] >= 1
                         and "NODE_FAIL" in (j["reason"] or "") and j, 90)
        assert requeued["state"] in ("PENDING", "RUNNING"), requeued  # one live job still, same Slurm id
        assert requeued["backend_id"] == again and nodes[again] in requeued["reason"], requeued
        assert "preempted" not in requeued["reason"], requeued
        rows = slurm(conf, "sacct", "-D", "-X", "-n", "-P", "-j", again, "-o", "State").split()
        assert rows[0] == "NODE_FAIL", rows

        with gw.http() as h:
            failed = h.get(f"/v1/jobs/{ids[1]}/wait", params={"timeout": 90}).json()
        assert failed["state"] == "FAILED" and failed["exit_code"] is None, failed
        assert "NODE_FAIL" in failed["reason"] and nodes[once] in failed["reason"], failed
        assert slurm(conf, "sacct", "-X", "-n", "-P", "-j", once, "-o", "State").strip() == "NODE_FAIL"
        with gw.http() as h:
            assert h.get(f"/v1/jobs/{ids[1]}/output").json()["data"].startswith("begin"), "its output is kept"
            h.post(f"/v1/jobs/{ids[0]}/cancel")
    finally:
        restore(conf)  # the node's slurmd again: ReturnToService=2 brings it back
    for node in set(nodes.values()):
        until(f"{node} back in service", lambda n=node: "DOWN" not in node_state(conf, n), 60)


def test_the_primary_controller_dies(gw: Gateway, agent_dir: Path) -> None:
    """ctl1 killed outright: the gateway keeps answering from its own view, takes work
    while no controller answers, and sends it once the backup ctl2 has taken over
    (SlurmctldTimeout=10 s); then the primary is started again."""
    conf = slurm_conf()
    with gw.http() as h:
        first = h.post("/v1/jobs", json={"command": "echo one", "workdir": str(agent_dir)}).json()
        assert h.get(f"/v1/jobs/{first['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
        try:
            assert kill_host(conf, "ctl1")
            assert h.get(f"/v1/jobs/{first['id']}").json()["state"] == "COMPLETED"  # its own view
            late = h.post("/v1/jobs", json={"command": "echo two", "workdir": str(agent_dir)})
            assert late.status_code == 201, late.text
            done = until("the job taken while no controller answered to end", lambda: (  # the client's 60 s a call
                d := h.get(f"/v1/jobs/{late.json()['id']}/wait", params={"timeout": 50}).json())["state"]
                in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and d, 180)
            assert done["state"] == "COMPLETED", done
            assert h.get(f"/v1/jobs/{done['id']}/output").json()["data"] == "two\n"
            ping = slurm(conf, "scontrol", "ping")
            assert "primary) at ctl1 is DOWN" in ping and "backup) at ctl2 is UP" in ping, ping
            third = h.post("/v1/jobs", json={"command": "echo three", "workdir": str(agent_dir)}).json()
            assert h.get(f"/v1/jobs/{third['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
            assert h.get("/v1/jobs").status_code == 200
        finally:
            restore(conf)
    ping = until("the primary in control again", lambda: "primary) at ctl1 is UP" in (p := slurm(conf, "scontrol", "ping"))
                 and p, 60)
    assert "ctl1 is UP" in ping


def test_an_agents_jobs_are_contained_on_every_node(gw: Gateway, agent_dir: Path) -> None:
    """An agent's jobs, spread over the nodes, each run in the sandbox on its node: never
    root, no network beyond its loopback, root's home and munge's key emptied (the sandbox
    is built where the job runs, by the batch script, not where the gateway is)."""
    conf = slurm_conf()
    with gw.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
        token = h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 64}).json()["token"]
    # /proc/net/dev is the caller's own network namespace (/sys/class/net is the host's sysfs)
    probe = ("hostname; id -u; awk -F: 'NR > 2 {print $1}' /proc/net/dev | tr -d ' ' | tr '\\n' ' '; echo; "
             "ls -A /root | wc -l; "
             "ls -A /etc/munge 2>/dev/null | wc -l; sleep 3")
    with gw.http(token) as h:
        posted = [h.post("/v1/jobs", json={"command": probe, "cpus": 4, "walltime": "5m", "workdir": str(agent_dir)})
                  for _ in range(6)]
        assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
        ids = [r.json()["id"] for r in posted]
        done = [h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json() for j in ids]
        assert [d["state"] for d in done] == ["COMPLETED"] * 6, done
        seen = [h.get(f"/v1/jobs/{j}/output").json()["data"].split("\n") for j in ids]
    nodes = [slurm(conf, "sacct", "-X", "-n", "-P", "-j", d["backend_id"], "-o", "NodeList").strip() for d in done]
    assert len(set(nodes)) >= 3, nodes
    for node, (host, uid, nets, root_files, munge_files, *_) in zip(nodes, seen):
        assert host == node and uid != "0", (node, host, uid)
        assert nets.split() == ["lo"], (node, nets)
        assert root_files == "0" and munge_files == "0", (node, root_files, munge_files)


@contextlib.contextmanager
def egress_gateway(tmp_path: Path, conf: str, bridge: str, allowed: int) -> Iterator[tuple[Gateway, str]]:
    """A Slurm gateway whose proxy listens on the nodes' bridge and allows ``allowed`` there,
    and a token of an agent, bot, of alice's. -> (gateway, token)."""
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=conf, CORRAL_TICK_S="0.5",
                 CORRAL_SANDBOX__ALLOW_HOSTS=f'["{bridge}:{allowed}"]',
                 CORRAL_SANDBOX__EGRESS_LISTEN=f"{bridge}:{free_port()}") as g:
        with g.http() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 64}).json()["token"]
        yield g, token


def test_egress_works_on_every_node_through_its_own_relay(tmp_path: Path, agent_dir: Path) -> None:
    """[sandbox] allow_hosts with egress_listen: an agent's jobs on several nodes each reach
    the allowed host through the proxy and are refused any other, by the proxy's own words;
    the socket each job's sandbox holds is its node's relay, not the gateway's Unix socket
    (which on a real cluster connects on the gateway's machine alone)."""
    conf = quiet(cluster_conf())
    bridge = f"{layout(conf)['NET']}.254"  # this host on the nodes' bridge (scripts/slurm-up)
    # A batch job's relay directory is mktemp's, 12 letters after the dot (a fast-lane
    # worker's, which another test may have meanwhile, is tempfile's 8): seen in a CI run.
    before = set(Path("/tmp").glob("corral-egress." + "?" * 12))
    with file_server(tmp_path / "allowed", bridge, "from-the-mirror") as aport, \
            file_server(tmp_path / "other", bridge, "should-never-arrive") as oport, \
            egress_gateway(tmp_path, conf, bridge, aport) as (g, token):
        probe = (f"hostname; stat -L -c %i /tmp/corral-egress.sock; curl -s -m 20 http://{bridge}:{aport}/ok.txt; echo; "
                 # (curl to a host off the list is refused at submit as exfiltration: asked another way)
                 f"python3 -c \"import urllib.request as u, urllib.error as e\ntry: u.urlopen('http://{bridge}:{oport}/ok.txt', "
                 "timeout=20)\nexcept e.HTTPError as x: print(x.code, x.read().decode().strip())\"; "
                 f"python3 -c \"import socket; socket.create_connection(('{bridge}', {aport}), 3)\" 2>/dev/null "
                 "|| echo direct-refused; sleep 2")
        with g.http(token) as h:
            posted = [h.post("/v1/jobs", json={"command": probe, "cpus": 4, "walltime": "5m",
                                               "workdir": str(agent_dir)}) for _ in range(6)]
            assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
            done = [h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 120}).json() for r in posted]
            seen = [h.get(f"/v1/jobs/{d['id']}/output").json()["data"].split("\n") for d in done]
        assert [d["state"] for d in done] == ["COMPLETED"] * 6, [(d["state"], d["reason"]) for d in done]
        gateways = os.stat(g.home / "egress" / "proxy.sock").st_ino
        nodes = [slurm(conf, "sacct", "-X", "-n", "-P", "-j", d["backend_id"], "-o", "NodeList").strip() for d in done]
        assert len(set(nodes)) >= 3, nodes
        for node, (host, inode, got, refused, direct, *_) in zip(nodes, seen):
            assert host == node, (node, host)
            assert inode.isdigit() and int(inode) != gateways, (node, inode)  # the node's relay, not ours
            assert got == "from-the-mirror", (node, got)
            assert "not on this facility's egress allow-list" in refused, (node, refused)
            assert direct == "direct-refused", (node, direct)
        assert set(Path("/tmp").glob("corral-egress." + "?" * 12)) <= before  # each relay stopped, its directory gone
        # A job cancelled while it runs (Slurm's SIGTERM, as at its walltime) leaves its
        # node's /tmp as it found it too (each such job left its relay's directory).
        with g.http(token) as h:
            job = h.post("/v1/jobs", json={"command": "touch started; sleep 120", "walltime": "5m",
                                           "workdir": str(agent_dir)}).json()
            deadline = time.monotonic() + 60
            while not (agent_dir / "started").exists():
                assert time.monotonic() < deadline, h.get(f"/v1/jobs/{job['id']}").json()
                time.sleep(0.2)
            assert set(Path("/tmp").glob("corral-egress." + "?" * 12)) - before  # its relay's, while it runs
            assert h.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
            assert h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
        deadline = time.monotonic() + 20
        while set(Path("/tmp").glob("corral-egress." + "?" * 12)) - before:
            assert time.monotonic() < deadline, set(Path("/tmp").glob("corral-egress." + "?" * 12)) - before
            time.sleep(0.2)


def test_a_requeued_job_makes_its_relay_afresh(tmp_path: Path, agent_dir: Path) -> None:
    """A run that Slurm ends (a requeue, a preemption, a node's end) dies before its
    script's cleanup, leaving its relay's directory on the node; its name was in the
    script, the same for every run, and in the relay's command line, which every user of
    the node reads in /proc. The run after a requeue stopped there ("cannot make"), and
    anyone who had read the name could stop every later run on any node by making it
    first. Now each run makes a directory of its own, named when it runs (attack46)."""
    conf = quiet(cluster_conf())
    bridge = f"{layout(conf)['NET']}.254"
    with file_server(tmp_path / "allowed", bridge, "from-the-mirror") as aport, \
            egress_gateway(tmp_path, conf, bridge, aport) as (g, token):
        with g.http(token) as h:
            r = h.post("/v1/jobs", json={"workdir": str(agent_dir), "walltime": "5m", "command":
                       f"if [ -e once ]; then curl -s -m 20 http://{bridge}:{aport}/ok.txt; else touch once; sleep 300; fi"})
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            until("the first run", lambda: (agent_dir / "once").exists(), 90)
            backend_id = h.get(f"/v1/jobs/{job_id}").json()["backend_id"]
            slurm(conf, "scontrol", "requeue", backend_id)
            until("the job requeued", lambda: h.get(f"/v1/jobs/{job_id}").json()["requeues"] >= 1, 90)
            # Another user of the nodes, who read the relay's name off the first run, makes it
            # first (where that run's cleanup removed its own, as a signal may let it).
            script = next((g.home / "slurm" / "jobs").glob("*/job.sh")).read_text()
            taken = sorted(set(re.findall(r"/tmp/corral-egress\.[0-9a-zA-Z]+", script)))
            for name in taken:
                subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "mkdir", "-p", name],
                               check=False)
            with contextlib.suppress(subprocess.CalledProcessError):  # Slurm holds a requeued job ~2 min
                start_requeued_now(conf, backend_id)
            done = h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 180}).json()
            err = h.get(f"/v1/jobs/{job_id}/output", params={"stream": "stderr"}).json()["data"]
            out = h.get(f"/v1/jobs/{job_id}/output").json()["data"]
        for name in taken:
            subprocess.run(["rm", "-rf", name], check=False)
        assert done["state"] == "COMPLETED" and out.endswith("from-the-mirror"), (done, out, err)


def open_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on at an address other hosts can reach (not
    loopback), read in its own network namespace (/proc/PID/net: a node's, for a worker)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state, inode = line.split()[1], line.split()[3], line.split()[9]
            raw, port = local.split(":")
            # the address as the kernel prints it: each 32-bit word in host (little-endian) order
            packed = b"".join(bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8))
            if state == "0A" and inode in inodes and not ipaddress.ip_address(packed).is_loopback:
                ports.add(int(port, 16))
    return ports


def fast_workers(home: Path) -> list[int]:
    """The pids of the fast-lane workers of the gateway whose home is ``home``."""
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if d.name.isdigit() and b"corral.lanes.fast.worker" in argv and str(home).encode() in b" ".join(argv):
                out.append(int(d.name))
    return out


def started_on(d: Path, n: int) -> dict[int, str]:
    """Task index -> the node its `started-<i>` says it started on, for those written."""
    out = {}
    for i in range(n):
        try:
            node = (d / f"started-{i}").read_text().strip()
        except FileNotFoundError:
            continue
        if node:
            out[i] = node
    return out


def sacct_rows(conf: str, slurm_ids: list[str], fields: str) -> dict[str, dict[str, str]]:
    """Slurm id -> accounting's record of the job itself (-X), by field."""
    names = fields.split(",")
    out: dict[str, dict[str, str]] = {}
    for line in slurm(conf, "sacct", "-X", "-n", "-P", "-j", ",".join(slurm_ids), "-o", "JobID," + fields).splitlines():
        jid, *values = line.split("|")
        out[jid] = dict(zip(names, values))
    return out


def test_a_fast_lane_pool_holds_allocations_on_several_nodes(cluster: str, tmp_path: Path, agent_dir: Path) -> None:
    """An agent's burst of fast-lane tasks: the pool's first allocation, sized to the
    burst, is the whole of c1 (only c1 has 32 CPUs); the burst is more than that worker
    takes, so the pool asks for a second, sized to the most a node has free, which with
    c1 full is one of the 8-CPU nodes: Slurm can place the two allocations only on
    different nodes. Tasks run on both at once (the workers on c1..c4 reach the pool's
    scheduler from their own namespaces), each under its node's name; other hosts reach
    only the pool's TLS listener, and the workers listen nowhere; a cancel reaches a running task on each node; every
    other task completes once with its own output; the idle pool gives both allocations
    back."""
    burst = 320  # 320 s of work as the pool reckons an unknown task (1 s each): 10 s on c1, longer than a node takes to join
    with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=cluster, CORRAL_TICK_S="0.3",
                 CORRAL_FASTLANE_CPUS="32", CORRAL_FASTLANE_MIN_CPUS="8",
                 CORRAL_FASTLANE_MAX_ALLOCATIONS="2", CORRAL_FASTLANE_IDLE_S="1",
                 CORRAL_RATE_API_BURST="1000") as gw:  # the agent reads each task's output once
        with gw.http() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "bot", "expires": "1h"}).json()["token"]
        t0 = time.monotonic()
        # Each task says where it started, then waits for `go` (the test's, made once tasks
        # run on both allocations): the first worker cannot drain the burst before the
        # second joins, however slow this machine is. Each appends its own line to a log:
        # a task run twice shows twice.
        jobs = [{"command": f"hostname > started-{i}; until [ -e go ]; do sleep 0.2; done; "
                            f"echo task-{i} $(hostname) | tee -a runs.log",
                 "lane": "fast", "walltime": "2m", "workdir": str(agent_dir)} for i in range(burst)]
        with gw.http(token) as h:
            r = h.post("/v1/jobs/batch", json={"jobs": jobs})
            assert r.status_code == 201, r.text
            ids = [j["id"] for j in r.json()["jobs"]]
            # more tasks running than c1's allocation has CPUs: the second allocation runs some
            until("tasks running on both allocations", lambda: len(h.get("/v1/jobs", params={
                "state": "RUNNING", "limit": 1000}).json()["jobs"]) > 32, 60)
            with gw.http() as admin:
                pilots = admin.get("/v1/jobs", params={"principal": "fastlane"}).json()["jobs"]
            slurm_ids = [job(gw, p["id"])["backend_id"] for p in pilots]
            # (a) Slurm runs both allocations now, each on a node of its own
            held = [line.split() for line in slurm(cluster, "squeue", "-h", "-j", ",".join(slurm_ids),
                                                    "-o", "%i %T %N %C").splitlines()]
            assert len(held) == 2 and {s[1] for s in held} == {"RUNNING"}, held
            nodes = {s[2] for s in held}
            assert len(nodes) == 2 and nodes <= {"c1", "c2", "c3", "c4"}, held
            # Other hosts reach only the pool's TLS listener in the gateway; a worker listens
            # nowhere, it opens its one connection to that listener (under Dask each worker
            # had a listener of its own, and Dask's unauthenticated diagnostics HTTP listened
            # beside both: the pool's workers, their addresses and logs, to anyone)
            scheduler = {int(re.search(r"--scheduler \S+:(\d+) ", job(gw, p["id"])["spec"]["command"])[1])
                         for p in pilots}
            assert gw.proc is not None and open_ports(gw.proc.pid) == scheduler, (open_ports(gw.proc.pid), scheduler)
            workers = fast_workers(gw.home)
            assert len(workers) == 2 and [len(open_ports(w)) for w in workers] == [0, 0], \
                [(w, open_ports(w)) for w in workers]
            # A cancel reaches a running task on each node, over its worker's own connection.
            started = until("tasks started on both nodes", lambda: (st := started_on(agent_dir, burst))
                            and set(st.values()) == nodes and st, 30)
            cancelled = {n: next(i for i, m in started.items() if m == n) for n in nodes}
            for i in cancelled.values():
                assert h.post(f"/v1/jobs/{ids[i]}/cancel").status_code == 200
            gone = h.post("/v1/jobs/wait", json={"ids": [ids[i] for i in cancelled.values()], "timeout": 30}).json()
            assert [j["state"] for j in gone["jobs"]] == ["CANCELLED"] * len(nodes), gone
            (agent_dir / "go").touch()
            rest = [j for i, j in enumerate(ids) if i not in cancelled.values()]
            done = h.post("/v1/jobs/wait", json={"ids": rest, "timeout": 50}).json()
            ran_s = time.monotonic() - t0
            assert done["reached"] and [j["state"] for j in done["jobs"]] == ["COMPLETED"] * len(rest), \
                [(j["id"], j["state"], j["reason"]) for j in done["jobs"] if j["state"] != "COMPLETED"][:5]
            outputs = {i: h.get(f"/v1/jobs/{j}/output").json()["data"] for i, j in enumerate(ids)}
        # (b), (c): each task's own output, naming the node it ran on: each of the allocations'
        started = started_on(agent_dir, burst)
        assert all(outputs[i] == "" for i in cancelled.values()), (cancelled, outputs)
        seen = {i: o.split() for i, o in outputs.items() if i not in cancelled.values()}
        wrong = [(i, s, started.get(i)) for i, s in seen.items() if s != [f"task-{i}", started.get(i)]]
        assert not wrong, wrong[:5]  # its own line, from the node it started on
        per_node = {n: sum(1 for s in seen.values() if s[1] == n) for n in {s[1] for s in seen.values()}}
        assert set(per_node) == nodes, (per_node, held)
        logged = sorted((agent_dir / "runs.log").read_text().splitlines())
        assert logged == sorted(o.strip() for o in outputs.values() if o), "each task ran once, none cancelled"
        # (d) idle: the pool gives both back, and Slurm shows them ended
        with gw.http() as h:
            until("the idle pool to release its allocations",
                  lambda: h.get("/v1/facility").json()["fast_lane"]["pools"][0]["allocations"] == [], 30)
        ended = until("Slurm to end both allocations", lambda: (rows := sacct_rows(cluster, slurm_ids, "State,End"))
                      and all(r["State"].split()[0] in ("CANCELLED", "COMPLETED") and r["End"] != "Unknown"
                              for r in rows.values()) and rows, 30)
        assert len(ended) == 2 and not slurm(cluster, "squeue", "-h", "-j", ",".join(slurm_ids)).strip()
        print(f"burst of {burst}: done {ran_s:.1f} s after sent, tasks per node {per_node}, allocations {held}; "
              f"released {time.monotonic() - t0:.1f} s after sent: {ended}")
