"""What the core does with memory: advice (and refusal of an exact deterministic
repeat) on submit, episodes of ended jobs, notes, and the facility's facts. A part of
``Service``; the store itself is ``memory.store``."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..errors import Conflict, CorralError, InvalidRequest
from ..fastlane.bridge import PILOT_PRINCIPAL
from ..jobs import Job, JobSpec, JobState, parse_duration_s
from ..principals import Caller, Principal
from ..safety import guard
from ..safety.gate import job_resource, job_text

if TYPE_CHECKING:
    from ..backends import Backend, OutputPaths
    from ..config import Settings
    from ..db import Database
    from ..safety.gate import Gate
    from .facts import Facts
    from .store import Memory

log = logging.getLogger("corral.service")


class MemoryVerbs:
    """Mixed into ``Service``, which provides the attributes below."""

    settings: Settings
    db: Database
    backend: Backend
    gate: Gate
    memory: Memory | None
    facts: Facts

    if TYPE_CHECKING:
        def record(self, caller: Caller, action: str, decision: str, rule: str,
                   resources: list[dict[str, Any]]) -> None: ...

        def get_job(self, caller: Caller, job_id: int) -> Job: ...

        async def _check_spec(self, spec: JobSpec) -> None: ...

        def _output_paths(self, job: Job) -> OutputPaths: ...

    def _advise(self, principal: Principal, spec: JobSpec, index: int | None = None) -> list[str]:
        """What memory says of this submission; refuses an exact deterministic repeat."""
        if self.memory is None:
            return []
        advice, refuse = self.memory.advise(principal, spec)
        if refuse and self.settings.memory_refuse_repeats:
            where = f"job {index}: " if index is not None else ""
            raise Conflict(where + refuse, hint="set force (CLI --force, JSON \"force\": true) to run it anyway")
        # Advice quotes job output (error lines): guarded like any output handed to an agent.
        return [guard.scan(a, "memory advice").text for a in advice]

    def remember_outcomes(self, job_ids: list[int]) -> None:
        """Ended jobs become episodes (their failures' output read once, bounded)."""
        if self.memory is None:
            return
        from .store import read_tail

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
                    paths = self._output_paths(j)
                    text = read_tail((paths.stdout, paths.stderr))
                except CorralError:
                    text = ""
            items.append((j, p, text))
        if items:
            with self.db.transaction():
                self.memory.record(items)

    def _mem(self) -> Any:
        if self.memory is None:
            raise InvalidRequest("memory is turned off at this facility (memory = false)")
        return self.memory

    def remember(self, caller: Caller, text: str, scope: str = "user", expires: str | None = None,
                 job_id: int | None = None) -> dict[str, Any]:
        if job_id is not None:
            self.get_job(caller, job_id)  # provenance must be a job the author may see
        mem = self._mem()
        self.gate.check(caller, "write_note", "Note", {"scope": scope, "author": caller.name})
        note: dict[str, Any] = mem.remember(caller, text, scope, parse_duration_s(expires) if expires else None, job_id)
        self.record(caller, "write_note", "allow", "policy", [{"note_id": note["id"], "scope": scope,
                                                               "flags": note.get("flags")}])
        return note

    def recall(self, caller: Caller, query: str, k: int = 5) -> list[dict[str, Any]]:
        mem = self._mem()
        self.gate.check(caller, "read_notes", "Note", {"scope": "any", "author": ""}, audit_allow=True,
                        audit_resource={"query": query[:200]})
        notes: list[dict[str, Any]] = mem.recall(caller, query, k)
        flagged = [n["id"] for n in notes if n.get("flags", {}).get("suspected_injection") and n["author"] != caller.name]
        if flagged:
            self.gate.taint(caller, f"notes {flagged} by other principals are flagged as possible injection")
        return notes

    def promote_note(self, caller: Caller, note_id: int) -> dict[str, Any]:
        mem = self._mem()
        self.gate.check(caller, "manage", "Facility", audit_resource={"promote_note": note_id}, audit_allow=True)
        return mem.promote(caller, note_id)  # type: ignore[no-any-return]

    async def advice(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """What corral would say of this submission, without submitting it."""
        await self._check_spec(spec)
        self.gate.check(caller, "advice", "Job", job_resource(spec, caller.name), text=job_text(spec), audit_allow=True)
        advice, refuse = self._mem().advise(caller.principal, spec)
        return {"advice": advice, "would_refuse": refuse if self.settings.memory_refuse_repeats else None}

    async def facts_loop(self) -> None:
        """Harvest the facility facts at start and every ``facts_interval_s``."""
        from .facts import harvest

        while True:
            try:
                facts = await asyncio.to_thread(harvest, self.backend, self.settings.facility_paths,
                                                self.settings.facility_quotas)
                self.facts.update(facts)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler may be away: try again next time
                log.warning("facility facts not harvested: %s", e)
            await asyncio.sleep(self.settings.facts_interval_s)
