"""A contained job's own credential: what Slurm's commands inside the job (corral's shims,
reaching the gateway through the job's door, decision 0057) present.

``crj_<job id>_<HMAC>``: the HMAC of the job's id under a key derived from the gateway's
root key, so nothing is stored and only this gateway can make one. It is worth what the
job's principal may read (``status``, ``read_output``) of that principal's own jobs, and
only while corral's record of the job is not terminal: it ends with the job (and comes
back if Slurm requeues the job and corral reopens its record). It never submits, cancels
or changes anything: a job that could submit would do so past its sponsor's narrowing of
the agent's token (budgets, partitions), which a credential minted here does not carry.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "crj_"
ACTIONS = ("status", "read_output")
"""What a job's credential may do: read, as its principal."""
READ_POSTS = frozenset({"wait_many"})
"""Routes by POST that only read (a wait on many jobs): a job's credential may use them."""
NOT_READS = frozenset({"ledger"})
"""Routes by GET that change something (the ledger acknowledges what it shows)."""


def may_call(method: str, route: str) -> bool:
    """Whether a job's credential may call the verb whose route is ``route``: its reads
    only. Its capability limits what the gate checks (status, read_output), but verbs
    that never ask the gate (the ledger's acknowledgement, an approval's answer, a
    dashboard link) would take it as its principal's: a job's code would hide what its
    agent is told, or a person's contained job would answer for them (decision 0057)."""
    return (method == "GET" and route not in NOT_READS) or route in READ_POSTS


def refusal(route: str) -> str:
    return (f"a job's own credential (CORRAL_TOKEN inside a contained job) does not allow this {route}: it only "
            "reads its principal's jobs")


_SHAPE = re.compile(r"crj_([0-9]{1,18})_([0-9a-f]{64})")


class JobCredentials:
    """Makes and checks jobs' credentials under one key (the gateway's, derived)."""

    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"corral job credential\0" + key).digest()

    def of(self, job_id: int) -> str:
        return f"{PREFIX}{job_id}_{self._mac(job_id)}"

    def check(self, token: str) -> int | None:
        """-> the job a well-formed credential of this gateway names; None otherwise."""
        m = _SHAPE.fullmatch(token)
        if m is None or not hmac.compare_digest(self._mac(int(m.group(1))), m.group(2)):
            return None
        return int(m.group(1))

    def _mac(self, job_id: int) -> str:
        return hmac.new(self._key, str(job_id).encode(), hashlib.sha256).hexdigest()


class EgressCredentials(JobCredentials):
    """A contained job's name at the egress proxy (``cre_<job id>_<HMAC>``), under a key of
    its own: what the proxy's grants (corral/sandbox/egress_grants.py) are matched against.
    Apart from the job's door credential, so one leaked reads no job and the other reaches
    no host; and the proxy holds neither key, only a digest of each granted credential."""

    PREFIX = "cre_"

    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"corral egress credential\0" + key).digest()

    def of(self, job_id: int) -> str:
        return f"{self.PREFIX}{job_id}_{self._mac(job_id)}"

    def check(self, token: str) -> int | None:
        m = _EGRESS_SHAPE.fullmatch(token)
        if m is None or not hmac.compare_digest(self._mac(int(m.group(1))), m.group(2)):
            return None
        return int(m.group(1))


_EGRESS_SHAPE = re.compile(r"cre_([0-9]{1,18})_([0-9a-f]{64})")
