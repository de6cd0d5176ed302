"""Jobs: what a caller asks for (``JobSpec``), what corral records (``Job``), and
the one ``JobState`` vocabulary every backend is translated into."""

from __future__ import annotations

import enum
import functools
import math
import os
import re
from typing import NamedTuple, Annotated, Any, Callable, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from corral.core import slurm_formats
from corral.core.errors import NotFound
from corral.core.lane_names import LaneChoice
from corral.core.signals import parse_notice
from corral.core.text import IMAGE_REF, WS_ID


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    """Accepted, waiting for resources."""
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    """Ended with exit code 0."""
    FAILED = "FAILED"
    """Ended with a non-zero exit code, or could not start (see ``reason``)."""
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    """Killed for running past its walltime."""
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    """Killed for using more memory than it asked for."""
    UNKNOWN = "UNKNOWN"
    """The backend reported a state corral does not know; logged, never a crash."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY}
)

_MEM_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_DUR_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_memory_mb(value: Any) -> int:
    """'512M', '4G', '4GB', 2048 (MB) -> megabytes."""
    if isinstance(value, bool):
        raise ValueError("memory must be a size such as '512M' or '4G'")
    if isinstance(value, (int, float)):
        mb = float(value) if abs(value) < 1e300 else math.inf  # a 400-digit int must not overflow
    else:
        m = _MEM_RE.match(str(value))
        if not m:
            raise ValueError(f"memory {value!r} is not a size; write it like '512M', '4G' or 2048 (MB)")
        mb = float(m.group(1)) * _MEM_UNITS[m.group(2).upper()]
    if not math.isfinite(mb) or mb > 64 * 1024 * 1024:
        raise ValueError("memory over 64T is not a request any node can meet; ask for less")
    if mb < 1:
        raise ValueError(f"memory must be at least 1M, got {value!r}")
    return int(round(mb))


MAX_DURATION_S = 10 * 365 * 86400
"""Longest duration corral takes anywhere (a walltime, an expiry): fits every clock and int."""


def parse_duration_s(value: Any, what: str = "walltime", unit_required: bool = False) -> int:
    """'90s', '30m', '2h', '1d', 600 (a number: seconds), or Slurm's colon forms read as
    Slurm reads them ('MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS', through
    corral.core.slurm_formats) -> seconds. ``unit_required`` (a job's walltime): a string of
    bare digits is refused, since Slurm reads minutes there and a program seconds; else
    it is seconds. ``what`` names the field in errors (walltime, expiry ...)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration such as '30m' or '02:00:00'")
    if isinstance(value, (int, float)):
        secs = float(value) if abs(value) < 1e300 else math.inf  # a 400-digit int must not overflow
    else:
        text = str(value).strip()
        if "-" in text or ":" in text:
            try:
                secs = slurm_formats.time_seconds(text, whole_minutes=False)
            except ValueError:
                raise ValueError(f"{what} {value!r} is not a duration; write '30m', '2h', 'HH:MM:SS' or "
                                 "'D-HH:MM:SS'") from None
            if secs == slurm_formats.NO_LIMIT:
                raise ValueError(f"{what} {value!r} asks for no limit; write the limit itself, e.g. '2h'")
        elif text.isdigit() and unit_required:
            raise ValueError(f"{what} {value!r} has no unit: write '{text}m' (what Slurm means by a bare "
                             f"number) or '{text}s', or send a JSON number of seconds")
        else:
            m = _DUR_RE.match(text)
            if not m:
                raise ValueError(f"{what} {value!r} is not a duration; write '30m', '2h' or 'HH:MM:SS'")
            secs = float(m.group(1)) * _DUR_UNITS[m.group(2).lower()]
    if not math.isfinite(secs) or secs > MAX_DURATION_S:
        raise ValueError(f"{what} {value!r} is too long; at most {MAX_DURATION_S // 86400} days")
    if secs < 1:
        raise ValueError(f"{what} must be at least 1 second, got {value!r}")
    return int(round(secs))


def format_duration(seconds: int) -> str:
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def _text_cached(parse: Callable[[Any], int]) -> Callable[[Any], int]:
    """A sweep's specs repeat the same few strings ('5m', '100M'): each is parsed once."""
    cached = functools.lru_cache(maxsize=1024)(parse)
    return lambda value: cached(value) if type(value) is str else parse(value)


MemoryMB = Annotated[int, BeforeValidator(_text_cached(parse_memory_mb))]
def _walltime(value: Any) -> int:
    return parse_duration_s(value, unit_required=True)


Seconds = Annotated[int, BeforeValidator(_text_cached(_walltime))]

_NAME_RE = r"^[A-Za-z0-9_.+-]{1,64}$"


def _whole(value: Any) -> Any:
    # JSON has one number type: 2.0 is the whole number 2 (JSON Schema's integer says so
    # too), while true, 2.5 and "2" stay refused.
    return int(value) if type(value) is float and value.is_integer() and abs(value) < 1e18 else value


Whole = Annotated[int, BeforeValidator(_whole)]


MAX_INT = 2**53 - 1
"""The largest id, offset or count corral takes: the largest integer every JSON reader
holds exactly (within SQLite's INTEGER and a file offset). At 2^63 - 1 the schemas'
``maximum`` was itself read as 2^63 by clients that parse numbers as doubles, and what
they generated as valid was refused (seen: schemathesis, tests/test_contract.py)."""
MAX_DEPENDENCIES = 100
"""Jobs one job may wait for (after_ok and after_any each)."""
MAX_COMMAND = 64 * 1024
MAX_SCRIPT = 256 * 1024
MAX_ENV_VARS = 256
MAX_ENV_VALUE = 32 * 1024
MAX_ENV_TOTAL = 128 * 1024
"""Sizes a job's text may have: every byte of it is parsed for risk before it runs, and its
environment must fit what execve accepts (MAX_ARG_STRLEN is 128 KiB a string)."""


def _check_env(env: dict[str, str]) -> None:
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"env has {len(env)} variables; at most {MAX_ENV_VARS}")
    total = 0
    for key, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$", key):
            raise ValueError(f"environment variable name {key[:80]!r} is invalid; use letters, digits and _")
        if "\x00" in value:
            raise ValueError(f"environment variable {key} contains a NUL byte; remove it")
        if len(value) > MAX_ENV_VALUE:
            raise ValueError(f"environment variable {key} is {len(value)} characters; at most {MAX_ENV_VALUE}")
        total += len(key) + len(value) + 2
    if total > MAX_ENV_TOTAL:
        raise ValueError(f"env is {total} characters in all; at most {MAX_ENV_TOTAL} (put large data in a file)")


