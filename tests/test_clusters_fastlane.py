"""Fast-lane pools per cluster (issue 52 item 1, decision 0053), on the two private Slurm
instances: a task for cluster two runs in cluster two's pool, whose pilot is a job of
cluster two's Slurm on one of its nodes; with cluster one's controller down, cluster
two's pool keeps serving and an 'auto' task is placed there."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx

from .conftest import Gateway, ended
from .slurm_env import restore, stop_controllers
from .test_clusters_slurm import both_turns, slurm, two_cluster_gateway, until

import pytest

pytestmark = pytest.mark.slurm_turn("none")  # both instances' turns, taken in both_turns

TWO_NET = "10.217.1."
"""Cluster two's nodes' addresses (scripts/slurm-up --second); cluster one's are 10.217.0.x."""


def gateway(root: Path, one: str, two: str) -> contextlib.AbstractContextManager[Gateway]:
    # idle_s: no warm allocation is released between the steps on a slow runner (released at the end).
    return two_cluster_gateway(root, one, two, settings='poll_s = 2\n[fastlane]\ncpus = 4\nmemory_mb = 2000\nidle_s = 900\n')


def run(h: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = h.post("/v1/jobs", json={"lane": "fast", "walltime": "1m", **body})
    assert r.status_code in (200, 201), r.text
    done = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 150}).json()
    assert done["state"] == "COMPLETED", done
    return dict(done)


def pools(h: httpx.Client) -> dict[str, dict[str, Any]]:
    return {p["cluster"]: p for p in h.get("/v1/facility").json()["fast_lane"]["pools"]}


def test_a_task_for_cluster_two_runs_in_its_pool_on_a_node_of_cluster_two(tmp_path: Path) -> None:
    with both_turns() as (one, two), gateway(tmp_path, one, two) as gw, gw.http() as h:
        plan = h.post("/v1/plan", json={"lane": "fast", "walltime": "1m", "command": "true", "cluster": "two"}).json()
        assert plan["allowed"] and plan["lane"] == "fast" and plan["cluster"] == "two", plan
        done = run(h, {"command": "hostname -I", "cluster": "two"})
        assert done["cluster"] == "two" and done["backend"] == "fast", done
        said = h.get(f"/v1/jobs/{done['id']}/output").json()["data"]
        assert said.startswith(TWO_NET), said  # it ran in cluster two's network
        pool = pools(h)["two"]
        assert "one" not in pools(h) and pool["pool"].endswith("-two"), pool
        (alloc,) = pool["allocations"]
        # The reconciler's next poll of cluster two records its pilot running (its task ran in it).
        pilot = until("the pilot recorded running", lambda: (
            j if (j := h.get(f"/v1/jobs/{alloc['job_id']}").json())["state"] == "RUNNING" else None), 60)
        assert pilot["cluster"] == "two" and pilot["backend"] == "two", pilot
        # Slurm's own record on cluster two: the pool's pilot (its name says which corral job).
        shown = slurm(two, "scontrol", "show", "job", pilot["backend_id"])
        assert f"JobName=corral-{pilot['id']}" in shown and "JobState=RUNNING" in shown, shown
        mine = slurm(one, "squeue", "-h", "-o", "%j")
        assert f"corral-{pilot['id']}" not in mine.split(), mine  # and nothing of it on cluster one
        # Status and metrics name the cluster.
        metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
        assert f'corral_fastlane_pool_allocations{{cluster="two",pool="{pool["pool"]}"}} 1.0' in metrics, metrics
        with httpx.Client(base_url=gw.url, timeout=60) as board:
            assert board.post("/dashboard/login", data={"token": gw.admin_token}).status_code == 303
            html = board.get("/dashboard/live").text
        assert f'<tr data-pool="{pool["pool"]}"><td>cluster two: ' in html, html[html.find('id="pools"'):][:2000]
        # A task naming cluster one gets a pool (and a pilot) of cluster one.
        first = run(h, {"command": "hostname -I", "cluster": "one"})
        assert first["cluster"] == "one" and h.get(f"/v1/jobs/{first['id']}/output").json()["data"].startswith(
            "10.217.0."), first
        assert set(pools(h)) == {"one", "two"}
        # 'auto' with both pools warm: one of them, no new pilot (a warm pool goes first).
        pilots = {c: [a["job_id"] for a in p["allocations"]] for c, p in pools(h).items()}
        auto = run(h, {"command": "true", "cluster": "auto"})
        assert auto["cluster"] in ("one", "two") and {c: [a["job_id"] for a in p["allocations"]]
                                                      for c, p in pools(h).items()} == pilots, (auto, pools(h))
        r = h.post("/v1/jobs", json={"lane": "fast", "command": "true", "cluster": "three"})
        assert r.status_code == 400 and "one, two" in r.json()["error"]["message"], r.text


