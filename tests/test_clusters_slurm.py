"""Many clusters, one gateway (issue 52, decision 0053), on the two private Slurm
instances (scripts/slurm-up and scripts/slurm-up --second): with one cluster full of
people's jobs, an agent's job is placed on the free one; plan_job ranks both and says why
one does not fit; with one cluster's controller down, the other keeps serving."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from .conftest import Gateway, ended, free_port
from .slurm_env import SECOND_CONF, SLURM_CONF, answers, restore, stop_controllers, turn_lock

pytestmark = pytest.mark.slurm_turn("none")  # both instances' turns, taken below


@contextlib.contextmanager
def both_turns() -> Iterator[tuple[str, str]]:
    """Both instances, each alone (in one order, the first's lock first: never a deadlock
    with a test that holds one of them)."""
    confs = (SLURM_CONF, SECOND_CONF)
    for conf in confs:
        if not (os.path.exists(conf) and answers(conf, 60)):
            if os.environ.get("CI") == "true":
                pytest.fail(f"two Slurm instances are required under CI ({conf} does not answer)")
            pytest.skip(f"no Slurm at {conf}: run scripts/slurm-up and scripts/slurm-up --second")
    with contextlib.ExitStack() as stack:
        for conf in confs:
            lock = turn_lock(conf)
            gate, f = stack.enter_context(open(lock + ".gate", "w")), stack.enter_context(open(lock, "w"))
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield confs


def slurm(conf: str, *argv: str, user: int | None = None) -> str:
    pre = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    cp = subprocess.run([*pre, *argv], env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                        timeout=60, cwd="/tmp")
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def fill(conf: str, minutes: int = 10) -> str:
    """People's work: one plain user's job holding every node of the cluster."""
    jid = slurm(conf, "sbatch", "--parsable", "-p", "batch", "-N4", "--exclusive", f"-t{minutes}",
                "-o", "/dev/null", "--wrap", f"sleep {minutes * 60}", user=65534).strip()
    until("people's job to hold the cluster", lambda: slurm(conf, "squeue", "-h", "-j", jid, "-o", "%T").strip()
          == "RUNNING", 60)
    return jid


def until(what: str, check: Callable[[], Any], within: float) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return got


@contextlib.contextmanager
def two_cluster_gateway(root: Path, one: str, two: str, objective: str = "earliest",
                        settings: str | None = None) -> Iterator[Gateway]:
    """A gateway on the Slurm backend fronting clusters one and two; ``settings``, the
    rest of corral.toml after the clusters line, else the objective and two at twice one's rate."""
    home = root / "home"
    home.mkdir()
    (home / "corral.toml").write_text(f'[slurm]\nclusters = {{one = "{one}", two = "{two}"}}\n' + (
        settings if settings is not None else
        f'placement = "{objective}"\npoll_s = 2\n[slurm.charge]\none = {{cpu_hour = 1.0}}\ntwo = {{cpu_hour = 2.0}}\n'))
    gw = Gateway(home, free_port(), extra_env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": one, "CORRAL_TICK_S": "0.5"})
    gw.start()
    try:
        yield gw
    finally:
        gw.kill(signal.SIGTERM)


def people(gw: Gateway) -> dict[str, str]:
    with gw.http() as h:
        for body in ({"name": "alice", "kind": "human"}, {"name": "bot1", "kind": "agent", "sponsor": "alice"}):
            assert h.post("/v1/principals", json=body).status_code == 201
        return {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"] for n in ("alice", "bot1")}


def test_placement_sends_an_agents_job_to_the_free_cluster(tmp_path: Path, agent_dir: Path) -> None:
    with both_turns() as (one, two), two_cluster_gateway(tmp_path, one, two) as gw:
        tok = people(gw)
        filler = fill(one)
        try:
            with gw.http(tok["bot1"]) as h:
                body = {"command": "echo placed", "walltime": "5m", "workdir": str(agent_dir)}
                plan = h.post("/v1/plan", json=body).json()
                assert plan["allowed"] and plan["cluster"] == "two" and plan["objective"] == "earliest", plan
                ranked = {(c["cluster"], c["partition"]): c for c in plan["clusters"]}
                assert ranked[("one", "debug")]["wait_s"] > 60 > ranked[("two", "debug")]["wait_s"], plan
                assert ranked[("two", "debug")]["sus"] == pytest.approx(2 * 5 / 60, abs=1e-3)  # two's rate: 2 SU/CPU-hour
                # Every reason at once: 40 CPUs for 2 h fit the default partition (debug) of neither cluster.
                big = h.post("/v1/plan", json={**body, "cpus": 40, "walltime": "2h"}).json()
                assert not big["allowed"], (big["clusters"], big.get("placement"))
                msg = big["refused"]["message"]
                assert "cluster one" in msg and "cluster two" in msg and "40 CPUs" in msg and "walltime" in msg, msg
                r = h.post("/v1/jobs", json={**body, "cpus": 40, "walltime": "2h"})
                assert r.status_code == 400 and "cluster two" in r.json()["error"]["message"]

                job = h.post("/v1/jobs", json=body).json()
                done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 90}).json()
                assert done["state"] == "COMPLETED" and done["cluster"] == "two" and done["backend"] == "two", done
                assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "placed\n"
                # An agent may name a cluster: there it waits behind people's work.
                pinned = h.post("/v1/jobs", json={**body, "cluster": "one"}).json()
                assert h.get(f"/v1/jobs/{pinned['id']}").json()["cluster"] == "one"
                r = h.post("/v1/jobs", json={**body, "cluster": "three"})
                assert r.status_code == 400 and "one, two" in r.json()["error"]["message"]
            # Slurm's own record on cluster two: this corral job (its name says which), run there.
            assert f"JobName=corral-{job['id']}" in slurm(two, "scontrol", "show", "job", done["backend_id"])
            shown = gw.cli("plan", "-t", "5m", "--", "echo placed", token=tok["bot1"]).stdout  # `corral plan`
            assert "would be allowed (lane two)" in shown and "one/debug: starts in" in shown, shown
            listed = gw.cli("jobs", token=tok["alice"]).stdout
            assert "CLUSTER" in listed.splitlines()[0] and " two " in listed, listed
            audit = [json.loads(line.partition(" ")[2]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
            subs = [r for r in audit if r.get("action") == "submit" and r.get("decision") == "allow"]
            assert {r.get("job_id"): r.get("cluster") for r in subs}[job["id"]] == "two", subs
            with gw.http(tok["bot1"]) as h:
                h.post(f"/v1/jobs/{pinned['id']}/cancel")
        finally:
            slurm(one, "scancel", filler)


def test_one_clusters_controller_down_leaves_the_other_serving(tmp_path: Path, agent_dir: Path) -> None:
    with both_turns() as (one, two), two_cluster_gateway(tmp_path, one, two) as gw:
        tok = people(gw)
        body = {"command": "sleep 3; echo served", "walltime": "5m", "workdir": str(agent_dir)}
        with gw.http(tok["bot1"]) as h:
            on_one = h.post("/v1/jobs", json={**body, "command": "sleep 600", "cluster": "one"}).json()
            until("the job on one to run", lambda: h.get(f"/v1/jobs/{on_one['id']}").json()["state"] == "RUNNING", 60)
            pids = stop_controllers(one)
            try:
                for pid in pids:
                    ended(pid)
                job = h.post("/v1/jobs", json=body).json()  # auto: only two can take it now
                done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 90}).json()
                assert done["state"] == "COMPLETED" and done["cluster"] == "two", done
                assert h.get(f"/v1/jobs/{on_one['id']}").json()["cluster"] == "one"  # still answered
                plan = h.post("/v1/plan", json=body).json()
                down = [c for c in plan["clusters"] if c["cluster"] == "one"]
                assert plan["cluster"] == "two" and down and not any(c["fits"] for c in down), plan
            finally:
                restore(one)
            h.post(f"/v1/jobs/{on_one['id']}/cancel")