def check_path(path: str, what: str) -> None:
    if "\x00" in path:
        raise ValueError(f"{what} contains a NUL byte; remove it")
    if any(c < " " or c == "\x7f" for c in path):
        # A newline in a path would end a line of a batch script or a log; no directory
        # worth running in needs one (issue 32's review: #SBATCH lines smuggled in a workdir).
        raise ValueError(f"{what} contains a control character (a newline, tab or the like); rename the directory")
    if not path.startswith("/"):
        raise ValueError(f"{what} must be an absolute path")
    if len(path) > 4096 or any(len(part.encode()) > 255 for part in path.split("/")):
        raise ValueError(f"{what} is too long: at most 4096 characters, 255 bytes a component")


_TEXT = "^[^\\u0000]*$"
"""JSON Schema for text without NUL (corral refuses it, and a lone surrogate: no file or
database keeps them; a surrogate range here made schemathesis drop the whole pattern)."""
MAX_WALLTIME_S = 366 * 86400
MAX_MEMORY_MB = 64 * 1024 * 1024


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _spec_schema(schema: dict[str, Any]) -> None:
    """The documented schema says what the validators accept, so that a client (and a
    generator such as schemathesis) can build a valid job from it: exactly one of command
    and script, the text and size rules, and the units of memory and walltime."""
    props = schema["properties"]

    def put(name: str, rule: dict[str, Any]) -> None:
        keep = {k: props[name][k] for k in ("description", "title", "default") if k in props[name]}
        props[name] = {**rule, **keep}

    put("command", _nullable({"type": "string", "minLength": 1, "maxLength": MAX_COMMAND, "pattern": _TEXT}))
    put("script", _nullable({"type": "string", "minLength": 1, "maxLength": MAX_SCRIPT, "pattern": _TEXT}))
    path = {"type": "string", "pattern": "^/[^\\u0000-\\u001f\\u007f]*$", "maxLength": 4096}
    put("workdir", _nullable(path))
    put("inputs", _nullable({"type": "array", "items": path, "maxItems": 256}))
    put("env", {"type": "object", "maxProperties": MAX_ENV_VARS,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,255}$"},
                "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE, "pattern": _TEXT}})
    put("labels", {"type": "object", "maxProperties": 32,
                   "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": _TEXT},
                   "additionalProperties": {"type": "string", "maxLength": 256, "pattern": _TEXT}})
    put("memory", {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_MEMORY_MB},
                             {"type": "string", "pattern": "^([1-9][0-9]{0,6}[Mm]?|[1-9][0-9]{0,3}[Gg]|[1-9][Tt]|[1-5][0-9][Tt]|6[0-4][Tt])$"}]})
    put("walltime", {"anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_WALLTIME_S},
        {"type": "string", "pattern": "^([1-9][0-9]{0,3}[sm]|[1-9][0-9]{0,2}h|[1-9][0-9]?d|[12][0-9]{2}d|3[0-5][0-9]d|36[0-6]d|"
                                      "[0-9]{1,2}:[0-5][0-9]:[0-5][0-9]|[1-9]-[0-9]{1,2}:[0-5][0-9]:[0-5][0-9])$"}]})
    for dep in ("after_ok", "after_any"):
        props[dep]["anyOf"][0]["uniqueItems"] = True
    schema["anyOf"] = [{"required": ["command"], "properties": {"command": {"type": "string"},
                                                                "script": {"type": "null"}}},
                       {"required": ["script"], "properties": {"script": {"type": "string"},
                                                               "command": {"type": "null"}}}]


