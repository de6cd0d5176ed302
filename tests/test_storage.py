"""Storage for trial-and-error on the real mechanisms (corral/storage): images resolved
by uv against the package index, packed by mksquashfs and mounted by the kernel; jobs
that import from them inside their sandbox; overlayfs workspaces forked, changed by a
job, diffed, committed, refused on conflict and discarded; metadata calls counted by
strace and capped by the session's budget. Bad input everywhere says what to fix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from corral.storage import mounts
from corral.storage.meta import count
from corral.storage.workspaces import changes

from .conftest import SHARED_TURN, Gateway, add_people, running

CI = os.environ.get("CI") == "true"
TOOLS = [t for t in ("mksquashfs", "unsquashfs", "bwrap", "strace") if shutil.which(t) is None]
needs_tools = pytest.mark.skipif(bool(TOOLS) and not CI, reason=f"missing {TOOLS}: run scripts/storage-up")
INDEX_HOSTS = json.dumps(["pypi.org", "files.pythonhosted.org"])
"""An agent's build installs in its sandbox: the index reached through corral's egress proxy."""
needs_root = pytest.mark.skipif(os.geteuid() != 0 and not CI, reason="kernel squashfs and overlay mounts need root")


def _principals(gw: Gateway) -> dict[str, str]:
    """bot2 in carol's family: another family than bot1's."""
    return add_people(gw, bot2_sponsor="carol", expires="2h")


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A stand-in for the shared filesystem, outside /tmp (a sandboxed job's /tmp is its own)."""
    d = Path(tempfile.mkdtemp(prefix="corral-shared-", dir="/var/tmp"))
    (d / "lib").mkdir()
    for i in range(30):
        (d / "lib" / f"mod{i}.py").write_text(f"x = {i}\n")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, shared: Path) -> Iterator[tuple[Gateway, dict[str, str]]]:
    if TOOLS and CI:
        pytest.fail(f"CI needs {TOOLS} (scripts/storage-up installs them)")
    home = tmp_path_factory.mktemp("storage")
    with running(home, cpus=4, CORRAL_STORAGE__SHARED_PATHS=json.dumps([str(shared)]),
                 CORRAL_STORAGE__META_SAMPLE="1.0", CORRAL_STORAGE__SESSION_META_BUDGET="60",
                 CORRAL_SANDBOX__ALLOW_HOSTS=INDEX_HOSTS) as g:
        yield g, _principals(g)


