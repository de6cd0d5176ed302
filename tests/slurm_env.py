"""Finding the private Slurm that scripts/slurm-up starts. Under CI a missing Slurm
fails the run; elsewhere the Slurm tests skip with the command to start one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
"""The first private Slurm: every real-Slurm test's unless its file is in SECOND_FILES."""
SECOND_CONF = os.environ.get("CORRAL_TEST_SLURM2") or "/tmp/corral-slurm2/etc/slurm.conf"
"""A second private Slurm (make test starts it: scripts/slurm-up --second), so that two
chains of real-Slurm tests run at once, each taking its turns on its own instance
(docs/decisions/0031). Where it is not there, its files' tests use the first."""
SECOND_FILES = {f"tests/{name}.py" for name in (
    "test_compat", "test_backend_slurm", "test_privsep_slurm", "test_privsep_submit", "test_cluster_workspaces",
    "test_preemption_slurm", "test_slurm_control")}
"""The test files on the second instance: about half of the real-Slurm tests' time
(docs/benchmarks.md, the suite), none of those that stop a controller or a node."""


def conf_of(path: str) -> str:
    """The private Slurm the tests of this file (a path from the repository's root) use."""
    return SECOND_CONF if path in SECOND_FILES and os.path.exists(SECOND_CONF) else SLURM_CONF


_current = SLURM_CONF
"""The instance of the test being run (a worker runs one test at a time: use())."""


def use(conf: str) -> None:
    """The test about to run uses this instance: slurm_conf() answers it, and so does
    SLURM_CONF in this process's environment (which its subprocesses inherit)."""
    global _current
    _current = conf
    os.environ["SLURM_CONF"] = conf


def current() -> str:
    return _current


def answers(conf: str, within: float) -> bool:
    """Whether slurmctld answers within this many seconds: a controller a test just
    restarted takes up to ~30 s to take requests again."""
    deadline = time.monotonic() + within
    while True:
        try:
            if subprocess.run(["sinfo", "-h"], env={**os.environ, "SLURM_CONF": conf},
                              capture_output=True, timeout=20).returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


_gone: set[str] = set()
"""The instances that did not answer once: the next tests do not wait for them again."""


def slurm_conf() -> str:
    """The current test's private Slurm, once it answers."""
    conf = _current
    ok = conf not in _gone and os.path.exists(conf) and answers(conf, 60)
    if not ok:
        _gone.add(conf)
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is required under CI and does not answer (SLURM_CONF={conf}); "
                        "make test runs scripts/slurm-up first")
        pytest.skip("no Slurm here: run scripts/slurm-up (as root) to test the Slurm backend")
    return conf


# ---- the private Slurm's layout (scripts/slurm-up; docs/decisions/0032-private-cluster.md)

def slurm_dir(conf: str) -> Path:
    """The instance's directory: its slurm.conf lies in DIR/etc."""
    return Path(conf).resolve().parent.parent


def layout(conf: str) -> dict[str, str]:
    """The settings slurm-up made this instance with (DIR/etc/layout): LAYOUT is 'cluster'
    (nodes c1..c4 and controllers ctl1, ctl2 in namespaces of their own) or 'single' (one
    node `localhost`, the layout of an instance made before the cluster)."""
    out = {"LAYOUT": "single", "NS": "corral"}
    try:
        text = (slurm_dir(conf) / "etc" / "layout").read_text()
    except FileNotFoundError:
        return out
    for key, value in re.findall(r"CORRAL_SLURM_(\w+):=([^}]*)\}", text):
        out[key] = value
    return out


def turn_lock(conf: str) -> str:
    """The file whose lock gives one real-Slurm test at a time on this instance (the
    default instance's path is the one every checkout used before)."""
    if Path(conf).resolve() == Path("/tmp/corral-slurm/etc/slurm.conf"):
        return "/tmp/corral-slurm-tests.lock"
    return str(slurm_dir(conf) / "tests.lock")


def controller_pidfile(conf: str) -> Path:
    """Where the primary slurmctld's pid is: slurm-up's own record in the cluster layout
    (Slurm's SlurmctldPidFile there lies in each controller's private mount)."""
    if layout(conf)["LAYOUT"] == "cluster":
        return slurm_dir(conf) / "run" / "ctl1.pid"
    for line in Path(conf).read_text().splitlines():
        if line.startswith("SlurmctldPidFile="):
            return Path(line.split("=", 1)[1])
    raise AssertionError("no SlurmctldPidFile in slurm.conf")


def restore(conf: str) -> None:
    """Start again whatever a test stopped (a controller, a node): slurm-up is idempotent,
    and in the cluster layout it alone knows how to start a daemon on a host of its own."""
    if layout(conf)["LAYOUT"] == "cluster":
        script = Path(__file__).resolve().parent.parent / "scripts" / "slurm-up"
        cp = subprocess.run([str(script)], env={**os.environ, "CORRAL_SLURM_DIR": str(slurm_dir(conf))},
                            capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, cp.stderr[-3000:]
    else:
        subprocess.run(["slurmctld", "-f", conf], env={**os.environ, "SLURM_CONF": conf}, check=True)
    assert answers(conf, 90), "slurmctld did not come back"


def kill_host(conf: str, host: str) -> list[int]:
    """A host of the private cluster dies: every process in its network namespace gets
    SIGKILL at once (its slurmd or slurmctld, and on a node the jobs' slurmstepd and
    tasks), as if it lost power. -> the pids killed."""
    ns = f"{layout(conf)['NS']}-{host}"
    pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                           check=True).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def stop_controllers(conf: str) -> list[int]:
    """Slurm's controller away: SIGTERM to slurmctld, and in the cluster layout to its
    backup too (else the backup takes over: tests/test_cluster_slurm.py). -> the pids,
    to wait for (`conftest.ended`) and `restore` after."""
    files = [controller_pidfile(conf)]
    if layout(conf)["LAYOUT"] == "cluster":
        files.append(slurm_dir(conf) / "run" / "ctl2.pid")
    pids = [int(f.read_text()) for f in files]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    return pids


def start_requeued_now(conf: str, backend_id: str) -> None:
    """Let a requeued job start now rather than at the BeginTime Slurm gives it (~2 min on
    22.05, its credentials' lifetime). Not within the second its last run was killed in:
    slurmd refuses a launch whose credential is as old, to the second, as the revocation of
    the run before ("Killing non-startable batch JobId=...: Job credential revoked"; the job
    then ends FAILED 1:0), which a loaded rehearsal hit (tests/test_preemption_slurm.py)."""
    ended = time.time()
    while time.time() < int(ended) + 2:  # a wait for the clock itself: nothing else to ask
        time.sleep(0.1)
    subprocess.run(["scontrol", "update", f"JobId={backend_id}", "StartTime=now"], env={**os.environ, "SLURM_CONF": conf},
                   capture_output=True, text=True, check=True, timeout=30)
