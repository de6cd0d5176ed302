"""What no partition of a lane can ever run, every problem at once: a job that asks too
much walltime, CPUs, memory and GPUs hears all four in one refusal, each with the
nearest value that fits, and the refusal carries that nearest request (``nearest``, in
JobSpec's fields) so that ``plan_job`` can report it and check it in the same call
(issue 49: a 24 h 8-CPU 64 GB GPU request took three rounds, one problem per refusal)."""

from __future__ import annotations

from typing import Any, Sequence

from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec, format_duration
from corral.lanes.backend import Partition


def _target(spec: JobSpec, parts: Sequence[Partition]) -> tuple[Partition, list[str], dict[str, Any]]:
    """The partition the job would run in, and, when it has too few GPUs or too short a
    walltime for the job while another has both, that other one: a job that names no
    partition is moved (the agent asked for the time and the GPUs, not for the default
    partition); one that names it keeps it when another has the GPUs only (said with its
    alternatives). The other sizes are judged where the job goes."""
    named = next((p for p in parts if p.name == spec.partition), None)
    target = named or next((p for p in parts if p.default), parts[0])
    if spec.gpus <= target.max_gpus and (named or spec.walltime_s <= target.max_walltime_s):
        return target, [], {}
    fits = [p for p in parts if p.max_gpus >= spec.gpus and (named or p.max_walltime_s >= spec.walltime_s)]
    if not fits and not named:  # none runs that long with the GPUs: the GPUs decide
        fits = [p for p in parts if p.max_gpus >= spec.gpus]
    # the fewest GPUs that do: a job without GPUs is not sent to the GPU nodes
    alt = min(fits, key=lambda p: p.max_gpus, default=target)
    if alt is target or (named and spec.gpus <= target.max_gpus):
        return target, [], {}
    if spec.gpus > target.max_gpus:
        limit = f"ask for gpus <= {target.max_gpus}" if target.max_gpus else "set gpus to 0"
        why = (f"{spec.gpus} GPUs asked but partition {target.name!r} has nodes with {target.max_gpus}; "
               f"use partition {alt.name!r}, or {limit}")
    else:
        why = (f"walltime {format_duration(spec.walltime_s)} is over the limit of partition {target.name!r}, "
               f"{format_duration(target.max_walltime_s)}; ask for walltime <= "
               f"{format_duration(target.max_walltime_s)}, or use partition {alt.name!r} (max "
               f"{format_duration(alt.max_walltime_s)})")
    return alt, [why], {"partition": alt.name}


def misfits(spec: JobSpec, parts: Sequence[Partition]) -> tuple[list[str], dict[str, Any]]:
    """(each problem in the caller's terms, the nearest request that fits: the fields to
    change and their values); ([], {}) when the job fits its partition."""
    target, said, nearest = _target(spec, parts)
    where = f" in partition {target.name!r}" if len(parts) > 1 else ""  # one partition: no name to say
    if spec.cpus > target.max_cpus:
        said.append(f"{spec.cpus} CPUs asked but the largest node{where} has {target.max_cpus}; "
                    f"ask for cpus <= {target.max_cpus}")
        nearest["cpus"] = target.max_cpus
    if spec.memory_mb > target.max_memory_mb:
        said.append(f"{spec.memory_mb}M of memory asked but the largest node{where} has "
                    f"{target.max_memory_mb}M; ask for memory <= {target.max_memory_mb}M")
        nearest["memory_mb"] = target.max_memory_mb
    if spec.gpus > target.max_gpus:
        said.append(f"{spec.gpus} GPUs asked but the nodes{where} have {target.max_gpus}; "
                    + (f"ask for gpus <= {target.max_gpus}" if target.max_gpus else "set gpus to 0"))
        nearest["gpus"] = target.max_gpus
    if spec.walltime_s > target.max_walltime_s:
        longer = [p for p in parts if p.max_walltime_s >= spec.walltime_s and p.name != target.name]
        alt = (f", or use partition {longer[0].name!r} (max {format_duration(longer[0].max_walltime_s)})"
               if longer and "partition" not in nearest else "")
        said.append(f"walltime {format_duration(spec.walltime_s)} is over the limit{where}, "
                    f"{format_duration(target.max_walltime_s)}; ask for walltime <= "
                    f"{format_duration(target.max_walltime_s)}{alt}")
        nearest["walltime_s"] = target.max_walltime_s
    return said, nearest


def refuse_misfits(spec: JobSpec, parts: Sequence[Partition]) -> None:
    """Raise every problem of ``spec`` in one InvalidRequest, with its nearest request."""
    names = [p.name for p in parts]
    if spec.partition is not None and spec.partition not in names:
        # the nearest that fits: in the default partition where it can, else the fewest changes
        near = nearest_in(spec, sorted(parts, key=lambda p: not p.default), None)
        fix = fields_of(spec, spec.model_copy(update=near)) if near else {}
        e = InvalidRequest(f"unknown partition {spec.partition!r}; this facility has: {', '.join(names)}"
                           + (f"; nearest that fits: {', '.join(f'{k}={v}' for k, v in fix.items())}" if fix else ""))
        e.nearest = near
        raise e
    said, nearest = misfits(spec, parts)
    if said:
        e = InvalidRequest("; ".join(said))
        e.nearest = nearest
        raise e


class PlanRefused(Exception):
    """plan_job's every problem (message, hint, rule), and the nearest spec it reached."""

    def __init__(self, problems: list[dict[str, Any]], spec: JobSpec) -> None:
        super().__init__(problems[0]["message"])
        self.problems, self.spec = problems, spec


def fields_of(asked: JobSpec, nearest: JobSpec) -> dict[str, Any]:
    """What differs in ``nearest``, as submit_job's fields take it ('12:00:00', '64G')."""
    out: dict[str, Any] = {}
    if nearest.walltime_s != asked.walltime_s:
        out["walltime"] = format_duration(nearest.walltime_s)
    if nearest.memory_mb != asked.memory_mb:
        mb = nearest.memory_mb
        out["memory"] = f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"
    for key in ("cpus", "gpus", "partition", "tier", "cluster"):
        if getattr(nearest, key) != getattr(asked, key):
            out[key] = getattr(nearest, key)
    return out


def nearest_in(spec: JobSpec, parts: Sequence[Partition], asked: str | None) -> dict[str, Any] | None:
    """The nearest request that fits one of a cluster's partitions (``asked``: the one the
    job would take there): the fewest sizes changed (``changes``), the asked partition on a tie; None
    when none of its partitions is up. JobSpec's fields, with ``partition`` when another."""
    best: dict[str, Any] | None = None
    for p in sorted(parts, key=lambda p: p.name != asked):  # the asked partition first: it wins a tie
        if p.extra.get("state") not in (None, "UP"):
            continue
        _, near = misfits(spec.model_copy(update={"partition": p.name}), [p])
        if p.name != asked:
            near = {"partition": p.name, **near}
        if best is None or changes(near, spec) < changes(best, spec):
            best = near
    return best


def changes(near: dict[str, Any], spec: JobSpec) -> tuple[int, int, float]:
    """How far a nearest request is from ``spec``: the sizes changed first (the work needs
    them), then whether it goes elsewhere (another partition or cluster costs it nothing),
    then how much of the sizes asked it takes away (48 of 64 CPUs is nearer than 8)."""
    elsewhere = int("partition" in near) + int("cluster" in near)
    cut = sum((getattr(spec, k) - v) / max(1, getattr(spec, k)) for k, v in near.items()
              if k in ("cpus", "memory_mb", "gpus", "walltime_s"))
    return len(near) - elsewhere, elsewhere, cut
