"""The notification verbs (``service.notify``): a person's own choices, and those of the
agents they sponsor; what was sent to them; a test notification.

Who may choose: a person for themselves and for the agents they answer for, an admin for
anyone. An agent may read its own choices but not change them: where it is told, and
what, is its sponsor's decision (a webhook is a way out of the facility).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from corral.core.config import NotifySettings
from corral.core.errors import Forbidden, InvalidRequest, NotFound
from corral.core.principals import Caller, Kind
from corral.notify.notifier import Notifier
from corral.notify.prefs import checked, effective

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from corral.core.db import Database
    from corral.lanes.backend import SubmitContext
    from corral.safety.audit import Audit


class NotifyVerbs:
    def __init__(self, site: NotifySettings, db: "Database", audit: "Audit", notifier: Notifier) -> None:
        self.site, self.db, self.audit, self.notifier = site, db, audit, notifier

    def _whose(self, caller: Caller, name: str | None, change: bool) -> str:
        name = name or caller.name
        p = self.db.get_principal(name)
        me = caller.principal
        if p is None:  # to a non-admin, one answer for missing and not theirs
            if me.is_admin:
                raise NotFound(f"no principal {name!r}")
            raise Forbidden(f"you do not sponsor {name!r}", hint="choose for yourself or for the agents you sponsor")
        if me.is_admin or (name == me.name and (me.kind == Kind.HUMAN or not change)):
            return name
        if me.kind == Kind.HUMAN and p.sponsor == me.name:
            return name
        if name == me.name:
            raise Forbidden("an agent's notifications are chosen by its sponsor",
                            hint=f"ask your sponsor ({me.sponsor or 'the person who answers for you'}) to set them")
        raise Forbidden(f"you do not sponsor {name!r}", hint="choose for yourself or for the agents you sponsor")

    def show(self, caller: Caller, principal: str | None = None) -> dict[str, Any]:
        name = self._whose(caller, principal, change=False)
        mine = self.db.notifications.prefs(name)
        return {"principal": name, "chosen": mine or {}, "effective": effective(mine, self.site).model_dump(),
                "channels_available": ["webhook"] + (["email"] if self.site.smtp_host else []),
                "webhook_hosts": list(self.site.webhook_hosts)}

    def choose(self, caller: Caller, body: dict[str, Any], principal: str | None = None) -> dict[str, Any]:
        """Replace the choices given (a field left out keeps its value; null resets it to
        the site's default)."""
        name = self._whose(caller, principal, change=True)
        merged = {**(self.db.notifications.prefs(name) or {}), **body}
        prefs = checked(merged, self.site).model_dump(exclude_none=True, exclude_defaults=True)
        self.db.notifications.set_prefs(name, prefs, self.notifier.now())
        self.audit.record(caller, "manage", "allow", "policy", [{"notify_prefs": name, "fields": sorted(body)}])
        return self.show(caller, name)

    def sent(self, caller: Caller, principal: str | None = None, limit: int = 50) -> dict[str, Any]:
        """The newest notifications to ``principal`` (the caller), each with its state."""
        if not 1 <= limit <= 500:
            raise InvalidRequest("limit must be between 1 and 500")
        name = self._whose(caller, principal, change=False)
        rows = self.db.notifications.recent(name, limit)
        keep = ("id", "kind", "about", "channel", "subject", "created", "state", "sent", "attempts", "error")
        return {"principal": name, "notifications": [{k: r[k] for k in keep} for r in rows]}

    def ledger(self, caller: Caller, limit: int = 20, read_job: int | None = None) -> dict[str, Any]:
        """What the caller was told and has not acknowledged (``read_job``: a job it just
        read by id, acknowledged first)."""
        if read_job is not None:
            self.db.ledger.ack_job(caller.name, read_job, self.notifier.now())
        items, total = self.db.ledger.unacked(caller.name, limit)
        return {"unacked": items, "total": total}

    def ack(self, caller: Caller, up_to: int) -> dict[str, Any]:
        n = self.db.ledger.ack(caller.name, up_to, self.notifier.now())
        return {"acked": n, "left": self.db.ledger.unacked(caller.name, 1)[1]}

    def slurm_mail(self, ctx: "SubmitContext") -> tuple[str, str] | None:
        """Slurm's --mail-user and --mail-type for a job about to be sent (the Slurm lane
        asks, corral/lanes/slurm/script.py): its sponsor's choice for an agent's job, the
        person's own for theirs; None: no mail."""
        if not self.site.slurm_mail:
            return None
        who = ctx.sponsor if ctx.kind == Kind.AGENT.value and ctx.sponsor else ctx.principal
        try:
            return effective(self.db.notifications.prefs(who), self.site).slurm()
        except Exception:  # noqa: BLE001 - a job is sent without mail rather than not at all
            log.exception("notify: Slurm mail of job %s", ctx.job_id)
            return None

    def test(self, caller: Caller, principal: str | None = None) -> dict[str, Any]:
        name = self._whose(caller, principal, change=True)
        eff = effective(self.db.notifications.prefs(name), self.site)
        if not eff.channels():
            raise InvalidRequest(f"{name} has no way to be reached", hint="set an email or a webhook first "
                                 "(corral notify set --webhook URL)")
        return {"principal": name, "queued": self.notifier.test(name, eff)}
