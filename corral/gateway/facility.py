"""The facility card: what ``facility`` answers (partitions and their limits, queue
pressure, the sandbox, the lanes beside the batch lane, memory's recall and facts, and
for a caller who it is, its jobs, budgets, storage and taint). A read of the service's
parts; it changes nothing."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.jobs import JobState
from corral.core.principals import Caller
from corral.safety.gate import budgets

if TYPE_CHECKING:
    from corral.control.reconciler import Reconciler
    from corral.core.db import Database
    from corral.gateway.memory_verbs import MemoryVerbs
    from corral.gateway.storage_verbs import StorageVerbs
    from corral.lanes.registry import Lanes
    from corral.safety.gate import Gate
    from corral.sandbox.bwrap import Sandbox
    from corral.sandbox.egress import Egress


class Parts(Protocol):
    """The service's parts the card reads (gateway/service.py's ``Service`` has them):
    named here so that the card need not import the service that calls it."""

    db: "Database"
    lanes: "Lanes"
    reconciler: "Reconciler"
    gate: "Gate"
    memory: "MemoryVerbs"
    storage: "StorageVerbs"
    sandbox: "Sandbox | None"
    egress: "Egress | None"


async def facility_card(service: Parts, caller: Caller | None) -> dict[str, Any]:
    """Partitions, limits and queue pressure; with a caller, also who it is and its usage."""
    parts = await asyncio.to_thread(service.lanes.batch.partitions)  # may ask the scheduler once
    counts = service.db.count_jobs()
    info: dict[str, Any] = {
        "backend": service.lanes.batch.name,
        "partitions": [
            {"name": p.name, "default": p.default, "max_cpus": p.max_cpus, "max_memory_mb": p.max_memory_mb,
             "max_gpus": p.max_gpus, "max_walltime_s": p.max_walltime_s,
             **({"nodes": p.extra["nodes"]} if p.extra.get("nodes") else {}),
             **({"state": p.extra["state"]} if p.extra.get("state") else {}),
             **({"min_memory_mb": p.extra["min_memory_mb"]} if p.extra.get("min_memory_mb") else {}),
             **({"node_cpus": p.extra["node_cpus"]} if p.extra.get("node_cpus") else {}),
             **({"min_job_age_s": p.extra["min_job_age_s"]} if p.extra.get("min_job_age_s") else {})}
            for p in parts
        ],
        "queue": {"pending": counts.get("PENDING", 0), "running": counts.get("RUNNING", 0)},
        "degraded": service.reconciler.degraded,
        "sandbox": ({"kinds": sorted(service.sandbox.kinds), "network": service.sandbox.network,
                     "available": service.sandbox.why_not is None, "why_not": service.sandbox.why_not,
                     "pids_max": service.sandbox.pids_max, "contains": [lane.name for lane in service.lanes],
                     "allow_hosts": service.egress.allow if service.egress else []}
                    if service.sandbox is not None else {"kinds": [], "contains": []}),
    }
    if caller is not None and service.sandbox is not None and service.sandbox.applies(caller.principal.kind.value):
        info["sandbox"]["you"] = (f"your jobs and tasks run contained: the host read-only, writable only the "
                                  "job's working and output directories and a private /tmp, credentials hidden, "
                                  f"at most {service.sandbox.pids_max} processes, never as root"
                                  + ("" if service.sandbox.network else
                                     f", no network but {', '.join(service.egress.allow)} through the proxy at "
                                     "$https_proxy" if service.egress else ", no network"))
    for lane in service.lanes:
        if lane is not service.lanes.batch:
            info[f"{lane.name}_lane"] = lane.describe()
    if service.memory.store is not None:
        info["memory"] = {"recall": service.memory.semantic.status() if service.memory.semantic is not None
                          else {"semantic": False, "why": "[memory] semantic = false"}}
    facts = service.memory.facts.current()
    info["facts"] = {"version": facts["version"], "updated": facts["updated"], "changes": facts["changes"],
                     "modules": (facts["facts"].get("modules") or [])[:200],
                     "filesystems": facts["facts"].get("filesystems", {})}
    if caller is not None:
        mine = service.db.list_jobs(caller.visible, [JobState.PENDING, JobState.RUNNING], limit=1000)
        info["you"] = {"principal": caller.name, "kind": caller.principal.kind.value,
                       "sponsor": caller.principal.sponsor, "session": caller.session, "active_jobs": len(mine),
                       "usage": service.db.usage([caller.name]),
                       "budgets": (found := budgets(service.gate.store, caller.cap)),
                       "budgets_note": None if found else "this token carries no budgets or caps"}
        info["storage"] = service.storage.facility(caller)
        taint = service.gate.taint_of(caller)
        info["you"]["tainted"] = taint[1] if taint else None
        if taint:
            info["you"]["tainted_note"] = ("this token read content flagged as prompt injection; whatever session "
                                           "it sends, the facility policy narrows what it may do (by default: no "
                                           "GPUs, at most 4 CPUs and 1 h per job, no shared notes) until its "
                                           f"sponsor runs 'corral token clear-taint {taint[0] or caller.token_id}'")
    return info
