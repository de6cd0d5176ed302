"""The door to the outside world for the gateway and its tools: ``spawn`` (detached,
long-lived), ``run`` (short, awaited) or ``attach`` (a program in the caller's terminal,
awaited: ``corral agent run``). Tests replace this seam, not the callers; argument lists
only, never a shell built from input. The programs that start jobs outside the gateway
(the local supervisor, a sandbox's host, the fast lane's launcher, the shim helper) fork
or posix_spawn themselves, for what this module does not offer (an identity, passed
descriptors, a process group); docs/architecture.md lists every exception. corral's two
small C programs (the shims' launcher, the job starter) are compiled here too."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from corral.core.errors import BackendError


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: Path | None = None,
    stderr: Path | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start a process in its own session, so that it outlives the gateway (kill -9
    of the gateway or a Ctrl-C in its terminal must not take jobs with it)."""
    out = open(stdout, "ab") if stdout else subprocess.DEVNULL
    err = open(stderr, "ab") if stderr else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    except OSError as e:
        raise BackendError(f"could not start {argv[0]}: {e}", argv=list(argv)) from None
    finally:
        for f in (out, err):
            if hasattr(f, "close"):
                f.close()


def run(
    argv: Sequence[str],
    *,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    inherit_env: bool = True,
    pass_fds: Sequence[int] = (),
) -> subprocess.CompletedProcess[str]:
    """Run a short command and return its output; a failure is a ``BackendError``
    that carries argv, return code and stderr. ``env`` is added to the gateway's
    environment, or is the whole environment with ``inherit_env=False``; ``pass_fds``
    stay open in it (a directory named to it as /proc/self/fd/N, opened without links)."""
    t0 = time.monotonic()
    try:
        cp = subprocess.run(
            list(argv),
            env=({**os.environ, **env} if inherit_env else dict(env)) if env is not None else None,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            pass_fds=tuple(pass_fds),
        )
    except FileNotFoundError:
        raise BackendError(f"{argv[0]} is not installed or not on PATH", argv=list(argv)) from None
    except subprocess.TimeoutExpired:
        raise BackendError(
            f"{argv[0]} did not answer within {timeout:.0f}s", argv=list(argv), hint="the scheduler may be overloaded: retry in a minute"
        ) from None
    if check and cp.returncode != 0:
        raise BackendError(
            f"{argv[0]} failed with exit code {cp.returncode} after {time.monotonic() - t0:.2f}s: {cp.stderr.strip()[:500]}",
            argv=list(argv),
            returncode=cp.returncode,
            stderr=cp.stderr,
        )
    return cp


def die_with_parent() -> None:
    """In a helper process the gateway starts (the risk parser, the egress proxy): it is
    killed when the gateway dies, even by SIGKILL (a parser left behind was seen using CPU
    an hour later), and so is every process it forks, each when its own parent dies (the
    proxy library forks its acceptor: after a gateway's kill -9 that one was left running,
    one more at every crash). PR_SET_PDEATHSIG; exits at once if the parent died before."""
    _die_with_parent()
    os.register_at_fork(after_in_child=_die_with_parent)


def _die_with_parent() -> None:
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(0)


def attach(argv: Sequence[str], *, env: Mapping[str, str]) -> int:
    """Run a program in the caller's terminal and session (an interactive agent such
    as Claude Code needs both) until it exits; its exit code. Ctrl-C and Ctrl-\\ are the
    program's to handle (an agent interrupts its own turn with them), so the caller
    ignores them meanwhile. SIGHUP (a closed terminal) and SIGTERM are passed on to the
    program, and the caller waits for its end: so the caller's own cleanup runs (where
    the default action ended the caller at once, leaving what it had made)."""
    import signal

    try:
        child = subprocess.Popen(list(argv), env=dict(env))
    except OSError as e:
        raise BackendError(f"could not start {argv[0]}: {e}", argv=list(argv)) from None

    def forward(sig: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(sig)

    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
    old.update({s: signal.signal(s, forward) for s in (signal.SIGHUP, signal.SIGTERM)})
    try:
        return child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def c_compiler() -> str | None:
    """The C compiler corral builds its small programs with: ``$CC`` (else ``cc``), else gcc."""
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def compile_c(cc: str, flags: Sequence[str], source: bytes, built: Path, timeout: float) -> bool:
    """``source`` (C, on stdin) built with ``cc flags`` into ``built``, mode 0755, renamed
    into place (atomic: a concurrent builder sees the old file or the new one). -> whether
    it was built; a failed or timed-out build leaves nothing behind."""
    tmp = built.with_name(f".{built.name}.{os.getpid()}")
    try:
        r = subprocess.run([cc, *flags, "-o", str(tmp), "-x", "c", "-"], input=source, capture_output=True,
                           timeout=timeout, check=False)
        if r.returncode != 0:
            return False
        tmp.chmod(0o755)
        os.replace(tmp, built)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        tmp.unlink(missing_ok=True)
