"""How a fast-lane launcher starts one task's process (launcher.py decides when): its
argv, and the two ways to start it. ``spawn``: ``posix_spawn`` as the worker (no fork
of the worker's large heap; the child opens its own output files). ``start_as``: a fork
that becomes the task's identity before it runs, for a person's task with no Unix user
on a root worker (posix_spawn cannot change identity). Both open a task's output with
``OUT`` (never through a link) in the pool's directory."""

from __future__ import annotations

import functools
import os
import shlex
import signal

SHELL_CHARS = set("|&;<>()$`\\\"'*?[]#~=%{}\n")
OUT = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
OUT_MODE = 0o600
"""A task's output: the worker's (its pool's user, or root) and the gateway's to read,
written by the task through the descriptor it was given (H4 F9: no other user reads it)."""


@functools.lru_cache(maxsize=4096)
def argv_for(command: str) -> list[str]:
    """A command without shell syntax runs directly (saves a bash per task); else via bash."""
    if not (set(command) & SHELL_CHARS):
        argv = shlex.split(command)
        if argv and "/" not in argv[0]:
            for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
                if os.access(os.path.join(d, argv[0]), os.X_OK):
                    return [os.path.join(d, argv[0]), *argv[1:]]
        elif argv and os.access(argv[0], os.X_OK):
            return argv
    return ["/bin/bash", "-c", command]


@functools.lru_cache(maxsize=4096)
def contained_argv_for(command: str) -> list[str]:
    """``argv_for`` for a task in the sandbox: a program is looked up on PATH inside
    (hidden places are empty there), not at the path argv_for found outside."""
    argv = argv_for(command)
    return argv if argv[:2] == ["/bin/bash", "-c"] else shlex.split(command)


def spawn(argv: list[str], env: dict[str, str], d: str, jid: int) -> int:
    """The task as the worker, in a session of its own; -> its pid. OSError (naming the
    program, even when an output file failed) when it could not start."""
    return os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                          file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                        (os.POSIX_SPAWN_OPEN, 1, f"{d}/{jid}.out", OUT, OUT_MODE),
                                        (os.POSIX_SPAWN_OPEN, 2, f"{d}/{jid}.err", OUT, OUT_MODE)])


def start_as(d: str, jid: int, ident: tuple[int, int], reads: list[str], argv: list[str],
             env: dict[str, str]) -> tuple[int, str | None]:
    """The task as ``ident`` (uid, gid), never the worker's root: -> (its pid, None) once
    it runs its program, or (0, why it could not start). ``reads``: files of corral's it
    gets as fd 3, 4, ... (its script: the pool's directory is closed to it)."""
    uid, gid = ident
    opened: list[int] = []
    try:
        for path, flags in ((f"{d}/{jid}.out", OUT), (f"{d}/{jid}.err", OUT),
                            *((f, os.O_RDONLY | os.O_NOFOLLOW) for f in reads)):
            opened.append(os.open(path, flags, OUT_MODE))
    except OSError as e:  # none of what it opened is kept (a missing script left the outputs open)
        for fd in opened:
            os.close(fd)
        return 0, f"could not open its output in {d}: {e.strerror}"
    out, err, *fds = opened
    for n, f in enumerate(reads):  # corral's own path, also inside a `cd DIR && ...` line
        argv = [a.replace(f, f"/dev/fd/{3 + n}") for a in argv]
    r, w = os.pipe()  # both close on exec: an empty read means the exec happened
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.setsid()
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            for n, fd in enumerate(fds):
                os.dup2(fd, 3 + n)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:
            os.write(w, str(getattr(e, "strerror", None) or e).encode())
        finally:
            os._exit(127)
    for fd in (out, err, *fds):
        os.close(fd)
    os.close(w)
    # Its pid is watched only once it runs the task's program: sampled before that,
    # its memory was this worker's copy (a `true` was killed as OUT_OF_MEMORY at 10 MB).
    with open(r, "rb") as pipe:
        failed = pipe.read().decode(errors="replace")
    if failed:
        os.waitpid(pid, 0)  # it ended: its exec failed, and it wrote why
        return 0, f"could not start {argv[0]} as its identity: {failed}"
    return pid, None
