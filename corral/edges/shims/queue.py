"""``squeue`` and ``scontrol show job`` from corral's shared view: one gateway request
per call, never one to slurmctld, so ``while squeue -j $ID ...; sleep 2; done`` costs
the controller nothing.

Formats are Slurm's: the default and ``-l`` columns, ``-o`` with %-letters (``%.18i``:
right-justified, 18 wide, cut to it), ``-O`` with field names (20 wide unless
``:[.]N``), ``-h``, ``--json``. The jobs are the caller's as corral sees them
(``squeue`` with no filter says so on stderr, since Slurm's would list everyone's);
NODELIST shows the node the job runs on, as its lane reports it (its partition's nodes
where the lane does not say).
"""

from __future__ import annotations

import copy
import functools
import grp
import json
import os
import re
import sys
import time
from typing import Any, Callable

from corral.core.errors import NotFound
from corral.core.slurm_formats import memory_text
from corral.edges.shims.base import (ACTIVE, SHORT, Parser, ShimError, client, elapsed, facility, limit, squeue_time,
                   stamp, unsupported, user)
from corral.edges import reads

DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
MIN_JOB_AGE_S = 300
LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
FORMAT_SPEC = re.compile(r"%(\.)?(-)?(\d+)?([a-zA-Z%])")


class View:
    """One job as the shims print it."""

    def __init__(self, job: dict[str, Any], partition: str, nodes: str, now: float) -> None:
        # The job's own node when its lane said (a cluster's jobs run on one node each), else
        # the partition's (a lane that does not say, or a record from before it did).
        self.j, self.partition, self.nodes, self.now = job, partition, job.get("node") or nodes, now
        spec = job.get("spec") or {}
        self.spec = spec
        labels = spec.get("labels") or {}
        self.task = labels.get("array_task")
        pos = int(labels.get("array_pos", 0) or 0)
        self.array_id = job["id"] - pos if self.task is not None else job["id"]
        self.labels = labels
        # the API's names (walltime, memory); walltime_s/memory_mb were the names before
        self.walltime = int(spec.get("walltime", spec.get("walltime_s", 3600)))
        self.memory = int(spec.get("memory", spec.get("memory_mb", 1024)))
        self.cpus = int(spec.get("cpus", 1))
        self.ntasks = int(labels.get("slurm_ntasks", 1))
        self.name = labels.get("slurm_name") or job.get("name") or "wrap"

    def time_limit(self, fmt: Callable[[float], str] = limit) -> str:
        """What the job asked (UNLIMITED for -t 0/UNLIMITED, as Slurm prints it)."""
        return "UNLIMITED" if self.labels.get("slurm_time") == "UNLIMITED" else fmt(self.walltime)

    def min_memory(self) -> str:
        """squeue's %m: per CPU for --mem-per-cpu, 0 for --mem=0, else per node."""
        if "slurm_mem_per_cpu" in self.labels:
            return memory_text(int(self.labels["slurm_mem_per_cpu"]))
        return "0" if self.labels.get("slurm_mem") == "0" else memory_text(self.memory)

    def tres(self) -> str:
        return (f"cpu={self.cpus},mem={memory_text(self.memory)},node=1,billing={self.cpus}"
                + (f",gres/gpu={self.spec['gpus']}" if self.spec.get("gpus") else ""))

    @property
    def jobid(self) -> str:
        return f"{self.array_id}_{self.task}" if self.task is not None else str(self.j["id"])

    @property
    def state(self) -> str:
        return self.j["state"]

    def reason(self) -> str:
        if self.state == "RUNNING":
            return self.nodes
        r = self.j.get("reason") or ""
        if self.j.get("held") or r.startswith("held"):
            return "(JobHeldUser)"
        if r.startswith("waiting for job") or (self.state == "PENDING" and "slurm_dependency" in self.labels
                                                and not re.fullmatch(r"(?!None$)[A-Z][A-Za-z_]+", r)):
            return "(Dependency)"
        word = r if re.fullmatch(r"[A-Z][A-Za-z_]+", r or "") else "None"  # Slurm's own words pass, corral's not
        return f"({word})" if self.state == "PENDING" else "(None)"

    def field(self, key: str) -> str:
        # Only the field asked is computed: %a (account) asks the gateway who the caller is,
        # a second request that every default-format row paid for when all were built.
        j, s = self.j, self.spec
        fields: dict[str, Callable[[], str]] = {
            "i": lambda: self.jobid, "A": lambda: str(self.array_id), "K": lambda: self.task or "N/A",
            "P": lambda: self.partition, "j": lambda: self.name, "u": user, "t": lambda: SHORT.get(self.state, "NF"),
            "T": lambda: self.state, "M": lambda: squeue_time(elapsed(j, self.now)), "D": lambda: "1",
            "R": self.reason, "N": lambda: self.nodes if self.state == "RUNNING" else "",
            "r": lambda: self.reason().strip("()") if self.state != "RUNNING" else "None", "l": self.time_limit,
            "L": lambda: (limit(max(0, self.walltime - elapsed(j, self.now))) if self.state == "RUNNING"
                          else self.time_limit()),
            "C": lambda: str(self.cpus), "m": self.min_memory, "V": lambda: stamp(j.get("submit_time")),
            "S": lambda: stamp(j.get("start_time")) if j.get("start_time") else "N/A",
            "e": lambda: stamp(j.get("end_time")) if j.get("end_time") else "N/A", "Z": lambda: s.get("workdir") or "",
            "a": account, "b": lambda: f"gpu:{s['gpus']}" if s.get("gpus") else "N/A", "%": lambda: "%",
            "stdout": lambda: self.io_path("slurm_stdout"), "stderr": lambda: self.io_path("slurm_stderr"),
            "stdin": lambda: "/dev/null",
        }
        return fields[key]()

    def io_path(self, key: str) -> str:
        """-O STDOUT/STDERR: the file as given, patterns unexpanded, made absolute (Slurm 22.05's squeue)."""
        text = self.labels.get(key)
        if not text:
            return "/dev/null"
        return text if text.startswith("/") else os.path.join(self.spec.get("workdir") or "", text)


