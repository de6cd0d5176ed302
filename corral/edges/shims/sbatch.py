"""``sbatch`` through corral: the same flags, ``#SBATCH`` lines, output
files and answers as Slurm's, one gateway request per submission.

The job's output goes where Slurm would put it (``slurm-%j.out`` in the submission
directory, or ``-o``/``-e`` with %j %x %u %A %a expanded inside the job), so an agent's
``cat slurm-$ID.out`` works; corral's job ids stand in for Slurm's throughout (squeue,
sacct, scancel through the shims all speak them). An array is a batch of jobs, its
first job's id is the array's (``N_IDX`` in squeue), as in Slurm.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from corral.core import slurm_formats as sf
from corral.edges.shims.export import exported
from corral.edges import acts
from corral.edges.shims.base import OPEN_FAILED, Parser, ShimError, client, facility, unsupported, user, wait

REFUSED: dict[str, tuple[str | None, str]] = {
    # option (its dest): (short flag, why corral does not take it)
    "account": ("-A", "corral charges every job to your principal's account (an agent's: its sponsor's, "
                      "which only an admin changes); drop it"),
    "exclusive": (None, "corral sizes jobs by what they ask for"),
    "begin": ("-b", "corral starts jobs when they are ready"),
    "mail_type": (None, "corral tells you when a job ends (wait_for_job, wait_for_events)"),
    "mail_user": (None, "corral tells you when a job ends (wait_for_job, wait_for_events)"),
    "nodelist": ("-w", "corral places jobs"), "exclude": ("-x", "corral places jobs"),
    "constraint": ("-C", "corral places jobs"), "reservation": (None, "corral places jobs"),
    "nice": (None, "corral gives agents' jobs their nice value itself, so people keep priority"),
}


def parser(prog: str) -> Parser:
    p = Parser(prog=prog, code=255)
    a = p.add_argument
    a("-J", "--job-name")
    a("-p", "--partition")
    a("-t", "--time")
    a("-c", "--cpus-per-task")
    a("-n", "--ntasks")
    a("-N", "--nodes")
    a("--ntasks-per-node")
    a("--gpus-per-node")
    a("--mem")
    a("--mem-per-cpu")
    a("-G", "--gpus")
    a("--gres")
    a("-o", "--output")
    a("-e", "--error")
    a("-a", "--array")
    a("-d", "--dependency")
    a("-D", "--chdir")
    a("--export")
    a("-H", "--hold", action="store_true")
    a("-W", "--wait", action="store_true")
    a("-Q", "--quiet", action="store_true")
    a("--test-only", action="store_true")
    a("--requeue", action="store_true")  # corral's Slurm jobs are requeueable either way: nothing differs
    a("--no-requeue", action="store_true")
    a("--open-mode", choices=("append", "truncate"))
    a("-q", "--qos")  # corral's tiers by name (TIERS)
    a("--signal")  # Slurm's own syntax, checked by the gateway (corral/core/signals.py)
    for dest, (short, _) in REFUSED.items():
        a(*([short] if short else []), "--" + dest.replace("_", "-"), dest=dest, nargs="?", const=True)
    return p


def _sbatch_lines(text: str) -> list[str]:
    """The #SBATCH options of a script, up to its first command (as Slurm reads them)."""
    out: list[str] = []
    for line in text.splitlines()[1:] if text.startswith("#!") else text.splitlines():
        s = line.strip()
        if not s or (s.startswith("#") and not s.startswith("#SBATCH")):
            continue
        if not s.startswith("#SBATCH"):
            break
        out += shlex.split(s[len("#SBATCH"):].split(" #", 1)[0])
    return out


def _gpus(ns: Any) -> int:
    given = ns.gpus or ns.gpus_per_node  # one node: per node is per job
    if given:
        try:
            return int(str(given).split(":")[-1])
        except ValueError:
            raise ShimError(f"Invalid GRES specification: gpu:{given}") from None
    if ns.gres:
        m = re.fullmatch(r"gpu(?::[^:,]+)?:(\d+)", ns.gres)
        if not m:
            raise ShimError(f"Invalid generic resource (gres) specification: {ns.gres}")
        return int(m[1])
    return 0


