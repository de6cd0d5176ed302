"""A resident per-session helper for the shims (decision 0008): ``corral agent run``
starts one beside the agent; each shim call is then a Python started without ``site``
that imports nothing but ``_socket`` (``LAUNCHER``), hands the helper its argv, working
directory, environment and its stdin/stdout/stderr (SCM_RIGHTS), and exits with the code
the helper sends back. The helper has imported the shims once and forks a child per
call, which becomes the caller (its directory, environment and file descriptors) and
runs the same code as a shim run on its own: the output is the same, byte for byte.

Without the helper (no $CORRAL_SHIM_SOCKET, or it does not answer) the launcher runs the
shim in-process, as before. The socket lives in the session's private directory (0700)
and the helper serves only its own uid (SO_PEERCRED).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import stat
import struct
import sys
from pathlib import Path

from corral.core import proc

LAUNCHER = r'''#!{python} -IS
# corral's Slurm shim launcher (corral/edges/shims/helper.py): the resident helper runs the
# command; this process imports only _socket. Written by corral agent run.
import os, sys
p = os.environ.get("CORRAL_SHIM_SOCKET")
if p:
    import _socket
    try:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.connect(p)
    except OSError:
        s = None
    if s is not None:
        items = [os.getcwd(), os.path.basename(sys.argv[0]), str(len(sys.argv) - 1), *sys.argv[1:],
                 *(k + "=" + v for k, v in os.environ.items())]
        data = "\0".join(items).encode("utf-8", "surrogateescape")
        fds = b"".join(i.to_bytes(4, sys.byteorder) for i in (0, 1, 2))
        s.sendmsg([len(data).to_bytes(8, "big") + data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        rc = s.recv(1)
        sys.exit(rc[0] if rc else 1)
sys.path.insert(0, {root!r})
from corral.edges.shims import main
main()
'''


def launcher(root: str) -> str:
    """The launcher's text for this Python and this checkout of corral."""
    return LAUNCHER.format(python=os.path.realpath(sys.executable), root=root)


def _c_string(text: str) -> str:
    """``text`` as a C string literal (paths may hold any byte but NUL)."""
    out = []
    for b in os.fsencode(text):
        ch = chr(b)
        out.append(f"\\{b:03o}" if not 32 <= b < 127 or ch in '"\\?' else ch)
    return '"' + "".join(out) + '"'


def _cache_dir() -> Path | None:
    """The user's own cache directory for built launchers, or None if it is not safely
    theirs (a launcher run by every shim call must be writable by its user alone)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = base.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return base


def compiled_launcher(root: str, spare: Path | None = None) -> Path | None:
    """The compiled launcher (launcher.c) for this Python and checkout: built once per
    user and kept in their cache (else in ``spare``, the session's own directory), keyed
    by what went into it; None where no C compiler is found or the build fails (the
    Python launcher serves then, at more CPU a call)."""
    cc = proc.c_compiler()
    if cc is None:
        return None
    source = (Path(__file__).parent / "launcher.c").read_bytes()
    python = os.path.realpath(sys.executable)
    key = hashlib.sha256(b"\0".join([source, os.fsencode(python), os.fsencode(root), os.fsencode(cc),
                                     os.uname().machine.encode()])).hexdigest()[:16]
    cache = _cache_dir() or spare
    if cache is None:
        return None
    built = cache / f"shim-launcher-{key}"
    if built.is_file() and built.stat().st_uid == os.getuid():
        return built
    flags = ["-O2", "-std=c99", "-D_GNU_SOURCE", f"-DCORRAL_PYTHON={_c_string(python)}",
             f"-DCORRAL_ROOT={_c_string(root)}"]
    return built if proc.compile_c(cc, flags, source, built, 60) else None


def install_launcher(target: Path, root: str) -> None:
    """The shims' one launcher at ``target``: the compiled one where it builds (copied:
    the session owns what its PATH runs), else the Python one."""
    built = None if os.environ.get("CORRAL_SHIM_COMPILED") == "0" else compiled_launcher(root, target.parent.parent)
    if built is not None:
        shutil.copyfile(built, target)
    else:
        target.write_text(launcher(root))
    target.chmod(0o755)


STATS = "__corral_stats__"
"""A request for the CPU the helper's children used so far (for bench/shim_cost.py)."""


