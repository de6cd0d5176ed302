"""The per-job supervisor of the local backend: ``python -m corral.lanes.local_runner DIR``.

It runs detached from the gateway (its own session), so a gateway crash or restart
leaves jobs running. It starts the job (corral/lanes/local_child.py), enforces walltime
(TIMEOUT) and memory (OUT_OF_MEMORY, by sampling every process of the job, detached or
not, and its private /tmp: corral/lanes/job_memory.py), turns SIGTERM into a cancel and
SIGUSR1 into the signal named in DIR/signal.json (job_control), and writes ``result.json``
atomically as its last act, into room reserved for it at submission
(corral/lanes/local_records.py: a full disk never turns a job's end into another), with
what the job used (CPU time, peak memory). The gateway learns everything from files in DIR.

Deliberately imports only the standard library (and corral's stdlib-only helpers named
above): it starts once per job.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from corral.lanes.job_memory import subreaper, tree_rss_mb, trees_rss_mb  # noqa: F401 (their old home)
from corral.lanes.local_child import VENV_FD, WORKDIR_FD, Child, Hosted, Popened, popen, stop
from corral.lanes.local_records import room, write_json

MAX_SAMPLE_S = 1.0  # memory and walltime checks: fast at first, then at most once a second
RESULT_WAIT_S = 600.0
"""How long a supervisor waits for room on a full disk to record its job's end (when the
job has no reserved slot): the record is the job's truth, worth holding its slots for."""
DISK_RESERVE = 256 << 20
"""Below this free on corral's disk (or an eighth of a small disk), a job that keeps
writing output is stopped, named as the cause: corral's own writes come first."""


KEPT = 1 << 20
"""What is kept of each output stream of a job stopped for filling corral's disk."""


class Cancelled(Exception):
    """Raised by the SIGTERM handler to interrupt the wait at once."""


def open_dir(path: str, who: list[Any] | None = None, what: str = "working directory") -> int:
    """``path``, a directory, opened one component at a time without following a link
    (what ``openat2(RESOLVE_NO_SYMLINKS)`` does), as the job's identity ``who`` ([uid,
    gid, groups]) when this supervisor is root (corral/sandbox/opendir.py): a link an agent
    swapped in after the gateway checked the path is refused, never followed."""
    from corral.sandbox.opendir import open_dir as walk

    return walk(path, (int(who[0]), int(who[1]), [int(g) for g in who[2]]) if who else None, what)


