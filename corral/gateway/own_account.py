"""Nobody's job runs as the gateway's own account (issue 47 item 7, decision 0046).

The account a gateway runs as owns its secrets: ``admin.token``, ``token.key``,
``corral.db`` (0600, ``runtime.make_private``). A job that runs as that account reads
them, whatever the output guard redacts (``cat admin.token | base64 | rev`` passes it):
the token is unreadable only if no job is its owner. A root gateway never runs a job as
itself (core/identity.py: each job its principal's user or a dynamic uid). A gateway run
as an unprivileged account cannot become anyone else on its own, so:

- it **refuses to start** unless it has a way to run people's jobs as someone else (on
  Slurm, the privileged submitter: ``[slurm] submitter``, with the fast lane off, whose
  workers would be the gateway's account), or it is declared **one person's own**
  (``personal = true``; ``make run`` as a plain user): the account is that person, and
  what her jobs can read she can read from her shell anyway (her agents' jobs are still
  contained, corral's state hidden from them);
- it **refuses each job that would still run as its account**, before anything is
  recorded, in the same words for a plan: on a service account, a principal with no Unix
  user of its own (or whose Unix user is the gateway's); on a personal gateway, a
  principal whose Unix user is another person's.

The gateway's admins (who hold its token already) and corral's own service principals
(its fast-lane pilots, its image packing) are the account's own work, and run as it.
"""

from __future__ import annotations

import os
import pwd

from corral.core.config import Settings
from corral.core.errors import Forbidden, InvalidRequest
from corral.core.principals import Kind, Principal, is_own_service

RULE = "own-account"
HOW = ("run the gateway as root (every job then runs as its principal's Unix user or a uid of its own); "
       "or, on Slurm, install the privileged submitter (sudo scripts/privsep-up) and set [slurm] submitter, "
       "with [fastlane] enabled = false; or, if this gateway is one person's own and serves only her and her "
       "agents, set personal = true (CORRAL_PERSONAL=true). README: 'Who a job runs as, and the two deployments'")


def account() -> str:
    """The name of the account this process runs as."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def is_mine(unix_user: str) -> bool:
    """Whether ``unix_user`` is this account, by uid: a second name for the same uid (an
    alias in passwd) is the same account, and the submitter would submit it as the gateway."""
    try:
        return pwd.getpwnam(unix_user).pw_uid == os.geteuid()
    except KeyError:
        return False


def why_unsafe(settings: Settings) -> str | None:
    """Why a gateway of ``settings``, run by this process, would run people's jobs as its
    own account; None when it would not."""
    if os.geteuid() == 0 or settings.personal:
        return None
    me = account()
    start = (f"this gateway runs as the unprivileged account {me!r}, which owns its admin token, token key and "
             f"database (in {settings.home})")
    if settings.backend != "slurm" or not settings.slurm.submitter:
        return (f"{start}, and it has no way to run a job as anyone else: every person's and agent's job would "
                f"run as {me!r} and could read them")
    if settings.fastlane.enabled:
        return (f"{start}: the fast lane's workers would run as {me!r}, and every fast-lane task with them "
                "([slurm] submitter serves batch jobs only)")
    return None


def check_start(settings: Settings) -> None:
    """Refuse to start a gateway that would run jobs as its own account, saying why and
    what to configure instead."""
    why = why_unsafe(settings)
    if why:
        raise InvalidRequest(f"refusing to start: {why}", hint=HOW)


def refuse(settings: Settings, p: Principal) -> None:
    """Refuse a job of ``p`` that would run as the gateway's own account (raises
    Forbidden, the rule ``own-account``); nothing to do on a root gateway."""
    if os.geteuid() == 0 or p.is_admin or (p.kind is Kind.SERVICE and is_own_service(p)):
        return
    me = account()
    if settings.personal:
        if p.unix_user and not is_mine(p.unix_user):
            raise Forbidden(f"this gateway is {me}'s own (personal = true) and runs every job as {me!r}: a job of "
                            f"{p.name} (Unix user {p.unix_user}) would run as {me}, not as {p.unix_user}",
                            hint="ask for a gateway that runs jobs as their own users (a root gateway, or a "
                                 "service account with the privileged submitter)", rule=RULE)
        return
    if p.unix_user and not is_mine(p.unix_user) and p.kind is not Kind.SERVICE:
        return  # the privileged submitter runs it as that user (lanes/slurm/submitter.py)
    whose = "a service principal's jobs are submitted as the gateway" if p.kind is Kind.SERVICE else \
        f"its Unix user {p.unix_user} is the gateway's account" if p.unix_user else \
        f"{p.name} has no Unix user, and a gateway that is not root cannot give it a uid of its own"
    raise Forbidden(f"no job runs as the gateway's own account {me!r}, which holds its tokens and database: "
                    f"{whose}", rule=RULE,
                    hint=f"an admin gives {p.name} (or its sponsor) a Unix user of its own "
                         "(corral principal add NAME --unix-user USER); or the facility runs the gateway as root")
