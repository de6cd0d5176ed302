"""The sponsor's own view (issue 51 item 4): what their agents ran, used and were refused,
and what waits for their answer; ``corral sponsor`` and GET /v1/sponsor. A person sees
their own agents; an admin names any sponsor."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from corral.core.errors import Forbidden, InvalidRequest
from corral.core.principals import Caller, Kind

if TYPE_CHECKING:
    from corral.core.db import Database

log = logging.getLogger(__name__)


class SponsorView:
    def __init__(self, db: "Database") -> None:
        self.db = db

    def on_deny(self, records: list[dict[str, Any]]) -> None:
        """The audit's listener: each refusal counted for its agent, rule and day."""
        try:
            now = time.time()
            for r in records:
                if r.get("kind") == "agent":
                    self.db.sponsor.count_refusal(str(r.get("principal")), str(r.get("rule")), int(now // 86400), now,
                                                  str(r.get("reason", "")))
        except Exception:  # noqa: BLE001 - a count must never fail the refused request's answer
            log.exception("sponsor view: could not count a refusal")

    def view(self, caller: Caller, days: float = 7.0, sponsor: str | None = None) -> dict[str, Any]:
        if not 0 < days <= 366:
            raise InvalidRequest("days must be between 0 and 366")
        me = caller.principal
        who = sponsor or me.name
        if who != me.name and not me.is_admin:
            raise Forbidden("you see your own agents only", hint="leave out the sponsor")
        if who == me.name and me.kind != Kind.HUMAN and not me.is_admin:
            raise Forbidden("the sponsor's view is for the people who answer for agents",
                            hint="your own jobs: list_jobs; your budget: budget")
        agents = self.db.sponsored_by(who)
        now = time.time()
        per: dict[str, dict[str, Any]] = {a: {"agent": a, "jobs": {}, "cpu_hours": 0.0, "refusals": [],
                                              "waiting": 0} for a in agents}
        if agents:
            for row in self.db.sponsor.ran(agents, now - days * 86400, now):
                a = per[row["principal"]]
                a["jobs"][row["state"]] = row["jobs"]
                a["cpu_hours"] = round(a["cpu_hours"] + row["cpu_hours"], 4)
            for row in self.db.sponsor.refusals(agents, int((now - days * 86400) // 86400)):
                per[row["principal"]]["refusals"].append({k: row[k] for k in ("rule", "count", "last_reason")})
        pending = [r for r in self.db.approvals.listing([who], "pending", 200) if r["sponsor"] == who]
        counts: dict[str, int] = defaultdict(int)
        for r in pending:
            counts[r["principal"]] += 1
        for name, n in counts.items():
            if name in per:
                per[name]["waiting"] = n
        return {"sponsor": who, "days": days, "agents": list(per.values()),
                "approvals": [{k: r[k] for k in ("id", "principal", "rule", "jobs", "summary", "expires")}
                              for r in pending]}
