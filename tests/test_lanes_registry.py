"""The lane registry: it owns the lane vocabulary (every list of lane choices in corral
is the registry's), routes a spec to its lane, and meters the batch lane's scheduler
calls (corral/lanes/registry.py). A real local backend, no gateway."""

from __future__ import annotations

import asyncio
import typing

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


def test_the_registry_routes_to_batch_and_refuses_a_lane_it_does_not_offer(tmp_path) -> None:
    lanes = registry.Lanes.over(LocalBackend(tmp_path, cpus=2, memory_mb=2048))
    who = Principal("ann", Kind.HUMAN)
    spec, lane = lanes.route(who, JobSpec(command="true", lane="auto"))
    assert lane is lanes.batch and spec.lane == registry.BATCH
    with pytest.raises(InvalidRequest, match="not offered") as e:
        lanes.route(who, JobSpec(command="true", lane="fast"))  # no fast lane registered
    assert "batch" in (e.value.hint or "")
    assert lanes.polled() == [lanes.batch.name]


def test_the_registry_meters_every_call_that_reaches_the_scheduler(tmp_path) -> None:
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