class JobSpec(BaseModel):
    """What a caller asks to run. Unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_spec_schema)

    command: str | None = Field(None, description="A shell command line, run with bash -c (at most 64 KiB).",
                                max_length=MAX_COMMAND)
    script: str | None = Field(None, description="A whole job script, bash unless it has a #! line (at most 256 KiB).",
                               max_length=MAX_SCRIPT)
    workdir: str | None = Field(None, description="Absolute working directory; must exist. Default: corral's job directory.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    cpus: Whole = Field(1, ge=1, le=100_000, strict=True, description="CPU cores (a whole number; true is not 1).")
    memory_mb: MemoryMB = Field(1024, alias="memory", description="Memory: '512M', '4G' or MB as a number.")
    gpus: Whole = Field(0, ge=0, le=1024, strict=True, description="GPUs (a whole number).")
    walltime_s: Seconds = Field(3600, alias="walltime", description=(
        "Time limit with its unit: '90s', '30m', '2h', '1d', Slurm's 'HH:MM:SS' or 'D-HH:MM:SS', or a JSON "
        "number of seconds. A string of bare digits is refused (Slurm reads minutes there, a program seconds)."))
    partition: str | None = Field(None, pattern=_NAME_RE, description="Partition (queue); default: the facility's default.")
    name: str | None = Field(None, pattern=_NAME_RE, description="A short name for people.")
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form key/value labels.")
    lane: LaneChoice | None = Field(
        None, description="'fast': a warm pool runs it at once (short, small tasks); 'batch': the scheduler's queue; "
                          "'auto': fast when it fits. Default: the facility's (usually batch).")
    cluster: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9-]{0,31}$",
        description="Where a batch job runs at a facility of several clusters: a cluster's name, or 'auto' (the "
                    "default): placed by the facility's objective (earliest start, fewest SUs, or a blend); "
                    "plan_job ranks them.")
    movable: bool | None = Field(
        None, description="At a facility of several clusters: while it waits, corral may move it to another cluster "
                          "where Slurm says it starts sooner (held and cancelled where it waits, then submitted "
                          "there as the same job: never run twice). You are told in your ledger.")
    idempotent: bool | None = Field(
        None, description="Safe to run twice: if the fast-lane allocation running it dies, rerun it instead of failing it.")
    cache: bool | None = Field(
        None, description="Reuse the result of an earlier successful run of exactly this job (script, inputs, "
                          "environment, resources) instead of running it again.")
    inputs: list[str] | None = Field(
        None, max_length=256, description="Absolute paths of the files the job reads: with cache, a change to any "
                                          "of them means a new run.")
    force: bool | None = Field(
        None, description="Run even if this exact job just failed in a way that repeats (corral refuses that otherwise).")
    after_ok: list[Annotated[int, Field(ge=1, le=MAX_INT)]] | None = Field(
        None, max_length=MAX_DEPENDENCIES,
        description="Start only once these jobs (corral ids) have all COMPLETED; if one ends any other way, this "
                    "job is cancelled (Slurm's --dependency=afterok).")
    after_any: list[Annotated[int, Field(ge=1, le=MAX_INT)]] | None = Field(
        None, max_length=MAX_DEPENDENCIES,
        description="Start only once these jobs (corral ids) have all ended, however they ended "
                    "(Slurm's --dependency=afterany).")

    image: str | None = Field(
        None, pattern=IMAGE_REF,
        description="An environment image mounted read-only in the job, its python first on PATH: the name you "
                    "gave one of yours (corral env build --name), its key (corral env list), or OWNER/NAME for "
                    "another principal's. 'env': NAME says the same.")
    tier: Literal["guaranteed", "opportunistic"] | None = Field(
        None, description="An agent's batch job on Slurm: 'guaranteed' (never preempted; granted while agents' "
                          "guaranteed share has room, else refused with the nearest request), 'opportunistic' "
                          "(preemptible: runs on idle cores, requeued when a person needs them). Default: "
                          "guaranteed while the share has room, else opportunistic; plan_job says which.")
    signal: Annotated[str | None, BeforeValidator(parse_notice)] = Field(
        None, description="Slurm's --signal: 'USR1@120' sends the job USR1 120 s before its walltime ends, and at "
                          "once when it is preempted (an opportunistic job gets USR1 by default). One of HUP, INT, "
                          "QUIT, USR1, USR2. Not on the fast lane: lane 'auto' runs it in batch, 'fast' refuses it.")
    workspace: str | None = Field(
        None, pattern=WS_ID,
        description="A trial workspace (from corral workspace fork DIR): the job runs in it and its writes stay "
                    "there until the workspace is committed or discarded.")

    @model_validator(mode="before")
    @classmethod
    def _env_names_an_image(cls, data: Any) -> Any:
        # The issue's spelling, env: NAME_OR_HASH, beside env as the job's variables.
        if isinstance(data, dict) and isinstance(data.get("env"), str):
            if data.get("image") not in (None, data["env"]):
                raise ValueError("give the image once: 'env': NAME or 'image': NAME")
            data = {**data, "image": data["env"]}
            del data["env"]
        return data

    @model_validator(mode="after")
    def _one_of_command_or_script(self) -> "JobSpec":
        if bool(self.command) == bool(self.script):
            raise ValueError("give exactly one of 'command' (a shell line) or 'script' (a job script)")
        if self.walltime_s > MAX_WALLTIME_S:
            raise ValueError("walltime over a year is not a request any facility can meet; ask for less")
        if self.memory_mb > 1024 * 1024 * 64:
            raise ValueError("memory over 64T is not a request any node can meet; ask for less")
        for what, text in (("command", self.command), ("script", self.script), ("name", self.name)):
            if text and "\x00" in text:
                raise ValueError(f"{what} contains a NUL byte; remove it")
        _check_env(self.env)
        if len(self.labels) > 32:
            raise ValueError("at most 32 labels per job")
        for key, value in self.labels.items():
            if len(key) > 64 or len(value) > 256 or "\x00" in key + value:
                raise ValueError("a label is a key of at most 64 and a value of at most 256 characters, without NUL")
        for path in self.inputs or []:
            check_path(path, f"input {path[:80]!r}")
        if self.workdir is not None:
            check_path(self.workdir, "workdir")
        return self

    @field_validator("workdir")
    @classmethod
    def _normal_workdir(cls, v: str | None) -> str | None:
        # Checked and run as the path it names: '/tmp/../../etc' is '/etc', and is refused
        # or allowed as '/etc', never as something under /tmp.
        return os.path.normpath(v) if v and v.startswith("/") and "\x00" not in v else v

    @field_validator("after_ok", "after_any")
    @classmethod
    def _once_each(cls, v: list[int] | None, info: Any) -> list[int] | None:
        seen: set[int] = set()
        for job_id in v or ():
            if job_id in seen:
                raise ValueError(f"{info.field_name} names job {job_id} twice; name each job once")
            seen.add(job_id)
        return v

    @property
    def parents(self) -> list[int]:
        """The jobs this one waits for (after_ok, then after_any)."""
        return [*(self.after_ok or ()), *(self.after_any or ())]

    def public(self) -> dict[str, Any]:
        """The spec as a caller writes it (with aliases)."""
        return self.model_dump(by_alias=True, exclude_none=True)


def no_job(job_id: int) -> NotFound:
    """The one answer for a job that is missing or not the caller's (they read alike)."""
    return NotFound(f"no job {job_id} visible to you; list your jobs to find the right id")