HEADERS = {"i": "JOBID", "A": "ARRAY_JOB_ID", "K": "ARRAY_TASK_ID", "P": "PARTITION", "j": "NAME", "u": "USER",
           "t": "ST", "T": "STATE", "M": "TIME", "D": "NODES", "R": "NODELIST(REASON)", "N": "NODELIST",
           "r": "REASON", "l": "TIME_LIMIT", "L": "TIME_LEFT", "C": "CPUS", "m": "MIN_MEMORY", "V": "SUBMIT_TIME",
           "S": "START_TIME", "e": "END_TIME", "Z": "WORK_DIR", "a": "ACCOUNT", "b": "TRES_PER_NODE", "%": "%",
           "stdout": "STDOUT", "stderr": "STDERR", "stdin": "STDIN"}
"""The %-letters a shim can answer truly; the others (priority, QOS, command, comment ...)
are refused by name rather than made up."""
LONG_FIELDS = {"jobid": "i", "arrayjobid": "A", "arraytaskid": "K", "partition": "P", "name": "j", "username": "u",
               "statecompact": "t", "state": "T", "timeused": "M", "numnodes": "D", "reasonlist": "R",
               "nodelist": "N", "reason": "r", "timelimit": "l", "timeleft": "L", "numcpus": "C",
               "minmemory": "m", "submittime": "V", "starttime": "S", "endtime": "e", "workdir": "Z",
               "account": "a", "stdout": "stdout", "stderr": "stderr", "stdin": "stdin"}


def group_name() -> str:
    try:
        return grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        return str(os.getgid())


@functools.lru_cache(maxsize=1)
def account() -> str:
    """The account corral charges: the principal's, else (as Slurm's default account
    usually is) the user's name."""
    try:
        return str(client().whoami().get("account") or user())
    except Exception:  # noqa: BLE001 - the field is a courtesy; the answer is not worth failing for
        return user()


def compile_format(fmt: str) -> list[tuple[str, Any]]:
    """-o FORMAT as [(literal text, None) | (letter, (right, width))]."""
    out: list[tuple[str, Any]] = []
    pos = 0
    for m in FORMAT_SPEC.finditer(fmt):
        if m.start() > pos:
            out.append((fmt[pos:m.start()], None))
        letter = m[4]
        if letter not in HEADERS:
            unsupported("squeue", f"the format field %{letter}")
        out.append((letter, (bool(m[1]), int(m[3]) if m[3] else None)))
        pos = m.end()
    if pos < len(fmt):
        out.append((fmt[pos:], None))
    return out


