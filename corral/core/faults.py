"""Fault points: where a test makes the gateway die, on purpose, to prove what survives.

``CORRAL_FAULT=<point>`` in the gateway's environment makes it exit at once
(``os._exit``, as a kill -9 would: no cleanup, no flush of anything not yet written) when
it reaches that point. Read once at import; unset, a point costs one comparison. For
tests only: a facility never sets it.

The points of the submit path, in order: ``before_insert``, ``after_insert`` (the jobs'
rows written, not committed), ``after_audit`` (their allow record appended, not
committed), ``after_commit`` (recorded, not sent), ``after_send``. Of a job's move to
another cluster (control/rebalance.py), in order: ``move_recorded``, ``move_held``,
``move_cancelled``, ``move_rehomed``; ``move_held_stall`` holds the move 30 s there instead. Of an approved action (gateway/approvals.py):
``approval_decided`` (the answer recorded, the action not yet taken to be carried out),
``approval_claimed`` (taken, not carried out: at the next start a cancel is carried out
again, anything else reported not done). And one that stalls
instead of dying: ``reconciler_stall`` (the reconciler's loop stops beating, as a hung
scheduler call would leave it; /healthz must say so).
"""

from __future__ import annotations

import os

EXIT_STATUS = 86
_POINT = os.environ.get("CORRAL_FAULT") or None


def fault(point: str) -> None:
    """Die here if this is the point the environment names."""
    if _POINT == point:
        os._exit(EXIT_STATUS)


def stalls(point: str) -> bool:
    """Whether this is the point the environment names (the caller then hangs there)."""
    return _POINT == point
