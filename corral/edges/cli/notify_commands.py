"""``corral notify``: what a sponsor is told of their agents, and where (issue 51)."""

from __future__ import annotations

import time
from typing import Any

import click

from corral.edges.cli.kit import Ctx, table
from corral.edges import acts, reads

FOR = click.option("--for", "for_", metavar="AGENT",
                   help="An agent you sponsor, instead of yourself (an admin: anyone).")


@click.group()
def notify() -> None:
    """Be told when your agents' jobs end, their budgets run low or the policy refuses them.

    A sponsor answers for their agents; corral tells them by email or a webhook (generic
    JSON, ntfy, or a Slack/Mattermost incoming webhook). What you have not chosen follows
    the facility's defaults (`corral notify show` says which).

    \b
    Examples:
      corral notify set --webhook https://ntfy.sh/alice-jobs --format ntfy --jobs failures
      corral notify set --email alice@uni.example --quiet 22-07 --digest
      corral notify set --for claude-1 --jobs all        what you hear of one agent
      corral notify test                                 one test message on each channel
      corral notify sent                                 what was sent, waiting or given up
    """


def _show(r: dict[str, Any]) -> str:
    e = r["effective"]
    where = ", ".join(filter(None, [e.get("email") and f"email {e['email']}",
                                    e.get("webhook") and f"webhook ({e['webhook_format']}) {e['webhook']}"]))
    lines = [f"{r['principal']} is told at: {where or 'nowhere (set --email or --webhook)'}",
             f"  job ends: {e['jobs']}; budgets (50/80/100%): {'yes' if e['budget'] else 'no'}; "
             f"refusals: {'yes' if e['denials'] else 'no'}; idle jobs: {'yes' if e.get('idle', True) else 'no'}",
             f"  quiet hours: {e['quiet_hours'] or 'none'}; digest: {'yes' if e['digest'] else 'no'}"]
    if r.get("chosen"):
        lines.append("  chosen: " + ", ".join(sorted(r["chosen"])) + " (the rest: the facility's defaults)")
    return "\n".join(lines)


@notify.command("show")
@FOR
@click.pass_obj
def notify_show(o: Ctx, for_: str | None) -> None:
    """What you (or an agent you sponsor) are told, where and when."""
    o.out(o.client.run(reads.notify_show, principal=for_), _show)


@notify.command("set")
@FOR
@click.option("--email", help="Where email goes ('' removes it).")
@click.option("--webhook", metavar="URL", help="A URL to POST each notification to ('' removes it); its host must "
              "be one the facility allows (corral notify show lists them).")
@click.option("--format", "webhook_format", type=click.Choice(["generic", "ntfy", "slack"]),
              help="The webhook's body: corral's JSON, ntfy's, or Slack/Mattermost's.")
@click.option("--jobs", type=click.Choice(["all", "failures", "none"]), help="Which job ends you are told of.")
@click.option("--budget/--no-budget", default=None, help="Told when a budget crosses 50, 80 and 100%.")
@click.option("--denials/--no-denials", default=None, help="Told when the policy refuses an agent or taints its token.")
@click.option("--idle/--no-idle", default=None, help="Told when an agent's running job holds its cores idle (once a job).")
@click.option("--quiet", "quiet_hours", metavar="HH-HH", help="Quiet hours ('22-07'; 'off'): what falls inside "
              "arrives as one message when they end.")
@click.option("--digest/--no-digest", default=None, help="Gather what is due into one message an hour.")
@click.option("--slurm-mail/--no-slurm-mail", "slurm_mail", default=None,
              help="Also Slurm's own mail of your (agents') batch jobs, to --email, where the facility offers it.")
@click.pass_obj
def notify_set(o: Ctx, for_: str | None, **fields: Any) -> None:
    """Choose what you are told and where. Fields left out keep their value.

    \b
    Example:
      corral notify set --webhook https://ntfy.sh/alice-jobs --format ntfy --jobs failures
    """
    prefs = {k: v for k, v in fields.items() if v is not None}
    if not prefs:
        raise click.UsageError("nothing to set: give --email, --webhook, --jobs, --budget, --denials, --idle, --quiet "
                               "--digest or --slurm-mail (corral notify show says what is set now)")
    o.out(o.client.run(acts.notify_set, prefs, principal=for_), _show)


@notify.command("sent")
@FOR
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500), help="Most notifications listed.")
@click.pass_obj
def notify_sent(o: Ctx, for_: str | None, limit: int) -> None:
    """The notifications sent to you: newest first, with those waiting or given up."""
    def show(r: dict[str, Any]) -> str:
        rows = [{**n, "created": time.strftime("%m-%d %H:%M", time.localtime(n["created"])),
                 "error": (n.get("error") or "")[:40]} for n in r["notifications"]]
        return table(rows, ["id", "created", "kind", "about", "channel", "state", "subject", "error"]) if rows \
            else "nothing sent yet"
    o.out(o.client.run(reads.notify_sent, principal=for_, limit=limit), show)


@notify.command("test")
@FOR
@click.pass_obj
def notify_test(o: Ctx, for_: str | None) -> None:
    """Send one test notification on each channel; `corral notify sent` shows how it went."""
    o.out(o.client.run(acts.notify_test, principal=for_),
          lambda r: f"queued {r['queued']} test notification(s) for {r['principal']}; see: corral notify sent")
