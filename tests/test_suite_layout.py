"""The suite's own layout: every test that takes a turn on the private Slurm runs on the
one worker the real-Slurm tests share (tests/conftest.py: pytest_xdist_make_scheduler),
so that none waits idle on the lock while the other worker's Slurm test runs."""

from __future__ import annotations

import pytest

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
