"""The simulated facility: partitions of identical nodes, each with its limits.

A partition is a pool of cores, GPUs and memory (the sum over its nodes): a job fits
when the pool has what it asks for in total. Slurm places a job on nodes, so a job can
wait on a fragmented partition that has room in sum; the pool model ignores that (as
AccaSim does with one-core slots, and most trace-driven studies do) and says so in
docs/simulation.md. A facility is a preset, an SWF trace's own header, or a file:

    [[partition]]
    name = "batch"
    nodes = 1800
    cores_per_node = 128
    memory_gb_per_node = 512
    gpus_per_node = 0
    max_walltime_h = 48
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from corral.core.errors import InvalidRequest


@dataclass(frozen=True)
class PartitionSpec:
    name: str
    nodes: int
    cores_per_node: int
    memory_gb_per_node: int = 256
    gpus_per_node: int = 0
    max_walltime_h: float = 48.0

    @property
    def cores(self) -> int:
        return self.nodes * self.cores_per_node

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def memory_mb(self) -> int:
        return self.nodes * self.memory_gb_per_node * 1024

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Facility:
    name: str
    partitions: tuple[PartitionSpec, ...]

    @property
    def default(self) -> PartitionSpec:
        return self.partitions[0]

    @property
    def gpu(self) -> PartitionSpec | None:
        return next((p for p in self.partitions if p.gpus_per_node > 0), None)

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.partitions)

    @property
    def cores(self) -> int:
        return sum(p.cores for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": self.nodes, "cores": self.cores,
                "partitions": [p.to_dict() for p in self.partitions]}


PRESETS: dict[str, Facility] = {
    "2000-node": Facility("2000-node", (
        PartitionSpec("batch", 1800, 128, 512, 0, 48),
        PartitionSpec("gpu", 200, 64, 512, 4, 24),
    )),
    "small": Facility("small", (
        PartitionSpec("batch", 64, 64, 256, 0, 48),
        PartitionSpec("gpu", 8, 32, 256, 4, 24),
    )),
}


def one_pool(cores: int, name: str = "trace", nodes: int = 0) -> Facility:
    """One partition of an SWF trace's machine: ``cores`` (MaxProcs) on ``nodes``
    (MaxNodes) when they divide evenly, else on one-core nodes (all a header without
    MaxNodes says; the report then warns that its "nodes" are processors)."""
    if cores < 1:
        raise InvalidRequest(f"a facility needs at least one core, got {cores}")
    if 0 < nodes <= cores and cores % nodes == 0:
        per = cores // nodes
        return Facility(name, (PartitionSpec("batch", nodes, per, 4 * per, 0, 10_000),))
    return Facility(name, (PartitionSpec("batch", cores, 1, 4, 0, 10_000),))


def load(spec: str) -> Facility:
    """A preset's name or a TOML/JSON file of ``[[partition]]`` tables."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InvalidRequest(f"facility {spec!r} is neither a preset nor a file",
                             hint=f"use one of {', '.join(PRESETS)} or a TOML file of [[partition]] tables")
    try:
        raw = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise InvalidRequest(f"cannot read facility file {path}: {e}") from None
    parts = raw.get("partition") or raw.get("partitions") or []
    if not isinstance(parts, list) or not parts:
        raise InvalidRequest(f"facility file {path} has no [[partition]] tables")
    known = {f.name for f in fields(PartitionSpec)}
    out = []
    for i, p in enumerate(parts):
        extra = set(p) - known
        if extra:
            raise InvalidRequest(f"partition {i + 1} of {path}: unknown keys {sorted(extra)}",
                                 hint=f"known keys: {', '.join(sorted(known))}")
        try:
            part = PartitionSpec(**p)
        except TypeError as e:
            raise InvalidRequest(f"partition {i + 1} of {path}: {e}") from None
        if part.nodes < 1 or part.cores_per_node < 1 or part.gpus_per_node < 0 or part.max_walltime_h <= 0:
            raise InvalidRequest(f"partition {part.name!r}: nodes and cores_per_node must be at least 1, "
                                 "gpus_per_node at least 0, max_walltime_h above 0")
        out.append(part)
    return Facility(str(raw.get("name", path.stem)), tuple(out))
