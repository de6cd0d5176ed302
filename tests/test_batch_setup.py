"""What a contained Slurm job's batch script does before its work, kept cheap (issue 50,
"what must hold" 4; bench/batch_overhead.py measures it): the run-time hiding resolves a
path only when it needs to, and the node's scratch check starts without corral's heavy
imports. Each still does what it did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corral.lanes.slurm.script import SCRATCH
from corral.sandbox.profile import HIDE_LATER


def _hidden(path: str, env: dict[str, str] | None = None) -> str:
    script = f'{HIDE_LATER}\ncorral_box=(); corral_hide "$1"; for a in "${{corral_box[@]}}"; do echo "$a"; done'
    r = subprocess.run(["/bin/bash", "-c", script, "hide", path], capture_output=True, text=True, env=env, check=True)
    return r.stdout


def _readlink_hidden(path: str) -> str:
    """What the hiding did before: every path through readlink -f."""
    r = subprocess.run(["readlink", "-f", "--", path], capture_output=True, text=True)
    if r.returncode:
        return ""
    p = Path(r.stdout.rstrip("\n"))
    return f"--tmpfs\n{p}\n" if p.is_dir() else f"--ro-bind\n/dev/null\n{p}\n" if p.exists() else ""


def test_each_form_of_a_hidden_path_is_hidden_where_it_really_lies(tmp_path: Path) -> None:
    """A plain path, one through a link (at its end or on the way), with ., .., //, a
    trailing slash, a file under a file, a path that is not there: as readlink -f put it."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "f").write_text("x")
    (tmp_path / "link").symlink_to(real)
    t = str(tmp_path)
    for p in [f"{t}/real", f"{t}/link", f"{t}/link/sub", f"{t}/real/f", f"{t}/link/f", f"{t}/nope",
              f"{t}/real/f/x", f"{t}/./real", f"{t}/real/../real/sub", f"/{t}/real", f"{t}/real/", f"{t}//real"]:
        assert _hidden(p) == _readlink_hidden(p), p
    assert _hidden(f"{t}/link/sub") == f"--tmpfs\n{real}/sub\n"