def _dependency(text: str) -> dict[str, list[int]]:
    """afterok/afterany on jobs, arrays (every task, as Slurm waits for the whole array)
    and single tasks (``ID_N``)."""
    out: dict[str, list[int]] = {}
    for part in text.split(","):
        kind, _, ids = part.partition(":")
        key = {"afterok": "after_ok", "afterany": "after_any"}.get(kind)
        if key is None or not ids:
            raise ShimError(f"corral's sbatch takes --dependency afterok:ID[:ID] or afterany:ID, not {part!r}")
        for x in ids.split(":"):
            if not re.fullmatch(r"\d+(_\d+)?(\+\d+)?", x):
                raise ShimError("Batch job submission failed: Job dependency problem")  # Slurm's words
            out.setdefault(key, []).extend(_dep_jobs(x.split("+")[0]))
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}  # afterok:A:A is A once, as Slurm takes it


def _dep_jobs(raw: str) -> list[int]:
    """corral's jobs behind one id of a dependency: an array's id is all its tasks (corral
    records each task as a job; the array's id is its first task's), ``ID_N`` that task."""
    from corral.edges.shims.queue import fetch

    found = [v for v in fetch([raw]) if v.task is not None]  # an array or one of its tasks
    return [v.j["id"] for v in found] or [int(raw.split("_")[0])]


def _redirect(path: str, stream: str, append: bool = False) -> list[str]:
    """Lines that send ``stream`` to ``path`` with Slurm's % patterns expanded in the job;
    a file that cannot be opened (a missing directory) ends the job before it runs, by
    the signal Slurm's own failure reads as (FAILED, ExitCode 0:53)."""
    expanded = (path.replace("%%", "\0").replace("%j", "${CORRAL_JOB_ID}").replace("%x", "${SLURM_JOB_NAME}")
                .replace("%u", "${USER}").replace("%A", "$((CORRAL_JOB_ID - ${CORRAL_ARRAY_POS:-0}))")
                .replace("%a", "${CORRAL_ARRAY_TASK_ID:-4294967294}"))
    if re.search(r"%", expanded.replace("$((", "")):  # before %% is % again: pct%%-%j.out is fine
        raise ShimError(f"corral's sbatch expands %j %x %u %A %a in file names, not in {path!r}")
    expanded = expanded.replace("\0", "%")
    fd = "1" if stream == "out" else "2"
    return [f'{{ : {">>" if append else ">"}"{expanded}"; }} 2>/dev/null || exit {OPEN_FAILED}',
            f'exec {fd}{">>" if append else ">"}"{expanded}"']


def _limits(partition: str | None) -> dict[str, Any]:
    """The partition's maxima (facility cache): what UNLIMITED and --mem=0 stand for."""
    parts = facility(client()).get("partitions") or []
    part = next((x for x in parts if x["name"] == partition or (partition is None and x.get("default"))), None)
    return part or {}


def shape_of(ns: Any, prog: str) -> sf.Shape:
    try:
        return sf.shape(ns.ntasks, ns.cpus_per_task, ns.nodes, ns.ntasks_per_node)
    except ValueError as e:
        raise ShimError(str(e)) from None


def resources(ns: Any, prog: str, labels: dict[str, str]) -> dict[str, Any]:
    """CPUs, memory, time and GPUs of parsed options, through corral.core.slurm_formats;
    what Slurm would print of the request (per-CPU memory, UNLIMITED) goes in ``labels``."""
    shape = shape_of(ns, prog)
    if shape.nodes > 1:
        unsupported(prog, f"--nodes={ns.nodes}", "corral runs a job on one node")
    spec: dict[str, Any] = {"cpus": shape.cpus}
    if shape.ntasks > 1:
        labels["slurm_ntasks"] = str(shape.ntasks)
    if shape.cpus_per_task > 1:
        labels["slurm_cpus_per_task"] = str(shape.cpus_per_task)
    if ns.mem and ns.mem_per_cpu:
        raise ShimError(f"{prog}: fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
                        bare=True)
    try:
        if ns.mem:
            mb = sf.memory_mb(ns.mem)
            if mb == sf.WHOLE_NODE:
                labels["slurm_mem"] = "0"
                # Slurm: all the memory of the node the job gets. corral sizes a job before it
                # is placed: the smallest node's memory, which every node of the partition has,
                # so the job waits for no particular node (the largest's fit only an empty one)
                lim = _limits(ns.partition.split(",")[0] if ns.partition else None)
                mb = int(lim.get("min_memory_mb") or lim.get("max_memory_mb") or 0)
                if not mb:
                    unsupported(prog, "--mem=0", "name the memory the job needs, e.g. --mem=4G")
            spec["memory"] = mb
        elif ns.mem_per_cpu:
            per = sf.memory_mb(ns.mem_per_cpu)
            if per == sf.WHOLE_NODE:
                unsupported(prog, "--mem-per-cpu=0", "name the memory per CPU, e.g. --mem-per-cpu=2G")
            labels["slurm_mem_per_cpu"] = str(per)
            spec["memory"] = per * shape.cpus
    except ValueError:
        raise ShimError("Invalid --mem specification", 255) from None
    if ns.time:
        try:
            secs = sf.time_seconds(ns.time)
        except ValueError:
            raise ShimError("Invalid --time specification", 255) from None
        if secs == sf.NO_LIMIT:
            labels["slurm_time"] = "UNLIMITED"
            secs = int(_limits(ns.partition).get("max_walltime_s") or 0)
            if not secs:
                unsupported(prog, f"--time={ns.time}", "name a time limit, e.g. -t 2:00:00")
        spec["walltime"] = secs
    gpus = _gpus(ns)
    if gpus:
        spec["gpus"] = gpus
    return spec


