"""A contained job's egress to a host off the allow-list, asked of the facility policy and,
where a rule says so (``@ask("sponsor")`` on a forbid of ``egress``), of the sponsor
(issue 51 item 3; docs/decisions/0061-egress-approvals.md).

The egress proxy refuses the connection at once, with the reason, and files an ask
(corral/sandbox/egress_grants.py); this loop, on every gateway process beside its own
proxy, reads each, checks the job's credential (its HMAC: a forged or replayed one names
no running job), and asks the policy as the job's principal, for a ``Destination``
(host, port, job, owner). A rule that asks makes an approval (gateway/approvals.py: the
sponsor notified with a single-use link, the agent told in its ledger, expiry); a sponsor's
approval ahead for the session grants at once; anything else stays refused, audited.
Each round it writes the decisions of running jobs for the proxy, so a grant opens within
a round (``SWEEP_S``) of the approval and closes within one of the job's end.

The connection is refused, not held: proxy.py decides in its event loop, which a wait for
a person would stall for every job; the job retries after the approval, told so by the
proxy's answer and by its agent's ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.destinations import own_machine
from corral.core.errors import ApprovalPending, CorralError
from corral.core.principals import Caller
from corral.gateway.approvals import EGRESS_GRANT_S
from corral.sandbox import egress_grants as grants

if TYPE_CHECKING:
    from corral.gateway.service import Service
    from corral.safety.job_credentials import EgressCredentials

log = logging.getLogger(__name__)

SWEEP_S = 0.5
"""How often the asks are read and the decisions written."""
ASKS_PER_JOB = 16
"""Hosts off the list one job may ask for; more are refused without asking anyone."""
RESOLVE_S = 5.0


async def resolved(host: str, port: int) -> list[str]:
    """The addresses ``host`` has now (what the sponsor is shown and the grant holds), none of
    the gateway's own machine; resolved off the event loop, within ``RESOLVE_S``."""
    try:
        found = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                       RESOLVE_S)
    except (OSError, UnicodeError, asyncio.TimeoutError):
        return []
    return sorted({str(i[4][0]) for i in found} - {a for a in (str(i[4][0]) for i in found) if own_machine(a)})


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


