"""The backend contract and the Slurm backend's own logic over the fake Slurm
(tests/fakeslurm): they run on a laptop with no Slurm. The real-Slurm tests
(test_backend_slurm.py) stay, and fail rather than skip under CI."""

from __future__ import annotations

import os

import pytest

from corral.lanes.slurm.backend import SlurmBackend

from . import fakeslurm
from .backend_contract import *  # noqa: F401,F403
from .test_backend_slurm import (test_partitions_from_the_cluster, test_preflight_names_the_nearest_valid_request,  # noqa: F401
                                 test_provenance_is_in_slurm_accounting, test_resubmit_after_crash_finds_the_job)


@pytest.fixture
def conf(tmp_path, monkeypatch) -> str:
    bin_dir, path = fakeslurm.install(tmp_path / "fake-slurm")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return str(path)


@pytest.fixture
def backend(conf, tmp_path):
    return SlurmBackend(tmp_path / "slurm-jobs", conf, poll_s=0.5)
