"""Inside one sandbox: the program that starts many tasks in it (stdlib only).

Building a sandbox costs ~14 ms (bwrap's namespaces and mounts, then setpriv,
unshare and prlimit, each an exec); starting a task in one that is already built costs
a ``posix_spawn``. So a fast-lane worker builds one sandbox per principal, profile and
working directory (corral/fastlane/hosts.py) and runs this program in it, as the job's
user, with the profile's limits; every task of that key is then spawned here. The
tasks of one host share its namespaces and its process limit: they are one
principal's, in one directory, which is the unit a sandbox protects others from.

It is started as ``python3 -I -S -c SOURCE FD``: the source travels in argv, because the
gateway's own install may lie in a place the sandbox hides (a home), and it imports
nothing of corral's. FD is one end of a SOCK_SEQPACKET pair; messages are JSON:

- in: ``{"id": N, "argv": [...], "env": {...}}`` with file descriptors (stdout, stderr,
  then files the task reads, which it finds as fd 3, 4, ...); ``{"kill": N}``;
- out: ``{"id": N, "pid": P}`` (its pid in here), ``{"id": N, "error": "..."}`` (it did
  not start), ``{"id": N, "status": W, "cpu_s": S}`` (it ended; W as from wait).

A task's end kills its process group; when no task runs, every process left in the
sandbox but the host's own is killed, so nothing a task started outlives the
principal's work there. When the other end closes (the worker ended), every task is
killed and it exits; bwrap then ends the namespace.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from typing import Any

PASS_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
"""Set on the sandbox (its egress proxy): every task gets them, as bwrap's --setenv did."""
HIGH_FD = 100


def _spawn(m: dict[str, Any], fds: list[int], extra: dict[str, str]) -> int:
    argv = m["argv"]
    env = {**m["env"], **extra}
    # posix_spawnp searches this process's PATH, not the child's: the task's PATH it is.
    path = env.get("PATH")
    if path is not None and os.environ.get("PATH") != path:
        os.environ["PATH"] = path
    # Received fds are moved above every target first, so no dup2 overwrites another.
    high = [os.dup2(f, HIGH_FD + i, inheritable=False) for i, f in enumerate(fds)]
    for f in fds:
        os.close(f)
    try:
        acts: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
        acts += [(os.POSIX_SPAWN_DUP2, f, 1 + i) for i, f in enumerate(high)]
        return os.posix_spawnp(argv[0], argv, env, setsid=True, file_actions=acts)
    finally:
        for f in high:
            os.close(f)


def _here() -> set[int]:
    """Every process in this sandbox's PID namespace (its own /proc)."""
    return {int(e) for e in os.listdir("/proc") if e.isdigit()}


def _sweep(keep: set[int]) -> None:
    """Kill every process here but ``keep``: what ended tasks left behind."""
    for pid in _here() - keep:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main(fd: int) -> None:
    os.set_inheritable(fd, False)
    keep = _here() | {os.getpid()}  # bwrap's init, the egress bridge, this
    sock = socket.socket(fileno=fd)
    extra = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN)
    running: dict[int, tuple[int, int]] = {}  # pidfd -> (id, pid)
    pids: dict[int, int] = {}  # id -> pid

    def send(obj: dict[str, Any]) -> None:
        try:
            sock.send(json.dumps(obj).encode())
        except OSError:
            pass  # the worker is gone: the EOF ends us next

    while True:
        for efd, _ in ep.poll():
            if efd != fd:
                jid, pid = running.pop(efd)
                ep.unregister(efd)
                os.close(efd)
                pids.pop(jid, None)
                _, status, ru = os.wait4(pid, 0)
                # A task ends with what it started in its process group; once no task
                # runs, with everything else it left here (even what left the group).
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                if not running:
                    _sweep(keep)
                send({"id": jid, "status": status, "cpu_s": ru.ru_utime + ru.ru_stime})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
            except OSError:
                data, fds = b"", []
            if not data:
                for pid in pids.values():
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                os._exit(0)
            m = json.loads(data)
            if "kill" in m:
                victim = pids.get(m["kill"])
                if victim is not None:
                    try:
                        os.killpg(victim, signal.SIGKILL)
                    except OSError:
                        pass
                continue
            try:
                pid = _spawn(m, fds, extra)
            except OSError as e:
                send({"id": m["id"], "error": f"could not start {m['argv'][0]}: {e.strerror}"})
                continue
            pidfd = os.pidfd_open(pid)
            running[pidfd] = (m["id"], pid)
            pids[m["id"]] = pid
            ep.register(pidfd, select.EPOLLIN)
            send({"id": m["id"], "pid": pid})


if __name__ == "__main__":
    main(int(sys.argv[1]))
