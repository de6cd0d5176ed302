"""``corral token``: mint capability tokens for agents, narrow them for sub-agents, list
and revoke them. Minting, listing and revoking go through the gateway; narrowing needs
only the token and the gateway's public key."""

from __future__ import annotations

import os
from typing import Any, Callable

import click

from corral.edges import acts, reads


F = Callable[..., Any]


def caveat_options(f: F) -> F:
    """The restrictions a token can carry; each one left out restricts nothing."""
    for opt in reversed([
        click.option("--actions", help="Only these, comma-separated: submit, cancel, status, read_output, "
                                       "write_note, read_notes, advice, manage, workspace_fork, workspace_commit, "
                                       "workspace_discard, env_build, env_use (another's image)."),
        click.option("--partitions", help="Submit only to these partitions, comma-separated."),
        click.option("--max-cpus", type=click.IntRange(0), help="CPUs per job at most."),
        click.option("--max-gpus", type=click.IntRange(0), help="GPUs per job at most."),
        click.option("--max-walltime", help="Walltime per job at most, e.g. 2h."),
        click.option("--cpu-hours", type=click.FloatRange(0), help="CPU-hour budget over everything it submits."),
        click.option("--gpu-hours", type=click.FloatRange(0), help="GPU-hour budget over everything it submits."),
        click.option("--submits-per-min", type=click.IntRange(0), help="Jobs submitted per minute at most."),
        click.option("--max-active", "max_active_jobs", type=click.IntRange(0), help="Unfinished jobs at once at most."),
    ]):
        f = opt(f)
    return f


@click.group()
def token() -> None:
    """Mint, narrow, list and revoke tokens, and see what each used.

    \b
    A token minted for an agent carries restrictions (caveats); whoever holds it may
    narrow it further for a sub-agent (attenuate) but can never widen it. Revoking a
    token's id stops it and every token narrowed from it at once.

    \b
    Examples:
      corral token mint --for bot --expires 8h --partitions debug --max-cpus 8 --cpu-hours 20
      corral token attenuate --max-cpus 2 --actions submit,status --expires 1h   # of $CORRAL_TOKEN
      corral token list                                      # ids, caveats, taint; never secrets
      corral token usage                                     # what each used of its limits
      corral token revoke 6eb44e209298474907d2a833
      corral token clear-taint 6eb44e209298474907d2a833      # after reading what tainted it
    """


@token.command("mint")
@click.option("--for", "for_", required=True, help="The principal the token acts as.")
@click.option("--expires", default="8h", show_default=True, help="Lifetime: 30m, 8h, 7d; 'never' for humans/services.")
@click.option("--note", help="Why this token exists.")
@caveat_options
@click.pass_obj
def token_mint(o: Any, for_: str, expires: str, note: str | None, **caveats: Any) -> None:
    """Mint a token. It is shown once: store it now (e.g. export CORRAL_TOKEN=...)."""
    from corral.safety.tokens import csv_list

    given = {k: v for k, v in caveats.items() if v is not None}
    for k in ("actions", "partitions"):  # comma-separated on the command line, lists in the API
        if k in given:
            given[k] = csv_list(given[k])
    t = o.client.run(acts.mint_token, for_, expires, note, **given)
    o.out(t, lambda t: _shown_once(t["token"], f"token {t['id']} for {t['principal']}; shown once", t.get("caveats", [])))


def _shown_once(token: str, what: str, caveats: list[str]) -> str:
    """The token alone on stdout (``export CORRAL_TOKEN=$(corral token mint ...)``), what it
    is and what it may do on stderr."""
    from corral.safety.tokens import in_words

    click.echo(f"({what})" + "".join(f"\n  {in_words(c)}" for c in caveats), err=True)
    return token


@token.command("attenuate")
@click.option("--token", "token_", help="The token to narrow (default: $CORRAL_TOKEN).")
@click.option("--expires", help="Expire sooner: 30m, 8h.")
@caveat_options
@click.pass_obj
def token_attenuate(o: Any, token_: str | None, expires: str | None, **caveats: Any) -> None:
    """Narrow a token for a sub-agent: the result can do only what both allow.

    Needs no secret: only the gateway's public key, fetched once from the gateway."""
    from corral.safety.tokens import attenuate, caveats_from, expires_in

    from corral.edges.cli.kit import fail

    tok = token_ or o.token or os.environ.get("CORRAL_TOKEN")
    if not tok:
        fail("give the token to narrow with --token or CORRAL_TOKEN")
    given = caveats_from({k: v for k, v in caveats.items() if v is not None})
    given.expires_at = expires_in(expires)
    key = bytes.fromhex(o.client.run(reads.public_key)["public_key"])
    block_id, narrowed = attenuate(tok, given, key)
    o.out({"id": block_id, "token": narrowed, "caveats": given.datalog().splitlines()},
          lambda t: _shown_once(t["token"], f"narrowed token {t['id']}; revoke it by that id", t["caveats"]))


@token.command("list")
@click.pass_obj
def token_list(o: Any) -> None:
    """List tokens (never their secrets), with narrowed ones seen in use."""
    from corral.edges.cli.kit import table, ts

    o.out(o.client.run(reads.tokens), lambda ts_: table(
        [{**t, "expires": ts(t.get("expires")), "revoked": "yes" if t.get("revoked") else ""} for t in ts_],
        ["id", "principal", "kind", "expires", "revoked", "note"]))


@token.command("usage")
@click.pass_obj
def token_usage(o: Any) -> None:
    """What each token used of its limits, and what unlimited tokens used: the dashboard's
    budgets table. Yours and your agents' (admins: everyone's); a live job counts its whole
    walltime, as admission charges it."""
    from corral.edges.cli.kit import table

    def used(v: Any, limit: Any) -> str:
        return f"{v} of {limit}" if limit is not None else f"{v} (no limit)"

    o.out(o.client.run(reads.token_usage), lambda r: table(
        [{**t, "token": t["token"][:12], "cpu_h": used(t["cpu_hours"], t["cpu_limit"]),
          "gpu_h": used(t["gpu_hours"], t["gpu_limit"]), "live_jobs": used(t["active_jobs"], t["active_limit"])}
         for t in r["tokens"]], ["sponsor", "principal", "token", "cpu_h", "gpu_h", "live_jobs"]))


@token.command("revoke")
@click.argument("token_id")
@click.pass_obj
def token_revoke(o: Any, token_id: str) -> None:
    """Revoke a token by id: it, and every token narrowed from it, stop working at once."""
    o.out(o.client.run(acts.revoke_token, token_id), lambda r: f"revoked token {r['id']}")


@token.command("clear-taint")
@click.argument("token_id")
@click.pass_obj
def token_clear_taint(o: Any, token_id: str) -> None:
    """Lift a token's taint: set when its holder read output flagged as prompt injection,
    it makes the facility policy stricter for that token and every token narrowed from
    it, whatever session they send. Only the token's sponsor or an admin may lift it
    (audited); 'corral whoami' shows the holder whether it is tainted."""
    o.out(o.client.run(acts.clear_taint, token_id), lambda r: f"cleared the taint of token {r['id']} (it was: {r['was']})")