def _wait_build(h: Any, r: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    import time

    end = time.monotonic() + timeout
    while r["state"] == "building" and time.monotonic() < end:
        time.sleep(0.3)
        r = h.get(f"/v1/env/{r['digest']}").json()
    return r


def _run(h: Any, spec: dict[str, Any], timeout: int = 120) -> dict[str, Any]:
    r = h.post("/v1/jobs", json=spec)
    assert r.status_code in (200, 201), r.text
    job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": timeout}).json()
    assert job["state"] in ("COMPLETED", "FAILED"), job
    out = h.get(f"/v1/jobs/{job['id']}/output").json()
    return {**job, "out": out.get("data", out.get("text", ""))}


@pytest.fixture
def project() -> Iterator[Path]:
    """A project an agent's job may write (it runs as an unprivileged user)."""
    d = Path(tempfile.mkdtemp(prefix="corral-proj-", dir="/tmp"))
    (d / "src").mkdir()
    (d / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (d / "README").write_text("calc\n")
    (d / "old.txt").write_text("to be removed\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(d)], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_tools
@needs_root
def test_image_is_built_once_shared_and_used_by_a_contained_job(gw: tuple[Gateway, dict[str, str]]) -> None:
    g, t = gw
    files = {"requirements.txt": "six==1.17.0\n"}
    with g.http(t["bot1"]) as h:
        r = h.post("/v1/env/build", json={"files": files, "name": "six-env"})
        assert r.status_code == 202 and r.json()["state"] == "building", r.text
        built = _wait_build(h, r.json())
        assert built["state"] == "ready", built
        assert built["packages"] == ["six==1.17.0"] and built["built_by"] == "bot1" and built["size"] > 0
        key = built["image"]
        # An agent's job: inside its sandbox, the image's python first on PATH, six from the image.
        job = _run(h, {"command": "python -c 'import six, sys; print(sys.prefix, six.__file__)'; id -u",
                       "env": "six-env"})
        assert job["state"] == "COMPLETED", (job["reason"], job["out"], job)
        prefix, where = job["out"].split()[:2]
        assert prefix.endswith(f"/images/{key}") and where.startswith(prefix + "/lib/") and "six.py" in where
        assert job["out"].split()[2] != "0"  # never root, even from an image
        assert mounts.mounted(prefix)
        again = h.post("/v1/env/build", json={"files": files})  # the same request of the same identity: at once
        assert again.status_code == 200 and again.json()["reused"] and again.json()["image"] == key
    with g.http(t["carol"]) as h:
        # Another identity installs its own (decision 0025): what bot1's job installed is
        # only as trustworthy as bot1, so it is never handed to carol as her build.
        hers_built = _wait_build(h, h.post("/v1/env/build", json={"files": files}).json())
        assert hers_built["state"] == "ready" and hers_built["image"] != key and hers_built["built_by"] == "carol"
        listed = h.get("/v1/env").json()["images"]
        mine = next(i for i in listed if i["image"] == key)
        assert mine["name"] == "bot1/six-env" and mine["last_used"] is not None  # names are their owner's
        # bot1's image, named by carol herself by key prefix, and the CLI says what it is in a person's words
        hers = _run(h, {"command": "python -c 'import six' 2>&1 | tail -3; id; pwd", "image": key[:12]})
        err = h.get(f"/v1/jobs/{hers['id']}/output", params={"stream": "stderr"}).json()
        assert hers["state"] == "COMPLETED" and "Error" not in hers["out"], (hers["reason"], hers["out"], err)
    cp = g.cli("env", "list", token=t["carol"])
    assert cp.returncode == 0 and "six-env" in cp.stdout and key[:12] in cp.stdout
    with g.http() as admin:  # one build job, by the envbuild service principal, audited
        builds = [j for j in admin.get("/v1/jobs", params={"principal": "envbuild", "limit": 50}).json()["jobs"]]
        assert len([b for b in builds if b["state"] == "COMPLETED"]) >= 1
    audit = (g.home / "audit.jsonl").read_text()
    assert '"env.build"' in audit


@needs_tools
@needs_root
def test_image_names_are_their_owners_and_another_principals_image_is_named_and_allowed(
        gw: tuple[Gateway, dict[str, str]]) -> None:
    """issue 47 item 9: image names were global. bot1's name "torch" belonged to bot1, so
    carol could not have her own (a squat refused her: "belongs to bot1"), and where she
    could name one, `env: NAME` ran whoever's image had it. Now each name is its owner's:
    carol's "torch" is her own image, bot1's is reached only as bot1/torch (or its key),
    and only while the policy allows env_use of it."""
    import time

    from corral.safety.policy import DEFAULT_POLICY

    g, t = gw
    files = {"requirements.txt": "six==1.17.0\n"}
    keys = {}
    for who in ("bot1", "carol"):
        with g.http(t[who]) as h:
            r = h.post("/v1/env/build", json={"files": files, "name": "torch"})
            assert r.status_code in (200, 202), r.text
            keys[who] = _wait_build(h, r.json())["image"]
    assert keys["bot1"] != keys["carol"]
    with g.http(t["carol"]) as h:
        own = _run(h, {"command": "echo $VIRTUAL_ENV", "env": "torch"})
        assert own["state"] == "COMPLETED" and own["out"].strip().endswith(keys["carol"]), own
        theirs = _run(h, {"command": "echo $VIRTUAL_ENV", "image": "bot1/torch"})
        assert theirs["state"] == "COMPLETED" and theirs["out"].strip().endswith(keys["bot1"]), theirs
        st = h.get("/v1/env/torch")
        assert st.status_code == 200 and st.json()["image"] == keys["carol"], st.text
        policy = g.home / "policy.cedar"
        policy.write_text(DEFAULT_POLICY.read_text() + '\n@id("carol-own-images")\nforbid (principal == '
                          'Corral::Human::"carol", action == Corral::Action::"env_use", resource);\n')
        try:
            time.sleep(2.5)  # the gate looks at the policy's file every 2 s
            for ref in ("bot1/torch", keys["bot1"][:12]):
                r = h.post("/v1/jobs", json={"command": "true", "image": ref})
                assert r.status_code == 403 and "carol-own-images" in r.text, r.text
            assert _run(h, {"command": "true", "env": "torch"})["state"] == "COMPLETED"  # her own: no env_use
        finally:
            policy.write_text(DEFAULT_POLICY.read_text())
            time.sleep(2.5)


@needs_tools
@needs_root
def test_bad_environments_say_what_to_fix(gw: tuple[Gateway, dict[str, str]]) -> None:
    g, t = gw
    with g.http(t["bot1"]) as h:
        r = _wait_build(h, h.post("/v1/env/build", json={"files": {
            "requirements.txt": "corral-no-such-package-xq7==1.0\n"}}).json())
        assert r["state"] == "failed" and "corral-no-such-package-xq7" in r["error"], r
        assert "Traceback" not in r["error"]
        bad = h.post("/v1/env/build", json={"files": {"setup.py": "x"}})
        assert bad.status_code == 400 and "requirements.txt" in bad.text
        lonely = h.post("/v1/env/build", json={"files": {"uv.lock": "version = 1\n"}})
        assert lonely.status_code == 400 and "pyproject.toml" in lonely.json()["error"]["message"]
        missing = h.post("/v1/jobs", json={"command": "true", "env": "never-built"})
        assert missing.status_code == 404 and "corral env build" in missing.json()["error"]["message"]
        forged = h.post("/v1/jobs", json={"command": "true", "labels": {"corral-image-file": "/etc/passwd"}})
        assert forged.status_code == 400 and "corral's own" in forged.json()["error"]["message"]
    (g.home.parent / "setup.py").write_text("import setuptools\n")
    cp = g.cli("--json", "env", "build", str(g.home.parent / "setup.py"), token=t["bot1"])
    assert cp.returncode == 2 and "is not one of" in json.loads(cp.stdout)["error"]["message"]


@needs_tools
@needs_root
def test_a_corrupt_image_is_refused_and_rebuilt_on_request(gw: tuple[Gateway, dict[str, str]]) -> None:
    g, t = gw
    files = {"requirements.txt": "six==1.16.0\n"}
    with g.http(t["alice"]) as h:
        img = _wait_build(h, h.post("/v1/env/build", json={"files": files, "name": "six-old"}).json())
        assert img["state"] == "ready", img
        path = g.home / "images" / f"{img['image']}.sqsh"
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:  # a bit flipped on the store's disk
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        refused = h.post("/v1/jobs", json={"command": "python -c 'import six'", "env": "six-old"})
        assert refused.status_code == 409 and "corrupt" in refused.json()["error"]["message"], refused.text
        assert "--rebuild" in refused.json()["error"]["message"]
        again = _wait_build(h, h.post("/v1/env/build", json={"files": files, "rebuild": True}).json())
        assert again["state"] == "ready" and again["image"] == img["image"]
        job = _run(h, {"command": "python -c 'import six; print(six.__version__)'", "env": "six-old",
                       "workdir": "/tmp"})
        assert job["state"] == "COMPLETED" and job["out"].strip() == "1.16.0", job


@needs_tools
def test_a_fifo_in_a_workspace_never_blocks_its_diff(gw: tuple[Gateway, dict[str, str]], project: Path) -> None:
    """H4 F11 variant: a FIFO in the base and one the job made in its workspace, of one
    mode: comparing them opened both, and the gateway's thread waited for a writer for ever."""
    g, t = gw
    os.mkfifo(project / "pipe", 0o666)
    os.chmod(project / "pipe", 0o666)
    with g.http(t["bot1"]) as h:
        h.timeout = httpx.Timeout(30)
        w = h.post("/v1/workspaces", json={"base": str(project)}).json()
        job = _run(h, {"command": "rm pipe && mkfifo pipe && chmod 666 pipe && echo x >> README",
                       "workspace": w["workspace"]})
        assert job["state"] == "COMPLETED", job
        d = h.get(f"/v1/workspaces/{w['workspace']}/diff")
        assert h.post(f"/v1/workspaces/{w['workspace']}/discard").status_code == 200
        # answered (a FIFO is compared by its metadata, never opened); the FIFO the job made
        # anew may be listed as a change of its own
        assert d.status_code == 200 and "README" in d.json()["modified"], d.text


@needs_tools
@needs_root
def test_workspace_fork_change_diff_commit_and_discard(gw: tuple[Gateway, dict[str, str]], project: Path) -> None:
    g, t = gw
    with g.http(t["bot1"]) as h:
        ws = h.post("/v1/workspaces", json={"base": str(project)})
        assert ws.status_code == 201, ws.text
        w = ws.json()
        assert w["how"] == "overlay" and w["path"].endswith("/merged")
        job = _run(h, {"command": "echo 'def sub(a, b): return a - b' > src/sub.py; echo more >> README; "
                                  "rm old.txt; pwd; cat \"$PWD/src/calc.py\" | wc -l", "workspace": w["workspace"]})
        # its absolute paths too: the workspace's parents are traversable by the job's user
        assert job["state"] == "COMPLETED" and job["out"].split() == [w["path"], "2"], job
        assert not (project / "src" / "sub.py").exists() and (project / "old.txt").exists()  # base untouched
        d = h.get(f"/v1/workspaces/{w['workspace']}/diff").json()
        assert (d["added"], d["modified"], d["deleted"]) == (["src/sub.py"], ["README"], ["old.txt"]), d
        cp = g.cli("workspace", "diff", w["workspace"], token=t["bot1"])
        assert cp.returncode == 0 and "A src/sub.py" in cp.stdout and "D old.txt" in cp.stdout
        # another family cannot see it, let alone commit it
        with g.http(t["bot2"]) as other:
            assert other.post(f"/v1/workspaces/{w['workspace']}/commit").status_code == 404
        done = h.post(f"/v1/workspaces/{w['workspace']}/commit").json()
        assert done["state"] == "committed" and done["added"] == ["src/sub.py"]
        assert (project / "src" / "sub.py").read_text().startswith("def sub")
        assert (project / "README").read_text() == "calc\nmore\n" and not (project / "old.txt").exists()
        assert not mounts.mounted(w["path"])
        assert h.get(f"/v1/workspaces/{w['workspace']}/diff").status_code == 404
        # a second trial thrown away: the base is as the first left it; not while its job runs
        w2 = h.post("/v1/workspaces", json={"base": str(project)}).json()
        busy = h.post("/v1/jobs", json={"command": "sleep 30", "workspace": w2["workspace"]}).json()
        for verb in ("commit", "discard"):
            r = h.post(f"/v1/workspaces/{w2['workspace']}/{verb}")
            assert r.status_code == 409 and f"job {busy['id']} still runs" in r.json()["error"]["message"], r.text
        h.post(f"/v1/jobs/{busy['id']}/cancel")
        h.get(f"/v1/jobs/{busy['id']}/wait", params={"timeout": 30})
        assert _run(h, {"command": "rm -r src", "workspace": w2["workspace"]})["state"] == "COMPLETED"
        assert h.post(f"/v1/workspaces/{w2['workspace']}/discard").json()["state"] == "discarded"
        assert (project / "src" / "calc.py").exists()
        assert h.get("/v1/workspaces").json()["workspaces"] == []


@needs_tools
@needs_root
def test_a_commit_over_a_moved_base_is_refused_naming_the_paths(gw: tuple[Gateway, dict[str, str]],
                                                                 project: Path) -> None:
    g, t = gw
    with g.http(t["bot1"]) as h:
        w = h.post("/v1/workspaces", json={"base": str(project)}).json()
        assert _run(h, {"command": "echo trial > README; echo new > src/new.py",
                        "workspace": w["workspace"]})["state"] == "COMPLETED"
        (project / "README").write_text("someone else's change\n")  # the base moved underneath
        r = h.post(f"/v1/workspaces/{w['workspace']}/commit")
        assert r.status_code == 409, r.text
        msg = r.json()["error"]["message"]
        assert "README" in msg and "src/new.py" not in msg and "nothing was written" in msg
        assert (project / "README").read_text() == "someone else's change\n" and not (project / "src/new.py").exists()
        assert h.get(f"/v1/workspaces/{w['workspace']}/diff").status_code == 200  # still there to redo
        h.post(f"/v1/workspaces/{w['workspace']}/discard")


@needs_tools
@needs_root
def test_workspaces_from_git_and_the_bad_bases(gw: tuple[Gateway, dict[str, str]], project: Path) -> None:
    g, t = gw
    git = ["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run(["chown", "-R", "nobody", str(project)], check=True)  # someone else's repository
    (project / "README").write_text("uncommitted\n")
    with g.http(t["bot1"]) as h:
        w = h.post("/v1/workspaces", json={"base": str(project), "rev": "HEAD"}).json()
        assert "workspace" in w, w
        job = _run(h, {"command": "cat README", "workspace": w["workspace"]})
        assert job["out"] == "calc\n", job  # the commit, not the working tree
        h.post(f"/v1/workspaces/{w['workspace']}/discard")
        bad_rev = h.post("/v1/workspaces", json={"base": str(project), "rev": "no-such-branch"})
        assert bad_rev.status_code == 400 and "not a commit" in bad_rev.json()["error"]["message"]
        gone = h.post("/v1/workspaces", json={"base": "/var/tmp/corral-no-such-dir"})
        assert gone.status_code == 400 and "does not exist" in gone.json()["error"]["message"]
        for hidden in (str(g.home), "/root", "/"):
            r = h.post("/v1/workspaces", json={"base": hidden})
            assert r.status_code == 400, (hidden, r.text)
        # the base vanishes after the fork: its next job is refused with what to do
        doomed = Path(tempfile.mkdtemp(prefix="corral-doomed-", dir="/tmp"))
        doomed.chmod(0o777)
        w = h.post("/v1/workspaces", json={"base": str(doomed)}).json()
        shutil.rmtree(doomed)
        r = h.post("/v1/jobs", json={"command": "true", "workspace": w["workspace"]})
        assert r.status_code == 409 and "is gone" in r.json()["error"]["message"] and "discard" in r.json()["error"]["message"]
        assert h.post(f"/v1/workspaces/{w['workspace']}/commit").status_code == 409
        assert h.post(f"/v1/workspaces/{w['workspace']}/discard").status_code == 200


@needs_tools
@needs_root
def test_twenty_trials_cost_their_changes_not_twenty_copies(gw: tuple[Gateway, dict[str, str]], project: Path) -> None:
    g, t = gw
    (project / "data.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    os.chmod(project / "data.bin", 0o666)
    with g.http(t["bot1"]) as h:
        ws = [h.post("/v1/workspaces", json={"base": str(project)}).json() for _ in range(20)]
        jobs = h.post("/v1/jobs/batch", json={"jobs": [
            {"command": f"echo trial {i} > result.txt; cat data.bin | wc -c", "workspace": w["workspace"]}
            for i, w in enumerate(ws)]}).json()
        assert "jobs" in jobs, jobs
        jobs = jobs["jobs"]
        waited = h.post("/v1/jobs/wait", json={"ids": [j["id"] for j in jobs], "timeout": 120}).json()
        assert "jobs" in waited, waited
        waited = waited["jobs"]
        assert all(j["state"] == "COMPLETED" for j in waited), waited
        sizes = [h.get(f"/v1/workspaces/{w['workspace']}").json()["upper_bytes"] for w in ws]
        assert sum(sizes) < 20 * 64 * 1024 < 2 * 1024 * 1024, sizes  # each a result file, never a copy of data.bin
        for w in ws:
            assert h.get(f"/v1/workspaces/{w['workspace']}/diff").json()["added"] == ["result.txt"]
            h.post(f"/v1/workspaces/{w['workspace']}/discard")


@needs_tools
@needs_root
def test_metadata_calls_on_shared_paths_are_counted_and_capped(gw: tuple[Gateway, dict[str, str]],
                                                               shared: Path) -> None:
    g, t = gw
    with g.http(t["bot1"], session="meta-s1") as h:
        job = _run(h, {"command": f"ls {shared}/lib | wc -l; for f in {shared}/lib/*.py; do cat $f >/dev/null; done",
                       "workdir": "/tmp"})
        assert job["state"] == "COMPLETED" and job["out"].strip() == "30", job
        import time

        for _ in range(50):  # counted off the event loop once the job ended
            usage = h.get(f"/v1/jobs/{job['id']}/usage").json()
            if "metadata_ops" in usage:
                break
            time.sleep(0.1)
        ops = usage["metadata_ops"]
        assert ops["on_shared_paths"] >= 30 and ops["calls"] >= ops["on_shared_paths"], ops
        assert ops["by_call"].get("openat", 0) >= 30
        info = h.get("/v1/facility").json()["storage"]
        assert info["session_meta_ops"] == ops["on_shared_paths"] and info["session_meta_budget"] == 60
        # the session is past its budget: a plain job is told to use an image or a workspace
        again = h.post("/v1/jobs", json={"command": f"ls {shared}", "workdir": "/tmp"})
        assert again.status_code == 403, again.text
        msg = again.json()["error"]["message"]
        assert "image" in msg and "workspace" in msg and "budget" in msg
    with g.http(t["bot1"], session="meta-s2") as h:  # another session starts afresh
        assert h.post("/v1/jobs", json={"command": "true", "workdir": "/tmp"}).status_code == 201
    assert g.metric('corral_metadata_ops_total{where="shared"}') >= 30
    import httpx

    with httpx.Client(base_url=g.url) as c:  # the admin's dashboard shows the session over its budget
        assert c.post("/dashboard/login", data={"token": g.admin_token}).status_code == 303
        panel = c.get("/dashboard/live.json").json()["storage"]
        row = next(r for r in panel["sessions"] if r["session"] == "meta-s1")
        assert row["principal"] == "bot1" and row["shared_ops"] == ops["on_shared_paths"] and panel["budget"] == 60
        assert "meta-s1" in c.get("/dashboard/live").text
    _the_page_reads_as_the_cli_says(g, t["bot1"], "meta-s1", job["id"])


def _the_page_reads_as_the_cli_says(g: Gateway, token: str, session: str, job_id: int) -> None:
    """Issue 54 item 1, in Chromium: the storage panel's row for the session has the
    metadata calls ``corral --session S facility --json`` counts for it, of its budget,
    and the traced jobs that ``corral usage --json`` gives metadata calls for."""
    from playwright.sync_api import sync_playwright

    from .test_dashboard import _browser, _sign_in

    said = g.cli_json("--session", session, "facility", token=token)["storage"]
    traced = [j["id"] for j in g.cli_json("jobs", "--session", session, token=token)["jobs"]
              if "metadata_ops" in g.cli_json("usage", str(j["id"]), token=token)]
    assert traced == [job_id], traced
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _sign_in(page, g.url, g.admin_token)
            page.wait_for_selector("#live main")  # the board, not the sign-in form it replaces
            row = next(r for r in page.locator("#storage tr").all() if r.locator("td").count() == 3
                       and r.locator("td").first.inner_text() == f"bot1 / {session}")
            cells = row.locator("td").all_inner_texts()
            assert cells[1:] == [str(len(traced)), f"{said['session_meta_ops']} of {said['session_meta_budget']}"], \
                (cells, said)
            assert "bad" in (row.locator("td").nth(2).get_attribute("class") or "")  # past its budget: red
        finally:
            browser.close()


def test_meta_counts_paths_under_the_shared_prefixes_only() -> None:
    lines = ['openat(AT_FDCWD</home/u/p>, "data/x.csv", O_RDONLY) = 3\n',
             'newfstatat(AT_FDCWD</work>, "/lus/proj/a.py", {st_mode=S_IFREG}, 0) = 0\n',
             'getdents64(3</lus/proj>, 0x5 /* 4 entries */, 32768) = 112\n',
             'access("/lus/projection/x", R_OK) = -1 ENOENT\n',
             'statx(AT_FDCWD</lus/proj/sub>, "../b.py", AT_STATX_SYNC_AS_STAT, STATX_ALL, 0x7f) = 0\n',
             '4242  openat(AT_FDCWD</>, "lus/proj/c.py", O_RDONLY) = 4\n',  # strace -f: the pid first
             '+++ exited with 0 +++\n']
    total, on, by = count(lines, ["/lus/proj"])
    assert (total, on) == (6, 4) and by == {"newfstatat": 1, "getdents64": 1, "statx": 1, "openat": 1}
    assert count(lines, ["/home/u"])[1] == 1


@needs_root
def test_diff_reads_overlay_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    (lower / "keep").mkdir(parents=True)
    (lower / "keep" / "a").write_text("a")
    (lower / "gone").mkdir()
    (lower / "gone" / "b").write_text("b")
    (lower / "same").write_text("same")
    m = mounts.mount_overlay(lower, upper, work, merged)
    try:
        shutil.rmtree(merged / "gone")
        (merged / "gone").mkdir()  # replaced: an opaque directory
        (merged / "gone" / "c").write_text("c")
        (merged / "keep" / "a").write_text("A")
        os.utime(merged / "same")  # copied up, same bytes: not a change
        got = sorted(changes(upper, lower))
        assert got == [("added", "gone/c"), ("deleted", "gone/b"), ("modified", "keep/a")], (m, got)
    finally:
        mounts.unmount(merged)


@needs_tools
@needs_root
def test_images_in_the_fast_lane_and_workspaces_across_a_restart(tmp_path: Path, project: Path) -> None:
    with running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS=INDEX_HOSTS) as g:
        t = _principals(g)
        with g.http(t["bot1"]) as h:
            img = _wait_build(h, h.post("/v1/env/build", json={"files": {"requirements.txt": "six==1.17.0\n"},
                                                               "name": "six"}).json())
            assert img["state"] == "ready", img
            w = h.post("/v1/workspaces", json={"base": str(project)}).json()
            assert _run(h, {"command": "echo 1 > one", "workspace": w["workspace"]})["state"] == "COMPLETED"
            task = _run(h, {"command": "python -c 'import six, sys; print(sys.prefix)'", "env": "six",
                            "lane": "fast", "walltime": "1m", "workdir": "/tmp"})
            assert task["state"] == "COMPLETED" and task["out"].strip().endswith(img["image"]), task
            assert h.get(f"/v1/jobs/{task['id']}").json()["backend"] == "fast"
        g.kill(signal.SIGKILL)  # a crash: the workspace and the image outlive the gateway
        g.start()
        with g.http(t["bot1"]) as h:
            assert _run(h, {"command": "cat one; echo 2 > two", "workspace": w["workspace"], "lane": "fast",
                            "walltime": "1m"})["out"] == "1\n"
            assert h.get(f"/v1/workspaces/{w['workspace']}/diff").json()["added"] == ["one", "two"]
            assert [i["image"] for i in h.get("/v1/env").json()["images"]] == [img["image"]]
            h.post(f"/v1/workspaces/{w['workspace']}/discard")


@needs_root
def test_a_full_scratch_disk_refuses_a_fork_saying_what_to_do(tmp_path: Path, project: Path) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="corral-full-", dir="/var/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(scratch)], check=True)
    try:
        with running(tmp_path, CORRAL_STORAGE__SCRATCH=str(scratch)) as g:
            t = _principals(g)
            with g.http(t["bot1"]) as h:
                r = h.post("/v1/workspaces", json={"base": str(project)})
                assert r.status_code == 400, r.text
                msg = r.json()["error"]["message"]
                assert "MB free" in msg and "discard" in msg
    finally:
        mounts.unmount_all(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


@needs_tools
@needs_root
def test_mcp_tools_build_an_environment_and_run_a_trial_workspace(gw: tuple[Gateway, dict[str, str]],
                                                                   project: Path) -> None:
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from .test_mcp import data, error_text

    g, t = gw

    async def go() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {t['bot1']}"}, timeout=60) as http:
            async with Client(streamable_http_client(f"{g.url}/mcp", http_client=http)) as client:
                names = {x.name for x in (await client.list_tools()).tools}
                assert {"build_environment", "workspace"} <= names
                built = data(await client.call_tool("build_environment", {"requirements": "six==1.17.0\n",
                                                                          "name": "six-mcp"}))
                assert built["state"] == "ready" and "submit_job image=" in built["next"], built
                bad = error_text(await client.call_tool("build_environment", {"requirements": "zz-no-pkg-q9==9\n"}))
                assert "zz-no-pkg-q9" in bad
                ws = data(await client.call_tool("workspace", {"action": "fork", "base": str(project)}))
                sub = data(await client.call_tool("submit_job", {"command": "python -c 'import six' && touch ok",
                                                                 "image": "six-mcp", "workspace": ws["workspace"]}))
                done = data(await client.call_tool("wait_for_job", {"job_id": sub["job_id"], "timeout_s": 60}))
                assert done["state"] == "COMPLETED", done
                diff = data(await client.call_tool("workspace", {"action": "diff", "workspace_id": ws["workspace"]}))
                assert diff["added"] == ["ok"]
                assert "needs workspace_id" in error_text(await client.call_tool("workspace", {"action": "commit"}))
                gone = data(await client.call_tool("workspace", {"action": "discard", "workspace_id": ws["workspace"]}))
                assert gone["state"] == "discarded"

    asyncio.run(go())


@needs_tools
@needs_root
@SHARED_TURN
def test_images_and_workspaces_on_the_private_slurm(tmp_path: Path, project: Path, shared: Path, slurm_turn: None) -> None:
    from .slurm_env import slurm_conf
    from .conftest import free_port

    g = Gateway(tmp_path / "home", free_port(), extra_env={
        "CORRAL_BACKEND": "slurm", "SLURM_CONF": slurm_conf(), "CORRAL_TICK_S": "0.5",
        "CORRAL_STORAGE__BUILD_MEMORY_MB": "1024", "CORRAL_STORAGE__BUILD_CPUS": "1",
        "CORRAL_STORAGE__SHARED_PATHS": json.dumps([str(shared)]), "CORRAL_STORAGE__META_SAMPLE": "1.0",
        "CORRAL_SANDBOX__ALLOW_HOSTS": INDEX_HOSTS})
    g.home.mkdir()
    g.start()
    try:
        t = _principals(g)
        with g.http(t["bot1"], session="slurm-s") as h:
            # the build is two Slurm jobs: bot1's install, contained, then the envbuild principal's pack
            img = _wait_build(h, h.post("/v1/env/build", json={"files": {"requirements.txt": "six==1.17.0\n"},
                                                               "name": "six"}).json())
            assert img["state"] == "ready", img
            w = h.post("/v1/workspaces", json={"base": str(project)}).json()
            job = _run(h, {"command": f"python -c 'import six, sys; print(sys.prefix)' > prefix.txt; "
                                      f"ls {shared}/lib > /dev/null; cat prefix.txt",
                           "env": "six", "workspace": w["workspace"]})
            assert job["state"] == "COMPLETED" and h.get(f"/v1/jobs/{job['id']}").json()["backend"] == "slurm", job
            assert job["out"].strip().endswith(f"/images/{img['image']}"), job
            assert h.get(f"/v1/workspaces/{w['workspace']}/diff").json()["added"] == ["prefix.txt"]
            import time

            for _ in range(50):
                usage = h.get(f"/v1/jobs/{job['id']}/usage").json()
                if "metadata_ops" in usage:
                    break
                time.sleep(0.2)
            assert usage["metadata_ops"]["on_shared_paths"] >= 1, usage
            h.post(f"/v1/workspaces/{w['workspace']}/discard")
        with g.http() as admin:
            builds = admin.get("/v1/jobs", params={"principal": "envbuild", "full": "true"}).json()["jobs"]
            assert builds and all(b["backend"] == "slurm" for b in builds)
    finally:
        g.kill(signal.SIGTERM)
        from .conftest import drop_scratch

        drop_scratch(g.home)


@needs_tools
@needs_root
def test_images_are_collected_by_the_admin_only(gw: tuple[Gateway, dict[str, str]]) -> None:
    g, t = gw
    with g.http(t["alice"]) as h:
        img = _wait_build(h, h.post("/v1/env/build", json={"files": {"requirements.txt": "six==1.15.0\n"},
                                                           "name": "six-gc"}).json())
        assert img["state"] == "ready", img
        r = h.post("/v1/env/gc", json={"image": "six-gc"})
        assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
    with g.http() as admin:
        dry = admin.post("/v1/env/gc", json={"image": "six-gc", "dry_run": True}).json()
        assert dry["collected"] == [img["image"]] and (g.home / "images" / f"{img['image']}.sqsh").exists()
        cp = g.cli("--json", "env", "gc", "--image", "six-gc")
        assert cp.returncode == 0 and json.loads(cp.stdout)["collected"] == [img["image"]], cp.stderr
        assert not (g.home / "images" / f"{img['image']}.sqsh").exists()
        assert img["image"] not in [i["image"] for i in admin.get("/v1/env").json()["images"]]
        assert admin.post("/v1/jobs", json={"command": "true", "env": "six-gc"}).status_code == 404


NOBODY = [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@needs_tools
@needs_root
def test_a_node_without_root_mounts_by_fuse_and_without_fuse_unpacks() -> None:
    """The fallbacks, each on its real mechanism: squashfuse and fuse-overlayfs for a user
    who is not root, unsquashfs to scratch when squashfuse is not there either."""
    d = Path(tempfile.mkdtemp(prefix="corral-fallback-", dir="/var/tmp"))
    try:
        (d / "src" / "bin").mkdir(parents=True)
        (d / "src" / "bin" / "hello").write_text("from the image\n")
        subprocess.run(["mksquashfs", str(d / "src"), str(d / "img.sqsh"), "-quiet", "-no-progress"], check=True)
        (d / "lower").mkdir()
        (d / "lower" / "f").write_text("base\n")
        subprocess.run(["chmod", "-R", "a+rwX", str(d)], check=True)
        code = ("import sys; from pathlib import Path; from corral.storage.mounts import mount_image, mount_overlay, "
                "unmount\nd = Path(sys.argv[1])\nm = mount_image(d / 'img.sqsh', d / sys.argv[2])\n"
                "print(m.how, '|', m.why, '|', open(m.path + '/bin/hello').read().strip())\nunmount(m.path)\n"
                "if sys.argv[2] == 'fuse':\n"
                "    o = mount_overlay(d / 'lower', d / 'up', d / 'wk', d / 'mg'); (d / 'mg' / 'g').write_text('x')\n"
                "    print(o.how, '|', sorted(p.name for p in (d / 'up').iterdir())); unmount(o.path)\n")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        fuse = subprocess.run([*NOBODY, sys.executable, "-c", code, str(d), "fuse"], capture_output=True, text=True,
                              env=env, timeout=60)
        assert fuse.returncode == 0, fuse.stderr
        img, ovl = fuse.stdout.splitlines()
        assert img.startswith("squashfuse | kernel mount: not root") and img.endswith("| from the image"), img
        assert ovl == "fuse-overlayfs | ['g']", ovl
        assert not mounts.under(d)
        bare = Path(d / "bin")  # a PATH with unsquashfs but no squashfuse
        bare.mkdir()
        for tool in ("unsquashfs", "mount", "umount"):
            os.symlink(str(shutil.which(tool)), bare / tool)
        nofuse = subprocess.run([*NOBODY, sys.executable, "-c", code, str(d), "bare"], capture_output=True,
                                text=True, env={**env, "PATH": str(bare)}, timeout=60)
        assert nofuse.returncode == 0, nofuse.stderr
        assert nofuse.stdout.startswith("unpacked | ") and "squashfuse is not installed" in nofuse.stdout
        assert nofuse.stdout.strip().endswith("| from the image") and not (d / "bare").exists()  # unmount removed it
    finally:
        mounts.unmount_all(d)
        shutil.rmtree(d, ignore_errors=True)


@needs_tools
@needs_root
def test_images_from_a_pyproject_and_from_a_uv_lock(gw: tuple[Gateway, dict[str, str]], tmp_path: Path) -> None:
    """The other two inputs, through the CLI: a pyproject.toml's dependencies, and a uv.lock
    (sent with its pyproject.toml) exported as locked. Both resolve to the same
    environment as six==1.17.0 alone, so they share its image."""
    g, t = gw
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text('[project]\nname = "trial"\nversion = "0.1"\nrequires-python = ">=3.10"\n'
                                         'dependencies = ["six==1.17.0"]\n')
    by_project = g.cli("--json", "env", "build", str(proj / "pyproject.toml"), token=t["bot1"])
    assert by_project.returncode == 0, by_project.stdout + by_project.stderr
    one = json.loads(by_project.stdout)
    assert one["state"] == "ready" and one["packages"] == ["six==1.17.0"], one
    uv = Path(sys.executable).with_name("uv")
    lock = subprocess.run([str(uv), "lock", "--project", str(proj), "--python", "/usr/bin/python3", "--quiet"],
                          capture_output=True, text=True, env={**os.environ, "UV_SYSTEM_CERTS": "1"}, timeout=300)
    assert lock.returncode == 0, lock.stderr
    by_lock = g.cli("--json", "env", "build", str(proj / "uv.lock"), token=t["bot1"])
    assert by_lock.returncode == 0, by_lock.stdout + by_lock.stderr
    two = json.loads(by_lock.stdout)
    assert two["packages"] == ["six==1.17.0"] and two["image"] == one["image"], two
    (proj / "pyproject.toml").unlink()
    alone = g.cli("--json", "env", "build", str(proj / "uv.lock"), token=t["bot1"])
    assert alone.returncode == 2 and "pyproject.toml" in json.loads(alone.stdout)["error"]["message"]


@needs_tools
@needs_root
def test_workspace_commands_as_a_person_reads_them(gw: tuple[Gateway, dict[str, str]], project: Path) -> None:
    g, t = gw
    ids = [g.cli_json("workspace", "fork", str(project), token=t["bot1"])["workspace"] for _ in range(2)]
    listed = g.cli("workspace", "list", token=t["bot1"]).stdout
    expiry = time.strftime("%Y-%m-%d", time.localtime(time.time() + 7 * 86400))
    assert expiry in listed, listed  # a week away: its date, not only a time of day
    cp = g.cli("workspace", "discard", *ids, token=t["bot1"])
    assert cp.returncode == 0 and cp.stdout.split("\n")[:2] == [f"discarded {ids[0]}", f"discarded {ids[1]}"], cp
    assert g.cli_json("workspace", "list", token=t["bot1"]) == []
    bad = g.cli("workspace", "diff", "ws-nonexistent", token=t["bot1"])
    assert bad.returncode == 2 and "'ws-nonexistent' is not a workspace id: ids look like ws-0123abcd4567" in bad.stderr
    assert "pattern" not in bad.stderr and "^ws-" not in bad.stderr