SUBMIT_HOST = os.uname().nodename


def _env_lines(ns: Any, name: str, spec: dict[str, Any], labels: dict[str, str], submit_dir: Path) -> list[str]:
    """Slurm's environment of a batch job, in the job's script: one job id in
    SLURM_JOB_ID and SLURM_JOBID, corral's (decision 0008), the submitter's directory,
    USER and HOME (sbatch's --export=ALL), the job's shape and its array."""
    ntasks = labels.get("slurm_ntasks", "1")
    env = {"SLURM_JOB_NAME": name, "SLURM_SUBMIT_DIR": str(submit_dir), "SLURM_SUBMIT_HOST": SUBMIT_HOST,
           "SLURM_NTASKS": ntasks, "SLURM_NPROCS": ntasks, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
           "SLURM_CPUS_ON_NODE": str(spec["cpus"]), "SLURM_JOB_CPUS_PER_NODE": str(spec["cpus"])}
    if ns.partition:
        env["SLURM_JOB_PARTITION"] = ns.partition
    if "memory" in spec and "slurm_mem_per_cpu" not in labels:
        env["SLURM_MEM_PER_NODE"] = str(spec["memory"])
    if "slurm_mem_per_cpu" in labels:
        env["SLURM_MEM_PER_CPU"] = labels["slurm_mem_per_cpu"]
    for key in ("USER", "HOME", "LOGNAME"):
        value = os.environ.get(key) or (user() if key != "HOME" else os.path.expanduser("~"))
        env[key] = value
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    # Slurm sets SLURM_CPUS_PER_TASK only for -c; corral's lane asks Slurm for the job's CPUs
    # as -c, whose value an -n4 job must not see (OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK)
    lines.append(f"export SLURM_CPUS_PER_TASK={labels['slurm_cpus_per_task']}" if "slurm_cpus_per_task" in labels
                 else "unset SLURM_CPUS_PER_TASK")
    lines.append('export SLURM_JOB_ID="${CORRAL_JOB_ID}" SLURM_JOBID="${CORRAL_JOB_ID}"')
    lines.append('if [ -n "${CORRAL_ARRAY_TASK_ID:-}" ]; then export SLURM_ARRAY_JOB_ID=$((CORRAL_JOB_ID - '
                 '${CORRAL_ARRAY_POS:-0})) SLURM_ARRAY_TASK_ID="$CORRAL_ARRAY_TASK_ID"; fi')
    return lines


