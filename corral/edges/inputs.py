"""What corral's verbs take, as models: the HTTP bodies, the path, query and header
parameters of each verb (``params`` in corral/edges/verbs.py; the HTTP routes, the
in-gateway MCP calls and the OpenAPI all check with these), and a job's fields as the
MCP tools take them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from corral.core.jobs import MAX_INT, JobSpec, expand_array
from corral.safety.tokens import Caveats, caveats_from
from corral.core.lane_names import LaneChoice
from corral.core.text import ABS_PATH, NAME, WS_ID
from corral.notify.prefs import Prefs as NotifyIn  # the body of PUT /v1/notify, as the notifier checks it

__all__ = ["JobSpec", "NotifyIn"]  # a verb's body by name, beside the others

JobIds = list[Annotated[int, Field(ge=1, le=MAX_INT)]]
Seconds = Annotated[float, Field(ge=0, le=86400, allow_inf_nan=False)]
JobId = Annotated[int, Field(ge=1, le=MAX_INT, description="A job id.")]
IDEMPOTENCY_KEY = Field(None, description="1-200 characters, unique per request (a UUID is a good key): a retry "
                                          "with the same key and body returns the first answer (200); the same "
                                          "key with another body is refused (409).",
                        json_schema_extra={"minLength": 1, "maxLength": 200})


class PrincipalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str = Field(description="human, agent or service")
    sponsor: str | None = None
    unix_user: str | None = None
    account: str | None = None
    admin: bool = False


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    for_: str = Field(alias="for", description="The principal the token acts as.")
    expires: str | None = Field("8h", description="Lifetime such as '8h' or '7d'; 'never' for humans and services.")
    note: str | None = None
    actions: list[str] | None = Field(None, description="Only these actions (submit, cancel, status, read_output, write_note, read_notes, advice, manage).")
    partitions: list[str] | None = Field(None, description="Submit only to these partitions.")
    max_cpus: int | None = Field(None, ge=0, le=100_000, description="CPUs per job at most.")
    max_gpus: int | None = Field(None, ge=0, le=1024, description="GPUs per job at most.")
    max_walltime: str | None = Field(None, description="Walltime per job at most, e.g. '2h'.")
    cpu_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="CPU-hour budget for everything submitted with this token.")
    gpu_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="GPU-hour budget for everything submitted with this token.")
    submits_per_min: int | None = Field(None, ge=0, le=1_000_000, description="Jobs submitted per minute at most.")
    max_active_jobs: int | None = Field(None, ge=0, le=10_000_000, description="Unfinished jobs at once at most.")

    def caveats(self) -> Caveats:
        return caveats_from(self.model_dump(exclude={"for_", "expires", "note"}))


class MungeSigninIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    credential: str = Field(min_length=1, max_length=4096, description="A munge credential (MUNGE:...) whose payload is 'corral-signin/1 ' and this gateway's URL, from the local munged ('corral login' makes it).")


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: JobIds = Field(min_length=1, max_length=10_000)


class NoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=20_000)
    scope: str = Field("user", description="agent, user (you and your agents), account, session, facility (admins)")
    expires: str | None = Field(None, description="e.g. '30d', '12h'; default: never")
    job_id: int | None = Field(None, ge=1, le=MAX_INT, description="The job this note is about (provenance).")


class WaitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: JobIds = Field(min_length=1, max_length=10_000)
    timeout: Seconds = Field(60.0, description="Seconds to wait at most.")


_ARRAY_SYNTAX = r"^[0-9]{1,7}(-[0-9]{1,7}(:[1-9][0-9]{0,6})?)?(,[0-9]{1,7}(-[0-9]{1,7}(:[1-9][0-9]{0,6})?)?)*$"
"""Slurm's --array syntax, for the schema (a throttle, %N, is refused by name)."""


class BatchIn(BaseModel):
    jobs: list[JobSpec] = Field(min_length=1, max_length=1000, description="The jobs, each as POST /v1/jobs takes it.")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["array"], "properties": {"array": {"type": "string"}, "jobs": {"maxItems": 1}}},
        {"properties": {"array": {"type": "null"}}}]})
    array: str | None = Field(None, max_length=200, json_schema_extra={"pattern": _ARRAY_SYNTAX},
                              description="Slurm's --array syntax ('0-9', '1,3,5', '0-99:2'): "
                              "jobs holds one spec, run once per index, the index in $CORRAL_ARRAY_TASK_ID "
                              "(and $SLURM_ARRAY_TASK_ID). A range goes low-high; at most 1,000 tasks.")

    @model_validator(mode="after")
    def _expand(self) -> "BatchIn":
        if self.array is not None:
            self.jobs = expand_array(self.jobs, self.array)
        return self


class ControlIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["hold", "release", "requeue", "signal"] = Field(
        description="hold: keep a pending job from starting; release: let it; requeue: run it again from the "
                    "start (Slurm); signal: send a signal to a running job.")
    signal: str | None = Field(None, max_length=10, description="With 'signal': USR1, TERM, INT, ... (default none).")


class EnvBuildIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=1024 * 1024)]] = Field(
        ..., min_length=1, max_length=2,
        description="The environment's file by its name: requirements.txt, pyproject.toml, or uv.lock with its "
                    "pyproject.toml.")
    name: str | None = Field(None, pattern=NAME,
                             description="A name jobs may use for the image (env: NAME).")
    rebuild: bool = Field(False, description="Build again even if an image exists (a corrupt one, say).")


class LedgerParams(BaseModel):
    limit: int = Field(20, ge=1, le=200)
    read_job: int | None = Field(None, ge=1, le=MAX_INT, description="A job just read by id: its end is acknowledged.")


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    up_to: int = Field(ge=1, le=MAX_INT, description="Acknowledge every entry up to this id.")


class SponsorParams(BaseModel):
    days: float = Field(7.0, gt=0, le=366, description="How far back.")
    sponsor: str | None = Field(None, max_length=128, description="Another sponsor's view (admins).")


class ApprovalsParams(BaseModel):
    state: Literal["pending", "approved", "declined", "expired", "void", "all"] = Field(
        "pending", description="Only approvals in this state (default: waiting); 'all': every one.")
    limit: int = Field(50, ge=1, le=500)


class ApprovalParams(BaseModel):
    approval_id: int = Field(ge=1, le=MAX_INT)
    note: str | None = Field(None, max_length=500, description="Why: the agent reads it (a decline's reason).")


class AheadIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    agent: str = Field(max_length=128, description="An agent you sponsor.")
    session: str = Field(min_length=1, max_length=200, description="Its session the approval holds for.")
    rule: str = Field(max_length=200, description="The policy rule (with @ask) approved ahead.")
    for_: str = Field("8h", alias="for", description="How long: '2h', '1d'.")


class NotifyParams(BaseModel):
    principal: str | None = Field(None, max_length=128,
                                  description="Whose notifications (default: your own; an agent you sponsor).")
    limit: int = Field(50, ge=1, le=500, description="Most notifications listed.")


class EnvGcIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    older_than_days: float | None = Field(None, gt=0, le=3650,
                                          description="Collect images unused this long (default: the facility's).")
    image: str | None = Field(None, pattern=NAME,
                              description="Collect this one image instead.")
    dry_run: bool = Field(False, description="Say what would be collected, collect nothing.")


class ForkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str = Field(..., min_length=1, max_length=4096, pattern=ABS_PATH,
                      description="Absolute path of the directory (or git repository) to fork.")
    rev: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_./^~@{}-]+$",
                            description="A git commit, branch or tag of base: the workspace starts from it.")


# -- the path, query and header parameters of each verb ------------------------------

class JobParams(BaseModel):
    job_id: JobId


class WaitParams(JobParams):
    timeout: float = Field(60.0, ge=0, le=86400, allow_inf_nan=False, description="Seconds to wait at most.")
    until: str | None = Field(None, description="Return once the job is in this state, or 'change' at its next "
                                                "state change (always at its end).")


class EventsParams(BaseModel):
    cursor: int | None = Field(None, ge=0, le=MAX_INT, description="The cursor the last call returned; none: from "
                                                                   "now on.")
    timeout: float = Field(60.0, ge=0, le=86400, allow_inf_nan=False,
                           description="Seconds to wait at most for a first event.")
    limit: int = Field(200, ge=1, le=1000, description="Most events in one answer.")


class SubmitParams(BaseModel):
    idempotency_key: str | None = IDEMPOTENCY_KEY
    hold: bool = Field(False, description="Recorded held, not sent until released (Slurm's sbatch -H).")


class BatchParams(BaseModel):
    idempotency_key: str | None = IDEMPOTENCY_KEY
    hold: bool = Field(False, description="All recorded held, not sent until released.")


class JobsParams(BaseModel):
    state: list[str] | None = Field(None, description="Filter by state; repeatable.")
    session: str | None = None
    principal: str | None = None
    limit: int = Field(50, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=MAX_INT)
    full: bool = Field(False, description="Each job whole (its spec, backend and backend id), as GET /v1/jobs/{id}.")


class OutputParams(JobParams):
    stream: str = Field("stdout", pattern="^(stdout|stderr)$")
    offset: int = Field(0, ge=0, le=MAX_INT)
    limit: int = Field(65536, ge=1, le=1024 * 1024)
    tail: int | None = Field(None, ge=0, le=100_000, description="Last N lines instead of a page from offset.")


