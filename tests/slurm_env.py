"""Finding the private Slurm that scripts/slurm-up starts. Under CI a missing Slurm
fails the run; elsewhere the Slurm tests skip with the command to start one."""

from __future__ import annotations

import os
import subprocess

import pytest

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"


def slurm_conf() -> str:
    ok = False
    if os.path.exists(SLURM_CONF):
        try:
            ok = subprocess.run(["sinfo", "-h"], env={**os.environ, "SLURM_CONF": SLURM_CONF},
                                capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is required under CI and does not answer (SLURM_CONF={SLURM_CONF}); "
                        "make test runs scripts/slurm-up first")
        pytest.skip("no Slurm here: run scripts/slurm-up (as root) to test the Slurm backend")
    return SLURM_CONF
