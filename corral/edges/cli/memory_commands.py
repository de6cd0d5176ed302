"""``corral remember``, ``corral recall`` and ``corral advice``: thin clients of the gateway."""

from __future__ import annotations

import os
import shlex
from typing import Any

import click
from corral.edges import acts, reads


@click.command()
@click.argument("text")
@click.option("--scope", type=click.Choice(["agent", "user", "account", "session", "facility"]), default="user",
              show_default=True, help="Who may read it: you only (agent), you and your agents or your sponsor's "
                                      "family (user), your account, this session, or everyone (facility, admins).")
@click.option("--expires", help="Forget it after this long, e.g. 30d or 12h (default: never).")
@click.option("--job", "job_id", type=int, help="The job this note is about (kept as provenance).")
@click.pass_obj
def remember(o: Any, text: str, scope: str, expires: str | None, job_id: int | None) -> None:
    """Write a note for later sessions: a fix, a pitfall, what works here.

    \b
    Examples:
      corral remember "torch needs 'module load cuda/12.2' first on the gpu partition"
      corral remember --scope account --expires 30d "scratch is purged every Sunday"
    """
    note = o.client.run(acts.remember, text, scope, expires, job_id)
    flags = note.get("flags", {})
    o.out(note, lambda n: f"remembered note {n['id']} ({n['scope']})"
          + (f"; redacted: {', '.join(flags['redacted'])}" if flags.get("redacted") else "")
          + ("; flagged as suspected injection" if flags.get("suspected_injection") else ""))


@click.command()
@click.argument("query", nargs=-1, required=True)
@click.option("-k", "k", type=int, default=5, show_default=True, help="How many notes at most.")
@click.pass_obj
def recall(o: Any, query: tuple[str, ...], k: int) -> None:
    """Search the notes you may read, best match first: by their words and by their
    meaning, so a question finds a note worded otherwise. Each note says which found it.

    \b
    Examples:
      corral recall cuda module gpu
      corral recall why does pytorch not see my graphics card
    """
    found = o.client.run(reads.recall, " ".join(query), k)
    o.out(found, lambda r: "\n\n".join(f"[{n['id']}] ({n['scope']}, {n['author']}; by {' and '.join(n.get('by', []))}) "
                                        f"{n['text']}" for n in r["notes"]) or "no notes match")


@click.command()
@click.argument("command", nargs=-1, required=True)
@click.option("--cpus", type=int, help="CPU cores.")
@click.option("--memory", "--mem", help="Memory, e.g. 4G.")
@click.option("--gpus", type=int, help="GPUs.")
@click.option("--walltime", "--time", "-t", help="Time limit, e.g. 30m.")
@click.option("--partition", "-p", help="Partition.")
@click.pass_obj
def advice(o: Any, command: tuple[str, ...], **res: Any) -> None:
    """What corral remembers of a job like this one, without submitting it.

    \b
    Example:
      corral advice --mem 4G -- python train.py
    """
    spec: dict[str, Any] = {k: v for k, v in res.items() if v is not None}
    spec["command"] = command[0] if len(command) == 1 else shlex.join(command)
    spec["workdir"] = os.getcwd()
    r = o.client.run(acts.advice, spec)
    o.out(r, lambda r: "\n".join(["- " + a for a in r["advice"]] + ([f"would be refused: {r['would_refuse']}"]
                                                                    if r.get("would_refuse") else []))
          or "nothing remembered about this job")
