"""``sbatch`` and ``srun`` through corral: the same flags, ``#SBATCH`` lines, output
files and answers as Slurm's, one gateway request per submission.

The job's output goes where Slurm would put it (``slurm-%j.out`` in the submission
directory, or ``-o``/``-e`` with %j %x %u %A %a expanded inside the job), so an agent's
``cat slurm-$ID.out`` works; corral's job ids stand in for Slurm's throughout (squeue,
sacct, scancel through the shims all speak them). An array is a batch of jobs, its
first job's id is the array's (``N_IDX`` in squeue), as in Slurm.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from ..backends.slurm_vocab import parse_slurm_time
from ..jobs import array_indices
from .base import Parser, ShimError, client, facility, unsupported, wait

REFUSED: dict[str, tuple[str | None, str]] = {
    # option (its dest): (short flag, why corral does not take it)
    "account": ("-A", "corral submits under your sponsor's account"),
    "qos": ("-q", "corral sets agents' QOS itself"),
    "exclusive": (None, "corral sizes jobs by what they ask for"),
    "begin": ("-b", "corral starts jobs when they are ready"),
    "mail_type": (None, "corral tells you when a job ends (wait_for_job, wait_for_events)"),
    "mail_user": (None, "corral tells you when a job ends (wait_for_job, wait_for_events)"),
    "signal": (None, "use corral control ID signal"),
    "nodelist": ("-w", "corral places jobs"), "exclude": ("-x", "corral places jobs"),
    "constraint": ("-C", "corral places jobs"), "reservation": (None, "corral places jobs"),
}


def parser(prog: str) -> Parser:
    p = Parser(prog=prog, code=255)
    a = p.add_argument
    a("-J", "--job-name")
    a("-p", "--partition")
    a("-t", "--time")
    a("-c", "--cpus-per-task", type=int)
    a("-n", "--ntasks", type=int)
    a("-N", "--nodes")
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


def _memory(text: str, per_cpu: int = 1) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)B?", text.strip().upper())
    if not m:
        raise ShimError(f"invalid memory constraint: {text}")
    n, unit = int(m[1]), m[2] or "M"
    mb = {"K": n / 1024, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]
    return max(1, int(mb * per_cpu))


def _gpus(ns: Any) -> int:
    if ns.gpus:
        return int(str(ns.gpus).split(":")[-1])
    if ns.gres:
        m = re.fullmatch(r"gpu(?::[^:,]+)?:(\d+)", ns.gres)
        if not m:
            raise ShimError(f"Invalid generic resource (gres) specification: {ns.gres}")
        return int(m[1])
    return 0


def _dependency(text: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in text.split(","):
        kind, _, ids = part.partition(":")
        key = {"afterok": "after_ok", "afterany": "after_any"}.get(kind)
        if key is None or not ids:
            raise ShimError(f"corral's sbatch takes --dependency afterok:ID[:ID] or afterany:ID, not {part!r}")
        try:
            out.setdefault(key, []).extend(int(x.split("_")[0].split("+")[0]) for x in ids.split(":"))
        except ValueError:
            raise ShimError(f"invalid dependency specification: {part}") from None
    return out


def _redirect(path: str, stream: str, append: bool = False) -> str:
    """A line that sends ``stream`` to ``path`` with Slurm's % patterns expanded in the job."""
    expanded = (path.replace("%%", "\0").replace("%j", "${CORRAL_JOB_ID}").replace("%x", "${SLURM_JOB_NAME}")
                .replace("%u", "${USER}").replace("%A", "$((CORRAL_JOB_ID - ${CORRAL_ARRAY_POS:-0}))")
                .replace("%a", "${CORRAL_ARRAY_TASK_ID:-4294967294}").replace("\0", "%"))
    if re.search(r"%[^%]", expanded.replace("$((", "")):
        raise ShimError(f"corral's sbatch expands %j %x %u %A %a in file names, not in {path!r}")
    fd = "1" if stream == "out" else "2"
    return f'exec {fd}{">>" if append else ">"}"{expanded}"'


def build(ns: Any, script: str, args: list[str], cwd: Path,
          default_out: bool = True) -> tuple[dict[str, Any], str | None, bool]:
    """(the job spec, the array text or None, whether to hold) of parsed options. Output
    goes to -o, else to Slurm's default file (``default_out``: sbatch's, not srun's,
    whose output is the caller's)."""
    for dest, (_, why) in REFUSED.items():
        if getattr(ns, dest, None):
            unsupported("sbatch", "--" + dest.replace("_", "-"), why)
    if ns.nodes not in (None, "1", "1-1"):
        unsupported("sbatch", f"--nodes={ns.nodes}", "corral runs a job on one node")
    if ns.export not in (None, "ALL"):
        unsupported("sbatch", f"--export={ns.export}", "jobs get your environment (ALL)")
    spec: dict[str, Any] = {}
    cpus = (ns.cpus_per_task or 1) * (ns.ntasks or 1)
    spec["cpus"] = cpus
    if ns.mem and ns.mem_per_cpu:
        raise ShimError("--mem and --mem-per-cpu are mutually exclusive.")
    if ns.mem:
        spec["memory"] = _memory(ns.mem)
    elif ns.mem_per_cpu:
        spec["memory"] = _memory(ns.mem_per_cpu, cpus)
    if ns.time:
        try:
            secs = parse_slurm_time(ns.time)
        except ValueError:
            secs = -1
        if secs is None or secs <= 0:
            raise ShimError("Invalid --time specification", 255)
        spec["walltime"] = secs
    gpus = _gpus(ns)
    if gpus:
        spec["gpus"] = gpus
    if ns.partition:
        spec["partition"] = ns.partition
    name = ns.job_name or "wrap"
    spec["name"] = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "wrap"
    workdir = Path(ns.chdir).resolve() if ns.chdir else cwd
    spec["workdir"] = str(workdir)
    out = ns.output or (("slurm-%A_%a.out" if ns.array else "slurm-%j.out") if default_out else None)
    lines = ["#!/bin/bash", f"export SLURM_JOB_NAME={shlex.quote(name)}",
             'export SLURM_JOB_ID="${CORRAL_JOB_ID}"', f"cd {shlex.quote(str(workdir))}",
             _redirect(out, "out", ns.open_mode == "append") if out else "",
             _redirect(ns.error, "err", ns.open_mode == "append") if ns.error else "exec 2>&1"]
    body = script if script.startswith("#!") else "#!/bin/bash\n" + script
    interp, _, rest = body.partition("\n")
    spec["script"] = "\n".join(x for x in lines if x) + "\n" + _run_script(interp, rest, args)
    if ns.dependency:
        spec.update(_dependency(ns.dependency))
    return spec, ns.array, bool(ns.hold)


