"""``sacct`` from corral's records: the caller's jobs, with the batch step Slurm lists
under each job that started (unless ``-X``), in Slurm's columns: the default seven,
``-o/--format`` (``Name%N`` widths), ``-P``/``-p``, ``-n``, ``-b``, ``--json``."""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Any

from corral.core.slurm_formats import memory_text
from corral.edges.shims.base import Parser, ShimError, elapsed, exit_code, hms, stamp, unsupported, user
from corral.edges.shims.queue import View, parse_states, views
from corral.edges.shims.queue import account as queue_account

DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF = "JobID,State,ExitCode"
WIDTH = {"jobid": 12, "jobidraw": 12, "jobname": 10, "partition": 10, "account": 10, "alloccpus": 10,
         "state": 10, "exitcode": 8, "elapsed": 10, "elapsedraw": 10, "start": 19, "end": 19, "submit": 19,
         "nodelist": 15, "reqmem": 10, "timelimit": 10, "ncpus": 10, "user": 9, "workdir": 20,
         "alloctres": 10, "reqcpus": 8, "nnodes": 8, "cputime": 10}
NAMES = {"jobid": "JobID", "jobidraw": "JobIDRaw", "jobname": "JobName", "partition": "Partition",
         "account": "Account", "alloccpus": "AllocCPUS", "state": "State", "exitcode": "ExitCode",
         "elapsed": "Elapsed", "elapsedraw": "ElapsedRaw", "start": "Start", "end": "End", "submit": "Submit",
         "nodelist": "NodeList", "reqmem": "ReqMem", "timelimit": "Timelimit", "ncpus": "NCPUS", "user": "User",
         "workdir": "WorkDir", "alloctres": "AllocTRES", "reqcpus": "ReqCPUS", "nnodes": "NNodes",
         "cputime": "CPUTime"}
LEFT = {"jobid", "jobidraw", "workdir", "nodelist"}


def _value(v: View, key: str, step: bool, account: str) -> str:
    j, s = v.j, v.spec
    el = elapsed(v.j, v.now)
    cpus = str(v.cpus)
    state = j["state"]
    if step and exit_code(j) == "0:53":
        state = "CANCELLED"
    elif state == "CANCELLED" and not step:
        state = "CANCELLED by " + str(__import__("os").getuid())
    vals = {
        "jobid": v.jobid + (".batch" if step else ""), "jobidraw": str(j["id"]) + (".batch" if step else ""),
        "jobname": "batch" if step else v.name, "partition": "" if step else v.partition,
        "account": account, "alloccpus": cpus, "ncpus": cpus, "reqcpus": cpus, "state": state,
        "exitcode": ("0:15" if j["state"] == "CANCELLED" else exit_code(j)) if step else exit_code(j),
        "elapsed": hms(el), "elapsedraw": str(int(el)),
        "start": stamp(j.get("start_time")), "end": stamp(j.get("end_time")), "submit": stamp(j.get("submit_time")),
        "nodelist": v.nodes if j.get("start_time") else "None assigned",
        "reqmem": "" if step else memory_text(v.memory), "timelimit": "" if step else v.time_limit(hms),
        "user": "" if step else user(), "workdir": s.get("workdir") or "",
        "alloctres": ("" if not j.get("start_time") else (f"cpu={cpus},mem={memory_text(v.memory)},node=1" if step
                      else f"billing={cpus},cpu={cpus},mem={memory_text(v.memory)},node=1")), "nnodes": "1",
        "cputime": hms(el * int(cpus)),
    }
    return vals[key]


def _midnight() -> float:
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


_REL = re.compile(r"now(?:([-+])(\d+)(?:(second|minute|hour|day|week)s?)?)?")
_UNIT = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800, None: 1}
"""sacct's units after now-N, singular or plural, any case (now-1hour, now-2Days): Slurm 22.05
reads these, and no abbreviation (now-1h: Invalid time specification)."""


def when(text: str) -> float:
    """sacct's -S/-E: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], now[-N{seconds,minutes,hours,days,weeks}],
    today, midnight, noon."""
    t = text.strip().lower()  # Slurm's words are case-blind
    if t in ("today", "midnight"):
        return _midnight()
    if t == "noon":
        return _midnight() + 12 * 3600
    m = _REL.fullmatch(t)
    if m:
        n = int(m[2] or 0) * _UNIT[m[3]]
        return time.time() + (n if m[1] == "+" else -n)
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y", "%m/%d"):
        try:
            parsed = time.strptime(text.strip(), fmt)
        except ValueError:
            continue
        year = parsed.tm_year if "%y" in fmt.lower() else time.localtime().tm_year
        return time.mktime((year, parsed.tm_mon, parsed.tm_mday, parsed.tm_hour, parsed.tm_min, parsed.tm_sec,
                            0, 0, -1))
    digits = re.match(r"now[-+](\d+)", t)  # Slurm's words: where its parser stopped (the count's last digit)
    pos = digits.end() - 1 if digits else 0
    raise ShimError(f"Invalid time specification (pos={pos}): {text}", bare=True)


def _fields(text: str) -> list[tuple[str, int]]:
    out = []
    for raw in text.split(","):
        name, _, width = raw.strip().partition("%")
        key = name.lower()
        if key not in NAMES:
            if key in ("maxrss", "maxvmsize", "averss", "totalcpu", "usercpu", "systemcpu"):
                unsupported("sacct", f"the field {name}", "corral usage ID reports what a job used")
            if key in ("reason", "derivedexitcode", "qos", "priority", "comment"):
                unsupported("sacct", f"the field {name}", "corral does not know it of a job")
            raise ShimError(f"Invalid field requested: \"{name}\"", bare=False)
        out.append((key, int(width) if width.isdigit() else WIDTH.get(key, 10)))
    return out