class RecallParams(BaseModel):
    q: str = Field(description="Words to search for.")
    k: int = Field(5, ge=1, le=50)


class NoteParams(BaseModel):
    note_id: int = Field(ge=1, le=MAX_INT)


class TokenParams(BaseModel):
    token_id: str


class EnvParams(BaseModel):
    ref: str = Field(pattern=NAME,
                     description="An image's name or key, or a build request's digest.")


class WsParams(BaseModel):
    ws_id: str = Field(pattern=WS_ID, description="A workspace id (ws-...).")


# -- a job as the MCP tools take it ----------------------------------------------------

Until = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "change"]


Int = Annotated[int, Field(ge=1)]
JOB_FIELDS: dict[str, tuple[Any, Any]] = {
    "command": (Annotated[str | None, Field(description="Shell line, run with bash -c (max 64 KiB).")], None),
    "script": (Annotated[str | None, Field(description="Whole job script, bash unless #! (max 256 KiB). "
                                                       "Exactly one of command or script.")], None),
    "cpus": (Annotated[int | None, Field(ge=1, description="CPU cores, 1 or more (default 1); at most the "
                                                           "partition's max (facility_info).")], None),
    "memory": (Annotated[str | int | None, Field(description="Memory: '512M', '4G' or MB as a number (default "
                                                             "'1G'); at most the partition's max.")], None),
    "gpus": (Annotated[int | None, Field(ge=0, description="GPUs, 0 or more (default 0).")], None),
    "walltime": (Annotated[str | int | None, Field(description="Time limit: '30m', '2h', 'HH:MM:SS' or seconds "
                                                               "(default '1h'); at most the partition's max.")], None),
    "partition": (Annotated[str | None, Field(description="Partition; default: the facility's.")], None),
    "name": (Annotated[str | None, Field(description="Short name for people.")], None),
    "workdir": (Annotated[str | None, Field(description="Absolute working directory; must exist.")], None),
    "env": (Annotated[dict[str, str] | None, Field(description="Extra environment variables.")], None),
    "lane": (Annotated[LaneChoice | None, Field(
        description="'fast': a warm allocation starts it at once (short, small tasks); 'batch': the queue; "
                    "'auto': fast when it fits.")], None),
    "cluster": (Annotated[str | None, Field(description="Where there are several clusters: one's name, or 'auto' "
                                                        "(default: placed by the site's objective; plan_job ranks "
                                                        "them).")], None),
    "movable": (Annotated[bool | None, Field(description="Several clusters: corral may move it while it waits to "
                                                         "one where it starts sooner (never run twice; told in "
                                                         "your ledger).")], None),
    "idempotent": (Annotated[bool | None, Field(description="Safe to run twice (fast lane may rerun it).")], None),
    "cache": (Annotated[bool | None, Field(description="Reuse the result of an earlier successful identical "
                                                       "run (script, inputs, env, resources).")], None),
    "inputs": (Annotated[list[str] | None, Field(description="Absolute paths the job reads (max 256): with "
                                                             "cache, a change means a new run.")], None),
    "force": (Annotated[bool | None, Field(description="Run even if this exact job just failed in a way that "
                                                       "repeats.")], None),
    "after_ok": (Annotated[list[Int] | None, Field(description="Start once these job ids all COMPLETED "
                                                               "(else cancelled).")], None),
    "after_any": (Annotated[list[Int] | None, Field(description="Start once these job ids all ended.")], None),
    "image": (Annotated[str | None, Field(description="Environment image name or key (build_environment): "
                                                      "its python first on PATH.")], None),
    "workspace": (Annotated[str | None, Field(description="Workspace id (ws-...): the job runs in it.")], None),
    "tier": (Annotated[Literal["guaranteed", "opportunistic"] | None, Field(
        description="Slurm batch: 'guaranteed' (never preempted; refused with the nearest request when agents' "
                    "guaranteed share is full), 'opportunistic' (preemptible). Default: guaranteed while the "
                    "share has room, else opportunistic; plan_job says which.")], None),
    "signal": (Annotated[str | None, Field(
        description="Slurm's --signal, e.g. 'USR1@120': sent to your command/script N s before its walltime and "
                    "at once when preempted (opportunistic jobs get USR1, 120 s grace, by default). Not on the "
                    "fast lane (lane 'auto' runs it in batch).")], None),
}
"""A job's fields as every tool takes them (submit_job, plan_job, submit_jobs' items):
one shape, strings for memory and walltime, limits said in words too (some clients drop
``maximum``). The service checks them as a JobSpec (corral/core/jobs.py)."""

JobFields = create_model("JobFields", __config__=ConfigDict(extra="forbid"),  # type: ignore[call-overload]
                         **{name: (kind, default) for name, (kind, default) in JOB_FIELDS.items()})


