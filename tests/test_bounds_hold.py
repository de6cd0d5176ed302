"""Bounds that hold (issue 47, item 8), as attacks on the local lane, with real
bubblewrap, real processes and a real gateway:

- a job cannot fill corral's disk: a contained job without a working directory writes
  until ENOSPC, and another principal's submission and cancel still succeed (2xx), and
  the job ends;
- a job's private /tmp counts as its memory and holds no more than it;
- memory is every process of the job: a detached child in a built sandbox, or of a job
  started by its supervisor, is counted;
- a full disk never rewrites history: jobs that completed while corral's home was full
  are recorded COMPLETED, exit 0, and a supervisor that vanished on a full disk is said
  to have done so, naming the job that holds the most there.
Under CI a missing bwrap or tmpfs mount fails these tests (conftest, test_disk_full)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from corral.core.jobs import JobSpec, JobState
from corral.lanes.local import LocalBackend

from .backend_contract import ctx, wait_all, wait_state
from .conftest import Gateway, drop_scratch, free_port, running
from .test_disk_full import fill, small_disk
from .test_sandbox import need_bwrap, pair

HOLD = "python3 -c 'import time; b = b\"x\" * ({mb} << 20); time.sleep(30)'"
"""A process that holds ``mb`` MB resident (written, so not shared zero pages)."""


def _wait(h: httpx.Client, jid: int, timeout: float = 90) -> dict:
    return h.get(f"/v1/jobs/{jid}/wait", params={"timeout": timeout}).json()


def test_a_job_cannot_fill_corrals_disk(tmp_path: Path) -> None:
    """Issue 47: 3 GB of dd in a job without a working directory filled corral's home;
    every submission answered 507 and the job's cancel too. Now the job writes in its
    private /tmp, bounded: it meets ENOSPC there, and corral's disk is untouched."""
    need_bwrap()
    with small_disk(tmp_path / "home", "64m") as home:
        gw = Gateway(home, free_port())
        gw.start()
        try:
            t = pair(gw)
            with gw.http() as h:
                assert h.post("/v1/principals", json={"name": "bot2", "kind": "agent", "sponsor": "alice"}).status_code == 201
                t["bot2"] = h.post("/v1/tokens", json={"for": "bot2", "expires": "1h"}).json()["token"]
            with gw.http(t["bot1"]) as h:
                r = h.post("/v1/jobs", json={"command": "dd if=/dev/zero of=fill bs=1M count=400; df -m . | tail -1; "
                                                        "sleep 60", "memory": "512M", "walltime": "2m"})
                assert r.status_code == 201, r.text
                hog = r.json()["id"]
                for _ in range(300):
                    if h.get(f"/v1/jobs/{hog}").json()["state"] == "RUNNING":
                        break
                    time.sleep(0.1)
                time.sleep(4)  # dd wrote all it could meanwhile
            st = os.statvfs(home)
            assert st.f_bavail * st.f_frsize > 32 << 20, "the job's writes landed on corral's disk"
            with gw.http(t["bot2"]) as h:  # another principal: submits and cancels
                r = h.post("/v1/jobs", json={"command": "sleep 30", "walltime": "1m"})
                assert r.status_code == 201, r.text
                c = h.post(f"/v1/jobs/{r.json()['id']}/cancel")
                assert c.status_code < 300, c.text
            with gw.http(t["bot1"]) as h:
                c = h.post(f"/v1/jobs/{hog}/cancel")
                assert c.status_code < 300, c.text
                end = _wait(h, hog)
                assert end["state"] in ("CANCELLED", "OUT_OF_MEMORY"), end
        finally:
            gw.kill()
            drop_scratch(home)


def test_a_job_flooding_its_output_gives_corrals_disk_back(tmp_path: Path) -> None:
    """Its output is the one thing a job writes on corral's disk. A job that floods it
    while the disk runs out is stopped (FAILED, saying so) and its output cut, so the
    disk is corral's again: the next submission of another principal is taken (201), not
    answered 507 until the job's directory is collected days later."""
    need_bwrap()
    with small_disk(tmp_path / "home", "64m") as home:
        gw = Gateway(home, free_port())
        gw.start()
        try:
            t = pair(gw)
            with gw.http(t["bot1"]) as h:
                r = h.post("/v1/jobs", json={"command": "head -c 200000000 /dev/zero; sleep 30", "walltime": "1m"})
                assert r.status_code == 201, r.text
                end = _wait(h, r.json()["id"])
            assert end["state"] == "FAILED" and "corral's state" in end["reason"] and "cut" in end["reason"], end
            st = os.statvfs(home)
            assert st.f_bavail * st.f_frsize > 32 << 20, "the job's output still fills corral's disk"
            with gw.http(t["alice"]) as h:
                r = h.post("/v1/jobs", json={"command": "true", "walltime": "1m"})
                assert r.status_code == 201, r.text
        finally:
            gw.kill()
            drop_scratch(home)


