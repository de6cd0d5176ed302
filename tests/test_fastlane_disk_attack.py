"""The fast lane's outputs on corral's disk, attacked (issue 47 item 8, decision 0044): a
fast-lane task is a job too, and its stdout lands in the pool's directory under corral's
home. The local lane's supervisor stops a job that floods its output under the disk's
reserve; a fast-lane task must not fill corral's disk either."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import Gateway, drop_scratch, free_port
from .test_disk_full import small_disk
from .test_fastlane import people
from .test_sandbox import need_bwrap


def test_a_fast_lane_task_cannot_fill_corrals_disk(tmp_path: Path) -> None:
    need_bwrap()
    with small_disk(tmp_path / "home", "96m") as home:
        gw = Gateway(home, free_port(), cpus=8,
                     extra_env={"CORRAL_FASTLANE_CPUS": "4", "CORRAL_FASTLANE_MEMORY_MB": "4096"})
        gw.start()
        try:
            t = people(gw)
            with gw.http(t["bot"]) as h:
                r = h.post("/v1/jobs", json={"command": "head -c 300000000 /dev/zero; sleep 20", "lane": "fast",
                                             "walltime": "1m"})
                assert r.status_code == 201, r.text
                jid = r.json()["id"]
                end = h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()
            assert end["state"] == "FAILED" and "corral's state" in (end["reason"] or ""), end
            st = os.statvfs(home)
            assert st.f_bavail * st.f_frsize > 32 << 20, ("a fast-lane task's output filled corral's disk", end)
            with gw.http(t["carol"]) as h:
                r = h.post("/v1/jobs", json={"command": "true", "walltime": "1m"})
                assert r.status_code == 201, r.text
        finally:
            gw.kill()
            drop_scratch(home)