class Job(BaseModel):
    """corral's record of one job: its identity, who asked, and what happened."""

    model_config = ConfigDict(frozen=True)

    id: int
    principal: str
    session: str | None = None
    backend: str
    backend_id: str | None = None
    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    spec: JobSpec
    requeues: int = 0
    """Times the scheduler requeued the job (an agent's opportunistic job preempted by a
    person's): each time it ran again from the start; it is still this one job."""
    lost_s: float | None = None
    """Seconds of work the requeued runs had done and lost (None: none, or not measured yet)."""
    node: str | None = None
    """The node it ran on (its last run's), as its scheduler or lane reported it."""
    advice: list[str] = []
    """What corral's memory says about this submission (set on submit, not stored)."""

    def sent_as(self, backend_id: str) -> Job:
        """This job once its lane took it: the same record with its backend id."""
        return Job.stored(**{**self.__dict__, "backend_id": backend_id})

    @classmethod
    def stored(cls, **fields: Any) -> Job:
        """A job from values corral itself validated and stored: no validation, as
        ``model_construct``, but without its per-field default handling (~10 µs a job,
        ~3 µs here); a sweep's submit, wait and outcomes each build hundreds."""
        job = cls.__new__(cls)
        fields.setdefault("requeues", 0)
        fields.setdefault("lost_s", None)
        fields.setdefault("node", None)
        fields.setdefault("advice", [])
        object.__setattr__(job, "__dict__", fields)
        object.__setattr__(job, "__pydantic_fields_set__", set(fields))
        object.__setattr__(job, "__pydantic_extra__", None)
        object.__setattr__(job, "__pydantic_private__", None)
        return job

    def with_advice(self, advice: list[str]) -> Job:
        return Job.stored(**{**self.__dict__, "advice": advice})

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def summary(self) -> dict[str, Any]:
        """A compact view for listings and for models' context windows."""
        return {
            "id": self.id,
            "name": self.spec.name,
            "principal": self.principal,
            "session": self.session,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "requeues": self.requeues,
            "lost_s": self.lost_s,
            "node": self.node,
            # A fast-lane task runs on its pool's cluster, which its spec names (decision 0053).
            "cluster": (self.spec.cluster if self.spec.cluster != "auto" else None) if self.backend == "fast"
            else self.backend,
        }

    def to_dict(self) -> dict[str, Any]:
        out = self.summary()
        out["backend"] = self.backend
        out["backend_id"] = self.backend_id
        out["spec"] = self.spec.public()
        if self.advice:
            out["advice"] = self.advice
        return out


from corral.core.slurm_formats import array_indices  # noqa: E402  (one parser of Slurm's formats)


def expand_array(specs: list[JobSpec], text: str, limit: int = 1000) -> list[JobSpec]:
    """An array's jobs: ``specs`` holds the one spec each index runs, its index in
    $CORRAL_ARRAY_TASK_ID (and $SLURM_ARRAY_TASK_ID, which scripts written for Slurm
    read) and in the label ``array_task``. Raises ValueError saying what to fix."""
    if len(specs) != 1:
        raise ValueError("with array, jobs holds exactly one job: the one each index runs")
    spec = specs[0]
    return [spec.model_copy(update={
        "env": {**spec.env, "CORRAL_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_ID": str(i)},
        "labels": {**spec.labels, "array_task": str(i)}}) for i in array_indices(text, limit)]


class Parent(NamedTuple):
    """What a waiting job needs to know of a job it waits for (control/dependencies.py)."""

    state: str
    backend: str
    backend_id: str | None
    principal: str
