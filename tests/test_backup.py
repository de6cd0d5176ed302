"""`corral backup` and `corral restore` (issue 48 item 8): a Slurm gateway backed up
while it serves, restored onto a fresh home, its audit chain verified, and the jobs still
in Slurm reconciled by the restored gateway (one ended in Slurm while no gateway ran, one
still running and cancelled through it). Restoring over a live home, over a home that holds
a gateway's state, or from a newer schema is refused: exit 2, a JSON error under --json."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.core.store import MIGRATIONS

from .conftest import Gateway, free_port
from .slurm_env import slurm_conf

CORRAL = [sys.executable, "-m", "corral.entry"]


def _corral(gw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    """``corral --json ARGS`` as the admin runs it on the gateway's host, a process of its own."""
    return subprocess.run([*CORRAL, "--json", *args], env=gw.env(), capture_output=True, text=True, timeout=300)


def _refused(cp: subprocess.CompletedProcess[str], words: str) -> None:
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert words in json.loads(cp.stdout)["error"]["message"], cp.stdout
    assert "Traceback" not in cp.stderr


@pytest.mark.usefixtures("slurm_turn")
def test_a_backup_restored_on_a_fresh_home_verifies_and_reconciles_slurm(tmp_path: Path) -> None:
    conf = slurm_conf()
    # [slurm] jobs_dir on the filesystem the nodes share, outside the home (docs/deploy.md)
    env = {"CORRAL_BACKEND": "slurm", "SLURM_CONF": conf, "CORRAL_TICK_S": "0.5",
           "CORRAL_SLURM__JOBS_DIR": str(tmp_path / "shared" / "jobs")}
    old = Gateway(tmp_path / "old" / "home", free_port(), extra_env=env)
    old.home.mkdir(parents=True)
    old.start()
    backup = tmp_path / "backup"
    try:
        with old.http() as h:
            ids = [h.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(tmp_path)}).json()["id"]
                   for _ in range(2)]
            for j in ids:
                assert h.get(f"/v1/jobs/{j}/wait", params={"timeout": 120, "until": "RUNNING"}).json()["state"] == "RUNNING"
            in_slurm = [h.get(f"/v1/jobs/{j}").json()["backend_id"] for j in ids]
        made = _corral(old, "backup", str(backup))  # online: the gateway is serving
        assert made.returncode == 0, made.stderr
        manifest = json.loads(made.stdout)
        assert manifest["store"] == "sqlite" and manifest["schema"] == len(MIGRATIONS)
        assert manifest["audit_head"][0] >= 2 and oct(backup.stat().st_mode & 0o777) == "0o700"
        assert {"audit.key", "token.key", "admin.token", "corral.db", "audit/audit.jsonl"} <= set(manifest["files"])
    finally:
        old.kill(signal.SIGTERM)
    # While no gateway runs, the first job ends in Slurm.
    subprocess.run(["scancel", in_slurm[0]], env={**os.environ, "SLURM_CONF": conf}, check=True, timeout=60)

    new = Gateway(tmp_path / "new" / "home", free_port(), extra_env=env)
    _refused(_corral(new, "restore", str(backup), "--home", str(old.home)), "already holds a gateway's state")
    done = _corral(new, "restore", str(backup), "--home", str(new.home))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["audit_records"] >= manifest["audit_head"][0]
    verified = _corral(new, "audit", "verify", "--home", str(new.home))
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
    new.start()
    try:
        _refused(_corral(new, "restore", str(backup), "--home", str(new.home)), "a gateway is running on")
        with new.http() as h:  # the old admin's token, restored with its key
            gone = h.get(f"/v1/jobs/{ids[0]}/wait", params={"timeout": 120}).json()
            assert gone["state"] == "CANCELLED", gone  # reconciled from what Slurm says now
            assert h.get(f"/v1/jobs/{ids[1]}").json()["state"] == "RUNNING"
            assert h.post(f"/v1/jobs/{ids[1]}/cancel").status_code == 200
            assert h.get(f"/v1/jobs/{ids[1]}/wait", params={"timeout": 120}).json()["state"] == "CANCELLED"
        queue = subprocess.run(["squeue", "-h", "-j", ",".join(in_slurm), "-o", "%i %T"], capture_output=True, text=True,
                               env={**os.environ, "SLURM_CONF": conf}, timeout=60).stdout
        assert "RUNNING" not in queue and "PENDING" not in queue, queue
    finally:
        new.kill(signal.SIGTERM)
    after = json.loads(_corral(new, "audit", "verify", "--home", str(new.home)).stdout)
    assert after["ok"] and after["head"] > manifest["audit_head"][0]  # the chain went on from the restored head


