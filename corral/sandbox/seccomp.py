"""The sandbox's system-call filter: what namespaces do not cover.

A network namespace hides the host's network and its abstract Unix sockets, but not
the Unix sockets that lie in the filesystem (a read-only bind still lets a job
``connect`` to one), nor AF_VSOCK, io_uring's back door around such filters, or a
new user namespace in which a job would hold every capability again. As Anthropic's
sandbox-runtime and Codex do, every contained job runs under a seccomp filter:

- ``socket(AF_UNIX)``: EPERM (the job cannot open a Unix socket at all: no host
  socket by path, no abstract one; ``socketpair`` stays, for pipes between its own
  processes); the egress bridge is started before the filter, so it keeps its one;
- ``socket(AF_VSOCK)``: EPERM; io_uring's three calls: ENOSYS (programs fall back);
- ``unshare``/``clone`` with ``CLONE_NEWUSER``: EPERM; ``clone3``: ENOSYS (libc falls
  back to ``clone``, whose flags the filter can read); ``setns``: EPERM;
- the kernel keyring (shared by every process of a uid), ``bpf``, ``userfaultfd``:
  EPERM; a system call of another ABI (i386, x32): the process is killed.

The BPF program is generated once per gateway by libseccomp (Debian's libseccomp2,
through the ``pyseccomp`` bindings), never written by hand, and travels as hex. It is
installed by ``APPLY`` (a per-job sandbox: the last program before the job's) or by a
built sandbox's host in each job's child (corral/sandbox/host.py), after the process
limit's own user namespace is made, so that the filter binds the job and not corral's
own setup.
"""

from __future__ import annotations

import errno
import functools
import socket
import tempfile

CLONE_NEWUSER = 0x10000000
AF_VSOCK = 40

APPLY = r"""import ctypes, os, sys
b = sys.argv[1] != "-" and bytes.fromhex(sys.argv[1])
env = dict(os.environ)
if sys.argv[2] != "-":
    fd = int(sys.argv[2])
    with os.fdopen(fd, "rb") as f:
        text = f.read(1 << 22).decode()
    try:  # json's own C scanner: the json package imports re, a third of this step's start
        from _json import make_scanner
        class J:
            strict, object_hook, object_pairs_hook, memo = True, None, None, {}
            parse_float, parse_int, parse_constant = float, int, None
        got, end = make_scanner(J)(text, 0)
        if text[end:].strip():
            raise ValueError("trailing data")
    except ImportError:
        import json
        got = json.loads(text)
    env.update(got)
if b:
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(b, len(b))
    prog = P(len(b) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        sys.stderr.write("corral: the sandbox's system-call filter could not be installed (errno %d)\n" % ctypes.get_errno())
        os._exit(126)
try:
    os.execvpe(sys.argv[3], sys.argv[3:], env)
except OSError as e:
    sys.stderr.write("corral: could not start %s: %s\n" % (sys.argv[3], e.strerror))
    os._exit(127)
"""
"""``python3 -I -S -c APPLY HEX ENVFD ARGV...``: the last step before a contained job.
Installs the filter (HEX ``-``: none), takes the job's own environment from descriptor
ENVFD (JSON; ``-``: none) over the one it was started with, then execs ARGV (stdlib
only). The job's environment is applied here and nowhere before: every step ahead of
it (bwrap run by root, setpriv, unshare, prlimit, the egress bridge) runs with corral's
environment, so a job's PATH, LD_PRELOAD or BASH_ENV reaches only the job itself, and
only after the filter is in place (issue 32's review, F1 and F16)."""


@functools.lru_cache(maxsize=2)
def program(unix_sockets: bool = False) -> str:
    """The filter as hex BPF. ``unix_sockets``: the admin allowed jobs Unix sockets
    ([sandbox] unix_sockets) and their filesystem's hiding is the only fence left."""
    import pyseccomp as s  # type: ignore[import-untyped]

    f = s.SyscallFilter(s.ALLOW)
    eperm, enosys = s.ERRNO(errno.EPERM), s.ERRNO(errno.ENOSYS)
    if not unix_sockets:
        f.add_rule(eperm, "socket", s.Arg(0, s.EQ, socket.AF_UNIX))
    f.add_rule(eperm, "socket", s.Arg(0, s.EQ, AF_VSOCK))
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3"):
        f.add_rule(enosys, call)
    f.add_rule(eperm, "unshare", s.Arg(0, s.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    f.add_rule(eperm, "clone", s.Arg(0, s.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    for call in ("setns", "keyctl", "add_key", "request_key", "bpf", "userfaultfd"):
        f.add_rule(eperm, call)
    with tempfile.TemporaryFile() as t:
        f.export_bpf(t)
        t.seek(0)
        return t.read().hex()


def apply_argv(python: str, hex_program: str | None, env_fd: int | None = None,
               starter: str | None = None) -> list[str]:
    """The argv prefix that runs what follows under the filter (None: no filter), with
    the environment read from ``env_fd`` (None: the one it inherits); ``starter``: by
    corral's compiled starter (corral/sandbox/starter.py), the same filter and steps, no
    Python started (None: by ``python``)."""
    tail = [hex_program or "-", "-" if env_fd is None else str(env_fd)]
    return [starter, "apply", *tail] if starter else [python, "-I", "-S", "-c", APPLY, *tail]