def compile_long(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for part in text.split(","):
        name, _, width = part.partition(":")
        letter = LONG_FIELDS.get(name.strip().lower())
        if letter is None:
            if name.strip().lower() in ("command", "comment", "qos", "priority", "prioritylong", "nice"):
                unsupported("squeue", f"the field {name}", "corral does not know it of a job")
            raise ShimError(f"Invalid job format specification: {name}")
        right = width.startswith(".")
        out.append((letter, (right, int(width.lstrip(".")) if width.strip(".") else 20)))
    return out


WHOLE = set("lLM")
"""Times squeue prints whole past their width (-l's %.9l shows 1-12:00:00)."""


def render(fields: list[tuple[str, Any]], value: Callable[[str], str], header: bool) -> str:
    cells = []
    for key, how in fields:
        if how is None:
            cells.append(key)
            continue
        right, width = how
        text = HEADERS[key] if header else value(key)
        if width is not None:
            if header or key not in WHOLE:
                text = text[:width]
            text = text.rjust(width) if right else text.ljust(width)
        cells.append(text)  # -O fields are padded and follow each other with no separator
    return "".join(cells)


def parse_states(text: str) -> set[str]:
    names = {v: k for k, v in SHORT.items()}
    out: set[str] = set()
    for s in text.upper().split(","):
        if s == "ALL":
            return set(SHORT)
        if s in SHORT:
            out.add(s)
        elif s in names:
            out.add(names[s])
        elif s in ("COMPLETING", "CG", "CONFIGURING", "CF", "SUSPENDED", "S", "PREEMPTED", "PR", "NODE_FAIL", "NF",
                   "BOOT_FAIL", "BF", "DEADLINE", "DL", "REQUEUED", "RQ", "RESIZING", "RS", "REVOKED", "RV",
                   "SIGNALING", "SI", "SPECIAL_EXIT", "SE", "STAGE_OUT", "SO", "STOPPED", "ST"):
            continue  # corral's jobs are never in these: nothing matches, as in Slurm
        else:
            raise ShimError(f"Invalid job state specified: {s}\nsqueue: error: Valid job states include: "
                            "PENDING,RUNNING,SUSPENDED,COMPLETED,CANCELLED,FAILED,TIMEOUT,NODE_FAIL,PREEMPTED,"
                            "BOOT_FAIL,DEADLINE,OUT_OF_MEMORY,COMPLETING,CONFIGURING,RESIZING,RESV_DEL_HOLD,"
                            "REQUEUED,REQUEUE_FED,REQUEUE_HOLD,REVOKED,SIGNALING,SPECIAL_EXIT,STAGE_OUT,STOPPED")
    return out


def fetch(ids: list[str] | None, server_states: list[str] | None = None) -> list[View]:
    """The caller's jobs as corral sees them: those ``ids`` (one request each), or the
    listing (filtered by state on the gateway), newest first with pending ones ahead."""
    c = client()
    parts = facility(c).get("partitions") or []
    default = next((p["name"] for p in parts if p.get("default")), parts[0]["name"] if parts else "batch")
    nodes = {p["name"]: ",".join(p.get("nodes") or []) or "localhost" for p in parts}
    now = time.time()
    if ids:
        jobs: list[dict[str, Any]] = []
        seen: set[int] = set()
        listing: list[dict[str, Any]] | None = None
        for raw in ids:
            base = raw.split(".")[0]
            head, _, task = base.partition("_")
            if not head.isdigit():
                raise ShimError("Invalid job id specified", bare=True)
            try:
                job = c.run(reads.job, int(head))  # one request per id: old jobs too, whatever the listing holds
            except NotFound:
                continue
            labels = (job.get("spec") or {}).get("labels") or {}
            if "array_task" not in labels or View(job, "", "", now).array_id != int(head):  # a job, or one task
                if job["id"] not in seen:
                    seen.add(job["id"])
                    jobs.append(job)
                continue
            if listing is None:  # an array: its tasks are the jobs that share its first id
                listing = c.run(reads.jobs, full=True, limit=1000)["jobs"]
            for j in listing:
                v0 = View(j, "", "", now)
                if v0.array_id == int(head) and (not task or v0.task == task) and j["id"] not in seen:
                    seen.add(j["id"])
                    jobs.append(j)
    else:
        jobs = c.run(reads.jobs, full=True, limit=1000, state=server_states)["jobs"]
    out = []
    for j in jobs:
        spec = j.get("spec") or {}
        part = spec.get("partition") or default
        if j["state"] == "PENDING" and ((spec.get("labels") or {}).get("slurm_partition")):
            part = spec["labels"]["slurm_partition"]  # -p A,B: Slurm lists them all until one starts it
        out.append(View(j, part, nodes.get(part, "localhost"), now))
    out.sort(key=lambda v: (v.state != "PENDING", -v.j["id"]))
    return out


def min_job_age() -> float:
    """How long slurmctld keeps an ended job (MinJobAge): $CORRAL_MIN_JOB_AGE_S (a test's),
    else the cluster's as the facility reports it (the Slurm backend reads slurm.conf),
    else Slurm's default, 300 s (the local backend's)."""
    try:
        parts = facility(client()).get("partitions") or [{}]
        return float(os.environ.get("CORRAL_MIN_JOB_AGE_S") or parts[0].get("min_job_age_s") or MIN_JOB_AGE_S)
    except (TypeError, ValueError):
        return MIN_JOB_AGE_S


def held(v: View) -> bool:
    """Whether Slurm's controller would still hold this job: active, or ended within MinJobAge."""
    return v.state in ACTIVE or (v.j.get("end_time") or v.now) > v.now - min_job_age()


def keep(vs: list[View], states: set[str] | None, partitions: set[str] | None, names: set[str] | None,
         active_only: bool) -> list[View]:
    return [v for v in vs if not (active_only and v.state not in ACTIVE) and (states is None or v.state in states)
            and (not partitions or v.partition in partitions) and (not names or v.name in names)]


def views(ids: list[str] | None, states: set[str] | None, partitions: set[str] | None,
          names: set[str] | None, active_only: bool) -> list[View]:
    """The caller's jobs, filtered as squeue/sacct/scontrol ask (an active-only or
    by-state listing is filtered by the gateway already)."""
    server = None if ids else sorted(ACTIVE) if active_only else sorted(states) if states else None
    return keep(fetch(ids, server), states, partitions, names, active_only)


@functools.lru_cache(maxsize=None)
def _squeue_parser() -> Parser:
    """Built once per process (the shim helper builds it before forking)."""
    p = Parser(prog="squeue", allow_abbrev=True)
    a = p.add_argument
    a("-h", "--noheader", action="store_true")
    a("-j", "--jobs")
    a("-u", "--user")
    a("--me", action="store_true")
    a("-t", "--states")
    a("-p", "--partition")
    a("-n", "--name")
    a("-o", "--format")
    a("-O", "--Format")
    a("-l", "--long", action="store_true")
    a("-a", "--all", action="store_true")
    a("-r", "--array", action="store_true")
    a("-v", "--verbose", action="store_true")
    a("--json", action="store_true")
    a("-S", "--sort")
    a("-i", "--iterate")
    a("-A", "--account")
    a("-q", "--qos")
    a("-w", "--nodelist")
    return p


def squeue(argv: list[str]) -> int:
    ns = _squeue_parser().parse_args(argv)
    _refuse(ns)
    if ns.jobs is not None and not ns.jobs.strip(","):
        return _no_job(ns)
    ids = ns.jobs.split(",") if ns.jobs else None
    states = parse_states(ns.states) if ns.states else None
    pool = _pool(ns, ids, states)
    parts, names = _set_of(ns.partition), _set_of(ns.name)
    vs = keep(pool, states, parts, names, active_only=states is None)
    if ids and len(ids) == 1:
        _held_or_refused(pool)
    if not (ids or _filtered(ns)) and sys.stderr.isatty():
        print("squeue: corral shows your jobs only", file=sys.stderr)
    if ns.json:  # as Slurm's, the jobs the controller still holds: ended ones for MinJobAge (300 s)
        recent = [v for v in keep(pool, None, parts, names, active_only=False)  # -p and -n hold here too
                  if held(v)]
        print(json.dumps({"jobs": [_json(v) for v in (vs if states else recent)]}, indent=2))
    else:
        _table(ns, vs, ns.array or any("_" in i for i in ids or []))  # ID_1 asked: listed as ID_1
    return 0


def _no_job(ns: Any) -> int:
    """-j "" (an empty $ID after a failed sbatch): Slurm lists no job, not every job, so
    `while squeue -h -j "$ID" | grep -q .` ends."""
    if not ns.noheader:
        print(render(compile_format(_format(ns)), lambda k: "", True))
    return 0


def _held_or_refused(pool: list[View]) -> None:
    """squeue -j ONE of a job slurmctld no longer holds (never known, or ended over MinJobAge
    ago) fails as Slurm's does, so `while squeue -h -j $ID; do sleep 2; done` ends; with
    several ids Slurm lists those it holds and exits 0."""
    if not [v for v in pool if held(v)]:
        raise ShimError("slurm_load_jobs error: Invalid job id specified", bare=True)


def _refuse(ns: Any) -> None:
    """The options corral's squeue refuses, in words that say what to do instead."""
    for flag, why in (("sort", "corral lists newest first"), ("iterate", "wait with corral wait or wait_for_events"),
                      ("account", ""), ("qos", ""), ("nodelist", "")):
        if getattr(ns, flag):
            unsupported("squeue", f"--{flag}", why)
    if ns.user and set(ns.user.split(",")) - {user()}:
        unsupported("squeue", f"--user={ns.user}", "corral shows you your own jobs (and your agents')")


def _pool(ns: Any, ids: list[str] | None, states: set[str] | None) -> list[View]:
    """One fetch: the ids asked (known or not), every job for --json, else what is asked."""
    if ids or (ns.json and not states):
        return fetch(ids)
    return fetch(None, sorted(states) if states else sorted(ACTIVE))


def _filtered(ns: Any) -> bool:
    """Whether the listing is narrowed by user, state, partition or name (none: Slurm's
    would list everyone's jobs, corral's the caller's)."""
    return bool(ns.user or ns.me or ns.states or ns.partition or ns.name)


def _set_of(text: str | None) -> set[str] | None:
    """-p A,B or -n A,B as a set; None: not asked."""
    return set(text.split(",")) if text else None


def _format(ns: Any) -> str:
    """-o's format, else -l's or the default."""
    return str(ns.format or (LONG if ns.long else DEFAULT))


def _table(ns: Any, vs: list[View], split: bool) -> None:
    """The listing in squeue's columns: -l's date line, the header, a line a job (an
    array's pending tasks on one line unless ``split``)."""
    fields = compile_long(ns.Format) if ns.Format else compile_format(_format(ns))
    if ns.long and not ns.noheader:
        print(time.strftime("%a %b %d %H:%M:%S %Y"))
    if not ns.noheader:
        print(render(fields, lambda k: "", True))
    for v in _arrays(vs, split):
        print(render(fields, v.field, False))


def _arrays(vs: list[View], split: bool) -> list[View]:
    """An array's pending tasks as Slurm lists them: one line, ``ID_[0-2]`` (the private
    Slurm: ``3125_[0,3,6]``, ``3126_[5]``), or with ``-r`` one line a task, by index."""
    groups: dict[int, list[View]] = {}
    for v in vs:
        if v.task is not None and v.state == "PENDING":
            groups.setdefault(v.array_id, []).append(v)
    out: list[View] = []
    for v in vs:
        if not (v.task is not None and v.state == "PENDING"):
            out.append(v)
            continue
        group = groups.pop(v.array_id, [])  # empty: listed with its array already
        group.sort(key=lambda x: int(x.task or 0))
        if group and not split:
            first = copy.copy(group[0])
            first.task = "[" + _ranges([int(x.task or 0) for x in group]) + "]"
            group = [first]
        out += group
    return out


def _ranges(ids: list[int]) -> str:
    """0,1,2,5 -> '0-2,5' (Slurm's way of writing a set of array indices)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _json(v: View) -> dict[str, Any]:
    j, s = v.j, v.spec
    return {"job_id": j["id"], "name": v.name, "job_state": v.state, "partition": v.partition,
            "user_name": user(), "cpus": s.get("cpus", 1), "node_count": 1, "nodes": v.nodes if v.state == "RUNNING"
            else "", "time_limit": v.walltime // 60, "submit_time": int(j.get("submit_time") or 0),
            "start_time": int(j.get("start_time") or 0), "end_time": int(j.get("end_time") or 0),
            "state_reason": v.reason().strip("()") if v.state != "RUNNING" else "None",
            "exit_code": j.get("exit_code") or 0, "current_working_directory": s.get("workdir") or "",
            "standard_output": v.io_path("slurm_stdout"), "standard_error": v.io_path("slurm_stderr"),
            "standard_input": "/dev/null"}
