"""The verb table: every operation of corral's API, in the order its route is added.

Every verb is declared once, typed, where it is served (corral/edges/declare.py: the
read-only ones in corral/edges/reads.py, the others in corral/edges/acts.py); this table
only orders their rows (a verb not placed here is added last), and produces the edges:

    VERBS ──┬─▶ corral/edges/http/routes.py   the FastAPI routes (the OpenAPI documents each answer)
            ├─▶ corral/edges/client.py        Client.run(verb, ...) typed; Client.<verb>(...) untyped
            └─▶ corral/edges/mcp/ops.py       ServiceOps.run / RemoteOps.run (in the gateway, or
                                              over the client); the tools' names and annotations
                                              (corral/edges/mcp/tools.py, generated.py)

This module imports nothing heavy: the CLI starts with it (rows are NamedTuples, cheaper
to define than frozen dataclasses).
"""

from __future__ import annotations

from corral.edges import acts, reads  # noqa: F401  (their verbs are declared as they are imported)
from corral.edges.declare import DECLARED, Tool, Verb

__all__ = ["Tool", "Verb", "VERBS", "BY_NAME"]


ORDER = """job wait events whoami add_principal principals mint_token public_key signin_munge signin_link tokens
revoke_token clear_taint submit jobs submit_batch wait_many remember recall promote advice plan cancel_many
output control usage cancel facility budget saved token_usage sponsor approvals approve decline approve_ahead
ledger ack notify_show notify_set notify_sent notify_test env_build env_list env_status env_gc ws_fork ws_list
ws_show ws_diff ws_commit ws_discard"""
"""The verbs in the order their routes are added: the hot reads first (Starlette tries routes in
that order), then as the OpenAPI lists them."""

_BY_DECLARED = {d.name: d.row for d in DECLARED}
VERBS: tuple[Verb, ...] = tuple(_BY_DECLARED.pop(name) for name in ORDER.split())
VERBS += tuple(_BY_DECLARED.values())  # declared, not placed in ORDER: their routes last
"""Every verb, in the order its route is added."""

BY_NAME: dict[str, Verb] = {v.name: v for v in VERBS}
