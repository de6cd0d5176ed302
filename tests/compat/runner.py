"""The compatibility corpus, run by either arm: Slurm's own commands against the
private Slurm (scripts/record-slurm-golden records that), or corral's shims against a
gateway in front of it, run as an agent inside ``corral agent run`` (tests/test_compat.py
starts ``python -m tests.compat.runner OUT`` there). Same setup jobs, same directory
layout, same shell: only what ``sbatch`` is differs.

Durations and memory are compared as printed (a time limit, ReqMem, %m); only the
invocations in ``ELAPSED`` show how long a job has run so far, which no two runs share,
and have their durations normalised."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
CORPUS = HERE / "corpus.tsv"
GOLDEN = HERE.parent / "golden" / "slurm_compat.json"
MISSING = "999999"
SCRIPT = "#!/bin/bash\n#SBATCH -J scripted\n#SBATCH -t 2\n#SBATCH -o /dev/null\necho scripted\n"


def corpus() -> list[tuple[str, str]]:
    out = []
    for line in CORPUS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, cmd = line.split("\t", 1)
            out.append((name, cmd))
    return out


def shell(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def setup(cwd: Path, env: dict[str, str]) -> dict[str, str]:
    """The jobs the corpus refers to: DONE (completed, its output in slurm-ID.out), FAIL
    (exit 3), HELD (held), RUN (running): their ids by name."""
    (cwd / "job.sh").write_text(SCRIPT)

    def submit(args: str) -> str:
        r = shell(f"sbatch --parsable {args}", cwd, env)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split(";")[0]

    ids = {"DONE": submit("-J done --wrap 'echo done-output'"), "FAIL": submit("-J fail -o /dev/null --wrap 'exit 3'"),
           "HELD": submit("-J held -H -t 5 -o /dev/null --wrap true"),
           "RUN": submit("-J sleeper -t 10 -o /dev/null --wrap 'sleep 600'")}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        acct = shell(f"sacct -X -n -P -j {ids['DONE']},{ids['FAIL']} -o JobName,State", cwd, env).stdout
        run = shell(f"squeue -h -j {ids['RUN']} -o %T", cwd, env).stdout.strip()
        if "done|COMPLETED" in acct and "fail|FAILED" in acct and run == "RUNNING" and \
                (cwd / f"slurm-{ids['DONE']}.out").exists():
            return ids
        time.sleep(0.5)
    raise AssertionError(f"the setup jobs did not settle: {acct!r} {run!r}")


def queue_wide(cmd: str) -> bool:
    """Whether an invocation reads or changes more than jobs of its own: the whole queue
    (squeue or sacct without -j, sinfo's node states), the setup's jobs (scancel or
    scontrol hold of them) or jobs by name. Those run alone, in the corpus's order, once
    the queue holds only the setup's jobs again; the rest run a few at a time."""
    for seg in re.split(r"[|;&]+|\$\(|\)", cmd):
        words = seg.split()
        tool, args = (words[0], words[1:]) if words else ("", [])
        if tool == "sinfo" or (tool == "scontrol" and args[:1] != ["show"]):
            return True
        if tool in ("squeue", "sacct") and "-j" not in args:
            return True
        if tool == "scancel" and any(a == "-n" or a in ("$HELD", "$RUN", "$DONE", "$FAIL") for a in args):
            return True
    return False


def _quiet(cwd: Path, env: dict[str, str], ids: dict[str, str]) -> None:
    """Until the caller's queue holds only the setup's jobs still there (what the
    queue-wide invocations saw when the corpus ran one invocation at a time)."""
    setup_jobs = {ids["RUN"], ids["HELD"]}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if set(shell("squeue -h --me -o %i", cwd, env).stdout.split()) <= setup_jobs:
            return
        time.sleep(0.5)


def run_all(cwd: Path, env: dict[str, str], only: set[str] | None = None,
            at_once: int = 6) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """The corpus, in its order: the invocations between two queue-wide ones run
    ``at_once`` at a time (each on jobs of its own), a queue-wide one alone after them."""
    from concurrent.futures import ThreadPoolExecutor

    ids = setup(cwd, env)
    full = {**env, **ids, "MISSING": MISSING, "USER": env.get("USER") or "root"}
    out: dict[str, dict[str, Any]] = {}

    def one(name: str, cmd: str) -> None:
        try:
            r = shell(cmd, cwd, full)
        except subprocess.TimeoutExpired as e:  # that case fails, saying so; the corpus goes on
            said = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            out[name] = {"cmd": cmd, "rc": 124, "stdout": "", "stderr": f"timed out after {e.timeout} s\n{said}"}
            return
        out[name] = {"cmd": cmd, "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}

    items = corpus()
    with ThreadPoolExecutor(at_once) as pool:
        batch = []
        for name, cmd in items:
            if only is not None and name not in only:
                continue
            if not queue_wide(cmd):
                batch.append(pool.submit(one, name, cmd))
                continue
            for f in batch:
                f.result()
            batch = []
            _quiet(cwd, full, ids)
            one(name, cmd)
        for f in batch:
            f.result()
    ids = {**ids, "CWD": str(cwd)}  # the directory differs between runs: normalised like an id
    return ids, {name: out[name] for name, _ in items if name in out}


def cleanup(cwd: Path, env: dict[str, str], ids: dict[str, str] | None = None) -> None:
    """The setup's jobs cancelled (by id: the private Slurm is shared, other users' jobs
    stay), and any sleeper left."""
    mine = " ".join(v for k, v in (ids or {}).items() if k in ("RUN", "HELD"))
    shell(f"scancel {mine} 2>/dev/null; scancel -n sleeper 2>/dev/null; true", cwd, env)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_CONF", "LANG", "LC_", "TZ", "HOME"))}
    env.setdefault("SLURM_CONF", "/tmp/corral-slurm/etc/slurm.conf")  # scripts/slurm-up's
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    env["USER"] = "root"
    return env


ELAPSED = {"squeue_default", "squeue_head", "squeue_noheader", "squeue_me", "squeue_user", "squeue_job_running",
           "squeue_job_h", "squeue_pending", "squeue_grep_running", "sacct_elapsed", "time_long", "time_held_limit"}
"""Invocations that print a running job's elapsed time (or time left)."""
_DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_DUR = re.compile(r"\b(\d+-)?\d{1,2}(:\d\d){1,2}\b")


def normalize(text: str, ids: dict[str, str], durations: bool = False) -> str:
    """Ids by role (<DONE>, <ID> for a new one), dates and runs of blanks (and, with
    ``durations``, every duration): what differs between two runs of the same thing."""
    for name, value in sorted(ids.items(), key=lambda kv: -len(kv[1])):
        text = re.sub(rf"(?<![\d.]){re.escape(value)}(?![\d])", f"<{name}>", text)
    # srun's notes while a busy cluster makes it wait: Slurm's, timing-dependent
    text = re.sub(r"(?m)^srun: job \d+ (queued and waiting for resources|has been allocated resources)\n?", "", text)
    text = re.sub(r"Submitted batch job \d+", "Submitted batch job <ID>", text)
    text = re.sub(r"(?m)^\d+$", "<ID>", text)
    text = _DATE.sub("<DATE>", text)
    # The private Slurm's node names: one node `localhost`, or the cluster's c1..c4
    # (decision 0032), so that a golden recorded on one layout holds on the other. The
    # shims' NODELIST is the partition's nodes, not the job's (corral keeps no node per
    # job): a difference only a cluster shows, which this hides. So are sinfo's node counts
    # (the shims count a partition's nodes alike whatever runs on each).
    text = re.sub(r"\b(?:localhost|c\[[\d,-]+\]|c\d+)(?:,c\d+)*\b", "<NODES>", text)
    text = re.sub(r"\b\d+/\d+/\d+/\d+\b", "<A/I/O/T>", text)
    text = re.sub(r"\b\d+[ \t]+(?=(?:mix|idle|alloc|allocated|down|drain|drng|comp)\b)", "<N> ", text)
    if durations:
        text = _DUR.sub("<T>", text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines()).strip()


def fields(text: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)


if __name__ == "__main__":  # the shim arm, inside `corral agent run`: the corpus as the agent runs it
    import json
    import sys

    env = {**os.environ, "USER": os.environ.get("USER") or "root"}
    cwd = Path.cwd()
    ids, out = run_all(cwd, env, set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None)
    cleanup(cwd, env, ids)
    Path(sys.argv[1]).write_text(json.dumps({"ids": ids, "results": out}))