class EgressAsks:
    def __init__(self, service: "Service", directory: Path, creds: "EgressCredentials",
                 grant_s: float = EGRESS_GRANT_S) -> None:
        self.service, self.directory, self.creds, self.grant_s = service, directory, creds, grant_s
        self.refused: dict[tuple[int, str, int], dict[str, Any]] = {}
        """What the policy refused outright, by (job, host, port): the proxy says why."""
        self.asks: dict[int, int] = {}
        """Destinations each running job asked for (``ASKS_PER_JOB``)."""
        self._written: str | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("egress asks: a round failed")
            await asyncio.sleep(SWEEP_S)

    async def sweep(self) -> None:
        for ask in grants.read_asks(self.directory):
            if self.creds.check(ask["credential"]) == ask["job"]:  # resolved only for a real job's ask
                ask["addresses"] = await resolved(ask["host"], ask["port"])
                self.consider(ask)
            else:
                log.info("egress asks: an ask naming job %s with a forged credential, dropped", ask["job"])
        self.publish()

    # -- an ask ------------------------------------------------------------------------------
    def consider(self, ask: dict[str, Any]) -> None:
        """``ask`` (its credential checked, ``addresses`` the host's now) asked of the policy."""
        s = self.service
        job_id = self.creds.check(ask["credential"])
        job = s.db.get_job(job_id) if job_id is not None and job_id == ask["job"] else None
        p = s.db.get_principal(job.principal) if job is not None and not job.state.terminal else None
        if job is None or p is None:  # forged, or of a job that has ended: nothing to ask (nor recorded:
            # a forger naming a running job must not settle that job's own ask)
            log.info("egress asks: an ask naming job %s with no running job's credential (%s), dropped", ask["job"],
                     "forged" if job_id is None else job.state.value if job is not None else "no such job")
            return
        host, port = ask["host"].lower().rstrip("."), int(ask["port"])
        addresses = list(ask["addresses"][:16])
        self.asks[job.id] = self.asks.get(job.id, 0) + 1
        if self.asks[job.id] > ASKS_PER_JOB:  # a job that sprays names: neither the sponsor nor the audit flooded
            self._refuse(job.id, host, port, f"refused: this job asked for more than {ASKS_PER_JOB} hosts off the "
                                             "list; the rest are refused without asking")
            return
        caller = Caller(p, job.session, f"job-{job.id}", frozenset([p.name]))
        args = {"job_id": job.id, "host": host, "port": port, "addresses": addresses,
                "_cred": grants.digest(ask["credential"])}
        summary = (f"job {job.id}: egress to {host}:{port} ({', '.join(addresses) or 'does not resolve'}), "
                   "not on the allow-list")
        resource = {"id": f"{host}:{port}", "host": host, "port": port, "job": job.id, "owner": p.name}
        try:
            with s.approvals.asking(caller, "egress", args, summary):
                rule = s.gate.check(caller, "egress", "Destination", resource)
        except ApprovalPending as e:
            self._tell(p.name, job.id, f"approval:{e.approval['id']}:asked",
                       f"job {job.id} asked to reach {host}:{port}, not on the allow-list: waiting for approval "
                       f"#{e.approval['id']} by {e.approval['sponsor']} until {_when(e.approval['expires'])} "
                       f"(rule {e.approval['rule']}); the job may connect once they approve, and you are told either way")
            return
        except CorralError as e:
            s.audit.record(caller, "egress", "deny", getattr(e, "rule", None) or "policy",
                           [{"job": job.id, "host": host, "port": port}])
            self._refuse(job.id, host, port, f"refused: {e.message}")
            return
        if ":approved-ahead-by-" in rule:
            self._grant_ahead(caller, rule, args, summary)
        else:  # a permit opens nothing: the allow-list is the site's, and only a sponsor's approval adds to it
            self._refuse(job.id, host, port, "ask the admin to add it to [sandbox] allow_hosts")

    def _refuse(self, job: int, host: str, port: int, why: str) -> None:
        self.refused[(job, host, port)] = {"job": job, "host": host, "port": port, "state": "refused", "why": why}

    def _grant_ahead(self, caller: Caller, rule: str, args: dict[str, Any], summary: str) -> None:
        """Approved ahead for the agent's session: recorded as an approval decided by who
        approved it ahead, and granted now."""
        db, now = self.service.db, time.time()
        base, _, by = rule.partition(":approved-ahead-by-")
        p = caller.principal
        aid = db.approvals.add(p.name, p.sponsor or by, caller.session, "egress", base, [args["job_id"]], summary, now,
                               now, hashlib.sha256(secrets.token_bytes(16)).hexdigest(), args)
        db.approvals.decide(aid, "approved", by, now, "approved ahead for the session")
        db.approvals.claim(aid, now)
        outcome = (f"done: job {args['job_id']} may reach {args['host']}:{args['port']} until it ends, at most until "
                   f"{_when(now + self.grant_s)} (approved ahead by {by})")
        db.approvals.finish(aid, outcome)
        self.service.audit.record(caller, "egress", "allow", rule, [{"approval": aid, "job": args["job_id"],
                                                                     "host": args["host"], "port": args["port"]}])
        self._tell(p.name, args["job_id"], f"approval:{aid}:approved", f"approval #{aid} ({summary}): {outcome}")

    def _tell(self, principal: str, job: int, key: str, text: str) -> None:
        self.service.db.ledger.add([(key, principal, "approval", job, text[:500], time.time())])

    # -- what the proxy reads ----------------------------------------------------------------
    def publish(self) -> None:
        """The decisions of running jobs, for the proxy; written only when they change."""
        db, now = self.service.db, time.time()
        rows = db.approvals.of_action("egress", now - self.service.approvals.wait_s - self.grant_s)
        asked = {r["jobs"][0] for r in rows} | {k[0] for k in self.refused} | set(self.asks)
        live = {j.id for j in db.get_jobs(sorted(asked)).values() if not j.state.terminal}
        self.refused = {k: v for k, v in self.refused.items() if k[0] in live}
        self.asks = {k: v for k, v in self.asks.items() if k in live}
        out: dict[tuple[int, str, int], dict[str, Any]] = {}
        for r in rows:  # newest first: a job's latest ask of a host is the one that holds
            a = r["args"] or {}
            key = (int(r["jobs"][0]), str(a.get("host")), int(a.get("port", 0)))
            if key[0] in live and key not in out:
                out[key] = self._entry(r, a, key)
        entries = [*out.values(), *(v for k, v in self.refused.items() if k not in out)]
        text = json.dumps(entries, sort_keys=True)
        if text != self._written:
            grants.write_decisions(self.directory, entries)
            self._written = text

    def _entry(self, r: dict[str, Any], a: dict[str, Any], key: tuple[int, str, int]) -> dict[str, Any]:
        state, until = r["state"], float(r["expires"])
        why = None
        if state == "approved" and (r["outcome"] or "").startswith("done"):
            until = float(r["decided_at"]) + self.grant_s
        elif state == "approved" and r["outcome"] is None:  # approved, being carried out: waiting, for a moment
            state = "pending"
        elif state == "approved":  # carried out, and not done (the gateway stopped in between)
            state, why = "void", r["outcome"]
        elif state == "declined":
            why = f"declined by {r['decided_by']}" + (f": {r['note']}" if r["note"] else "")
        elif state == "expired":
            why = f"approval #{r['id']} by {r['sponsor']} expired unanswered"
        elif state == "void":
            why = r["outcome"]
        return {"job": key[0], "host": key[1], "port": key[2], "cred": a.get("_cred"),
                "addresses": a.get("addresses") or [], "state": state, "approval": r["id"], "sponsor": r["sponsor"],
                "until": until, "when": _when(until), "why": why}