def build(ns: Any, script: str, args: list[str], cwd: Path,
          default_out: bool = True, prog: str = "sbatch") -> tuple[dict[str, Any], str | None, bool]:
    """(the job spec, the array text or None, whether to hold) of parsed options. Output
    goes to -o, else to Slurm's default file (``default_out``: sbatch's, not srun's,
    whose output is the caller's)."""
    for dest, (_, why) in REFUSED.items():
        if getattr(ns, dest, None):
            unsupported(prog, "--" + dest.replace("_", "-"), why)
    labels: dict[str, str] = {}
    spec = resources(ns, prog, labels)
    if ns.partition:
        spec["partition"] = _partition(ns.partition, spec, labels)
    name = ns.job_name or (os.path.basename(getattr(ns, "script_name", None) or "wrap") if prog == "sbatch"
                           else os.path.basename((ns.command or ["wrap"])[0]))
    spec["name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "wrap"
    if spec["name"] != name:
        labels["slurm_name"] = name[:256]  # printed by the shims as Slurm would, 'my job' included
    workdir = Path(ns.chdir).resolve() if ns.chdir else cwd
    spec["workdir"] = str(workdir)
    out = ns.output or (("slurm-%A_%a.out" if ns.array else "slurm-%j.out") if default_out else None)
    for key, path in (("slurm_stdout", out), ("slurm_stderr", ns.error or out)):
        if path and len(path) <= 256:
            labels[key] = path
    if ns.dependency and len(ns.dependency) <= 256:
        labels["slurm_dependency"] = ns.dependency
    lines = ["#!/bin/bash", *exported(ns.export), *_env_lines(ns, name, spec, labels, cwd), _chdir(str(workdir)),
             *(_redirect(out, "out", ns.open_mode == "append") if out else []),
             *(_redirect(ns.error, "err", ns.open_mode == "append") if ns.error else
               (["exec 2>&1"] if out else []))]
    body = script if script.startswith("#!") else "#!/bin/bash\n" + script
    interp, _, rest = body.partition("\n")
    spec["script"] = "\n".join(x for x in lines if x) + "\n" + _run_script(interp, rest, args)
    if labels:
        spec["labels"] = labels
    if ns.dependency:
        spec.update(_dependency(ns.dependency))
    if ns.qos:
        spec["tier"] = _tier(ns.qos, prog)
    if ns.signal:  # to the script (B: or not: corral's batch shell passes it on, as Slurm's B: does)
        spec["signal"] = ns.signal
    return spec, ns.array, bool(ns.hold)


TIERS = ("guaranteed", "opportunistic")
"""What --qos may name: corral's tiers (it sets the site's QOS itself)."""


def _tier(qos: str, prog: str) -> str:
    if qos.lower() in TIERS:
        return qos.lower()
    return unsupported(prog, f"--qos={qos}", "corral sets the QOS itself; name a tier instead: --qos=guaranteed "
                                              "(never preempted, while agents' share has room) or --qos=opportunistic "
                                              "(preemptible; corral plan says which a job gets)")


def _chdir(workdir: str) -> str:
    """Into the job's directory, unless it starts there: a contained job is started in it,
    and may be unable to reach it again by its path (its parents are not in its sandbox)."""
    q = shlex.quote(workdir)
    return f'[ "$PWD" = {q} ] || cd {q}'


def _run_script(interp: str, rest: str, args: list[str]) -> str:
    """The user's script run by its own interpreter with its arguments."""
    prog = interp[2:].strip() or "/bin/bash"
    quoted = " ".join(shlex.quote(a) for a in args)
    marker = "CORRAL_SBATCH_SCRIPT_END"
    while marker in rest:
        marker += "_"
    # mktemp, not a name from the pid: in a job that is not contained /tmp is shared, and a
    # file another user made there first would be the script this job runs.
    # Run by exec, from a descriptor (the file removed first): the script is the job's top
    # process, which a signal passed on (a preemption's, decision 0058) reaches, as Slurm's
    # --signal=B: reaches a batch script; a shell that waited for it would die of it instead.
    return f"corral_script=$(mktemp \"${{TMPDIR:-/tmp}}/corral-script-XXXXXX\") || exit 1\n" \
           f"cat > \"$corral_script\" <<'{marker}'\n{interp}\n{rest}\n{marker}\n" \
           f"exec {{corral_fd}}< \"$corral_script\"; rm -f \"$corral_script\"\n" \
           f"exec {prog} \"/dev/fd/$corral_fd\" {quoted}\n"


@functools.lru_cache(maxsize=None)
def _sbatch_parser() -> Parser:
    """Built once per process (the shim helper builds it before forking)."""
    p = parser("sbatch")
    p.add_argument("--wrap")
    p.add_argument("--parsable", action="store_true")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str]) -> int:
    p = _sbatch_parser()
    ns = p.parse_args(argv)
    ns_script = ns.script
    if ns.wrap is not None:
        if ns.script:
            raise ShimError("Script arguments not permitted with --wrap option")
        script, args = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{ns.wrap}\n", list[str]()
    else:
        if ns.script is None:
            if sys.stdin.isatty():
                raise ShimError("Batch script is empty!")
            script, args = sys.stdin.read(), []
            options = argv
        else:
            try:
                script = Path(ns.script).read_text()
            except OSError:
                raise ShimError(f"Unable to open file {ns.script}") from None
            args = list(ns.args)
            options = argv[:len(argv) - len(args) - 1]
        if not script.strip():
            raise ShimError("Batch script is empty!")
        if not script.startswith("#!"):
            raise ShimError("This does not look like a batch script.  The first\nsbatch: error: line must start "
                            "with #! followed by the path to an interpreter.\nsbatch: error: For instance: "
                            "#!/bin/sh")
        ns = p.parse_args(_sbatch_lines(script) + options)  # the command line over #SBATCH, as Slurm does
        ns.script_name = ns_script or "sbatch"  # Slurm names a job by its script's file ("sbatch": stdin)
    if ns.test_only:
        unsupported("sbatch", "--test-only", "ask corral plan (MCP plan_job) for a start estimate")
    spec, array, hold = build(ns, script, args, Path.cwd())
    c = client()
    check_partition(c, spec)
    if array:
        try:
            indices = sf.array_indices(array)
        except ValueError as e:
            if "%" in array or "more than" in str(e):  # what Slurm takes and corral does not: said by name
                raise ShimError(f"Invalid job array specification: {e}") from None
            raise ShimError("Batch job submission failed: Invalid job array specification") from None
        whole = {"SLURM_ARRAY_TASK_COUNT": str(len(indices)), "SLURM_ARRAY_TASK_MIN": str(indices[0]),
                 "SLURM_ARRAY_TASK_MAX": str(indices[-1])}
        m = re.fullmatch(r"\d+-\d+(?::(\d+))?", array.strip())
        if m:  # one range: its step (the private Slurm: -a 7-9:2 -> 2); a list's is not known here
            whole["SLURM_ARRAY_TASK_STEP"] = m.group(1) or "1"
        specs = [{**spec, "env": {"CORRAL_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_ID": str(i),
                                  "CORRAL_ARRAY_POS": str(pos), **whole},
                  "labels": {**spec.get("labels", {}), "array_task": str(i), "array_pos": str(pos)}}
                 for pos, i in enumerate(indices)]
        jobs = c.run(acts.submit_batch, specs, hold=hold)["jobs"]
    else:
        jobs = [c.run(acts.submit, spec, hold=hold)]  # held as it is recorded: it cannot start before the hold
    if not ns.quiet:
        print(jobs[0]["id"] if ns.parsable else f"Submitted batch job {jobs[0]['id']}", flush=True)
    if ns.wait:
        code = 0
        for j in jobs:
            done = wait(c, j["id"])
            code = max(code, done.get("exit_code") or (0 if done.get("state") == "COMPLETED" else 1))
        return code
    return 0


