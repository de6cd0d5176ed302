"""corral's compiled job starter (corral/sandbox/jobstart.c, starter.py) against the
Python steps it replaces (seccomp.APPLY, opendir.py): run for real, both ways, side by
side: the same system calls refused with the same errors, the same environment byte for
byte, the same working directory opened or refused in the same words. Needs a C compiler
(scripts/sandbox-up installs gcc); under CI its absence fails the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox import opendir, seccomp, starter

PYTHON = "/usr/bin/python3"

PROBE = r"""
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *a):
    r = libc.syscall(nr, *[ctypes.c_long(x) for x in a])
    return 0 if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
def sock(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return 0
    except OSError as e:
        return errno.errorcode.get(e.errno, e.errno)
NR = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435, "setns": 308,
      "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323, "unshare": 272}
out = {name: call(nr, 0, 0, 0, 0, 0) for name, nr in NR.items() if name not in ("unshare",)}
out["unshare(NEWUSER)"] = call(NR["unshare"], 0x10000000)
out["unshare(NEWNS)"] = call(NR["unshare"], 0x00020000)
out["socket(AF_UNIX)"] = sock(socket.AF_UNIX)
out["socket(AF_VSOCK)"] = sock(40)
out["socket(AF_INET)"] = sock(socket.AF_INET)
out["socketpair"] = (lambda p: [s.close() for s in p] and 0)(socket.socketpair())
out["seccomp"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]
out["fds"] = sorted(int(f) for f in os.listdir("/proc/self/fd"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def built() -> str:
    got = starter.compiled()
    if got is None:
        if os.environ.get("CI") == "true":
            pytest.fail("a C compiler is required under CI; scripts/sandbox-up installs gcc")
        pytest.skip("no C compiler here: run scripts/sandbox-up (as root)")
    return got


def both(built: str, hexprog: str | None, env_fd: int | None, argv: list[str],
         **kw: Any) -> list[subprocess.CompletedProcess]:
    """``argv`` under the Python step and under the compiled one, the compiled one run as
    the batch script runs it (through a descriptor of its own, ``/dev/fd/N``)."""
    out = []
    for way in ("python", "compiled"):
        fd = os.open(built, os.O_RDONLY)
        try:
            prefix = seccomp.apply_argv(PYTHON, hexprog, env_fd, f"/dev/fd/{fd}" if way == "compiled" else None)
            fds = [fd] if way == "compiled" else []
            if env_fd is not None:
                os.lseek(env_fd, 0, os.SEEK_SET)
                fds.append(env_fd)
            out.append(subprocess.run([*prefix, *argv], capture_output=True, text=True, pass_fds=fds, timeout=60,
                                      **kw))
        finally:
            os.close(fd)
    return out


def test_the_starter_refuses_the_system_calls_the_python_step_refuses(built: str) -> None:
    """The filter the gateway made (libseccomp's BPF, as hex) loaded by each: every call
    the filter names answers the same errno, the rest still work, and nothing of the
    starter's own is left open in the job."""
    for unix in (False, True):
        prog = seccomp.program(unix)
        py, c = both(built, prog, None, [PYTHON, "-I", "-c", PROBE])
        assert py.returncode == c.returncode == 0, (py.stderr, c.stderr)
        got_py, got_c = json.loads(py.stdout), json.loads(c.stdout)
        assert got_c == got_py, (got_c, got_py)
        assert got_c["socket(AF_UNIX)"] == (0 if unix else "EPERM") and got_c["unshare(NEWUSER)"] == "EPERM"
        assert got_c["clone3"] == "ENOSYS" and got_c["socket(AF_INET)"] == 0 and got_c["seccomp"] == "2"
        assert got_c["fds"] == [0, 1, 2, 3], got_c  # 3: the listing's own
    py, c = both(built, None, None, [PYTHON, "-I", "-c", PROBE])  # no filter
    assert json.loads(c.stdout)["seccomp"] == json.loads(py.stdout)["seccomp"] == "0"


def test_the_starter_gives_the_job_the_environment_the_python_step_gives(built: str, tmp_path: Path) -> None:
    """The job's environment (env.json, as the lane writes it) over the inherited one,
    byte for byte, the job found on the job's own PATH; bad environments refused by both
    before anything runs."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "dumpenv").write_text("#!/bin/sh\nexec env -0\n")
    (bin_ / "dumpenv").chmod(0o755)
    job = {"PATH": f"{bin_}:/usr/bin:/bin", "MSG": "it's \"quoted\"\n\ttabbed \\ back/slash", "EQ": "a=b=c",
           "UNI": "caf\u00e9 \u2603 \U0001f600", "EMPTY": "", "KEEP": "overridden", "CTRL": "\x01\x1f\x7f"}
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps(job))
    inherited = {"PATH": "/usr/bin:/bin", "KEEP": "inherited", "ONLY_OURS": "x", "LC_ALL": "C.UTF-8"}
    fd = os.open(env_file, os.O_RDONLY)
    try:
        py, c = both(built, None, fd, ["dumpenv"], env=inherited)
    finally:
        os.close(fd)
    assert py.returncode == c.returncode == 0, (py.stderr, c.stderr)
    got = dict(x.split("=", 1) for x in c.stdout.split("\0") if x)
    assert sorted(c.stdout.split("\0")) == sorted(py.stdout.split("\0"))
    assert {k: got[k] for k in job} == job and got["ONLY_OURS"] == "x"
    for bad in ('{"A": "1"} x', '{"A": 1}', '["A"]', '{"A": "1",}', '{"A=B": "1"}', '{"A": "\\u0000"}',
                '{"A": "\\ud800"}', '{"A": "1"', ""):
        env_file.write_text(bad)
        fd = os.open(env_file, os.O_RDONLY)
        try:
            py, c = both(built, None, fd, ["echo", "RAN"], env=inherited)
        finally:
            os.close(fd)
        assert py.returncode != 0 and c.returncode != 0 and "RAN" not in py.stdout + c.stdout, (bad, py, c)
        assert "corral:" in c.stderr, (bad, c.stderr)


def opened_both(built: str, path: str, who: opendir.Who | None) -> list[subprocess.CompletedProcess]:
    out = []
    for way in ("python", "compiled"):
        fd = os.open(built, os.O_RDONLY)
        try:
            prefix = opendir.command(7, path, who, f"/dev/fd/{fd}" if way == "compiled" else None)
            out.append(subprocess.run([*prefix, "readlink", "/proc/self/fd/7"], capture_output=True, text=True,
                                      pass_fds=[fd], timeout=60))
        finally:
            os.close(fd)
    return out


def test_the_starter_opens_the_working_directory_as_the_python_step_does(built: str, tmp_path: Path) -> None:
    """Opened at the descriptor the sandbox binds; a link swapped in, or a parent closed
    to the job's identity, refused by both in the same words (exit 125)."""
    import tempfile

    # reachable by nobody (pytest's own directories are 0700): only the walk's checks decide
    top = Path(os.path.realpath(tempfile.mkdtemp(prefix="corral-jobstart-", dir="/var/tmp")))
    try:
        top.chmod(0o755)
        (top / "open" / "work").mkdir(parents=True)
        (top / "real").mkdir()
        (top / "link").symlink_to(top / "real")
        (top / "closed").mkdir(mode=0o700)
        (top / "closed" / "work").mkdir()
        py, c = opened_both(built, str(top / "open" / "work"), None)
        assert py.returncode == c.returncode == 0 and c.stdout == py.stdout == f"{top}/open/work\n", (py, c)
        py, c = opened_both(built, str(top / "link"), None)
        assert py.returncode == c.returncode == 125 and c.stderr == py.stderr and "following a link" in c.stderr
        if os.geteuid() == 0:  # as the job's identity: the kernel's own checks decide
            nobody = (65534, 65534, [65534])
            py, c = opened_both(built, str(top / "open" / "work"), nobody)
            assert py.returncode == c.returncode == 0 and c.stdout == py.stdout, (py, c)
            py, c = opened_both(built, str(top / "closed" / "work"), nobody)
            assert py.returncode == c.returncode == 125 and c.stderr == py.stderr and "not reachable" in c.stderr
            py, c = opened_both(built, str(top / "link"), nobody)
            assert py.returncode == c.returncode == 125 and c.stderr == py.stderr and "following a link" in c.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_where_no_compiler_is_found_the_python_steps_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback (decision 0013's precedent): no compiler, or the starter turned off,
    and the batch script's steps are the Python ones; with it, the compiled one."""
    from corral.lanes.slurm.script import STARTER_FD, starter_line

    empty = tmp_path / "nothing"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CC", "cc-that-is-not-here")
    assert starter._build(tmp_path / "libexec") is None
    assert not (tmp_path / "libexec").exists() or not any((tmp_path / "libexec").iterdir())
    monkeypatch.setenv("CORRAL_JOBSTART_COMPILED", "0")
    lines: list[str] = []
    assert starter.compiled() is None and starter_line(lines) is None and lines == []
    monkeypatch.delenv("CORRAL_JOBSTART_COMPILED")
    monkeypatch.setenv("PATH", os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/bin:/bin")
    monkeypatch.delenv("CC")
    if starter.compiled() is not None:
        assert starter_line(lines) == f"/dev/fd/{STARTER_FD}" and "jobstart-" in lines[0]


def test_a_starter_in_a_place_others_may_write_is_not_used(tmp_path: Path) -> None:
    """Root execs it: a directory that anyone may write (not sticky) is refused, and the
    Python steps run."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    import tempfile

    top = Path(os.path.realpath(tempfile.mkdtemp(prefix="corral-jobstart-", dir="/var/tmp")))
    try:
        top.chmod(0o755)
        (top / "anyone").mkdir()
        (top / "anyone").chmod(0o777)
        assert starter._build(top / "anyone" / "libexec") is None
        got = starter._build(top / "ours" / "libexec")
        assert got is not None and Path(got).stat().st_mode & 0o777 == 0o755
        (top / "ours").chmod(0o775)  # group-writable since it was built: no longer trusted
        starter._build.cache_clear()
        assert starter._build(top / "ours" / "libexec") is None
    finally:
        starter._build.cache_clear()
        shutil.rmtree(top, ignore_errors=True)