def _recv_all(conn: socket.socket) -> tuple[bytes, list[int]]:
    head, anc, _, _ = conn.recvmsg(8, socket.CMSG_SPACE(3 * 4))
    fds: list[int] = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - len(data) % 4, 4)]
    need = int.from_bytes(head, "big") if len(head) == 8 else 0
    chunks, got = [], 0
    while got < need:
        chunk = conn.recv(min(1 << 20, need - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), fds


def _serve_one(conn: socket.socket) -> None:
    """In the forked child: become the caller, run its command, send the exit code."""
    data, fds = _recv_all(conn)
    items = data.decode("utf-8", "surrogateescape").split("\0")
    cwd, name, argc = items[0], items[1], int(items[2])
    argv, env = items[3:3 + argc], items[3 + argc:]
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    for kv in env:
        key, eq, value = kv.partition("=")
        if eq:
            os.environ[key] = value
    os.chdir(cwd)
    sys.argv = [name, *argv]
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the caller's, kept open for its owner
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    from corral.edges.shims import dispatch

    try:
        rc = dispatch(name, argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    conn.sendall(bytes([rc & 0xFF]))


def guard(root: str, parent: int) -> None:
    """The helper of an agent session ends with its ``corral agent run``, however that
    ends, and takes the session's directory (its mcp.json holds the token) with it: a
    death signal (SIGTERM when the parent dies, even by SIGKILL), and the directory
    removed as the helper exits (corral/edges/cli/agent_session.py)."""
    import atexit
    import ctypes

    atexit.register(shutil.rmtree, root, True)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the sweep at the next start stays
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exits through atexit, before serve starts too
    if os.getppid() != parent:  # the parent died before the death signal was set
        sys.exit(0)


def warm() -> None:
    """What every call would otherwise do again in its forked child: the shims' imports,
    argparse's parsers (~20 ms a call otherwise), and what the shims import when first used
    (sbatch's look for secrets in the exported environment imports corral.safety.secrets and
    compiles its patterns: ~5 ms of every sbatch's CPU in the child, bench/agent_shell.py)."""
    from corral.edges.shims import acct, control, misc, queue, sbatch, srun  # noqa: F401 imported once, for every call
    from corral.safety import secrets  # noqa: F401 (export._secret_value's, imported when sbatch first runs)

    for build in (sbatch._sbatch_parser, srun._srun_parser, queue._squeue_parser, acct._sacct_parser,
                  misc._scancel_parser, misc._sinfo_parser):
        build()


def serve(path: str) -> None:
    import gc

    warm()
    gc.collect()
    gc.freeze()  # a forked child then does not touch (and copy) the imported objects' pages
    cpu = [0.0]

    def reap(*_: object) -> None:
        while True:
            try:
                pid, _status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            cpu[0] += ru.ru_utime + ru.ru_stime

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    srv.listen(64)
    me = os.getuid()
    while True:
        conn, _ = srv.accept()
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != me:
            conn.close()
            continue
        if conn.recv(len(STATS), socket.MSG_PEEK) == STATS.encode():
            conn.sendall(f"{cpu[0] * 1000:.3f}".encode())
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            gc.disable()  # a child lives for one command
            try:
                srv.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _serve_one(conn)
            except BaseException:  # noqa: BLE001 - the caller gets exit 1, never a hang
                code = 1
                try:
                    conn.sendall(b"\x01")
                except OSError:
                    pass
            os._exit(code)
        conn.close()


def children_cpu_ms(path: str) -> float:
    """CPU (ms) the helper's children have used so far."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(STATS.encode())
        return float(s.recv(64).decode())


if __name__ == "__main__":
    serve(sys.argv[1])
