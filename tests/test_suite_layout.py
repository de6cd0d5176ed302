"""The suite's own layout: every test that takes a turn on a private Slurm runs on the
one worker its instance's tests share (tests/conftest.py: pytest_xdist_make_scheduler),
so that none waits idle on the lock while another worker's Slurm test runs."""

from __future__ import annotations

import os

import pytest

from . import slurm_env
from .conftest import SLURM_FILES, SLURM_TESTS


def test_every_slurm_turn_is_on_the_slurm_worker(request: pytest.FixtureRequest) -> None:
    taking = []
    for item in request.session.items:
        marker = item.get_closest_marker("slurm_turn")
        how = marker.args[0] if marker and marker.args else "alone"
        if "slurm_turn" in getattr(item, "fixturenames", ()) and how != "none":
            taking.append(item.nodeid)
    if len(taking) < 20:
        pytest.skip("run with the whole suite: this session collected only part of it")
    stray = [n for n in taking if n.split("::")[0] not in SLURM_FILES and n.split("[")[0] not in SLURM_TESTS]
    assert stray == [], f"add these to tests/conftest.py's SLURM_FILES or SLURM_TESTS: {stray}"


def test_the_second_instances_files_are_a_chain_of_their_own() -> None:
    """A file on the second instance is one of the Slurm files (else its tests would spread
    over the workers and wait on each other's turns); under CI the instance is there (make
    test starts it), so its files' tests do not fall back to the first."""
    assert slurm_env.SECOND_FILES <= SLURM_FILES, slurm_env.SECOND_FILES - SLURM_FILES
    if os.environ.get("CI") == "true":
        assert os.path.exists(slurm_env.SECOND_CONF), "make test starts it: scripts/slurm-up --second"
        assert slurm_env.conf_of("tests/test_compat.py") == slurm_env.SECOND_CONF
