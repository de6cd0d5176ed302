"""The lane registry: it owns the lane vocabulary (every list of lane choices in corral
is the registry's), routes a spec to its lane, and meters the batch lane's scheduler
calls (corral/lanes/registry.py). A real local backend, no gateway."""

from __future__ import annotations

import asyncio
import typing
from pathlib import Path

import pytest

from corral.core.config import Settings
from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec
from corral.core.principals import Kind, Principal
from corral.lanes import registry
from corral.lanes.backend import SubmitContext
from corral.lanes.local import LocalBackend


def test_every_list_of_lane_choices_is_the_registrys() -> None:
    from corral.edges.cli.main import cli
    from corral.edges.inputs import JobFields

    assert set(registry.CHOICES) == {"batch", "fast", "auto"}
    spec_choices = typing.get_args(typing.get_args(JobSpec.model_fields["lane"].annotation)[0])
    assert spec_choices == registry.CHOICES
    assert typing.get_args(Settings.model_fields["default_lane"].annotation) == registry.CHOICES
    submit = cli.commands["submit"]
    lane = next(p for p in submit.params if p.name == "lane")
    assert tuple(lane.type.choices) == registry.CHOICES  # type: ignore[attr-defined]
    assert JobFields.model_json_schema()["properties"]["lane"]["anyOf"][0]["enum"] == list(registry.CHOICES)


def test_the_registry_routes_to_batch_and_refuses_a_lane_it_does_not_offer(tmp_path: Path) -> None:
    lanes = registry.Lanes.over(LocalBackend(tmp_path, cpus=2, memory_mb=2048))
    who = Principal("ann", Kind.HUMAN)
    spec, lane = lanes.route(who, JobSpec(command="true", lane="auto"))
    assert lane is lanes.batch and spec.lane == registry.BATCH
    with pytest.raises(InvalidRequest, match="not offered") as e:
        lanes.route(who, JobSpec(command="true", lane="fast"))  # no fast lane registered
    assert "batch" in (e.value.hint or "")
    assert lanes.polled() == [lanes.batch.name]


def test_the_registry_meters_every_call_that_reaches_the_scheduler(tmp_path: Path) -> None:
    counted: list[str] = []
    lanes = registry.Lanes.over(LocalBackend(tmp_path, cpus=2, memory_mb=2048), meter=counted.append)
    batch = lanes.batch

    async def scenario() -> None:
        sent = await batch.submit([(SubmitContext(1, "ann", "human"), JobSpec(command="true"))])
        assert sent[0].backend_id
        await batch.status([sent[0].backend_id or ""])
        batch.output_paths(sent[0].backend_id or "")  # a path, not a scheduler call
        batch.partitions()
        await batch.cancel([sent[0].backend_id or ""])
        await batch.close()

    asyncio.run(scenario())
    assert counted == ["submit", "status", "cancel"]


def test_a_job_named_to_any_cluster_is_offered_to_the_fast_lane(tmp_path: Path) -> None:
    """With several clusters the fast lane has a pool on each (decision 0053): a job named
    to the second cluster is offered to it as one named to the first (before, it never was,
    and one asking for both was refused); what it declines goes to batch, placed by Sites."""
    from corral.core.config import SlurmSettings

    class Fast:
        name, reports_itself = "fast", True

        def claim(self, principal: Principal, spec: JobSpec) -> JobSpec | None:
            return spec.model_copy(update={"lane": "fast"}) if spec.lane in ("fast", "auto") else None

    one, two = (LocalBackend(tmp_path / n, cpus=2, memory_mb=2048) for n in ("one", "two"))
    one.name, two.name = "one", "two"
    lanes = registry.Lanes.of_clusters([one, two], SlurmSettings(clusters={"one": "/a", "two": "/b"}))
    lanes.add(Fast())  # type: ignore[arg-type]
    who = Principal("ann", Kind.HUMAN)
    for cluster in (None, "one", "two", "auto"):
        spec, lane = lanes.route(who, JobSpec(command="true", lane="auto", cluster=cluster))
        assert lane.name == "fast" and spec.cluster == cluster
    assert lanes.route(who, JobSpec(command="true", lane="fast", cluster="two"))[1].name == "fast"
    spec, lane = lanes.route(who, JobSpec(command="true", lane="batch", cluster="two"))
    assert lane is lanes.batch and spec.lane == registry.BATCH  # then placed on two (Sites.settle)