def test_a_backup_of_a_newer_schema_or_changed_since_is_refused(tmp_path: Path) -> None:
    """A backup's schema newer than this corral's, or a file changed after the backup was
    written: refused before anything is written to the home."""
    src = tmp_path / "gw" / "home"
    src.mkdir(parents=True)
    gw = Gateway(src, free_port())
    gw.start()
    try:
        with gw.http() as h:  # one decision in the audit
            assert h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}).status_code == 201
        assert _corral(gw, "backup", str(tmp_path / "b")).returncode == 0
        _refused(_corral(gw, "backup", str(tmp_path / "b")), "is not an empty directory")
    finally:
        gw.kill(signal.SIGTERM)
    newer = tmp_path / "newer"
    shutil.copytree(tmp_path / "b", newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "schema": len(MIGRATIONS) + 1}))
    fresh = tmp_path / "fresh"
    _refused(_corral(gw, "restore", str(newer), "--home", str(fresh)), "newer than this corral's")
    with open(tmp_path / "b" / "audit" / "audit.jsonl", "a") as f:
        f.write("0" * 64 + ' {"seq": 999}\n')
    _refused(_corral(gw, "restore", str(tmp_path / "b"), "--home", str(fresh)), "changed since it was written")
    assert not fresh.exists()
    _refused(_corral(gw, "restore", str(tmp_path / "nothing"), "--home", str(fresh)), "is not a corral backup")


def test_a_postgresql_store_is_dumped_online_and_restored_into_an_empty_database(tmp_path: Path) -> None:
    """On PostgreSQL the store is taken by pg_dump while the gateway serves and restored by
    pg_restore into an empty database; one that holds a store already is refused."""
    from .pg_env import fresh_database

    with fresh_database() as url, fresh_database() as empty:
        gw = Gateway(tmp_path / "old" / "home", free_port(), extra_env={"CORRAL_STORE__URL": url})
        gw.home.mkdir(parents=True)
        gw.start()
        try:
            with gw.http() as h:
                job = h.post("/v1/jobs", json={"command": "echo kept", "workdir": str(tmp_path)}).json()
                assert h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
            made = _corral(gw, "backup", str(tmp_path / "bk"))
            assert made.returncode == 0, made.stderr
            assert json.loads(made.stdout)["store"] == "postgresql" and (tmp_path / "bk" / "store.pgdump").stat().st_size
        finally:
            gw.kill(signal.SIGTERM)
        new = Gateway(tmp_path / "new" / "home", free_port(), extra_env={"CORRAL_STORE__URL": url})
        _refused(_corral(new, "restore", str(tmp_path / "bk")), "already holds")  # the old store, not empty
        new = Gateway(tmp_path / "new" / "home", free_port(), extra_env={"CORRAL_STORE__URL": empty})
        done = _corral(new, "restore", str(tmp_path / "bk"))
        assert done.returncode == 0, done.stderr
        new.start()
        try:
            with new.http() as h:
                got = h.get(f"/v1/jobs/{job['id']}").json()
                assert got["state"] == "COMPLETED" and got["principal"] == "admin"
            verified = _corral(new, "audit", "verify")
            assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
        finally:
            new.kill(signal.SIGTERM)
