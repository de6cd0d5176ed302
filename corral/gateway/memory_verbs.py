"""What the core does with memory: advice (and refusal of an exact deterministic
repeat) on submit, episodes of ended jobs, notes, and the facility's facts. An object
the service holds (``service.memory``); the store itself is ``memory.store``."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from corral.core.errors import Conflict, CorralError, InvalidRequest
from corral.core.text import text_problem
from corral.core.jobs import JobSpec, JobState, no_job, parse_duration_s
from corral.core.principals import PILOT_PRINCIPAL, Caller, Principal
from corral.gateway.approvals import Asking, not_asking
from corral.safety import guard

if TYPE_CHECKING:
    from corral.core.config import MemorySettings
    from corral.core.db import Database
    from corral.lanes.registry import Lanes
    from corral.safety.audit import Audit
    from corral.safety.gate import Gate
    from corral.memory.facts import Facts
    from corral.memory.semantic import SemanticRecall
    from corral.memory.store import Memory

log = logging.getLogger("corral.gateway.service")

SEMANTIC_DEPTH = 200
"""Nearest notes asked of the semantic index, before those the caller may not read are
left out (recall by words looks as far as it must; by meaning this far)."""


class MemoryVerbs:
    def __init__(self, settings: "MemorySettings", db: "Database", gate: "Gate", audit: "Audit", lanes: "Lanes",
                 facts: "Facts", store: "Memory | None", semantic: "SemanticRecall | None" = None) -> None:
        self.settings, self.db, self.gate, self.audit, self.lanes = settings, db, gate, audit, lanes
        self.facts, self.store, self.semantic = facts, store, semantic
        self.asking: Asking = not_asking
        """Where a rule that asks the sponsor holds a note (ApprovalVerbs.asking, set at assembly)."""

    async def prepare(self, spec: JobSpec) -> None:
        """The costly part of ``advise`` for a long text, done off the event loop."""
        if self.store is not None:
            from corral.memory.store import prepare

            await prepare(spec)

    def advise(self, principal: Principal, spec: JobSpec, index: int | None = None) -> list[str]:
        """What memory says of this submission; refuses an exact deterministic repeat."""
        if self.store is None:
            return []
        advice, refuse = self.store.advise(principal, spec)
        if refuse and self.settings.refuse_repeats:
            where = f"job {index}: " if index is not None else ""
            raise Conflict(where + refuse, hint="set force (CLI --force, JSON \"force\": true) to run it anyway")
        # Advice quotes job output (error lines): guarded like any output handed to an agent.
        return [guard.scan(a, "memory advice").text for a in advice]

    def runtimes(self, principal: Principal, spec: JobSpec, n: int) -> list[tuple[int, float]]:
        """What this script's last ``n`` successful runs took (job id, seconds), newest
        first; [] when memory is off (corral/lanes/placement.py tightens walltimes from it)."""
        return self.store.runtimes(principal, spec, n) if self.store is not None else []

    def remember_outcomes(self, job_ids: list[int]) -> None:
        """Ended jobs become episodes (their failures' output read once, bounded)."""
        if self.store is None:
            return
        from corral.memory.store import read_tail

        jobs = [j for j in self.db.get_jobs(list(job_ids)).values() if j.terminal and j.principal != PILOT_PRINCIPAL]
        principals: dict[str, Principal | None] = {}
        items = []
        for j in jobs:
            if j.principal not in principals:
                principals[j.principal] = self.db.get_principal(j.principal)
            p = principals[j.principal]
            if p is None:
                continue
            text = ""
            if j.state is not JobState.COMPLETED and j.backend_id:
                try:
                    paths = self.lanes[j.backend].output_paths(j.backend_id)
                    text = read_tail((paths.stdout, paths.stderr))
                except (CorralError, KeyError):  # KeyError: its lane is not offered any more
                    text = ""
            items.append((j, p, text))
        if items:
            with self.db.transaction():
                self.store.record(items)

    def _mem(self) -> "Memory":
        if self.store is None:
            raise InvalidRequest("memory is turned off at this facility (memory = false)")
        return self.store

    def remember(self, caller: Caller, text: str, scope: str = "user", expires: str | None = None,
                 job_id: int | None = None) -> dict[str, Any]:
        with self.audit.refusals(caller, "write_note", {"scope": scope}):
            if problem := text_problem(text, "text"):  # the MCP tool's and CLI's way in, as well as HTTP's
                raise InvalidRequest(problem)
            if job_id is not None:  # provenance must be a job the author may see
                job = self.db.get_job(job_id)
                if job is None or not caller.sees(job.principal):
                    raise no_job(job_id)
            mem = self._mem()
            with self.asking(caller, "write_note", {"text": text, "scope": scope, "expires": expires, "job_id": job_id},
                             f"write a note for scope {scope}: {text[:80]!r}"):
                rule = self.gate.check(caller, "write_note", "Note", {"scope": scope, "author": caller.name})
            try:
                ttl = parse_duration_s(expires, "expiry") if expires else None
            except ValueError as e:
                raise InvalidRequest(f"{e} (for example '30d' or '12h'; leave it out to keep the note)") from None
            with self.db.transaction():  # the note and its record together, or neither (a full disk)
                note: dict[str, Any] = mem.remember(caller, text, scope, ttl, job_id)
                self.audit.record(caller, "write_note", "allow", rule, [{"note_id": note["id"], "scope": scope,
                                                                         "flags": note.get("flags")}])
        if self.semantic is not None:
            self.semantic.wake()
        return note

    async def recall(self, caller: Caller, query: str, k: int = 5) -> list[dict[str, Any]]:
        with self.audit.refusals(caller, "read_notes", {"query": query[:200]}):
            mem = self._mem()
            rule = self.gate.check(caller, "read_notes", "Note", {"scope": "any", "author": ""})
        self.audit.record(caller, "read_notes", "allow", rule, [{"query": query[:200]}])
        # The query's embedding and the vector search run in a worker thread (3-10 ms).
        near = await self.semantic.nearest(query, SEMANTIC_DEPTH) if self.semantic is not None else None
        notes: list[dict[str, Any]] = mem.recall(caller, query, k, near)
        flagged = [n["id"] for n in notes if n.get("flags", {}).get("suspected_injection") and n["author"] != caller.name]
        if flagged:
            reason = f"notes {flagged} by other principals are flagged as possible injection"
            if self.gate.taint(caller, reason):
                self.audit.record(caller, "taint", "allow", "guard", [{"reason": reason[:200]}])
        return notes

    def promote_note(self, caller: Caller, note_id: int) -> dict[str, Any]:
        with self.audit.refusals(caller, "manage", {"promote_note": note_id}):
            mem = self._mem()
            rule = self.gate.check(caller, "manage", "Facility")
            promoted: dict[str, Any] = mem.promote(caller, note_id)
        self.audit.record(caller, "manage", "allow", rule, [{"promote_note": note_id}])
        return promoted

    def would_say(self, principal: Principal, spec: JobSpec) -> dict[str, Any]:
        """Advice on a submission not made (``Service.advice`` checks it first)."""
        advice, refuse = self._mem().advise(principal, spec)
        return {"advice": advice, "would_refuse": refuse if self.settings.refuse_repeats else None}

    async def index_loop(self) -> None:
        """Embed notes as they are written (off every request's path)."""
        if self.semantic is not None:
            await self.semantic.run()

    async def facts_loop(self) -> None:
        """Harvest the facility facts at start and every ``facts_interval_s``."""
        from corral.memory.facts import harvest

        while True:
            try:
                facts = await asyncio.to_thread(harvest, self.lanes.batch.backend, self.settings.facility_paths,
                                                self.settings.facility_quotas)
                self.facts.update(facts)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler may be away: try again next time
                log.warning("facility facts not harvested: %s", e)
            await asyncio.sleep(self.settings.facts_interval_s)