def test_cluster_ones_controller_down_leaves_cluster_twos_pool_serving(tmp_path: Path) -> None:
    with both_turns() as (one, two), gateway(tmp_path, one, two) as gw, gw.http() as h:
        pids = stop_controllers(one)
        try:
            for pid in pids:
                ended(pid)
            # 'auto', no pool anywhere yet: placed as a job would be, and one does not answer.
            placed = run(h, {"command": "hostname -I", "cluster": "auto"})
            assert placed["cluster"] == "two" and set(pools(h)) == {"two"}, (placed, pools(h))
            assert h.get(f"/v1/jobs/{placed['id']}/output").json()["data"].startswith(TWO_NET)
            # A task named to one cannot get a pilot there: refused now, or waiting; never
            # in the way of two's tasks.
            r = h.post("/v1/jobs", json={"lane": "fast", "command": "true", "walltime": "1m", "cluster": "one"})
            assert r.status_code in (200, 201, 400), r.text
            for i in range(3):
                got = run(h, {"command": f"echo {i}", "cluster": "two"})
                assert h.get(f"/v1/jobs/{got['id']}/output").json()["data"] == f"{i}\n"
            up = until("two's pool up", lambda: [a for a in pools(h)["two"]["allocations"] if a["up"]], 30)
            assert up, pools(h)
            if r.status_code != 400:
                h.post(f"/v1/jobs/{r.json()['id']}/cancel")
        finally:
            restore(one)



def test_after_a_restart_each_pilot_is_released_through_its_own_clusters_slurm(tmp_path: Path) -> None:
    """A restart releases the last run's allocations (their workers lost their scheduler),
    each through its own cluster's Slurm: through the first cluster's, cluster one would be
    asked to cancel a job id of cluster two (someone else's job there, or none). Without a
    Slurm: the ports are recorders (on the private Slurms a killed gateway's worker ends
    its pilot itself before the restart could say which Slurm released it)."""
    import asyncio
    from types import SimpleNamespace

    from corral.core.config import FastLaneSettings
    from corral.core.principals import PILOT_PRINCIPAL
    from corral.lanes.fast.lane import FastLane

    stopped: dict[str, list[int]] = {"one": [], "two": []}

    class Port:
        def __init__(self, cluster: str) -> None:
            self.cluster = cluster

        async def stop(self, job_id: int) -> None:
            stopped[self.cluster].append(job_id)

    ports = {c: Port(c) for c in stopped}
    jobs = [SimpleNamespace(id=7, principal=PILOT_PRINCIPAL, backend="two", backend_id="5874"),
            SimpleNamespace(id=8, principal=PILOT_PRINCIPAL, backend="one", backend_id="5874")]
    lane = FastLane(FastLaneSettings(), tmp_path, "batch", 1.0, SimpleNamespace(active_jobs=lambda: jobs),  # type: ignore[arg-type]
                    SimpleNamespace(name="one"), ports["one"], SimpleNamespace(),  # type: ignore[arg-type]
                    sites=SimpleNamespace(lanes={"one": None, "two": None}), ports=ports)  # type: ignore[arg-type]
    asyncio.run(lane.recover())
    assert stopped == {"one": [8], "two": [7]}


def test_a_task_is_placed_where_the_policy_allows_it_a_warm_pool_first(tmp_path: Path) -> None:
    """FastLane.place without a Slurm: a warm pool where the policy refuses the task is not
    taken (it is ranked among the others instead); a warm pool where it is allowed is
    taken with no ranking; a cluster named where the policy refuses is refused, saying why."""
    import asyncio
    from types import SimpleNamespace

    from corral.core.config import FastLaneSettings
    from corral.core.errors import InvalidRequest
    from corral.core.jobs import JobSpec
    from corral.core.principals import Kind, Principal
    from corral.lanes.backend import Partition
    from corral.lanes.clusters import Option
    from corral.lanes.fast.lane import FastLane

    part = Partition("debug", 8, 16000, 0, 3600, default=True)
    clusters = {c: SimpleNamespace(name=c, partitions=lambda: [part]) for c in ("one", "two")}
    ranked: list[list[str]] = []

    async def rank(spec: JobSpec, only: list[str], refuses: Any) -> list[Option]:
        ranked.append(list(only))
        return [Option(c, "debug", [r] if (r := refuses(c)) else []) for c in only]

    sites = SimpleNamespace(lanes=clusters, settings=SimpleNamespace(filesystems={}), rank=rank,
                            named=lambda name: clusters[name])
    lane = FastLane(FastLaneSettings(), tmp_path, "batch", 1.0, SimpleNamespace(),  # type: ignore[arg-type]
                    clusters["one"], SimpleNamespace(), SimpleNamespace(), sites=sites)  # type: ignore[arg-type]
    ann = Principal("ann", Kind.HUMAN)
    spec = JobSpec(command="true", lane="fast", walltime=60)
    warm = SimpleNamespace(allocations={1: SimpleNamespace(up_since=1.0)}, breaker=SimpleNamespace(is_open=False))
    lane.pools[lane.key(ann, spec, "two")] = warm  # type: ignore[assignment]

    def refuse(c: str) -> Any:
        return lambda x: "rule forbid-two" if x == c else None

    placed = asyncio.run(lane.place(ann, spec, refuse("two")))
    assert placed.cluster == "one" and ranked == [["one", "two"]]
    placed = asyncio.run(lane.place(ann, spec, refuse("one")))
    assert placed.cluster == "two" and len(ranked) == 1  # the warm pool, no ranking
    with pytest.raises(InvalidRequest, match="cluster two: rule forbid-two"):
        asyncio.run(lane.place(ann, spec.model_copy(update={"cluster": "two"}), refuse("two")))