def test_a_plain_path_is_hidden_without_a_process_of_its_own(tmp_path: Path) -> None:
    """No readlink on PATH: a path with no link on the way is still hidden (before, each
    path cost a readlink process, and none was hidden without one); one through a link
    still needs it (the shell cannot resolve a link) and is left to readlink."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    bare = {"PATH": "/nonexistent"}
    assert _hidden(str(tmp_path / "secret"), bare) == f"--tmpfs\n{tmp_path}/secret\n"
    assert _hidden(str(tmp_path / "link"), bare) == ""  # readlink not found: as before, left out
    assert _hidden(str(tmp_path / "link")) == f"--tmpfs\n{tmp_path}/secret\n"


def _scratch(root: Path, *subs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", "-c", SCRATCH, str(root), *subs],
                          capture_output=True, text=True, timeout=30)


def test_the_scripts_scratch_step_makes_checks_and_refuses_as_before(tmp_path: Path) -> None:
    """The batch script's scratch step (python -I -S, the module alone): made when gone,
    accepted when its own, refused in words when another user made it first; and it
    imports neither logging nor corral's errors on the way (what cost a job 150-400 ms)."""
    root = Path(f"/var/tmp/corral-setup{os.getpid()}")
    try:
        r = _scratch(root, "workspaces", "uv-cache")
        assert r.returncode == 0, r.stderr
        assert oct(root.stat().st_mode & 0o777) == "0o711" and oct((root / "uv-cache").stat().st_mode & 0o777) == "0o755"
        assert _scratch(root, "workspaces", "uv-cache").returncode == 0
        (root / "workspaces").rmdir()
        mine = "setpriv --reuid=nobody --regid=nogroup --clear-groups".split()
        subprocess.run([*mine, "mkdir", "-m", "777", str(tmp_path / "theirs")], check=False)
        os.chmod(root, 0o777)
        subprocess.run([*mine, "mkdir", str(root / "workspaces")], check=True)
        os.chmod(root, 0o711)
        r = _scratch(root, "workspaces")
        assert r.returncode == 1 and f"node-local scratch {root}/workspaces is owned by nobody" in r.stderr, r.stderr
        probe = SCRATCH.replace("sys.exit(main(sys.argv[1:]))", "print(sorted(m for m in ('logging', 'typing', "
                                "'corral.core.errors') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[]", out.stdout
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_the_last_step_takes_the_jobs_environment_byte_for_byte_without_json_or_re() -> None:
    """seccomp.APPLY reads the job's environment with json's own C scanner (the json
    package imports re, a third of that step's start): every value arrives as it was
    written, trailing data is still refused, and neither json nor re is imported."""
    import json

    from corral.sandbox.seccomp import APPLY

    env = {"A": "x y", "B": 'quote" back\\slash', "C": "ünï\u2603", "D": "", "E": "line\nbreak", "F": "1e5"}
    r, w = os.pipe()
    os.write(w, json.dumps(env).encode())
    os.close(w)
    probe = APPLY.replace("try:\n    os.execvpe", "import sys as s; s.stderr.write(repr([m for m in ('json', 're') if m in "
                          "s.modules])); s.stderr.flush()\ntry:\n    os.execvpe")
    out = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", probe, "-", str(r), "/usr/bin/env", "-0"], pass_fds=[r],
                         capture_output=True, env={"PATH": "/bin"}, timeout=30)
    os.close(r)
    got = dict(x.split("=", 1) for x in out.stdout.decode().split("\0") if x)
    assert out.returncode == 0 and {k: got.get(k) for k in env} == env, out
    assert out.stderr.decode() == "[]"
    r, w = os.pipe()
    os.write(w, b'{"A": "x"} {"B": "y"}')
    os.close(w)
    bad = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", APPLY, "-", str(r), "/usr/bin/true"], pass_fds=[r],
                         capture_output=True, timeout=30)
    os.close(r)
    assert bad.returncode == 1 and b"trailing data" in bad.stderr


def test_the_scratch_line_starts_python_only_when_prepare_has_something_to_do(tmp_path: Path) -> None:
    """Root's batch-script line for scratch: as prepare left it, no Python runs (here: a
    Python that would fail); a sub gone, a sub another user made, a sub others may write,
    a parent others may write (not sticky): Python runs, and makes, refuses, tightens,
    refuses, as prepare does."""
    from corral.lanes.slurm.script import scratch_line

    root = Path(f"/var/tmp/corral-line{os.getpid()}")
    mine = "setpriv --reuid=nobody --regid=nogroup --clear-groups".split()

    def run(top: Path, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", scratch_line(top, ["workspaces", "trees"], python)],
                              capture_output=True, text=True, timeout=30)

    try:
        assert run(root, "/bin/false").returncode == 1  # nothing there: Python's (here one that fails)
        assert run(root).returncode == 0 and (root / "trees").is_dir()
        assert run(root, "/bin/false").returncode == 0  # as prepare left it: Python never started
        (root / "trees").rmdir()
        assert run(root, "/bin/false").returncode == 1 and run(root).returncode == 0 and (root / "trees").is_dir()
        (root / "trees").chmod(0o777)
        assert run(root).returncode == 0 and (root / "trees").stat().st_mode & 0o777 == 0o711
        (root / "trees").rmdir()
        os.chmod(root, 0o777)
        subprocess.run([*mine, "mkdir", str(root / "trees")], check=True)
        os.chmod(root, 0o711)
        r = run(root)
        assert r.returncode == 1 and f"node-local scratch {root}/trees is owned by nobody" in r.stderr, r.stderr
        subprocess.run(["rm", "-rf", str(root)], check=True)
        open_parent = root / "open"
        open_parent.mkdir(parents=True)
        open_parent.chmod(0o777)  # not sticky: anyone could swap what lies in it
        assert run(open_parent / "scratch").returncode == 1
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
