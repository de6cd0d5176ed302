"""What a person chose to be told, and how, over the site's defaults."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.core.errors import InvalidRequest

if TYPE_CHECKING:  # the edges import Prefs as an input model: nothing heavy at import
    from corral.core.config import NotifySettings

_QUIET = re.compile(r"^([01]?\d|2[0-3])-([01]?\d|2[0-3])$")
_EMAIL = re.compile(r"^[^@\s<>,;\"']{1,64}@[A-Za-z0-9.-]{1,253}$")
_SLURM_MAIL = re.compile(r"[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9.-]{1,253}")
"""An address Slurm's --mail-user takes as one word (corral-submit's pattern too)."""


class Prefs(BaseModel):
    """One person's choices (the body of PUT /v1/notify): a field left out keeps its
    value, an empty address removes it; a choice never made takes the site's default."""

    model_config = ConfigDict(extra="forbid")

    email: str | None = Field(None, max_length=320, description="Where email notifications go.")
    webhook: str | None = Field(None, max_length=2000, description="An https:// (or http://) URL to POST to.")
    webhook_format: Literal["generic", "ntfy", "slack"] = Field(
        "generic", description="The body a webhook gets: corral's JSON, ntfy's, or a Slack/Mattermost incoming webhook's.")
    jobs: Literal["all", "failures", "none"] | None = None
    budget: bool | None = None
    denials: bool | None = None
    idle: bool | None = Field(None, description="Told when an agent's running job holds its allocation idle.")
    quiet_hours: str | None = Field(None, description="'HH-HH' (local time of the gateway), or 'off'.")
    digest: bool | None = None
    slurm_mail: bool | None = Field(None, description="On the Slurm lane, also Slurm's own mail of the jobs "
                                    "(to email; where the site offers it: [notify] slurm_mail).")


class Effective(BaseModel):
    """The choices in force: the person's, else the site's."""

    email: str | None
    webhook: str | None
    webhook_format: str
    jobs: str
    budget: bool
    denials: bool
    quiet_hours: str | None
    digest: bool
    idle: bool = True
    slurm_mail: bool = False

    def slurm(self) -> tuple[str, str] | None:
        """Slurm's --mail-user and --mail-type for this person's jobs, if they chose its mail."""
        if not self.slurm_mail or not self.email or self.jobs == "none" or not _SLURM_MAIL.fullmatch(self.email):
            return None
        return self.email, "END" if self.jobs == "all" else "FAIL"

    def channels(self) -> list[tuple[str, str]]:
        """(channel, target) of every way this person is reached."""
        out = [("email", self.email)] if self.email else []
        return out + ([(f"webhook:{self.webhook_format}", self.webhook)] if self.webhook else [])

    def quiet_until(self, now: float) -> float | None:
        """The end of the quiet hours ``now`` falls in, or None."""
        if not self.quiet_hours:
            return None
        start, end = (int(x) for x in self.quiet_hours.split("-"))
        local = time.localtime(now)
        hour = local.tm_hour
        inside = (start <= hour < end) if start < end else (hour >= start or hour < end)
        if not inside or start == end:
            return None
        midnight = now - (local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec)
        until = midnight + end * 3600
        return until if until > now else until + 86400


def checked(body: dict[str, Any], site: NotifySettings) -> Prefs:
    """``body`` as choices, or InvalidRequest naming what is wrong and what to give."""
    try:
        prefs = Prefs.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise InvalidRequest(f"notification choices: {where}: {first['msg']}",
                             hint="fields: email, webhook, webhook_format (generic|ntfy|slack), jobs "
                                  "(all|failures|none), budget, denials, idle, quiet_hours ('22-07' or 'off'), digest, "
                                  "slurm_mail") from None
    if prefs.email is not None and prefs.email and not _EMAIL.fullmatch(prefs.email):
        raise InvalidRequest(f"email {prefs.email!r} is not an address", hint="give name@host")
    if prefs.email and not site.smtp_host:
        raise InvalidRequest("this facility sends no email (its [notify] smtp_host is unset)",
                             hint="use a webhook, or ask the facility's admins to set [notify] smtp_host")
    if prefs.quiet_hours not in (None, "off") and not _QUIET.fullmatch(prefs.quiet_hours or ""):
        raise InvalidRequest(f"quiet_hours {prefs.quiet_hours!r} is not 'HH-HH'", hint="for example '22-07', or 'off'")
    if prefs.webhook:
        _check_webhook(prefs.webhook, site)
    if prefs.slurm_mail and not site.slurm_mail:
        raise InvalidRequest("this facility does not offer Slurm's own mail ([notify] slurm_mail is off)",
                             hint="corral's own email and webhooks tell you of job ends")
    if prefs.slurm_mail and not (prefs.email and _SLURM_MAIL.fullmatch(prefs.email)):
        raise InvalidRequest("Slurm's mail needs your email, letters, digits and ._+- before the @",
                             hint="set email too: corral notify set --email you@host --slurm-mail")
    return prefs


def _check_webhook(url: str, site: NotifySettings) -> None:
    from corral.sandbox.egress import allowed
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidRequest(f"webhook {url!r} is not an http(s) URL", hint="give https://host/path")
    if parts.username or parts.password:
        raise InvalidRequest("a webhook URL may not carry a user or password", hint="put a secret in its path instead")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not allowed(parts.hostname, port, site.webhook_hosts):
        shown = ", ".join(site.webhook_hosts) or "none"
        raise InvalidRequest(f"webhooks to {parts.hostname}:{port} are not allowed here (allowed: {shown})",
                             hint="use one of the allowed hosts, or ask the facility's admins to add yours "
                                  "to [notify] webhook_hosts")


def effective(mine: dict[str, Any] | None, site: NotifySettings) -> Effective:
    p = Prefs.model_validate(mine or {})
    quiet = site.quiet_hours if p.quiet_hours is None else (None if p.quiet_hours == "off" else p.quiet_hours)
    return Effective(email=p.email or None, webhook=p.webhook or None, webhook_format=p.webhook_format,
                     jobs=p.jobs or site.jobs, budget=site.budget if p.budget is None else p.budget,
                     denials=site.denials if p.denials is None else p.denials, quiet_hours=quiet,
                     digest=site.digest if p.digest is None else p.digest,
                     slurm_mail=bool(site.slurm_mail and p.slurm_mail),
                     idle=site.idle if p.idle is None else p.idle)
