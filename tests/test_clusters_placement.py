"""The site's objective over several clusters (corral/lanes/clusters.py, decision 0053),
with each cluster's partitions and Slurm's start estimates as a cluster would answer them
(tests/test_clusters_slurm.py drives the same on the two private Slurm instances)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from corral.core.config import SlurmSettings
from corral.core.errors import BackendError, InvalidRequest
from corral.core.jobs import JobSpec
from corral.lanes.backend import Partition
from corral.lanes.clusters import Sites
from corral.lanes.fits import refuse_misfits

pytestmark = pytest.mark.slurm_turn("none")
NOW = time.time()


class Cluster:
    """A cluster's lane as Sites asks it: its partitions, and when a job would start."""

    def __init__(self, name: str, wait_s: float | None, cpus: int = 32, down: bool = False) -> None:
        self.name, self.wait_s, self.cpus, self.down = name, wait_s, cpus, down
        self.asked = 0

    def partitions(self) -> list[Partition]:
        if self.down:
            raise BackendError("scontrol: Unable to contact slurm controller")
        return [Partition("debug", self.cpus, 64000, 0, 3600, default=True, extra={"state": "UP"}),
                Partition("long", self.cpus, 64000, 0, 86400, extra={"state": "UP"})]

    async def test_only(self, spec: JobSpec) -> tuple[float | None, str]:
        self.asked += 1
        return (None, "sbatch: error: QOSMaxCpuPerUserLimit") if self.wait_s is None else (NOW + self.wait_s, "")


def sites(clusters: list[Cluster], **settings: Any) -> Sites:
    s = SlurmSettings(clusters={c.name: "/x" for c in clusters}, **settings)
    return Sites({c.name: c for c in clusters}, s, clock=lambda: NOW)  # type: ignore[misc]


SPEC = JobSpec(command="true", cpus=4, walltime="1h")


@pytest.mark.parametrize(("objective", "chosen"), [("earliest", "quick"), ("cheapest", "cheap"), ("blend", "cheap")])
def test_the_objective_picks_the_cluster(objective: str, chosen: str) -> None:
    # quick: starts now at 3 SU/CPU-hour (12 SUs); cheap: in 2 h at 1 (4 SUs). Blend: 4 + 2 h x 1 SU < 12.
    s = sites([Cluster("quick", 0), Cluster("cheap", 7200)], placement=objective,
              charge={"quick": {"cpu_hour": 3.0}, "cheap": {"cpu_hour": 1.0}})
    spec, lane, options = asyncio.run(s.settle(SPEC))
    assert lane.name == chosen and spec.cluster == chosen
    assert [o.cluster for o in options if o.fits][0] == chosen


def test_a_partition_rate_wins_over_its_clusters_and_plan_ranks_every_partition() -> None:
    s = sites([Cluster("a", 0)], charge={"a": {"cpu_hour": 2.0}, "a/long": {"cpu_hour": 0.5}})
    ranked = {o.partition: o for o in asyncio.run(s.rank(SPEC, every_partition=True))}
    assert ranked["debug"].sus == pytest.approx(8.0) and ranked["long"].sus == pytest.approx(2.0)
    assert ranked["debug"].candidate and not ranked["long"].candidate  # submit keeps the default partition


def test_a_refusal_names_every_cluster_and_every_reason() -> None:
    s = sites([Cluster("small", 0, cpus=8), Cluster("limited", None), Cluster("gone", 0, down=True)])
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(s.settle(JobSpec(command="true", cpus=16, walltime="2h")))
    msg = e.value.message
    assert "cluster small partition debug: 16 CPUs asked, its largest node has 8, walltime 02:00:00" in msg
    assert "cluster limited partition debug: walltime" in msg  # no start asked of what cannot fit
    assert "cluster gone" in msg and "does not answer" in msg
    # What fits but gets no start from Slurm says what Slurm said.
    with pytest.raises(InvalidRequest, match="QOSMaxCpuPerUserLimit"):
        asyncio.run(s.settle(SPEC.model_copy(update={"cluster": "limited"})))


def test_a_named_cluster_is_taken_and_an_unknown_one_refused_with_the_choices() -> None:
    one, two = Cluster("one", 600), Cluster("two", 0)
    s = sites([one, two])
    spec, lane, _ = asyncio.run(s.settle(SPEC.model_copy(update={"cluster": "one"})))
    assert lane is one and two.asked == 0  # only the named cluster is asked
    with pytest.raises(InvalidRequest, match="the clusters are: one, two"):
        asyncio.run(s.settle(SPEC.model_copy(update={"cluster": "three"})))


def test_data_a_cluster_does_not_mount_and_a_refusing_policy_keep_a_job_off_it() -> None:
    """Issue 52 items 4 and 5: what a job needs on a cluster's filesystems, said at
    placement ('needs data moved'), not found missing at its start; and a cluster the
    policy (or a budget) refuses is weighed as one that does not fit, with why."""
    from corral.storage import IMAGE_FILE, WS_DIR

    one, two = Cluster("one", 600), Cluster("two", 0)
    s = sites([one, two], filesystems={"two": ["/gpfs"]})
    spec = SPEC.model_copy(update={"workdir": "/home/alice/run",
                                   "labels": {IMAGE_FILE: "/gpfs/images/k.sqsh", WS_DIR: "/home/ws/ws-1"}})
    ranked = {o.cluster: o for o in asyncio.run(s.rank(spec))}
    assert ranked["one"].fits and not ranked["two"].fits
    said = " ".join(ranked["two"].reasons)
    assert "needs data moved: its workdir /home/alice/run is not on cluster two's filesystems (/gpfs)" in said
    assert "its workspace /home/ws/ws-1" in said and "image" not in said  # the image is on /gpfs
    placed, lane, _ = asyncio.run(s.settle(spec))
    assert lane is one and placed.cluster == "one"  # two would start sooner, but the data is not there
    with pytest.raises(InvalidRequest, match="needs data moved"):
        asyncio.run(s.settle(spec.model_copy(update={"cluster": "two"})))
    assert s.holding("/gpfs/images/k.sqsh") == ["one", "two"] and s.holding("/home/x") == ["one"]
    # The policy's word, per cluster: two refused, so one takes it; neither, and the refusal says both.
    placed, lane, _ = asyncio.run(s.settle(SPEC, refuses=lambda c: "rule 'no-two'" if c == "two" else None))
    assert lane is one
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(s.settle(SPEC, refuses=lambda c: f"rule 'no-{c}'"))
    assert "cluster one partition debug: rule 'no-one'" in e.value.message and "rule 'no-two'" in e.value.message