def main(job_dir: str) -> int:
    d = Path(job_dir)
    launch = json.loads((d / "launch.json").read_text())
    os.umask(0o022)  # the job's files get the usual modes, whatever corral's own umask is
    # A SIGTERM is remembered at any time, and interrupts the wait only while
    # waiting, so it never cuts the writing of a result short.
    term = {"pending": False, "armed": False}

    def on_term(signum: int, frame: object) -> None:
        term["pending"] = True
        if term["armed"]:
            raise Cancelled()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # The gateway asks for a signal to the job (job_control) through this supervisor,
    # which has not reaped the job: its pid cannot name another process meanwhile.
    held: dict[str, Child] = {}

    def on_usr1(signum: int, frame: object) -> None:
        try:
            sig = int(json.loads((d / "signal.json").read_text())["signal"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if "child" in held:
            held["child"].signal(sig)

    signal.signal(signal.SIGUSR1, on_usr1)
    subreaper()  # a job's detached orphans stay below this process: sampled, and counted
    start = time.time()
    if (d / "cancel").exists():
        write_json(d / "result.json", {"state": "CANCELLED", "exit_code": None, "reason": "cancelled before start",
                                       "start_time": None, "end_time": start})
        return 0
    # Corral's own files in corral's own directory (or, for a harness that writes its own
    # launch.json, the paths it names there): never through a link.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    paths = launch.get("output") or {}
    try:
        out_fd = os.open(paths.get("stdout") or d / "stdout", flags, 0o600)
        err_fd = os.open(paths.get("stderr") or d / "stderr", flags, 0o600)
    except OSError as e:
        write_json(d / "result.json", {"state": "FAILED", "exit_code": None, "start_time": None, "end_time": time.time(),
                                       "reason": f"its output could not be opened ({e.strerror}); nothing ran"})
        return 0
    with open(out_fd, "ab") as out, open(err_fd, "ab") as err:
        started = _start(launch, d, out, err, start)
    if started is None:
        return 0
    child: Child = started
    held["child"] = child
    write_json(d / "running.json", {"pid": os.getpid(), "child": child.pid, "start_time": start})
    state, reason, rc, peak, seen = _watch(d, launch, child, term, start)
    held.clear()
    child.close()
    if seen.get("cut"):
        reason = f"{reason}{_cut(launch, d)}"
    end = time.time()
    cpu_s, rss_mb = child.usage()
    state, reason = _outcome(d, child, state, reason, rc)
    # The one rule of every lane: a cancelled job has no exit code (it did not exit by itself).
    exit_code = None if state == "CANCELLED" else 128 - rc if rc < 0 else rc
    write_json(d / "result.json", {"state": state, "exit_code": exit_code, "reason": reason,
                                   "start_time": start, "end_time": end, "cpu_s": cpu_s,
                                   "max_rss_mb": round(max(peak, rss_mb or 0.0), 1)}, wait=RESULT_WAIT_S)
    return 0


def _start(launch: dict[str, Any], d: Path, out: BinaryIO, err: BinaryIO, start: float) -> Child | None:
    """The job started, in its built sandbox (``host``) or as a process of its own, its
    working directory and venv opened first onto the descriptors it finds them at. None:
    it could not start (its result says why)."""
    started: Child | None = None
    try:
        for key, at, what in (("workdir", WORKDIR_FD, "working directory"), ("venv", VENV_FD, "venv (VIRTUAL_ENV)")):
            if launch.get(key):
                wfd = open_dir(launch[key], launch.get("open_as"), what)  # its error says why and what to do
                os.dup2(wfd, at)
                os.close(wfd)
        started = Hosted(launch, out.fileno(), err.fileno()) if launch.get("host") else Popened(
            popen(launch, out, err), bool(launch.get("contained")))
    except OSError as e:
        write_json(d / "result.json", {"state": "FAILED", "exit_code": 127, "reason": f"could not start: {e.strerror or e}",
                                       "start_time": start, "end_time": time.time()})
        return None
    finally:
        for at in (WORKDIR_FD, VENV_FD):
            if not isinstance(started, Hosted):  # a hosted job's are its own until its host started it
                try:
                    os.close(at)
                except OSError:
                    pass
    return started


def _watch(d: Path, launch: dict[str, Any], child: Child, term: dict[str, bool],
           start: float) -> tuple[str | None, str | None, int, float, dict[str, int]]:
    """Wait for the job's end, sampling it (fast at first, then once a second), and stop
    it when it is cancelled (``term``: SIGTERM's flags) or goes past a bound. -> (state and
    reason, None when it ended by itself; its return code; its peak memory in MB; what was
    seen of its output, ``_over``'s)."""
    deadline = start + launch["walltime_s"]
    notice = _notice(launch, deadline)
    state, reason = None, None
    interval = 0.05
    peak = 0.0
    rc = None
    stuck = False
    seen = {"written": 0}
    while rc is None:
        try:
            term["armed"] = True
            if term["pending"]:
                raise Cancelled()
            ready, _, _ = select.select([child], [], [], min(interval, max(0.0, deadline - time.time())))
            term["armed"] = False
            if ready:
                rc = child.ended()
                if rc is not None:
                    break
                continue
            interval = min(interval * 2, MAX_SAMPLE_S)
            if (d / "cancel").exists():
                raise Cancelled()
            procs, tmp = child.rss_mb()
            peak = max(peak, procs + tmp)
            _tell(d, launch, child, seen, notice)
            if past := _past(d, launch, child, deadline, (procs, tmp), seen):
                state, reason, stuck = past
        except Cancelled:
            state, reason = "CANCELLED", "cancelled by request"
        term["armed"] = False
        if state:
            rc = child.force() if stuck else stop(child)
    return state, reason, rc, peak, seen


def _tell(d: Path, launch: dict[str, Any], child: Child, seen: dict[str, int], notice: list[Any]) -> None:
    """The gateway told a hosted job's pid, once; the job its notice signal, once, when due."""
    if launch.get("host") and child.pid and not seen.get("pid"):
        seen["pid"] = child.pid  # how the gateway's idle check finds a hosted job's processes
        with contextlib.suppress(OSError):
            write_json(d / "job.json", {"pid": child.pid})
    if notice and time.time() >= notice[1]:
        child.signal(notice.pop(0))  # once: Slurm's --signal, to the job's process group
        notice.clear()


def _past(d: Path, launch: dict[str, Any], child: Child, deadline: float, rss: tuple[float, float],
          seen: dict[str, int]) -> tuple[str, str, bool] | None:
    """(state, reason, whether it is stuck: forced, not stopped) once the job went past
    its walltime or a bound (``_over``: ``rss`` is its processes' and its /tmp's), or its
    sandbox's end left it stuck; None: it runs on."""
    if time.time() >= deadline:
        return "TIMEOUT", f"killed after its walltime of {launch['walltime_s']}s", False
    if over := _over(d, launch, *rss, seen):
        return over[0], over[1], False
    if stuck := child.stuck():
        return "FAILED", stuck, True
    return None


def _outcome(d: Path, child: Child, state: str | None, reason: str | None, rc: int) -> tuple[str, str | None]:
    """The job's state and reason once it has ended: corral's (``state``), or its own."""
    if state is None and rc != 0 and (d / "cancel").exists():
        # Asked to cancel, it died before this loop saw the request (the signal reached the
        # job's own tree first): cancelled, not failed.
        state, reason = "CANCELLED", "cancelled by request"
    if child.why and state is None:  # its sandbox ended it, or never started it
        state, reason = "FAILED", child.why
    elif child.why and reason and child.why not in reason:  # ended by corral, through its sandbox's end
        reason = f"{reason}; {child.why}"
    if state is None:
        return _ended(rc, reason)
    return state, reason


def _ended(rc: int, reason: str | None) -> tuple[str, str | None]:
    """The state of a job that ended by itself with return code ``rc`` (Popen's: -N for a signal)."""
    if rc == 0:
        return "COMPLETED", reason
    if rc == -signal.SIGXFSZ or rc == 128 + signal.SIGXFSZ:
        return "FAILED", ("a file it wrote reached the facility's size limit for one file "
                          "([sandbox] file_max); write smaller files")
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in set(signal.Signals) else str(-rc)
        return "FAILED", f"killed by signal {name}"
    return "FAILED", f"exited with code {rc}"


def _notice(launch: dict[str, Any], deadline: float) -> list[Any]:
    """[signal number, when] of the job's ``signal`` ('USR1@30', corral/core/signals.py), or
    []: sent once, that many seconds before the walltime ends (at once when it is longer),
    as Slurm sends --signal; the loop samples at least once a second, so it is on time to
    within that."""
    if not launch.get("notice"):
        return []
    name, _, at = str(launch["notice"]).partition("@")
    return [int(getattr(signal, f"SIG{name}")), deadline - int(at or 60)]


SHORT_WRITE = 1 << 20
"""Output written in one sample that, on a short disk, marks the job as what filled it."""


def _over(d: Path, launch: dict[str, Any], procs: float, tmp: float, seen: dict[str, int]) -> tuple[str, str] | None:
    """(state, reason) when the job went past a bound: its memory (its processes and its
    private /tmp), its output, or corral's disk's reserve while it writes output."""
    limit = launch["memory_mb"]
    if procs + tmp > limit:
        held = f" ({procs:.0f}M in its processes, {tmp:.0f}M in its private /tmp and shared memory)" if tmp >= 1 else ""
        return "OUT_OF_MEMORY", f"killed for using more than its {limit}M of memory{held}"
    written = _written(d)
    if launch.get("output_max") and written > launch["output_max"]:
        return "FAILED", (f"stopped after writing {written} bytes of output, over the facility's "
                          f"limit of {launch['output_max']}; write large results to files instead")
    before, seen["written"] = seen["written"], written
    free = room(d, launch.get("disk_reserve") or DISK_RESERVE) if written > before else None
    if free is None:
        if written > before:
            seen.pop("short_at", None)
        return None
    # Blamed for a large write into a short disk, or for writing on once it was seen
    # short: a few bytes this sample saw may predate the shortage (a job that printed 'ok'
    # before another filled the disk, sampled late on a loaded host).
    if written - before >= SHORT_WRITE or seen.setdefault("short_at", written) < written:
        seen["cut"] = 1
        return "FAILED", (f"stopped while writing output ({written} bytes so far): the disk that holds corral's "
                          f"state ({d.parent.parent}) had only {free >> 20} MB left; write large results "
                          "to files in a working directory instead")
    return None


def _cut(launch: dict[str, Any], d: Path) -> str:
    """Give corral's disk back: the output of a job stopped for filling it is cut to its
    first ``KEPT`` bytes each (corral's files: never through a link). -> what to add to its reason."""
    paths = launch.get("output") or {}
    cut = 0
    for name in ("stdout", "stderr"):
        try:
            fd = os.open(paths.get(name) or d / name, os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size > KEPT:
                os.ftruncate(fd, KEPT)
                cut += size - KEPT
        finally:
            os.close(fd)
    return f"; its output was cut to its first {KEPT >> 20} MB per stream ({cut} bytes dropped)" if cut else ""


def _written(d: Path) -> int:
    """What the job wrote to its output so far (files only corral can reach)."""
    try:
        return sum(os.stat(d / n, follow_symlinks=False).st_size for n in ("stdout", "stderr"))
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
