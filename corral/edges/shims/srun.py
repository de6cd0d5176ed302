"""``srun`` through corral, batch-style: the command (once per task, ``-n``), submitted
as one job, waited for, its output printed (stdout and stderr apart) and its exit code
returned, as Slurm's srun returns them; its stdin passed to every task (decision 0013).
Its options are sbatch's (sbatch.parser) and what is srun's own. Inside a job, a step
in that job's allocation instead (shims/steps.py, decision 0057)."""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from corral.edges.shims.base import Parser, ShimError, client, facility, unsupported, wait
from corral.edges.shims.sbatch import check_partition, shape_of, build, parser
from corral.edges import acts, reads


@functools.lru_cache(maxsize=None)
def _srun_parser() -> Parser:
    p = parser("srun")
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-u", "--unbuffered", action="store_true")  # corral reads the output once the job ends
    p.add_argument("command", nargs="...")
    return p


def srun(argv: list[str]) -> int:
    """``srun [options] COMMAND...`` as one batch-style job: submitted, waited for, its
    output printed, its exit code returned."""
    p = _srun_parser()
    for flag in ("--pty", "--x11", "--mpi", "--het-group", "--multi-prog"):
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            unsupported("srun", flag, "corral runs srun batch-style, without a terminal or steps")
    ns = p.parse_args(argv)
    if not ns.command:
        raise ShimError("No command given to execute.")
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("CORRAL_JOB_ID"):  # a step of this job's (shims/steps.py)
        from corral.edges.shims import steps

        shape = shape_of(ns, "srun")
        if shape.nodes > 1:
            raise ShimError(f"Unable to create step for job {os.environ['SLURM_JOB_ID']}: Requested node "
                            "configuration is not available (a corral job has one node)")
        ntasks = shape.ntasks if ns.ntasks else None
        return steps.run(ns, ntasks, shape.cpus_per_task if ns.cpus_per_task else None,
                         None if (ntasks or int(os.environ.get("SLURM_NTASKS") or 1)) == 1 else _stdin())
    if os.environ.get("SLURM_JOB_ID"):  # a Slurm job that is not corral's: its steps are Slurm's own
        unsupported("srun", "a step inside a job", "inside a job, run the command directly")
    ns.array = None
    ntasks = shape_of(ns, "srun").ntasks
    script = _tasks_script(ns.command, ntasks, ns.label, _stdin())
    spec, _, _ = build(ns, script, [], Path.cwd(), default_out=False, prog="srun")
    c = client()
    check_partition(c, spec)
    job = c.run(acts.submit, spec)
    done = wait(c, job["id"])
    sys.stdout.write(c.run(reads.output, job["id"], limit=1 << 20).get("data") or "")
    sys.stdout.flush()
    sys.stderr.write(c.run(reads.output, job["id"], stream="stderr", limit=1 << 20).get("data") or "")
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


STDIN_MAX = 128 << 10
"""srun's standard input passed to its tasks, at most (it travels inside the job's script)."""
STDIN_WAIT_S = 1.0
"""How long srun waits for a pipe on its stdin to say something (data or its end): an
agent's shell may leave a pipe open that never does, and srun must not hang on it."""


def _stdin() -> bytes:
    """What srun was given on its standard input, to pass to every task as Slurm does
    (``echo x | srun -n2 cat`` prints x twice): a file, or a pipe that speaks within
    STDIN_WAIT_S; nothing from a terminal or a device (/dev/null)."""
    import select
    import stat

    try:
        if os.isatty(0):
            return b""
        mode = os.fstat(0).st_mode
    except OSError:
        return b""
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        if not select.select([0], [], [], STDIN_WAIT_S)[0]:
            return b""
    elif not stat.S_ISREG(mode):
        return b""
    chunks, size = [], 0
    while size <= STDIN_MAX:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > STDIN_MAX:
        raise ShimError(f"corral's srun passes at most {STDIN_MAX >> 10} KiB of standard input to its tasks: "
                        "read a larger input from a file inside the command (srun sh -c 'cmd < FILE')")
    return b"".join(chunks)


def _tasks_script(command: list[str], ntasks: int, label: bool, stdin: bytes = b"") -> str:
    """The command once per task (srun -n4 runs it four times, SLURM_PROCID 0..3), each
    line prefixed with its task number under -l, each reading srun's stdin (or nothing);
    the exit code is the highest."""
    import base64

    cmd = " ".join(shlex.quote(a) for a in command) + ' <"$corral_in"'
    if stdin:  # base64 in a quoted here-document: any bytes travel intact inside the script
        text = base64.encodebytes(stdin).decode()
        feed = (f'corral_in="${{TMPDIR:-/tmp}}/corral-stdin-$$"\nbase64 -d > "$corral_in" <<\'CORRAL_STDIN\'\n'
                f'{text}CORRAL_STDIN\n')
        done = 'rm -f "$corral_in"\n'
    else:
        feed, done = "corral_in=/dev/null\n", ""
    if ntasks == 1 and not label:
        return (f"#!/bin/bash\n{feed}export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0\n{cmd}\n"
                f"rc=$?\n{done}exit $rc\n")
    # Pipes, not process substitutions: bash's wait would not wait for a substitution's
    # sed, so a task's last labelled line could be lost when the job ended first. Each
    # task opens the input itself (a shared descriptor would give it all to one task).
    run = (f'set -o pipefail; {{ {cmd} 2>&1 1>&3 3>&- | sed "s/^/$t: /" >&2 3>&-; }} 3>&1 | sed "s/^/$t: /"'
           if label else cmd)
    return (f"#!/bin/bash\n{feed}pids=()\n"
            f"for t in $(seq 0 {ntasks - 1}); do\n"
            f"  (export SLURM_PROCID=$t SLURM_LOCALID=$t SLURM_NODEID=0; {run}) &\n"
            "  pids+=($!)\ndone\nrc=0\n"
            'for p in "${pids[@]}"; do wait "$p"; r=$?; [ "$r" -gt "$rc" ] && rc=$r; done\n'
            f"{done}exit $rc\n")


def _node(c: Any, spec: dict[str, Any]) -> str:
    parts = facility(c).get("partitions") or []
    want = spec.get("partition")
    p = next((x for x in parts if x["name"] == want or (want is None and x.get("default"))), None)
    return ",".join((p or {}).get("nodes") or ["localhost"])
