"""Credentials under a job's own home are hidden by name (sandbox/homes.py CREDENTIALS):
a job that could rename their parent would move them out of hiding for the next job
(`mv ~/.config cfg`, then `cat ~/cfg/gcloud/...`), so no job works in a directory that
holds such a place. Attack found reading bwrap.py against core/workdirs.py (issue 47)."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from pathlib import Path

import pytest

from .conftest import running


def test_a_workdir_that_holds_a_credential_place_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("jobs run as a person's Unix user only under a root gateway")
    name = f"zzcred{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    try:
        home = Path(pwd.getpwnam(name).pw_dir)
        for d in (".config/gcloud", ".local/share/keyrings", "proj"):
            (home / d).mkdir(parents=True)
        (home / ".config" / "gcloud" / "credentials.db").write_text("secret\n")
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        with running(tmp_path) as gw:
            with gw.http() as h:
                assert h.post("/v1/principals", json={"name": "pat", "kind": "human", "unix_user": name}).status_code == 201
                assert h.post("/v1/principals", json={"name": "pbot", "kind": "agent", "sponsor": "pat",
                                                      "unix_user": name}).status_code == 201
                token = h.post("/v1/tokens", json={"for": "pbot", "expires": "1h"}).json()["token"]
            with gw.http(token) as b:
                for where in (".config", ".local", ".local/share"):
                    r = b.post("/v1/jobs", json={"command": "mv gcloud g2", "workdir": str(home / where)})
                    assert r.status_code == 400, (where, r.text)
                    assert "where credentials are kept" in r.json()["error"]["message"], r.text
                r = b.post("/v1/jobs", json={"command": "ls", "workdir": str(home / "proj")})
                assert r.status_code == 201, r.text
                assert b.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
