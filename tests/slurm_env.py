"""Finding the private Slurm that scripts/slurm-up starts. Under CI a missing Slurm
fails the run; elsewhere the Slurm tests skip with the command to start one."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"


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


_gone = False
"""Set once Slurm did not answer: the next tests do not wait for it again."""


def slurm_conf() -> str:
    global _gone
    ok = not _gone and os.path.exists(SLURM_CONF) and answers(SLURM_CONF, 60)
    _gone = not ok
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is required under CI and does not answer (SLURM_CONF={SLURM_CONF}); "
                        "make test runs scripts/slurm-up first")
        pytest.skip("no Slurm here: run scripts/slurm-up (as root) to test the Slurm backend")
    return SLURM_CONF