def test_a_workspace_says_which_clusters_filesystems_hold_it(tmp_path: Any) -> None:
    """Issue 52 item 4: a workspace's answer names the clusters whose filesystems hold it
    (an image's does the same through the same Sites.holding; gateway/runtime.py wires both)."""
    import shutil
    import tempfile
    from pathlib import Path

    own = Path(tempfile.mkdtemp(dir="/tmp"))  # scratch under a directory only its owner writes (tmp_path's is 777)
    try:
        _workspace_clusters(tmp_path, own / "scratch")
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _workspace_clusters(tmp_path: Any, scratch: Any) -> None:
    from corral.core.config import StorageSettings
    from corral.core.principals import Caller, Kind, Principal
    from corral.core.store import Database
    from corral.storage.workspaces import Workspaces

    db = Database(tmp_path / "corral.db")
    alice = db.add_principal(Principal(name="alice", kind=Kind.HUMAN))
    caller = Caller(principal=alice, session=None, token_id="t", visible=frozenset({"alice"}))
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "a.txt").write_text("x")
    ws = Workspaces(StorageSettings(), scratch, db.storage, on_nodes=True)
    ws.where = sites([Cluster("one", 0), Cluster("two", 0)], filesystems={"two": ["/gpfs"]}).holding
    made = ws.fork(caller, str(tmp_path / "proj"))
    assert made["clusters"] == ["one"] and ws.describe(caller, made["workspace"])["clusters"] == ["one"]
    ws.where = sites([Cluster("one", 0), Cluster("two", 0)], filesystems={"two": [str(scratch)]}).holding
    assert ws.describe(caller, made["workspace"])["clusters"] == ["one", "two"]


def test_a_refusal_gives_each_cluster_its_nearest_request_that_fits() -> None:
    """Issue 52 item 2: nothing fits, and each cluster says every reason with the nearest
    request that fits there (a longer partition before a shorter walltime: the work needs
    its time); the refusal's ``nearest`` is the fewest changes, and the HTTP body lists them."""
    small, gone = Cluster("small", 0, cpus=8), Cluster("gone", 0, down=True)
    s = sites([small, Cluster("big", 0, cpus=48), gone])
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(s.settle(JobSpec(command="true", cpus=64, memory="100G", walltime="2h")))
    msg = e.value.message
    assert ("cluster small partition debug: 64 CPUs asked, its largest node has 8, 102400M asked, its largest node "
            "has 64000M, walltime 02:00:00 over its limit 01:00:00 (fits there: memory=64000M, cpus=8, "
            "partition=long)") in msg, msg
    assert "cluster big partition debug: 64 CPUs asked, its largest node has 48" in msg
    assert "(fits there: memory=64000M, cpus=48, partition=long)" in msg, msg
    assert "cluster gone" in msg and "(no request fits there now)" in msg
    assert e.value.nearest == {"partition": "long", "cpus": 48, "memory_mb": 64000, "cluster": "big"}
    body: dict[str, Any] = e.value.to_dict()
    assert body["code"] == "invalid_request" and [c["cluster"] for c in body["clusters"]] == ["small", "big", "gone"]
    assert body["clusters"][1]["nearest"] == {"cluster": "big", "memory": "64000M", "cpus": 48, "partition": "long"}
    assert body["clusters"][2]["nearest"] is None
    # A partition one cluster does not have: the nearest there is its default.
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(s.settle(JobSpec(command="true", cpus=4, walltime="30m", partition="gpu", cluster="small")))
    assert "it has no partition 'gpu' (it has: debug, long) (fits there: partition=debug)" in e.value.message
    assert e.value.nearest == {"partition": "debug"}
    # The one-cluster preflight (and a named cluster's) says the same.
    with pytest.raises(InvalidRequest) as e:
        refuse_misfits(JobSpec(command="true", cpus=16, walltime="30m", partition="gpu"), small.partitions())
    assert "unknown partition 'gpu'; this facility has: debug, long; nearest that fits: cpus=8, partition=debug" \
        in e.value.message and e.value.nearest == {"partition": "debug", "cpus": 8}
    # plan_job's ranking carries each misfit's nearest too.
    ranked = asyncio.run(s.rank(JobSpec(command="true", cpus=16, walltime="30m"), every_partition=True))
    misfit = next(o.public() for o in ranked if o.cluster == "small" and o.partition == "debug")
    assert misfit["nearest"] == {"cluster": "small", "cpus": 8}
    beside = next(o.public() for o in ranked if o.cluster == "small" and o.partition == "long")
    assert beside["nearest"] == {"cluster": "small", "cpus": 8, "partition": "long"}  # what fits in that one
    assert "nearest" not in next(o.public() for o in ranked if o.cluster == "big")
