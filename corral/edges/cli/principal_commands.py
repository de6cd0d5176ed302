"""``corral principal``: who may act through the gateway (humans, agents, services)."""

from __future__ import annotations

import click

from corral.edges.cli.kit import Ctx, table
from corral.edges import acts, reads


@click.group()
def principal() -> None:
    """Register and list principals: humans, agents (with a sponsor) and services.

    \b
    Examples:
      corral principal add alice --kind human
      corral principal add claude-1 --kind agent --sponsor alice
      corral principal add ci --kind service
      corral principal list
    """


@principal.command("add")
@click.argument("name")
@click.option("--kind", type=click.Choice(["human", "agent", "service"]), required=True, help="What acts: a person, an AI agent, or a service.")
@click.option("--sponsor", help="For agents: the human who answers for it.")
@click.option("--unix-user", help="Unix user its jobs run as (under a root gateway; an agent without one works as its sponsor's, and a principal with neither gets a uid of its own).")
@click.option("--account", help="Scheduler account its jobs are charged to.")
@click.option("--admin", is_flag=True, help="Make this human an admin.")
@click.pass_obj
def principal_add(o: Ctx, name: str, kind: str, sponsor: str | None, unix_user: str | None,
                  account: str | None, admin: bool) -> None:
    """Add a principal. Example: corral principal add bot1 --kind agent --sponsor alice"""
    p = o.client.run(acts.add_principal, name=name, kind=kind, sponsor=sponsor, unix_user=unix_user, account=account, admin=admin)
    o.out(p, lambda p: f"added {p['kind']} {p['name']}" + (f" (sponsor {p['sponsor']})" if p.get("sponsor") else ""))


@principal.command("list")
@click.pass_obj
def principal_list(o: Ctx) -> None:
    """List the principals you may see."""
    o.out(o.client.run(reads.principals), lambda ps: table(ps, ["name", "kind", "sponsor", "unix_user", "account", "admin"]))