def _partition(text: str, spec: dict[str, Any], labels: dict[str, str]) -> str:
    """-p A,B: Slurm runs the job in whichever partition starts it first; corral sends it
    to the first of them whose limits it fits (a corral job has one partition), and the
    shims print the list while it waits, as Slurm's squeue does."""
    names = [n for n in text.split(",") if n]
    if len(names) <= 1:
        return text
    labels["slurm_partition"] = text
    known = {x["name"]: x for x in facility(client()).get("partitions") or []}
    for n in names:
        if n not in known:
            check_partition(client(), {"partition": n})  # Slurm's words for the one it does not have
    for n in names:
        x = known.get(n)
        if x and spec.get("walltime", 0) <= (x.get("max_walltime_s") or 1 << 62) and \
                spec.get("memory", 0) <= (x.get("max_memory_mb") or 1 << 62) and spec["cpus"] <= (x.get("max_cpus") or 1 << 30):
            return str(n)
    return names[0]


def check_partition(c: Any, spec: dict[str, Any]) -> None:
    """Slurm's words for a partition it does not have (the gateway's would name the others)."""
    if spec.get("partition") and spec["partition"] not in {x["name"] for x in facility(c).get("partitions") or []}:
        raise ShimError(f"invalid partition specified: {spec['partition']}\nsbatch: error: Batch job submission "
                        "failed: Invalid partition name specified")
