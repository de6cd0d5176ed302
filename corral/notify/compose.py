"""The words of each notification, and each channel's body. Everything an agent could
have written (a job's name, a refusal's reason) passes the output guard's redaction first:
a notification never carries a secret, and it goes to a person, never to a model."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from corral.core.jobs import Job, JobState
from corral.safety.guard import redact

FAILURES = frozenset({JobState.FAILED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY})


@dataclass(frozen=True)
class Note:
    kind: str
    """job, budget, denial, idle, approval, test."""
    subject: str
    body: str


def clean(text: str, limit: int = 300) -> str:
    text = redact(text)[0]
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _took(job: Job) -> str:
    if job.start_time is None or job.end_time is None:
        return "never started"
    s = int(job.end_time - job.start_time)
    return f"ran {s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"ran {s // 60}m{s % 60:02d}s"


def job_end(job: Job, sponsor: str | None) -> Note:
    name = clean(job.spec.name or "unnamed", 80)
    how = job.state.value + (f" exit {job.exit_code}" if job.exit_code not in (None, 0) else "")
    subject = f"[corral] job {job.id} of {job.principal} {how}"
    lines = [f"Job {job.id} ({name}) of {job.principal}" + (f", sponsored by {sponsor}" if sponsor else "")
             + f": {how}, {_took(job)}.", f"Lane: {job.backend}" + (f", Slurm job {job.backend_id}" if job.backend_id else "") + "."]
    if job.reason:
        lines.append(f"Reason: {clean(job.reason)}")
    lines.append(f"See it: corral status {job.id}   (its output: corral output {job.id})")
    return Note("job", subject, "\n".join(lines))


def job_line(job: Job) -> str:
    """A job's end in one line, for its own principal's ledger."""
    how = job.state.value + (f" exit {job.exit_code}" if job.exit_code not in (None, 0) else "")
    return f"job {job.id} {how}" + (f" ({clean(job.reason, 120)})" if job.reason and job.state.value != "COMPLETED"
                                   else "")


def denial(record: dict[str, Any]) -> Note:
    who, rule = record.get("principal", "?"), record.get("rule", "?")
    subject = f"[corral] {who} was refused ({rule})"
    reason = clean(str(record.get("reason", "")))
    body = (f"The facility's policy refused {who} ({record.get('action', '?')}, rule {rule}): {reason}\n"
            "This is the first such refusal this hour; every one is in the audit "
            f"(corral audit --principal {who}).")
    if record.get("risk_tags"):
        body += f"\nRisk: {clean(', '.join(map(str, record['risk_tags'])))}"
    return Note("denial", subject, body)


def budget(principal: str, what: str, level: int, used: float, limit: float) -> Note:
    return Note("budget", f"[corral] {principal} has used {level}% of its {what} budget",
                f"{principal} has used {used:.1f} of {limit:.1f} {what} ({used / limit:.0%}). At 100% its "
                f"submissions are refused until you mint it a token with more (corral token mint --for {principal}).")


def approval(aid: int, agent: str, rule: str, summary: str, until: str, url: str) -> Note:
    return Note("approval", f"[corral] {agent} asks your approval (#{aid}, rule {rule})",
                f"{agent} wants to run: {clean(summary, 600)}\n"
                f"The facility's rule {rule} asks you, its sponsor, to approve it first. It waits until {until}, "
                "then is cancelled.\n"
                f"Answer: corral approvals approve {aid}   or   corral approvals decline {aid} --note 'why'\n"
                f"Or open this single-use link: {url}")


def idle(job: Job, sponsor: str | None, idle_s: float, share: float) -> Note:
    """A RUNNING job holding its allocation while using almost none of it."""
    name = clean(job.spec.name or "unnamed", 80)
    held = f"{job.spec.cpus} CPU" + (f", {job.spec.gpus} GPU" if job.spec.gpus else "") + f", {job.spec.memory_mb} MB"
    return Note("idle", f"[corral] job {job.id} of {job.principal} holds {job.spec.cpus} CPU idle",
                f"Job {job.id} ({name}) of {job.principal}" + (f", sponsored by {sponsor}" if sponsor else "")
                + f", has held {held} for {_span(idle_s)} while using {share:.1%} of its CPU "
                "(a sleep, a notebook, a step waiting on input?). Others could use what it holds.\n"
                f"Release it: corral cancel {job.id}   or tell {job.principal} to (it was told too).\n"
                f"See it: corral status {job.id}")


def idle_line(job: Job, idle_s: float, share: float) -> str:
    """The same, for the agent's own ledger: it can release it itself."""
    return (f"job {job.id} is RUNNING but idle: {share:.1%} of its {job.spec.cpus} CPU used for {_span(idle_s)}; "
            f"cancel it (cancel_job {job.id}) if it waits for nothing, so others can use its cores")


def _span(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def test_note(recipient: str) -> Note:
    return Note("test", "[corral] test notification", f"This is a test notification for {recipient}, sent "
                f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}. Your notifications reach you here.")


def digest(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """Many notifications as one (subject, body)."""
    subject = f"[corral] {len(rows)} notifications"
    return subject, "\n\n".join(f"- {r['subject']}\n{r['body']}" for r in rows)


def webhook_body(fmt: str, subject: str, body: str, rows: list[dict[str, Any]]) -> tuple[dict[str, str], bytes]:
    """(headers, body) of a webhook in ``fmt``: corral's JSON, ntfy's or Slack's."""
    ids = [r["key"] for r in rows]
    headers = {"Corral-Notification-Id": ",".join(ids)[:900]}
    if fmt == "ntfy":  # ntfy publishes the body as the message, the title from a header
        headers |= {"Title": subject.encode("ascii", "replace").decode(), "Content-Type": "text/plain; charset=utf-8",
                    "Tags": "corral"}
        return headers, body.encode()
    headers["Content-Type"] = "application/json"
    if fmt == "slack":  # Slack and Mattermost incoming webhooks: `text`; <, > and & are their markup
        esc = (f"*{subject}*\n{body}").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        # Mattermost renders Markdown and @mentions: an agent's command or job name must not
        # become a link dressed as "Approve" beside the real one, nor ping a whole channel.
        # A word joiner breaks both and shows nothing.
        esc = esc.replace("](", "]\u2060(").replace("@", "@\u2060")
        return headers, json.dumps({"text": esc}).encode()
    return headers, json.dumps({"subject": subject, "body": body, "ids": ids,
                                "kinds": sorted({r["kind"] for r in rows})}).encode()
