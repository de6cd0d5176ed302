"""What the HTTP API answers, as models: the OpenAPI's response schemas (the routes
serialize with json.dumps for speed; these document, and schemathesis checks each
answer against them in tests/test_contract.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from corral.core.jobs import JobState


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class JobSummaryOut(_Out):
    id: int
    name: str | None
    principal: str
    session: str | None
    state: JobState
    exit_code: int | None
    reason: str | None
    submit_time: float
    start_time: float | None
    """When it first started (a requeued job ran again later, from the start)."""
    end_time: float | None
    requeues: int = 0
    """Times the scheduler requeued it (preempted for a person's job); still one job."""
    lost_s: float | None = None
    """Seconds of work its requeued runs lost."""


class JobOut(JobSummaryOut):
    backend: str
    backend_id: str | None
    spec: dict[str, Any]
    advice: list[str] | None = None
    created: bool | None = None
    """On submit: false for an idempotent replay or a cache hit."""
    reached: bool | None = None
    """On wait: whether the job got there before the timeout."""


class JobListOut(_Out):
    jobs: list[JobSummaryOut]
    limit: int
    offset: int
    next_offset: int | None


class BatchJobOut(JobSummaryOut):
    backend: str
    lane: str | None
    advice: list[str] | None = None


class BatchOut(_Out):
    jobs: list[BatchJobOut]
    created: bool


class JobsOut(_Out):
    jobs: list[JobSummaryOut]
    reached: bool | None = None


class EventOut(_Out):
    event: int
    """This change's place in the stream: a cursor."""
    job_id: int
    principal: str
    state: JobState
    exit_code: int | None
    at: float


class EventsOut(_Out):
    events: list[EventOut]
    cursor: int
    """Pass it to the next call: the events after it come next."""
    more: bool
    """More events are waiting: call again at once."""


class PlanOut(_Out):
    allowed: bool
    """Whether a submission now would be taken."""
    rule: str | None
    """The rule that would allow it, or refuse it."""
    refused: dict[str, Any] | None
    cost: dict[str, float]
    budgets: list[dict[str, Any]]
    lane: str | None = None
    start: dict[str, Any] | None = None
    """{"start": a time or null, "how": how it was estimated}."""
    advice: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    """An agent's batch job: its tier (opportunistic: preemptible, requeued), the QOS,
    the walltime asked of the scheduler and the agent's own, and why."""


class OutputOut(_Out):
    data: str
    offset: int
    next_offset: int
    size: int
    eof: bool
    stream: str
    job_state: str | None = None
    truncated: bool | None = None
    guard: dict[str, Any] | None = None


class PrincipalOut(_Out):
    name: str
    kind: str
    sponsor: str | None
    unix_user: str | None
    account: str | None
    admin: bool
    created: float | None


class WhoamiOut(PrincipalOut):
    session: str | None
    token_id: str | None
    tainted: str | None = None
    """Why this credential is tainted (it read content flagged as injection), or None."""
    tainted_token: str | None = None
    """The token block that holds the taint (what 'corral token clear-taint' takes)."""


class TokenOut(_Out):
    id: str
    token: str
    principal: str
    expires: float | None
    caveats: list[str]


class TokenInfo(_Out):
    id: str
    principal: str


class TaintClearedOut(_Out):
    id: str
    tainted: bool
    was: str


class RevokedOut(_Out):
    id: str
    revoked: bool


class PublicKeyOut(_Out):
    public_key: str
    algorithm: str


class NoteOut(_Out):
    id: int
    text: str
    scope: str


class NotesOut(_Out):
    notes: list[dict[str, Any]]


class AdviceOut(_Out):
    advice: list[str]
    would_refuse: str | None


class HealthOut(_Out):
    ok: bool
    backend: str
    degraded: str | None
    last_tick: float | None
    last_beat: float | None = Field(None, description="When the reconciler's loop last went round, busy or idle.")
    loops: dict[str, str] = Field(default_factory=dict, description="Each background loop: running, or how it ended.")
    stalled: list[str] = Field(default_factory=list, description="Loops dead or silent too long (then 503).")


class FacilityOut(_Out):
    backend: str
    partitions: list[dict[str, Any]]
    queue: dict[str, int]
    degraded: str | None


class UsageOut(_Out):
    job_id: int
    state: JobState
    final: bool
    asked: dict[str, Any]
    elapsed_s: float | None
    cpu_s: float | None
    max_rss_mb: float | None
    efficiency: dict[str, float]
    how: str
    advice: list[str]
