"""A run Slurm has superseded does not end the job (issue 50): on the private cluster
(scripts/slurm-up, nodes c1..c4 each in a namespace of its own) the slurmd of the node a
job runs on is killed, and only it: the job's slurmstepd and its work go on. Slurm
marks the node DOWN, the job NODE_FAIL, and requeues it to run again elsewhere; the
first run, orphaned, ends later and writes its end marker. corral must follow Slurm
(the job waits to run again, its requeue counted), not the orphan's end (before:
COMPLETED, for good, while Slurm ran the job a second time)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Gateway
from .slurm_env import layout, restore, slurm_conf
from .test_cluster_slurm import cluster_conf, job, node_state, quiet, slurm, until
from .test_gateway_slurm import start_slurm_gateway

pytestmark = pytest.mark.usefixtures("slurm_turn")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    g = start_slurm_gateway(tmp_path, quiet(cluster_conf()))
    try:
        yield g
    finally:
        g.kill(signal.SIGTERM)


def kill_slurmd(conf: str, node: str) -> None:
    """SIGKILL to the node's slurmd alone (its jobs' slurmstepds and tasks live on)."""
    ns = f"{layout(conf)['NS']}-{node}"
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
                os.kill(int(pid), signal.SIGKILL)
                return
        except OSError:
            continue
    raise AssertionError(f"no slurmd runs on {node}")


def restarts(conf: str, backend: str) -> int:
    fields = dict(t.split("=", 1) for t in slurm(conf, "scontrol", "show", "job", backend, "-o").split() if "=" in t)
    return int(fields.get("Restarts", 0))


@pytest.mark.slurm_turn("alone")
def test_an_orphaned_runs_end_does_not_end_a_requeued_job(gw: Gateway, agent_dir: Path) -> None:
    conf = slurm_conf()
    # The first run outlives Slurm's notice of its node (SlurmdTimeout=15 s, pings every 5 s):
    # it ends at ~45 s, after the requeue. Slurm makes the requeued job wait ~2 minutes
    # (BeginTime) before its second run: not awaited here, the job is cancelled.
    work = 'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 45; fi; echo run-$SLURM_RESTART_COUNT'
    node = ""
    try:
        with gw.http() as h:
            jid = h.post("/v1/jobs", json={"command": work, "cpus": 4, "walltime": "10m",
                                           "workdir": str(agent_dir)}).json()["id"]
            first = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 120, "until": "RUNNING"}).json()
        assert first["state"] == "RUNNING", first
        backend = first["backend_id"]
        node = slurm(conf, "squeue", "-h", "-j", backend, "-o", "%N").strip()
        ended = Path(slurm(conf, "scontrol", "show", "job", backend, "-o").split("StdOut=")[1].split()[0]).parent / "ended"
        kill_slurmd(conf, node)
        until(f"Slurm to mark {node} down", lambda: "DOWN" in node_state(conf, node), 90)
        until("Slurm to requeue the job", lambda: restarts(conf, backend) >= 1, 90)
        until("the first run, orphaned, to write its end", ended.exists, 90)
        assert ended.read_text().split() == ["0", "0"], ended.read_text()  # its status, and its run: the first
        for _ in range(8):  # the gateway's ticks after the marker (CORRAL_TICK_S=0.5)
            j = job(gw, jid)
            assert j["state"] in ("PENDING", "RUNNING"), (j, "Slurm says", slurm(
                conf, "squeue", "-h", "-j", backend, "-o", "%T %r").strip() or "gone")
            time.sleep(1)
        assert j["requeues"] >= 1 and j["backend_id"] == backend, j
        with gw.http() as h:
            h.post(f"/v1/jobs/{jid}/cancel")
    finally:
        restore(conf)  # the node's slurmd again
        if node:
            until(f"{node} back in service", lambda: "DOWN" not in node_state(conf, node), 90)


def freeze_stepds(conf: str, node: str, sig: int) -> list[int]:
    """``sig`` (SIGSTOP, SIGCONT) to the node's slurmstepds: a stopped one cannot tell the
    controller that its batch script ended, while the script itself goes on to its end."""
    ns = f"{layout(conf)['NS']}-{node}"
    hit = []
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd":
                os.kill(int(pid), sig)
                hit.append(int(pid))
        except OSError:
            continue
    return hit


@pytest.mark.slurm_turn("alone")
def test_an_end_recorded_before_slurm_requeues_the_job_is_reopened(gw: Gateway, agent_dir: Path) -> None:
    """The end corral took from the job's own marker comes before Slurm's word: the node's
    slurmd is killed and the job's slurmstepd stopped (it cannot report), so the script
    ends and writes its marker (corral: COMPLETED) while Slurm still has the job RUNNING;
    then Slurm marks the node down and requeues the job (NODE_FAIL). corral reopens its
    record: the job waits to run again, its requeue counted, its end gone. Before: COMPLETED
    for good (corral never asked about a job it had recorded as ended)."""
    conf = slurm_conf()
    node = ""
    stepds: list[int] = []
    try:
        with gw.http() as h:
            jid = h.post("/v1/jobs", json={"command": "sleep 3; echo run-${SLURM_RESTART_COUNT:-0}", "cpus": 4,
                                           "walltime": "10m", "workdir": str(agent_dir)}).json()["id"]
            first = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 120, "until": "RUNNING"}).json()
            assert first["state"] == "RUNNING", first
            backend = first["backend_id"]
            node = slurm(conf, "squeue", "-h", "-j", backend, "-o", "%N").strip()
            kill_slurmd(conf, node)
            stepds = freeze_stepds(conf, node, signal.SIGSTOP)
            assert stepds, f"no slurmstepd on {node}"
            ended = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()
            assert ended["state"] == "COMPLETED" and ended["requeues"] == 0, ended  # the marker's word
            assert slurm(conf, "squeue", "-h", "-j", backend, "-o", "%T").strip() == "RUNNING"  # not yet Slurm's
            until("Slurm to requeue the job", lambda: restarts(conf, backend) >= 1, 120)
            again = until("corral to reopen the job", lambda: (j := job(gw, jid))["state"] in ("PENDING", "RUNNING")
                          and j, 60)
            assert again["requeues"] >= 1 and again["end_time"] is None and again["exit_code"] is None, again
            assert again["backend_id"] == backend, again
            h.post(f"/v1/jobs/{jid}/cancel")
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
    finally:
        if node:
            freeze_stepds(conf, node, signal.SIGCONT)
        restore(conf)  # the node's slurmd again
        if node:
            until(f"{node} back in service", lambda: "DOWN" not in node_state(conf, node), 90)


@pytest.mark.slurm_turn("alone")
def test_a_job_ending_as_the_primary_controller_dies_is_reopened_when_the_backup_requeues_it(
        gw: Gateway, agent_dir: Path) -> None:
    """Issue 50's last case: a job's script ends as the primary controller (ctl1) dies, so
    its end reaches no controller: its node's slurmd killed and its slurmstepd stopped (it
    cannot report), ctl1 killed outright once it has saved the job as running. corral
    takes the end from the job's own marker (COMPLETED). The backup (ctl2) takes over
    (SlurmctldTimeout), recovers the job as RUNNING, finds its node gone, and requeues it
    (NODE_FAIL): corral follows Slurm, the record reopened (its end gone, the requeue
    counted), and the first run's marker no longer ends it. Before: COMPLETED, requeues
    0, while Slurm ran the job again. (Killed before it saved the job's start, ctl1 leaves
    the backup a pending job that it runs anew, its count still 0: Polling._rerun, in
    tests/test_reopened.py; killed before it saved the job at all, the backup never knew it
    and corral's end from the marker stands.)"""
    from .slurm_env import kill_host

    conf = slurm_conf()
    saved = Path(next(line.split("=", 1)[1].strip() for line in slurm(conf, "scontrol", "show", "config").splitlines()
                      if line.startswith("StateSaveLocation"))) / "job_state"

    def asked(check: Any) -> Any:  # Slurm's commands fail or time out while no controller answers
        def safely() -> Any:
            try:
                return check()
            except (subprocess.SubprocessError, OSError):
                return None
        return safely

    # the first run ends when the test says (the file go); a run after it finds the mark
    # and runs on (until cancelled), so that Slurm's second run is there to be seen
    work = ("if [ -e again ]; then echo second; sleep 600; fi; touch again; "
            "for i in $(seq 1200); do [ -e go ] && break; sleep 0.1; done; echo first")
    node = ""
    try:
        with gw.http() as h:
            jid = h.post("/v1/jobs", json={"command": work, "cpus": 4, "walltime": "20m",
                                           "workdir": str(agent_dir)}).json()["id"]
            first = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 120, "until": "RUNNING"}).json()
            assert first["state"] == "RUNNING", first
            seen_running = time.time()
            backend = first["backend_id"]
            node = slurm(conf, "squeue", "-h", "-j", backend, "-o", "%N").strip()
            until("ctl1 to save the job as running", lambda: saved.stat().st_mtime > seen_running + 1, 90)
            kill_slurmd(conf, node)
            assert freeze_stepds(conf, node, signal.SIGSTOP), f"no slurmstepd on {node}"
            assert kill_host(conf, "ctl1")  # the primary dies as the job's script ends
            (agent_dir / "go").touch()
            ended = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()
            assert ended["state"] == "COMPLETED" and ended["requeues"] == 0, ended  # the marker's word
            until("Slurm (the backup) to requeue the job", asked(lambda: restarts(conf, backend) >= 1), 240)
            again = until("corral to reopen the job", lambda: (j := job(gw, jid))["state"] in ("PENDING", "RUNNING")
                          and j, 60)
            assert again["requeues"] >= 1 and again["end_time"] is None and again["exit_code"] is None, again
            assert again["backend_id"] == backend, again
            for _ in range(6):  # the first run's marker does not end it again (CORRAL_TICK_S=0.5)
                time.sleep(1)
                assert job(gw, jid)["state"] in ("PENDING", "RUNNING"), job(gw, jid)
            h.post(f"/v1/jobs/{jid}/cancel")
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 90}).json()["state"] == "CANCELLED"
    finally:
        if node:
            freeze_stepds(conf, node, signal.SIGCONT)
        restore(conf)  # the primary controller and the node's slurmd again
        until("the primary in control again", asked(lambda: "primary) at ctl1 is UP" in slurm(conf, "scontrol", "ping")),
              120)
        if node:
            until(f"{node} back in service", lambda: "DOWN" not in node_state(conf, node), 90)
