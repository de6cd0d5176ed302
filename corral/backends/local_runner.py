"""The per-job supervisor of the local backend: ``python -m corral.backends.local_runner DIR``.

It runs detached from the gateway (its own session), so a gateway crash or restart
leaves jobs running. It starts the job in a new process group, enforces walltime
(TIMEOUT) and memory (OUT_OF_MEMORY, by sampling the resident memory of the job's
process tree), turns SIGTERM into a cancel, and writes ``result.json`` atomically
as its last act. The gateway learns everything from files in DIR.

Deliberately imports only the standard library: it starts once per job.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 3.0  # between SIGTERM and SIGKILL, as Slurm's KillWait
MAX_SAMPLE_S = 1.0  # memory and walltime checks: fast at first, then at most once a second


class Cancelled(Exception):
    """Raised by the SIGTERM handler to interrupt the wait at once."""
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def tree_rss_mb(pid: int) -> float:
    """Resident memory of the job's process and all its descendants, in MB: by parent
    links, not process group, because a sandboxed job runs in a session of its own."""
    return trees_rss_mb([pid])[pid]


def trees_rss_mb(pids: list[int]) -> dict[int, float]:
    """``tree_rss_mb`` of each of ``pids``, from one pass over /proc."""
    rss: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command name; ppid is field 4, rss field 24.
        fields = stat[stat.rfind(b")") + 2 :].split()
        p = int(entry.name)
        rss[p] = int(fields[21])
        children.setdefault(int(fields[1]), []).append(p)
    out = {}
    for pid in pids:
        total_pages, todo = 0, [pid]
        while todo:
            p = todo.pop()
            total_pages += rss.get(p, 0)
            todo += children.get(p, ())
        out[pid] = total_pages * PAGE_KB / 1024
    return out


def main(job_dir: str) -> int:
    d = Path(job_dir)
    launch = json.loads((d / "launch.json").read_text())
    # A SIGTERM is remembered at any time, and interrupts the wait only while
    # waiting, so it never cuts the writing of a result short.
    term = {"pending": False, "armed": False}

    def on_term(signum: int, frame: object) -> None:
        term["pending"] = True
        if term["armed"]:
            raise Cancelled()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    start = time.time()
    if (d / "cancel").exists():
        write_json(d / "result.json", {"state": "CANCELLED", "exit_code": None, "reason": "cancelled before start",
                                       "start_time": None, "end_time": start})
        return 0
    with open(d / "stdout", "ab") as out, open(d / "stderr", "ab") as err:
        try:
            child = subprocess.Popen(
                launch["argv"], cwd=launch["cwd"], env=launch["env"], stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, process_group=0,
            )
        except OSError as e:
            write_json(d / "result.json", {"state": "FAILED", "exit_code": 127, "reason": f"could not start: {e}",
                                           "start_time": start, "end_time": time.time()})
            return 0
    write_json(d / "running.json", {"pid": os.getpid(), "child": child.pid, "start_time": start})

    deadline = start + launch["walltime_s"]
    mem_limit = launch["memory_mb"]
    state, reason = None, None
    # A pidfd becomes readable when the child exits: the supervisor sleeps in the
    # kernel instead of polling (Popen.wait(timeout) polls every few ms).
    pidfd = os.pidfd_open(child.pid)
    interval = 0.05
    rc = None
    while rc is None:
        try:
            term["armed"] = True
            if term["pending"]:
                raise Cancelled()
            ready, _, _ = select.select([pidfd], [], [], min(interval, max(0.0, deadline - time.time())))
            term["armed"] = False
            if ready:
                rc = child.wait()
                break
            interval = min(interval * 2, MAX_SAMPLE_S)
            if (d / "cancel").exists():
                raise Cancelled()
            if time.time() >= deadline:
                state, reason = "TIMEOUT", f"killed after its walltime of {launch['walltime_s']}s"
            elif tree_rss_mb(child.pid) > mem_limit:
                state, reason = "OUT_OF_MEMORY", f"killed for using more than its {mem_limit}M of memory"
        except Cancelled:
            state, reason = "CANCELLED", "cancelled by request"
        term["armed"] = False
        if state:
            rc = stop(child)
    os.close(pidfd)
    end = time.time()
    if state is None:
        if rc == 0:
            state = "COMPLETED"
        elif rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            state, reason = "FAILED", f"killed by signal {name}"
        else:
            state, reason = "FAILED", f"exited with code {rc}"
    # The one rule of every lane: a cancelled job has no exit code (it did not exit by itself).
    exit_code = None if state == "CANCELLED" else 128 - rc if rc < 0 else rc
    write_json(d / "result.json", {"state": state, "exit_code": exit_code, "reason": reason,
                                   "start_time": start, "end_time": end})
    return 0


def stop(child: subprocess.Popen[bytes]) -> int:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
