"""A full disk is a clean refusal (issue 39): a gateway whose state lives on an 8 MB
tmpfs is filled up; requests answer 507 saying what is full and what to do, nothing of a
refused request is recorded, and once space is freed everything works and the audit
chain verifies. A torn final audit record is cut off at start (and the cut recorded),
while an edit inside the chain is still found."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import Gateway, drop_scratch, free_port
from tests.test_submit_faults import allowed


@contextlib.contextmanager
def small_disk(where: Path, size: str = "8m") -> Iterator[Path]:
    where.mkdir(parents=True)
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs (run as root): {cp.stderr}")
        pytest.skip(f"cannot mount a tmpfs (run as root): {cp.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: no remainder for close() to fail on
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
    return filler


def test_a_full_disk_is_refused_507_and_nothing_is_half_recorded(tmp_path: Path) -> None:
    with small_disk(tmp_path / "home") as home:
        gw = Gateway(home, free_port())
        gw.start()
        try:
            with gw.http() as h:
                assert h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}).status_code == 201
                h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "admin"})
                filler = fill(home)
                made, minted, statuses = 1, 0, []
                for i in range(40):
                    r = h.post("/v1/jobs", json={"command": f"echo {i} " + "x" * 3000, "walltime": "1m"})
                    statuses.append(r.status_code)
                    made += r.status_code == 201
                    t = h.post("/v1/tokens", json={"for": "bot", "note": "n" * 3000})
                    statuses.append(t.status_code)
                    minted += t.status_code == 201
                    if r.status_code == 507:
                        body = r.json()["error"]
                        assert body["code"] == "storage_full", body
                        assert "disk is full" in body["message"] and str(home) in body["message"], body
                        assert "free space" in body["hint"], body
                assert 507 in statuses and 500 not in statuses, statuses
                assert h.get("/healthz").status_code == 200
                filler.unlink()
                jobs = h.get("/v1/jobs", params={"full": True, "limit": 1000}).json()["jobs"]
                assert len(jobs) == made, (len(jobs), made, statuses)  # no job of a refused request
                on_record = allowed(home)
                assert all((j["id"], j["submit_time"]) in on_record for j in jobs)
                tokens = [t for t in h.get("/v1/tokens").json() if t["principal"] == "bot"]
                assert len(tokens) == minted, (tokens, minted)
                assert h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}).status_code == 201
            cp = gw.cli("audit", "verify")
            assert cp.returncode == 0, cp.stderr
        finally:
            gw.kill()
            drop_scratch(home)


def test_a_torn_final_record_is_cut_at_start_and_an_edit_is_still_found(tmp_path: Path) -> None:
    gw = Gateway(tmp_path / "home", free_port())
    gw.home.mkdir()
    gw.start()
    try:
        with gw.http() as h:
            for _ in range(3):
                assert h.post("/v1/jobs", json={"command": "true", "walltime": "1m"}).status_code == 201
        gw.kill()
        log = gw.home / "audit.jsonl"
        whole = log.read_bytes()
        with open(log, "ab") as f:  # a crash in the middle of a write
            f.write(b"a3f9 {\"seq\": 99, \"action\": \"sub")
        gw.start()
        assert log.read_bytes().startswith(whole)
        records = [json.loads(line.partition(" ")[2]) for line in log.read_text().splitlines()]
        repair = records[-1]
        assert repair["action"] == "audit_repair" and repair["torn_bytes"] == 31, repair
        cp = gw.cli("audit", "verify")
        assert cp.returncode == 0, cp.stderr
        gw.kill()
        lines = log.read_text().splitlines(keepends=True)
        lines[1] = lines[1].replace('"cpus":1', '"cpus":64')
        log.write_text("".join(lines))
        cp = gw.cli("audit", "verify")
        assert cp.returncode == 1 and "record 2 was edited" in cp.stderr, cp.stderr
    finally:
        gw.kill()
        drop_scratch(gw.home)
