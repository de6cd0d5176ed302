"""An action that waits for a person, told to a 2026-07-28 client as ``input_required``
(issue 51 item 3): where the request declares URL elicitation, the tool answers with one
URL-mode elicitation pointing at the dashboard, where the sponsor signs in as themselves
and answers. The client's user may be that sponsor (often, at a terminal) or not: the
dashboard, not the client's answer, decides (an agent's client cannot approve for the
sponsor). The client's retry carries the state back and gets the waiting answer itself
(who, until when), as every other client gets it at once; nothing is asked twice."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp_types import ElicitRequest, ElicitRequestURLParams, InputRequiredResult
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from corral.core.errors import ApprovalPending


def url_elicitation(ctx: Any) -> bool:
    """Whether this request (2026-07-28, its first round) declared URL elicitation."""
    try:
        rc = ctx.request_context
        if rc.protocol_version not in MODERN_PROTOCOL_VERSIONS or ctx.request_state is not None:
            return False
        meta = (rc.params or {}).get("_meta") if isinstance(rc.params, Mapping) else \
            getattr(rc.params, "meta", None)
    except (AttributeError, LookupError, ValueError):  # no request here (a call from inside the gateway)
        return False
    caps = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    elicit = caps.get("elicitation") if isinstance(caps, Mapping) else None
    return isinstance(elicit, Mapping) and "url" in elicit


def input_required(ctx: Any, e: ApprovalPending) -> InputRequiredResult | None:
    """The ``input_required`` answer to an action waiting for approval, or None where it
    does not fit (another protocol, no URL elicitation, the retry, no dashboard known)."""
    url = e.approval.get("answer_at")
    if not url or not url_elicitation(ctx):
        return None
    message = (f"{e.message}. If you are {e.approval['sponsor']}, answer on corral's dashboard (sign in as "
               "yourself); anyone else has nothing to do: the agent is told when they answer.")
    ask = ElicitRequest(params=ElicitRequestURLParams(message=message, url=url))
    return InputRequiredResult(input_requests={"approval": ask},
                               request_state=json.dumps({"approval": e.approval["id"]}))