def test_a_private_tmp_counts_as_memory(tmp_path: Path) -> None:
    """Issue 47: two jobs limited to 128 MB held 900 MB each in /tmp and COMPLETED. Now
    /tmp holds at most the job's memory, and what it holds is counted as memory."""
    need_bwrap()
    with running(tmp_path) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "dd if=/dev/zero of=/tmp/f bs=1M count=900 2>/dev/null; "
                                                    "du -m /tmp/f; sleep 10", "memory": "128M", "walltime": "1m"})
            assert r.status_code == 201, r.text
            end = _wait(h, r.json()["id"])
        assert end["state"] == "OUT_OF_MEMORY", end
        assert "private /tmp" in end["reason"], end


def test_a_detached_child_in_a_built_sandbox_is_counted(tmp_path: Path) -> None:
    """Issue 47: in a built sandbox (a job with a working directory), a child that left
    the job's tree held 600 MB under a 200 MB limit unseen. It stays in the job's own
    user namespace, where it is counted."""
    need_bwrap()
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    with running(tmp_path) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            cmd = f"(setsid {HOLD.format(mb=600)} &); sleep 20"
            r = h.post("/v1/jobs", json={"command": cmd, "memory": "200M", "walltime": "1m", "workdir": str(work)})
            assert r.status_code == 201, r.text
            end = _wait(h, r.json()["id"])
        assert end["state"] == "OUT_OF_MEMORY", end
        assert [p.name for p in (gw.home / "local" / "sandboxes").glob("*.sock")], "not a built sandbox's job"


def test_memory_held_in_a_memory_file_is_counted(tmp_path: Path) -> None:
    """An attack on the sampling: 300 MB written into a memfd (not mapped) is in no
    process's resident memory (9 MB here), and passed a 128M limit unseen; it is counted
    through the descriptor that holds it, in a built sandbox and under its supervisor."""
    need_bwrap()
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    memfd = ("python3 -c 'import os, time; fd = os.memfd_create(\"x\"); "
             "[os.write(fd, b\"x\" * (1 << 20)) for _ in range(300)]; time.sleep(30)'")
    with running(tmp_path) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": memfd, "memory": "128M", "walltime": "1m", "workdir": str(work)})
            assert r.status_code == 201, r.text
            assert _wait(h, r.json()["id"])["state"] == "OUT_OF_MEMORY"
    b = LocalBackend(tmp_path / "state", cpus=2, memory_mb=4096)
    bid = b.submit(ctx(), JobSpec(command=memfd, memory="128M", workdir=str(tmp_path), walltime="1m"))
    assert wait_all(b, [bid], 60)[bid].state is JobState.OUT_OF_MEMORY


SHM = ("python3 -c 'import ctypes, time; c = ctypes.CDLL(None); c.shmat.restype = ctypes.c_void_p\n"
       "for _ in range(3):\n i = c.shmget(0, 90 << 20, 0o1600); a = c.shmat(i, None, 0)\n"
       " ctypes.memset(a, 1, 90 << 20); c.shmdt(ctypes.c_void_p(a))\ntime.sleep(30)'")
"""270 MB of SysV shared memory, written 90 MB at a time (never over 128M resident) and
detached: in no process's memory."""


def test_memory_held_in_sysv_shared_memory_is_counted(tmp_path: Path) -> None:
    """An attack on the sampling: a SysV segment written and detached lives in the
    sandbox's IPC namespace, held by no process; it is counted as the job's."""
    need_bwrap()
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    with running(tmp_path) as gw:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            ends = []
            for where in ({"workdir": str(work)}, {}):  # a built sandbox, a sandbox of its own
                r = h.post("/v1/jobs", json={"command": SHM, "memory": "128M", "walltime": "1m", **where})
                assert r.status_code == 201, r.text
                ends.append(_wait(h, r.json()["id"]))
    assert [e["state"] for e in ends] == ["OUT_OF_MEMORY"] * 2, ends
    assert all("shared memory" in e["reason"] for e in ends), ends


def test_a_detached_child_of_a_supervised_job_is_counted(tmp_path: Path) -> None:
    """An uncontained job's child that detached (reparented away from the job) is the
    supervisor's still (a subreaper): counted."""
    b = LocalBackend(tmp_path / "state", cpus=2, memory_mb=4096)
    bid = b.submit(ctx(), JobSpec(command=f"(setsid {HOLD.format(mb=300)} &); sleep 20", memory="100M",
                                  workdir=str(tmp_path), walltime="1m"))
    assert wait_all(b, [bid], 60)[bid].state is JobState.OUT_OF_MEMORY