def _run_script(interp: str, rest: str, args: list[str]) -> str:
    """The user's script run by its own interpreter with its arguments."""
    prog = interp[2:].strip() or "/bin/bash"
    quoted = " ".join(shlex.quote(a) for a in args)
    marker = "CORRAL_SBATCH_SCRIPT_END"
    while marker in rest:
        marker += "_"
    return f"cat > \"${{TMPDIR:-/tmp}}/corral-script-$$\" <<'{marker}'\n{interp}\n{rest}\n{marker}\n" \
           f"{prog} \"${{TMPDIR:-/tmp}}/corral-script-$$\" {quoted}\nrc=$?\n" \
           f"rm -f \"${{TMPDIR:-/tmp}}/corral-script-$$\"\nexit $rc\n"


def main(argv: list[str]) -> int:
    p = parser("sbatch")
    p.add_argument("--wrap")
    p.add_argument("--parsable", action="store_true")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
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
    if ns.test_only:
        unsupported("sbatch", "--test-only", "ask corral plan (MCP plan_job) for a start estimate")
    spec, array, hold = build(ns, script, args, Path.cwd())
    c = client()
    _check_partition(c, spec)
    if array:
        try:
            indices = array_indices(array)
        except ValueError as e:
            raise ShimError(f"Invalid job array specification: {e}") from None
        specs = [{**spec, "env": {"CORRAL_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_ID": str(i),
                                  "CORRAL_ARRAY_POS": str(pos)},
                  "labels": {"array_task": str(i), "array_pos": str(pos)}} for pos, i in enumerate(indices)]
        jobs = c.submit_batch(specs)["jobs"]
    else:
        jobs = [c.submit(spec)]
    if hold:
        for j in jobs:
            c.control(j["id"], "hold")
    if not ns.quiet:
        print(jobs[0]["id"] if ns.parsable else f"Submitted batch job {jobs[0]['id']}", flush=True)
    if ns.wait:
        code = 0
        for j in jobs:
            done = wait(c, j["id"])
            code = max(code, done.get("exit_code") or (0 if done.get("state") == "COMPLETED" else 1))
        return code
    return 0


def srun(argv: list[str]) -> int:
    """``srun [options] COMMAND...`` as one batch-style job: submitted, waited for, its
    output printed, its exit code returned."""
    p = parser("srun")
    p.add_argument("command", nargs="...")
    for flag in ("--pty", "--x11", "--mpi", "--het-group", "--multi-prog"):
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            unsupported("srun", flag, "corral runs srun batch-style, without a terminal or steps")
    ns = p.parse_args(argv)
    if not ns.command:
        raise ShimError("No command given to execute.")
    if os.environ.get("SLURM_JOB_ID"):
        unsupported("srun", "a step inside a job", "inside a job, run the command directly")
    script = "#!/bin/bash\n" + " ".join(shlex.quote(a) for a in ns.command) + "\n"
    ns.array = None
    spec, _, _ = build(ns, script, [], Path.cwd(), default_out=False)
    c = client()
    _check_partition(c, spec)
    job = c.submit(spec)
    done = wait(c, job["id"])
    out = c.output(job["id"], limit=1 << 20)
    sys.stdout.write(out.get("data") or "")
    state = done.get("state")
    if state == "COMPLETED":
        return 0
    code = done.get("exit_code")
    node = _node(c, spec)
    if state == "FAILED" and isinstance(code, int):
        print(f"srun: error: {node}: task 0: Exited with exit code {code}", file=sys.stderr)
        return code if 0 < code < 256 else 1
    print(f"srun: error: {node}: task 0: {state}", file=sys.stderr)
    return 1


def _node(c: Any, spec: dict[str, Any]) -> str:
    parts = facility(c).get("partitions") or []
    want = spec.get("partition")
    p = next((x for x in parts if x["name"] == want or (want is None and x.get("default"))), None)
    return ",".join((p or {}).get("nodes") or ["localhost"])


def _check_partition(c: Any, spec: dict[str, Any]) -> None:
    """Slurm's words for a partition it does not have (the gateway's would name the others)."""
    if spec.get("partition") and spec["partition"] not in {x["name"] for x in facility(c).get("partitions") or []}:
        raise ShimError(f"invalid partition specified: {spec['partition']}\nsbatch: error: Batch job submission "
                        "failed: Invalid partition name specified")
