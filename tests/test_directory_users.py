"""Principals whose Unix users exist only in the site's directory (issue 48 item 9,
decision 0056): a real slapd, nslcd answering NSS for it in a mount namespace of the
test's own (tests/ldap_env.py), and a root gateway started in that namespace. The user
is in no /etc/passwd: the test checks that this process cannot resolve her."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, drop_scratch, free_port
from .ldap_env import SUFFIX, Directory, need_ldap


@pytest.fixture
def directory() -> Iterator[Directory]:
    need_ldap()
    d = Directory().start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def gateway_in(directory: Directory, tmp_path: Path) -> Iterator[Gateway]:
    """A root gateway whose NSS is the directory's (started in its namespace)."""
    gw = Gateway(tmp_path / "home", free_port(), prefix=directory.argv())
    gw.home.mkdir()
    gw.start()
    try:
        yield gw
    finally:
        gw.kill(15)
        drop_scratch(gw.home)


def _run(gw: Gateway, token: str, body: dict[str, Any]) -> dict[str, Any]:
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"walltime": "60s", **body})
        assert r.status_code == 201, r.text
        job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
        out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
    return {**job, "out": out}


def _doctor(gw: Gateway, argv: list[str]) -> dict[str, Any]:
    """``corral --json doctor``'s finding on principals' Unix users, run under ``argv``."""
    cp = subprocess.run([*argv, sys.executable, "-m", "corral.edges.cli.main", "--json", "doctor", "--home",
                         str(gw.home)], env=gw.env(), capture_output=True, text=True, timeout=120)
    assert cp.stdout, cp.stderr
    found = [f for f in json.loads(cp.stdout)["findings"] if f["check"] == "unix users"]
    assert len(found) == 1, cp.stdout
    return found[0]


def test_a_directory_user_runs_as_her_uid_and_is_refused_once_removed(directory: Directory,
                                                                      gateway_in: Gateway) -> None:
    if os.geteuid() != 0:
        pytest.skip("a gateway changes identity only as root")
    name = f"dirusr{os.getpid() % 100000}"
    uid = directory.add_user(name)
    with pytest.raises(KeyError):
        pwd.getpwnam(name)  # not in this process's NSS (files): only the directory has her
    assert directory.getent("passwd", name).stdout.startswith(f"{name}:*:{uid}:"), "nslcd does not answer"
    project = directory.dir / "home" / name / "proj"
    project.mkdir()
    os.chown(project, uid, uid)
    gw = gateway_in
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": "dora", "kind": "human", "unix_user": name}).status_code == 201
        token = h.post("/v1/tokens", json={"for": "dora", "expires": "1h"}).json()["token"]

    job = _run(gw, token, {"command": "id -u; id -un; echo made > made.txt", "workdir": str(project)})
    assert job["state"] == "COMPLETED", job
    assert job["out"].split() == [str(uid), name], job["out"]  # her uid, and her name through the directory
    assert (project / "made.txt").stat().st_uid == uid

    seen = _doctor(gw, directory.argv())
    assert seen["status"] == "ok" and f"{name} (uid {uid})" in seen["detail"] and "ldap" in seen["detail"], seen
    outside = _doctor(gw, [])  # the same store, from the machine's own NSS: she is not there
    assert outside["status"] == "warn" and name in outside["detail"], outside

    directory.remove_user(name)
    assert directory.getent("passwd", name).returncode == 2
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": "id -u", "workdir": str(project), "walltime": "60s"})
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert f"Unix user {name!r} (uid {uid}) is no longer known" in err["message"], err
    assert "ldap" in err["message"] and f"getent passwd {name}" in err["hint"], err
    gone = _doctor(gw, directory.argv())
    assert gone["status"] == "warn" and name in gone["detail"], gone
    shutil.rmtree(project, ignore_errors=True)


def test_a_directory_user_in_roots_group_is_refused(directory: Directory, gateway_in: Gateway) -> None:
    """A directory user whose primary group is gid 0 (root's group) is refused as uid 0 is:
    when a principal is added naming her, and for a job once the directory moves her
    there (403, saying what to do), never run with root's group."""
    if os.geteuid() != 0:
        pytest.skip("a gateway changes identity only as root")
    rooted = f"dirgrp{os.getpid() % 100000}"
    directory.add_user(rooted, gid=0)
    assert directory.getent("passwd", rooted).stdout.split(":")[3] == "0", "nslcd does not answer"
    later = f"dirmv{os.getpid() % 100000}"
    uid = directory.add_user(later)
    gw = gateway_in
    with gw.http() as h:
        r = h.post("/v1/principals", json={"name": "rhea", "kind": "human", "unix_user": rooted})
        assert r.status_code == 403 and "gid 0 (root's group)" in r.json()["error"]["message"], r.text
        assert h.post("/v1/principals", json={"name": "dora", "kind": "human", "unix_user": later}).status_code == 201
        token = h.post("/v1/tokens", json={"for": "dora", "expires": "1h"}).json()["token"]
    directory.ldap("ldapmodify", f"dn: uid={later},ou=people,{SUFFIX}\nchangetype: modify\n"
                                 "replace: gidNumber\ngidNumber: 0\n")
    assert directory.getent("passwd", later).stdout.startswith(f"{later}:*:{uid}:0:"), "the move did not land"
    with gw.http(token) as h:
        r = h.post("/v1/jobs", json={"command": "id -g", "workdir": "/tmp", "walltime": "60s"})
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert "gid 0 (root's group)" in err["message"] and "another primary group" in err["hint"], err