def test_output_written_before_the_disk_filled_is_not_blamed(tmp_path: Path, monkeypatch) -> None:
    """The 21:16 rehearsal's failure of the test below: a job that printed 'ok' before
    another filled the disk, first sampled (late, on a loaded host) after it, was stopped
    as the disk's filler. Only output written on after the disk was seen short is."""
    from corral.lanes import local_runner

    (tmp_path / "stdout").write_text("ok\n")
    (tmp_path / "stderr").write_text("")
    monkeypatch.setattr(local_runner, "room", lambda d, reserve: 1 << 20)  # the disk is short from now on
    launch = {"memory_mb": 1024}
    seen = {"written": 0}
    assert local_runner._over(tmp_path, launch, 1.0, 0.0, seen) is None  # its 3 bytes predate the shortage
    assert local_runner._over(tmp_path, launch, 1.0, 0.0, seen) is None  # and it writes no more
    with (tmp_path / "stdout").open("a") as f:
        f.write("more\n")
    over = local_runner._over(tmp_path, launch, 1.0, 0.0, seen)  # writing on into a short disk: stopped
    assert over is not None and over[0] == "FAILED" and "stopped while writing output" in over[1], over
    flood = {"written": 0}  # a megabyte or more in one sample into a short disk: the filler, at once
    (tmp_path / "stderr").write_bytes(b"x" * (2 << 20))
    assert local_runner._over(tmp_path, launch, 1.0, 0.0, flood) is not None


def test_a_full_disk_never_rewrites_a_jobs_end(tmp_path: Path) -> None:
    """Issue 47: with corral's home full, 7 of 8 jobs that completed with exit 0 were
    recorded FAILED ("the job's supervisor process vanished without a result"). Each
    record's room is taken at submission now: jobs that end on a full disk are
    recorded as they ended."""
    with small_disk(tmp_path / "home", "64m") as home:
        b = LocalBackend(home / "state", cpus=8, memory_mb=8192)
        ids = [b.submit(ctx(), JobSpec(command="echo ok; sleep 3", workdir=str(tmp_path))) for _ in range(8)]
        for bid in ids:
            wait_state(b, bid, JobState.RUNNING)
        deadline = time.monotonic() + 30  # each wrote its output before the disk fills (under load RUNNING comes first)
        while time.monotonic() < deadline and not all(b.output_paths(bid).stdout.read_text() == "ok\n" for bid in ids):
            time.sleep(0.05)
        filler = fill(home)
        try:
            st = wait_all(b, ids, 60)
            assert {s.state for s in st.values()} == {JobState.COMPLETED}, st
            assert {s.exit_code for s in st.values()} == {0}, st
            assert all(b.output_paths(bid).stdout.read_text() == "ok\n" for bid in ids)
        finally:
            filler.unlink()


def test_a_supervisor_lost_on_a_full_disk_is_said_with_the_cause(tmp_path: Path) -> None:
    """When a supervisor vanished anyway on a full disk, its job's reason says the disk
    is full and which running job's directory holds the most there."""
    with small_disk(tmp_path / "home", "64m") as home:
        b = LocalBackend(home / "state", cpus=4, memory_mb=8192)
        a = b.submit(ctx(), JobSpec(command="sleep 30", workdir=str(tmp_path)))
        hog = b.submit(ctx(), JobSpec(command="head -c 20000000 /dev/zero; sleep 30", workdir=str(tmp_path)))
        for bid in (a, hog):
            wait_state(b, bid, JobState.RUNNING)
        time.sleep(1)
        filler = fill(home)
        try:
            os.kill(b._running[a].pid, signal.SIGKILL)  # type: ignore[arg-type]
            wait_state(b, a, JobState.FAILED, 20)
            reason = b.status([a])[a].reason or ""
            assert "is full" in reason and f"job {hog}" in reason, reason
        finally:
            filler.unlink()
            b.cancel([hog])


@pytest.mark.usefixtures("slurm_turn")
def test_a_contained_batch_job_works_in_its_bounded_tmp_on_slurm(tmp_path: Path) -> None:
    """The Slurm lane's contained work shares the sandbox's builder: without a working
    directory it works in its private /tmp, sized at most its memory, and nothing it
    writes lands in its directory on corral's disk (d/out/work stays empty)."""
    from .slurm_env import slurm_conf
    from .test_gateway_slurm import start_slurm_gateway

    need_bwrap()
    gw = start_slurm_gateway(tmp_path, slurm_conf())
    try:
        t = pair(gw)
        with gw.http(t["bot1"]) as h:
            r = h.post("/v1/jobs", json={"command": "pwd; df -m --output=size /tmp | tail -1; "
                                                    "dd if=/dev/zero of=fill bs=1M count=300 2>&1 | tail -1",
                                         "memory": "128M", "walltime": "2m"})
            assert r.status_code == 201, r.text
            end = _wait(h, r.json()["id"], 120)
            out = h.get(f"/v1/jobs/{end['id']}/output").json()["data"].split("\n")
        assert out[0] == "/tmp/corral-job", (end, out)
        assert int(out[1]) <= 128, out
        assert "No space left" in out[2] or "128" in out[2], out
        works = list((gw.home / "slurm").rglob("out/work"))
        assert works and all(not any(w.iterdir()) for w in works), works
    finally:
        gw.kill(signal.SIGTERM)
