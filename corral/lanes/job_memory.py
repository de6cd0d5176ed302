"""What a local job holds in memory: every process of it, detached or not, and its private /tmp.

A job is its processes wherever they went (issue 47): a child that detached (a double
fork, ``setsid``, ``nohup ... &``) is reparented away from the job's tree, to its
sandbox's init or to the machine's. So the job is found by what it cannot leave:

- in a built sandbox (corral/sandbox/host.py) each job has a user namespace of its own,
  and the sandbox's filter refuses it another one (corral/sandbox/seccomp.py): every
  process in that user namespace is the job's; where user namespaces are off, the
  sandbox's PID namespace (the principal's jobs in that directory, counted together);
- a job started by its supervisor (a sandbox of its own, or none) is below the
  supervisor, which is a child subreaper: an orphan of the job is reparented to it.

What a job writes into an anonymous memory file (``memfd_create``) is memory no
process has resident; it is counted through the descriptors that hold it. A contained
job's private /tmp (and its own directory there) is a tmpfs: memory, so what it holds
counts as memory too (docs/decisions/0044-job-space.md). Where cgroup v2
is delegated, a cgroup per job would bound this in the kernel between two samples;
corral samples (docs/security.md says what that leaves).

Standard library only: the supervisor imports it once per job.
"""

from __future__ import annotations

import os
from typing import Callable

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWIPC = 0x08000000


def subreaper() -> None:
    """Make this process the reaper of its descendants' orphans (they stay below it)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _walk(value: Callable[[list[bytes]], int]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """One pass over /proc: pid -> ``value`` of its stat fields (those after the
    parenthesised command name: ppid is [1], utime..cstime [11:15], rss [21]), and ppid ->
    children."""
    out: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        p = int(entry.name)
        out[p] = value(fields)
        children.setdefault(int(fields[1]), []).append(p)
    return out, children


def _stats() -> tuple[dict[int, int], dict[int, list[int]]]:
    """pid -> resident pages, and ppid -> children."""
    return _walk(lambda fields: int(fields[21]))


def trees_rss_mb(pids: list[int]) -> dict[int, float]:
    """Resident memory of each of ``pids`` and all its descendants, in MB, from one pass
    over /proc: by parent links, not process group (a sandboxed job has a session of its own)."""
    rss, children = _stats()
    out = {}
    for pid in pids:
        total_pages, todo = 0, [pid]
        while todo:
            p = todo.pop()
            total_pages += rss.get(p, 0)
            todo += children.get(p, ())
        out[pid] = total_pages * PAGE_KB / 1024
    return out


def tree_rss_mb(pid: int) -> float:
    return trees_rss_mb([pid])[pid]


def below_mb(pid: int) -> float:
    """Every descendant of ``pid`` (a subreaper: the job's orphans too), not ``pid`` itself:
    their resident memory and what they hold in memory files (``held_mb``)."""
    rss, children = _stats()
    todo, pages, seen = list(children.get(pid, ())), 0, []
    while todo:
        p = todo.pop()
        seen.append(p)
        pages += rss.get(p, 0)
        todo += children.get(p, ())
    return pages * PAGE_KB / 1024 + held_mb(seen)


def below_cpu_s(pid: int) -> float | None:
    """CPU seconds (user and system, with their reaped children's) of every descendant of
    ``pid``, and of the children ``pid`` itself reaped; None: it has none (a job hosted in a
    built sandbox runs below its host, not its supervisor: not measured here). What the
    notifier's idle check samples (corral/notify/idle.py)."""
    tick = os.sysconf("SC_CLK_TCK")
    used, children = _walk(lambda fields: sum(int(x) for x in fields[11:15]))
    todo, ticks = list(children.get(pid, ())), 0
    if not todo:
        return None
    while todo:
        p = todo.pop()
        ticks += used.get(p, 0)
        todo += children.get(p, ())
    try:  # its reaped orphans' (fields 16-17 of the supervisor)
        with open(f"/proc/{pid}/stat", "rb") as f:
            own = f.read()
        ticks += sum(int(x) for x in own[own.rfind(b")") + 2:].split()[13:15])
    except OSError:
        return None
    return ticks / tick


def held_mb(pids: list[int]) -> float:
    """Memory the processes ``pids`` hold in anonymous memory files (``memfd_create``)
    through a descriptor, each file once: written, not mapped, it is in no one's resident
    memory, and 300 MB in one passed a 128M limit unseen."""
    files: dict[tuple[int, int], int] = {}
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:"):
                    continue
                st = os.stat(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            files[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(files.values()) / 2**20


def namespace(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def own_namespace(pid: int) -> tuple[str, str] | None:
    """(kind, id) of the namespace that holds exactly ``pid``'s job: its user namespace if
    it has its own, else its PID namespace if that is not this process's; None: neither."""
    for kind in ("user", "pid"):
        theirs = namespace(pid, kind)
        if theirs is not None and theirs != namespace("self", kind):
            return kind, theirs
    return None


def ns_rss_mb(kind: str, ident: str) -> float:
    """Memory of every process in the namespace ``ident`` (a ``namespace`` answer): resident,
    and held in memory files (``held_mb``)."""
    pages, seen = 0, []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or namespace(entry.name, kind) != ident:
            continue
        try:
            with open(f"/proc/{entry.name}/statm", "rb") as f:
                pages += int(f.read().split()[1])
            seen.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pages * PAGE_KB / 1024 + held_mb(seen)


def ns_cpu_s(kind: str, ident: str) -> float:
    """CPU seconds (with reaped children's) of every process in the namespace ``ident``:
    a job hosted in a built sandbox (``below_cpu_s`` for the others)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or namespace(entry.name, kind) != ident:
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
            ticks += sum(int(x) for x in stat[stat.rfind(b")") + 2:].split()[11:15])
        except (OSError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def inside(root: int) -> int | None:
    """A process below ``root`` (a sandbox's bwrap) in another mount namespace than this
    one: its ``/proc/P/root`` is the sandbox's."""
    mine, todo = namespace("self", "mnt"), [root]
    while todo:
        p = todo.pop(0)
        if p != root and namespace(p, "mnt") not in (None, mine):
            return p
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return None


def shm_mb(pid: int | None) -> float:
    """What the SysV shared memory of the IPC namespace ``pid`` is in holds, in MB: a
    segment written and detached is in no process's memory, and lives as long as its
    namespace (the job's sandbox). Read from a thread that joins that namespace (root's;
    a namespace is a thread's own), never from this process's; 0 where it is this
    process's own (an uncontained job's: the machine's) or cannot be joined."""
    if pid is None or namespace(pid, "ipc") in (None, namespace("self", "ipc")):
        return 0.0
    import threading

    got: list[float] = []

    def read() -> None:
        import ctypes

        try:
            fd = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY)
        except OSError:
            return
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWIPC) != 0:
                return
            with open("/proc/sysvipc/shm") as f:
                lines = f.read().splitlines()
        finally:
            os.close(fd)
        col = lines[0].split().index("rss") if lines and "rss" in lines[0].split() else None
        if col is not None:
            got.append(sum(int(ln.split()[col]) for ln in lines[1:] if len(ln.split()) > col) / 2**20)

    t = threading.Thread(target=read, daemon=True)  # it ends with its namespace: never reused
    t.start()
    t.join()
    return got[0] if got else 0.0


def tmp_mb(pid: int | None) -> float:
    """What the private /tmp of the sandbox ``pid`` runs in holds, in MB (0 unknown)."""
    if pid is None:
        return 0.0
    try:
        st = os.statvfs(f"/proc/{pid}/root/tmp")
    except OSError:
        return 0.0
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20