@functools.lru_cache(maxsize=None)
def _sacct_parser() -> Parser:
    """Built once per process (the shim helper builds it before forking)."""
    p = Parser(prog="sacct", allow_abbrev=True)
    a = p.add_argument
    a("-j", "--jobs")
    a("-X", "--allocations", action="store_true")
    a("-P", "--parsable2", action="store_true")
    a("-p", "--parsable", action="store_true")
    a("-n", "--noheader", action="store_true")
    a("-o", "--format")
    a("-b", "--brief", action="store_true")
    a("-u", "--user")
    a("--me", action="store_true")
    a("-a", "--allusers", action="store_true")
    a("-s", "--state")
    a("--name")
    a("-S", "--starttime")
    a("-E", "--endtime")
    a("--json", action="store_true")
    a("-l", "--long", action="store_true")
    a("-D", "--duplicates", action="store_true")
    return p


def sacct(argv: list[str]) -> int:
    ns = _sacct_parser().parse_args(argv)
    if ns.long:
        unsupported("sacct", "--long", "name the fields with --format")
    if ns.user and set(ns.user.split(",")) - {user()} or ns.allusers:
        unsupported("sacct", "--user/--allusers", "corral shows you your own jobs (and your agents')")
    ids = ns.jobs.split(",") if ns.jobs else None
    vs = _window(ns, ids, views(ids, parse_states(ns.state) if ns.state else None, None,
                                set(ns.name.split(",")) if ns.name else None, False))
    account = queue_account() if vs else user()
    if ns.json:
        print(json.dumps({"jobs": [_json(v, account) for v in vs]}, indent=2))
        return 0
    print("\n".join(_lines(ns, ids, vs, account)))
    return 0


def _window(ns: Any, ids: list[str] | None, vs: list[View]) -> list[View]:
    """The jobs in Slurm's window, by id: without -j, jobs since 00:00 today; -S/-E narrow
    it either way."""
    start = when(ns.starttime) if ns.starttime else (None if ids else _midnight())
    end = when(ns.endtime) if ns.endtime else None
    vs = [v for v in vs if (start is None or (v.j.get("end_time") or v.now) >= start)
          and (end is None or (v.j.get("submit_time") or 0) <= end)]
    vs.sort(key=lambda v: v.j["id"])
    return vs


def _lines(ns: Any, ids: list[str] | None, vs: list[View], account: str) -> list[str]:
    """The listing in sacct's columns: the header (and its dashes, unless parsable), then
    a line a job and one a step."""
    fields = _fields(ns.format or (BRIEF if ns.brief else DEFAULT))
    sep = "|" if ns.parsable or ns.parsable2 else " "
    trail = "|" if ns.parsable else ""
    lines = []
    if not ns.noheader:
        lines.append(_row([(NAMES[k], w, k) for k, w in fields], sep, trail, ns))
        if not (ns.parsable or ns.parsable2):
            lines.append(" ".join("-" * w for _, w in fields) + " ")
    only_steps = _asked_steps(ids)
    for v in vs:
        for step in _steps(v, ns.allocations, only_steps):
            lines.append(_row([(_value(v, k, step, account), w, k) for k, w in fields], sep, trail, ns))
    return lines


def _steps(v: View, allocations: bool, only_steps: dict[str, set[str]]) -> list[bool]:
    """The lines of a job: [False] its allocation, [True] its batch step (once it started,
    unless -X); with -j ID.batch, that step alone, as Slurm lists it."""
    steps = [False] + ([True] if v.j.get("start_time") and not allocations else [])
    asked = only_steps.get(str(v.j["id"]), only_steps.get(v.jobid))
    if asked is not None:
        steps = [True] if "batch" in asked and v.j.get("start_time") else []
    return steps


def _asked_steps(ids: list[str] | None) -> dict[str, set[str]]:
    """-j ID.STEP: the steps asked of each job asked only by its steps (corral's jobs have
    one, batch; Slurm lists no other step of a batch job here either)."""
    steps: dict[str, set[str]] = {}
    whole = set()
    for raw in ids or []:
        head, dot, step = raw.partition(".")
        if dot:
            steps.setdefault(head, set()).add(step)
        else:
            whole.add(head)
    return {k: v for k, v in steps.items() if k not in whole}


def _row(cells: list[tuple[str, int, str]], sep: str, trail: str, ns: Any) -> str:
    if sep == "|":
        return "|".join(c for c, _, _ in cells) + trail
    out = []
    for text, width, key in cells:
        text = text if len(text) <= width else text[:width - 1] + "+"
        out.append(text.ljust(width) if key in LEFT else text.rjust(width))
    return " ".join(out) + " "


def _json(v: View, account: str) -> dict[str, Any]:
    j, s = v.j, v.spec
    return {"job_id": j["id"], "name": v.name, "partition": v.partition, "account": account,
            "user": user(), "state": {"current": j["state"]}, "exit_code": {"return_code": j.get("exit_code") or 0},
            "time": {"submission": int(j.get("submit_time") or 0), "start": int(j.get("start_time") or 0),
                     "end": int(j.get("end_time") or 0), "elapsed": int(elapsed(v.j, v.now)),
                     "limit": v.walltime // 60},
            "required": {"CPUs": v.cpus, "memory": v.memory},
            "working_directory": s.get("workdir") or ""}
