"""What a contained Slurm batch job costs over a bare one (issue 50, "what must hold" 4).

N `sleep 2` jobs are submitted bare (`sbatch --wrap`) and N through corral as an agent
principal (its batch script, contained in corral's sandbox), interleaved one of each at a
time, and Slurm's own start-to-end of each is read back: from slurmctld's log (the
"Allocate" and "_job_complete" lines, in milliseconds) and from sacct's Start/End (in whole
seconds, whose mean is still unbiased: a job's start falls anywhere within its second).

    python bench/batch_overhead.py [--quick] [--jobs 20]

A full run (not ``--quick``) has a third arm, interleaved with the others: contained through
a second gateway whose batch scripts run the Python steps (``CORRAL_JOBSTART_COMPILED=0``,
as where no C compiler is) instead of corral's compiled starter (corral/sandbox/starter.py):
what the starter saves, in the same run (``python_steps_minus_bare_p50_ms``).

Needs the private Slurm of scripts/slurm-up (SLURM_CONF). Last line: one JSON object with
``contained_minus_bare_p50_ms`` (slurmctld's milliseconds; sacct's seconds are beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct, sponsored_agents  # noqa: E402

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
ENV = {**os.environ, "SLURM_CONF": SLURM_CONF}
WORK = "sleep 2"
STAMP = r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\]"


def sh(*argv: str, patience_s: float = 60) -> str:
    """A Slurm command's output; tried again for a while when the controller does not
    answer (other users of the private cluster restart it, or fail it over)."""
    deadline = time.monotonic() + patience_s
    while True:
        r = subprocess.run(argv, env=ENV, capture_output=True, text=True)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    if r.returncode:
        raise SystemExit(f"{' '.join(argv[:2])}: {r.stderr.strip()}")
    return r.stdout


@contextlib.contextmanager
def turn() -> Iterator[None]:
    """The instance alone, as a real-Slurm test takes it (tests/slurm_env.py::turn_lock):
    tests stop and fail over its controllers and nodes."""
    lock = ("/tmp/corral-slurm-tests.lock" if Path(SLURM_CONF).resolve() == Path("/tmp/corral-slurm/etc/slurm.conf")
            else str(Path(SLURM_CONF).resolve().parent.parent / "tests.lock"))
    with open(lock + ".gate", "w") as gate, open(lock, "w") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield


def ctld_log() -> Path | None:
    """slurmctld's log: where its configuration says, else through the descriptor a
    running slurmctld holds it by (scripts/slurm-up runs each daemon in a namespace of
    its own, where the path may name another file than it does here)."""
    named = next((line.split("=", 1)[1].strip() for line in sh("scontrol", "show", "config").splitlines()
                  if line.startswith("SlurmctldLogFile")), "")
    if not named or named == "(null)":
        return None
    if Path(named).exists():
        return Path(named)
    for pid in subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True, text=True).stdout.split():
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if os.readlink(fd) == named:
                    return fd
        except OSError:
            continue
    return None


def _when(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp).timestamp()


def ctld_elapsed(ids: list[str]) -> dict[str, float]:
    """Slurm job id -> seconds from slurmctld's allocation to its completion, from its log
    (both on the controller's clock, in milliseconds). Empty where the log is unreadable."""
    log = ctld_log()
    try:
        text = log.read_text(errors="replace") if log else ""
    except OSError:
        return {}
    want = set(ids)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for m in re.finditer(STAMP + r" sched: Allocate JobId=(\d+) ", text):
        if m.group(2) in want:
            start[m.group(2)] = _when(m.group(1))
    for m in re.finditer(STAMP + r" _job_complete: JobId=(\d+) WEXITSTATUS", text):
        if m.group(2) in want:
            end[m.group(2)] = _when(m.group(1))
    return {j: end[j] - start[j] for j in want if j in start and j in end}


def sacct_elapsed(ids: list[str]) -> dict[str, float]:
    """Slurm job id -> End - Start from sacct (whole seconds), for jobs that COMPLETED."""
    out = sh("sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "JobID,Start,End,State")
    got = {}
    for line in out.splitlines():
        jid, start, end, state = line.split("|")[:4]
        if state == "COMPLETED" and start[:1].isdigit() and end[:1].isdigit():
            got[jid] = _when(end) - _when(start)
    return got


def submit_pairs(n: int, hs: list[httpx.Client], workdir: str, gap_s: float) -> tuple[list[str], list[list[int]]]:
    """n bare and n corral jobs per gateway of ``hs``, one of each in turn -> (bare Slurm
    ids, each gateway's corral job ids)."""
    bare: list[str] = []
    ours: list[list[int]] = [[] for _ in hs]
    for _ in range(n):
        bare.append(sh("sbatch", "--parsable", "-o", "/dev/null", "-D", workdir, "-t", "1", "--mem=100M",
                       "--wrap", WORK).strip().split(";")[0])
        for h, mine in zip(hs, ours):
            r = h.post("/v1/jobs", json={"command": WORK, "workdir": workdir, "memory": "100M", "walltime": "1m",
                                         "lane": "batch"})
            r.raise_for_status()
            mine.append(r.json()["id"])
        time.sleep(gap_s)
    return bare, ours


def wait_corral(h: httpx.Client, ids: list[int], deadline: float) -> list[str]:
    """The Slurm ids of corral's jobs once each has ended (or the deadline passed)."""
    done: dict[int, dict] = {}
    while len(done) < len(ids) and time.monotonic() < deadline:
        for i in ids:
            if i not in done:
                j = h.get(f"/v1/jobs/{i}").json()
                if j["state"] not in ("PENDING", "RUNNING", "UNKNOWN"):
                    done[i] = j
        time.sleep(0.5)
    return [str(j["backend_id"]) for j in done.values() if j.get("state") == "COMPLETED" and j.get("backend_id")]


def wait_bare(ids: list[str], deadline: float) -> None:
    while time.monotonic() < deadline and sh("squeue", "-h", "-j", ",".join(ids), "-o", "%i").strip():
        time.sleep(0.5)


def all_arms(n: int, workdir: str, gap_s: float, python_steps: bool) -> tuple[list[str], list[list[str]]]:
    """Every arm's jobs run and ended -> (bare Slurm ids, per gateway (compiled starter,
    then the Python steps when asked) corral's Slurm ids that completed)."""
    envs = [{"SLURM_CONF": SLURM_CONF}] + ([{"SLURM_CONF": SLURM_CONF, "CORRAL_JOBSTART_COMPILED": "0"}]
                                           if python_steps else [])
    gws = [GatewayProcess("--backend", "slurm", env=env) for env in envs]
    try:
        with contextlib.ExitStack() as stack:
            hs = [stack.enter_context(httpx.Client(base_url=gw.url, timeout=60, headers={
                "Authorization": f"Bearer {sponsored_agents(gw, 1)[0]}"})) for gw in gws]
            bare, ours = submit_pairs(n, hs, workdir, gap_s)
            deadline = time.monotonic() + 20 + 3 * n * len(hs)
            wait_bare(bare, deadline)
            return bare, [wait_corral(h, mine, deadline) for h, mine in zip(hs, ours)]
    finally:
        for gw in gws:
            gw.stop()


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": round(pct(values, 50) * 1000, 1), "p90_ms": round(pct(values, 90) * 1000, 1),
            "mean_ms": round(sum(values) / len(values) * 1000, 1) if values else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20, help="jobs per arm")
    ap.add_argument("--gap", type=float, default=0.7, help="seconds between one pair's submission and the next")
    ap.add_argument("--quick", action="store_true", help="5 jobs an arm, without the Python steps' arm (under 30 s)")
    a = ap.parse_args()
    n = 5 if a.quick else a.jobs
    if not Path(SLURM_CONF).exists():
        sys.exit(f"no {SLURM_CONF}: run scripts/slurm-up first")
    workdir = tempfile.mkdtemp(prefix="corral-bench-batch-")
    os.chmod(workdir, 0o777)  # the contained work runs as another, unprivileged identity
    waited = time.monotonic()
    with turn():  # then asked: a test that had the turn may have left the controller restarting
        waited = time.monotonic() - waited
        try:
            sh("sinfo", "-h", patience_s=30)
        except (SystemExit, FileNotFoundError):
            sys.exit(f"no Slurm answers with SLURM_CONF={SLURM_CONF}: run scripts/slurm-up first")
        bare, arms = all_arms(n, workdir, a.gap, python_steps=not a.quick)
        contained, python = arms[0], (arms[1] if len(arms) > 1 else [])
        time.sleep(1)  # slurmdbd is told of a job's end a moment after slurmctld
        ctld = ctld_elapsed(bare + contained + python)
        acct = sacct_elapsed(bare + contained + python)
    ctld_bare, ctld_ours = [ctld[j] for j in bare if j in ctld], [ctld[j] for j in contained if j in ctld]
    acct_bare, acct_ours = [acct[j] for j in bare if j in acct], [acct[j] for j in contained if j in acct]
    s: dict[str, Any] = {"bare": summary(ctld_bare), "contained": summary(ctld_ours),
         "bare_sacct": summary(acct_bare), "contained_sacct": summary(acct_ours)}
    diff = round(s["contained"]["p50_ms"] - s["bare"]["p50_ms"], 1) if ctld_bare and ctld_ours else None
    if python:  # the same run's third arm: what the compiled starter saves
        ctld_py = [ctld[j] for j in python if j in ctld]
        s["contained_python_steps"] = summary(ctld_py)
        s["python_steps_minus_bare_p50_ms"] = (round(s["contained_python_steps"]["p50_ms"] - s["bare"]["p50_ms"], 1)
                                              if ctld_bare and ctld_py else None)
    s["load1"] = round(os.getloadavg()[0], 2)
    mean_sacct = (round(s["contained_sacct"]["mean_ms"] - s["bare_sacct"]["mean_ms"], 1)
                  if acct_bare and acct_ours else None)
    print(f"bare {s['bare']} contained {s['contained']} (slurmctld, ms); sacct mean difference {mean_sacct} ms",
          file=sys.stderr)
    finish("batch_overhead", {"bench": "batch_overhead", "jobs_per_arm": n, "work": WORK, "turn_wait_s": round(waited, 1),
                              "contained_minus_bare_p50_ms": diff, "contained_minus_bare_mean_ms_sacct": mean_sacct,
                              **s}, {"bare": bool(ctld_bare and acct_bare), "contained": bool(ctld_ours and acct_ours),
                                     **({"contained_python_steps": bool(s["contained_python_steps"]["n"])}
                                        if python else {})})


if __name__ == "__main__":
    main()
