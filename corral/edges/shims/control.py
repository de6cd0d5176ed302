"""``scontrol`` through corral: ``show job`` in Slurm 22.05's lines, and ``hold``,
``uhold`` and ``release`` of the caller's jobs (split from queue.py, which reads the
jobs both print)."""

from __future__ import annotations

import os
import sys

from corral.core.errors import NotFound
from corral.edges.shims.base import ACTIVE, ShimError, client, elapsed, exit_code, hms, stamp, unsupported, user
from corral.edges.shims.queue import View, account, group_name, held, views
from corral.edges import acts, reads


def scontrol(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "show" and argv[1] in ("job", "jobs", "jobid"):
        rest = argv[2:]
        one_line = False
        if "-o" in rest or "--oneliner" in rest:
            one_line = True
            rest = [x for x in rest if x not in ("-o", "--oneliner")]
        vs = [v for v in views(rest[:1] if rest else None, None, None, None, False) if held(v)]
        if rest and not vs:
            raise ShimError("slurm_load_jobs error: Invalid job id specified", bare=True)
        if not rest:  # every job the controller holds, ended within MinJobAge too, by id as Slurm lists them
            vs.sort(key=lambda v: v.j["id"])
            if not vs:
                print("No jobs in the system")
                return 0
        for v in vs:
            print(_show(v, one_line))
        return 0
    if argv and argv[0] in ("hold", "uhold", "release"):
        return _hold(argv[0], argv[1:])
    what = " ".join(argv[:2]) or "(nothing)"
    unsupported("scontrol", what, "corral's scontrol shows jobs (scontrol show job ID) and holds and releases "
                "them; requeue is corral control ID requeue")


def _hold(action: str, ids: list[str]) -> int:
    """scontrol hold|uhold|release ID[,ID...]: Slurm 22.05's words on the private Slurm
    (a finished or unknown job: two lines, exit 1; a running job: nothing, exit 0)."""
    if not ids:
        print(f"too few arguments for keyword:{action}", file=sys.stderr)
        return 1
    c, rc = client(), 0
    for raw in ",".join(ids).split(","):
        try:
            job = c.run(reads.job, int(raw)) if raw.isdigit() else None
        except NotFound:
            job = None
        why = ("Invalid job id specified" if job is None else
               "Job has already finished" if job["state"] not in ACTIVE else None)
        if why:
            print(f"{why} for job {raw}\nslurm_suspend error: {why}", file=sys.stderr)
            rc = 1
        elif job is not None and job["state"] == "PENDING":  # Slurm takes either on a running job, a no-op
            c.run(acts.control, int(raw), "release" if action == "release" else "hold")
    return rc


def _show(v: View, one_line: bool) -> str:
    """scontrol show job, in Slurm 22.05's lines, with what corral knows of the job."""
    j, s, lab = v.j, v.spec, v.labels
    head = [("JobId", str(j["id"]) if v.task is not None else v.jobid)]
    if v.task is not None:
        head += [("ArrayJobId", str(v.array_id)), ("ArrayTaskId", v.task)]
    workdir = s.get("workdir") or ""

    def path(key: str) -> str:
        text = lab.get(key)
        if not text:
            return "/dev/null" if key != "slurm_stdout" else "(null)"
        text = (text.replace("%j", str(j["id"])).replace("%x", v.name).replace("%u", user())
                .replace("%A", str(v.array_id)).replace("%a", v.task or "4294967294"))
        return text if text.startswith("/") else os.path.join(workdir, text)

    dep = lab.get("slurm_dependency")
    dep_text = f"{dep}(unfulfilled)" if dep and v.state == "PENDING" else "(null)"
    mem_key = "MinMemoryCPU" if "slurm_mem_per_cpu" in lab else "MinMemoryNode"
    cpt = int(lab.get("slurm_cpus_per_task", 1))
    pairs = [
        head + [("JobName", v.name)],
        [("UserId", f"{user()}({os.getuid()})"), ("GroupId", f"{group_name()}({os.getgid()})"),
         ("Account", account()), ("QOS", "normal")],
        [("JobState", v.state), ("Reason", v.reason().strip("()") if v.state != "RUNNING" else "None"),
         ("Dependency", dep_text)],
        [("Restarts", str(j.get("requeues") or 0)), ("ExitCode", exit_code(j))],  # requeued by Slurm (decision 0022)
        [("RunTime", hms(elapsed(j, v.now))), ("TimeLimit", v.time_limit(hms))],
        [("SubmitTime", stamp(j.get("submit_time")))],
        [("StartTime", stamp(j.get("start_time"))),
         ("EndTime", stamp(j.get("end_time") or ((j["start_time"] + v.walltime) if j.get("start_time") else None)))],
        [("Partition", v.partition)],
        [("NodeList", v.nodes if v.state == "RUNNING" else "(null)")],
        [("NumNodes", "1"), ("NumCPUs", str(v.cpus)), ("NumTasks", str(v.ntasks)), ("CPUs/Task", str(cpt))],
        [("TRES", v.tres())],
        [(mem_key, v.min_memory())],
        [("WorkDir", workdir)],
        [("StdErr", path("slurm_stderr"))],
        [("StdIn", "/dev/null")],
        [("StdOut", path("slurm_stdout"))],
    ]
    if one_line:
        return " ".join(f"{k}={val}" for line in pairs for k, val in line)
    return "\n".join(("" if i == 0 else "   ") + " ".join(f"{k}={val}" for k, val in line)
                     for i, line in enumerate(pairs)) + "\n"
