"""The adversarial review's findings on working directories, outputs, credentials and
identities (H4 F8, F9, F17, F18; docs/decisions/0010-privsep.md), attacked as the review
did: a real root gateway, a real agent token, real identities and real bubblewrap.

- F8: a link swapped in after the working directory was checked (the directory named
  itself, or a parent of it) never redirects a job, in the fast lane as in batch;
- F9: a fast-lane task's output, script and journal are read by no other local user;
- F17: a credential made after the gateway started is hidden from the next job;
- F18: two corral installs on one machine never give one dynamic uid to two principals.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import Gateway, running
from .test_privsep import DYNAMIC, finish, run, submit, tokens
from .test_sandbox import need_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="privilege separation is a root gateway's (CI runs as root)")

FAST = {"CORRAL_FASTLANE_CPUS": "4", "CORRAL_FASTLANE_MEMORY_MB": "4096"}


@pytest.fixture
def fast(tmp_path: Path) -> Iterator[Gateway]:
    need_bwrap()
    with running(tmp_path, cpus=8, **FAST) as g:
        yield g


@pytest.fixture
def project() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="corral-proj-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def private() -> Iterator[Path]:
    """Root's closed directory (0700) with a world-writable project in it, and a canary:
    nothing an agent's identity may enter."""
    d = Path(tempfile.mkdtemp(prefix="corral-private-", dir="/tmp"))
    d.chmod(0o700)
    (d / "ledger.txt").write_text("CANARY-PRIVATE-51c2\n")
    for name in ("okwd", ".ssh"):
        (d / name).mkdir()
        (d / name).chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def person(tmp_path: Path) -> Iterator[pwd.struct_passwd]:
    name = f"corralc{os.getpid() % 100000}"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    # Under /home, as people's are (a job's /tmp is private: a home there is out of sight).
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-u", name], capture_output=True)
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(f"/home/{name}", ignore_errors=True)


def as_nobody(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", cmd],
                          capture_output=True, text=True, timeout=30)


def swap(link: Path, target: Path) -> None:
    """`ln -sfn target link`, as the review did."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    os.replace(tmp, link)


# -- F8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("lane", ["fast", "batch"])
def test_a_link_swapped_after_submit_never_redirects_the_job(person: pwd.struct_passwd, fast: Gateway, project: Path,
                                                             lane: str) -> None:
    """The review's F8: submit with a link to a checked directory, then point the link at
    a person's home (hidden from an agent's job). The job runs in the directory that was
    checked, and nothing of that home is read or written."""
    victim = Path(person.pw_dir)
    (victim / "notes.txt").write_text("VISIBLE_NOTE\n")
    t = tokens(fast, ("bot1", "alice"))
    ok = project / "okwd"
    ok.mkdir()
    ok.chmod(0o777)
    (ok / "okwd-marker").write_text("here\n")
    link = project / "lnk2"
    link.symlink_to(ok)
    r = submit(fast, t["bot1"], {"command": "sleep 1; ls -a; echo x > pwned", "workdir": str(link), "lane": lane,
                                 "walltime": "1m"})
    assert r.status_code == 201, r.text
    swap(link, victim)
    job = finish(fast, t["bot1"], r.json()["id"])
    assert "notes.txt" not in job["out"] and not (victim / "pwned").exists(), job
    assert job["state"] == "COMPLETED", job
    assert "okwd-marker" in job["out"], job["out"]
    assert (ok / "pwned").exists()
    assert r.json()["spec"]["workdir"] == str(ok), r.json()  # recorded as checked, not as the link


@pytest.mark.parametrize("lane", ["fast", "batch"])
def test_a_parent_swapped_for_a_link_fails_the_job(fast: Gateway, project: Path, private: Path, lane: str) -> None:
    """The checked path is resolved; its owner then swaps a parent of it for a link to a
    place the job's identity may not enter, where a directory of the same name waits.
    The directory is opened one component at a time without following a link: the job
    fails saying so, and nothing is written there."""
    t = tokens(fast, ("bot1", "alice"))
    parent = project / "p"
    (parent / "okwd").mkdir(parents=True)
    for d in (parent, parent / "okwd"):
        d.chmod(0o777)
    blocker = None
    if lane == "batch":  # both CPU slots taken: the job waits after its check
        blocker = submit(fast, t["bot1"], {"command": "sleep 30", "cpus": 8, "workdir": str(project)})
        assert blocker.status_code == 201, blocker.text
    r = submit(fast, t["bot1"], {"command": "ls -a; cat ../ledger.txt; echo x > pwned", "workdir": str(parent / "okwd"),
                                 "lane": lane, "walltime": "1m"})
    assert r.status_code == 201, r.text
    parent.rename(project / "p-old")
    (project / "p").symlink_to(private)
    if blocker is not None:
        with fast.http(t["bot1"]) as h:
            h.post(f"/v1/jobs/{blocker.json()['id']}/cancel")
    job = finish(fast, t["bot1"], r.json()["id"])
    assert job["state"] == "FAILED" and "link" in (job["reason"] or ""), job
    assert "CANARY-PRIVATE" not in job["out"]
    assert not (private / "okwd" / "pwned").exists()


def test_a_hidden_name_behind_a_swapped_parent_is_not_reached(fast: Gateway, project: Path, private: Path) -> None:
    """The same with a credential directory's name (.ssh) as the working directory's last
    component, in the fast lane: never the private one."""
    t = tokens(fast, ("bot1", "alice"))
    parent = project / "q"
    (parent / ".ssh").mkdir(parents=True)
    for d in (parent, parent / ".ssh"):
        d.chmod(0o777)
    r = submit(fast, t["bot1"], {"command": "echo x > note.txt", "workdir": str(parent / ".ssh"), "lane": "fast",
                                 "walltime": "1m"})
    assert r.status_code == 201, r.text
    os.rename(parent, project / "q-old")
    (project / "q").symlink_to(private)
    job = finish(fast, t["bot1"], r.json()["id"])
    assert job["state"] == "FAILED", job
    assert not (private / ".ssh" / "note.txt").exists()


def test_a_directory_under_a_parent_the_identity_cannot_enter(fast: Gateway, private: Path) -> None:
    """No link at all: a world-writable directory under root's closed one. Root could
    open it; the job's identity cannot, so the job never works there (refused at submit,
    or failed saying why)."""
    t = tokens(fast, ("bot1", "alice"))
    for lane in ("fast", "batch"):
        r = submit(fast, t["bot1"], {"command": "echo x > pwned; cat ../ledger.txt", "workdir": str(private / "okwd"),
                                     "lane": lane, "walltime": "1m"})
        if r.status_code == 201:
            job = finish(fast, t["bot1"], r.json()["id"])
            assert job["state"] == "FAILED", (lane, job)
            assert "CANARY-PRIVATE" not in job["out"]
        else:
            assert r.status_code == 400, r.text
        assert not (private / "okwd" / "pwned").exists(), lane


# -- F9 --------------------------------------------------------------------------------


def test_no_other_user_reads_a_fast_tasks_output_or_script(fast: Gateway, project: Path) -> None:
    """The review's F9: a fast-lane task echoing a token; another local user (nobody)
    then tries `cat fastlane/*/N.out`, the task's script and the pool's journal."""
    t = tokens(fast, ("bot1", "alice"))
    out = run(fast, t["bot1"], {"command": "echo HF_TOKEN=hf_SECRET_F9", "lane": "fast", "workdir": str(project)})
    assert out["state"] == "COMPLETED" and "HF_TOKEN" in out["out"], out  # the guard redacts what corral returns
    scripted = run(fast, t["bot1"], {"script": "#!/bin/bash\nexport WANDB_API_KEY=wandb_SECRET_F9\necho scripted",
                                     "lane": "fast", "workdir": str(project)})
    assert scripted["state"] == "COMPLETED" and "scripted" in scripted["out"], scripted
    home = fast.home.resolve()
    slug = out["backend_id"].split(":")[1]
    pool = home / "fastlane" / slug
    assert "hf_SECRET_F9" in (pool / f"{out['id']}.out").read_text()  # raw, where the review found it
    for cmd in (f"cat {home}/fastlane/*/{out['id']}.out", f"cat {pool}/{out['id']}.out",
                f"cat {pool}/{scripted['id']}.sh", f"cat {pool}/journals/*", f"ls {pool}", f"ls {home}/fastlane"):
        got = as_nobody(cmd)
        assert got.returncode != 0 and "SECRET" not in got.stdout and slug not in got.stdout, (cmd, got)
    assert (pool / f"{out['id']}.out").stat().st_mode & 0o077 == 0
    assert pool.stat().st_mode & 0o077 == 0


def test_a_persons_script_task_with_a_dynamic_identity_still_runs(fast: Gateway, project: Path) -> None:
    """A person without a Unix user runs uncontained as its dynamic identity, which cannot
    enter the pool's closed directory: its script reaches it as a descriptor."""
    with fast.http() as h:
        assert h.post("/v1/principals", json={"name": "erin", "kind": "human"}).status_code == 201
        tok = h.post("/v1/tokens", json={"for": "erin", "expires": "1h"}).json()["token"]
    for script in ("#!/bin/bash\necho shebang; id -u", "echo plain; id -u"):
        for wd in (None, str(project)):
            body: dict[str, Any] = {"script": script, "lane": "fast", **({"workdir": wd} if wd else {})}
            job = run(fast, tok, body)
            assert job["state"] == "COMPLETED", (body, job)
            words = job["out"].split()
            assert words[0] in ("shebang", "plain") and DYNAMIC[0] <= int(words[1]) <= DYNAMIC[1], job


def test_a_link_planted_in_a_pool_directory_is_not_written_through(person: pwd.struct_passwd, fast: Gateway,
                                                                    tmp_path: Path) -> None:
    """A pool of a person's Unix user has a directory that user owns, where the root
    gateway writes each task's script. The person plants the next task's script name as
    a link to a root-only file: the gateway replaces the link, never writes, chmods or
    chowns through it."""
    target = tmp_path / "root-only"
    target.write_text("ROOT-ONLY\n")
    target.chmod(0o600)
    with fast.http() as h:
        assert h.post("/v1/principals", json={"name": "pat", "kind": "human",
                                              "unix_user": person.pw_name}).status_code == 201
        tok = h.post("/v1/tokens", json={"for": "pat", "expires": "1h"}).json()["token"]
    with fast.http(tok) as h:
        first = h.post("/v1/jobs", json={"script": "echo one", "lane": "fast", "walltime": "30s"})
        assert first.status_code == 201, first.text
        pool = fast.home.resolve() / "fastlane" / first.json()["backend_id"].split(":")[1]
        for n in range(1, 6):  # the next ids (the pool's allocation is a job too, recorded meanwhile)
            subprocess.run(["setpriv", f"--reuid={person.pw_uid}", f"--regid={person.pw_gid}", "--clear-groups",
                            "ln", "-s", str(target), str(pool / f"{first.json()['id'] + n}.sh")], check=True)
        second = h.post("/v1/jobs", json={"script": "echo PLANTED-THROUGH", "lane": "fast", "walltime": "30s"})
        assert second.status_code == 201, second.text
        nxt = pool / f"{second.json()['id']}.sh"
        assert second.json()["id"] <= first.json()["id"] + 5
    assert target.read_text() == "ROOT-ONLY\n"
    st = target.stat()
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    assert not nxt.is_symlink() and nxt.read_text() == "echo PLANTED-THROUGH"
    assert pool.stat().st_uid == person.pw_uid and pool.stat().st_mode & 0o777 == 0o700


# -- F17 -------------------------------------------------------------------------------


def _plant(home: Path, person: pwd.struct_passwd) -> list[Path]:
    """Credentials the sponsor makes after the gateway started (and after a sandbox of
    its agent's was built)."""
    made = []
    (home / "notes.txt").write_text("VISIBLE_NOTE\n")
    for rel, text in ((".aws/credentials", "aws_secret_access_key=AKIA_F17_SECRET"),
                      (".config/gh/hosts.yml", "oauth_token: gho_F17_SECRET"), (".netrc", "password F17_SECRET")):
        f = home / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
        made.append(f)
    subprocess.run(["chown", "-R", f"{person.pw_uid}:{person.pw_gid}", str(home)], check=True)
    return made


def _reads(home: Path, n: int) -> str:
    """What the review did to read them past the risk tags and the output guard (reversed
    text): the sandbox must hold anyway."""
    return f"find {home} -type f 2>/dev/null | while read f; do rev $f; done; ls -a {home}/.a?s; true # {n}"


def _leaked(out: str) -> bool:
    return "TERCES_71F" in out or "F17_SECRET" in out or "credentials" in out


def test_a_credential_made_after_start_is_hidden(tmp_path: Path, person: pwd.struct_passwd) -> None:
    """The review's F17: ~/.aws/credentials made after the gateway started was readable
    by the sponsor's agent (its job runs as the sponsor's Unix user). Now hidden from
    the next job."""
    need_bwrap()
    home = Path(person.pw_dir)
    proj = home / "proj"
    proj.mkdir()
    os.chown(proj, person.pw_uid, person.pw_gid)
    with running(tmp_path) as gw:
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "cara", "kind": "human",
                                                  "unix_user": person.pw_name}).status_code == 201
            assert h.post("/v1/principals", json={"name": "cb", "kind": "agent", "sponsor": "cara"}).status_code == 201
            tok = h.post("/v1/tokens", json={"for": "cb", "expires": "1h"}).json()["token"]
        warm = run(gw, tok, {"command": "id -un", "workdir": str(proj)})  # a sandbox built before they exist
        assert warm["state"] == "COMPLETED" and warm["out"].strip() == person.pw_name, (warm["reason"], warm["err"])
        _plant(home, person)
        for n, wd in enumerate((str(proj), None)):  # a built sandbox (a working directory), and one built alone
            job = run(gw, tok, {"command": _reads(home, n), **({"workdir": wd} if wd else {})})
            assert job["state"] == "COMPLETED" and not _leaked(job["out"]), (wd, job)
            assert "ETON_ELBISIV" in job["out"], job  # its home is read: what is missing was hidden


def test_a_fast_lane_sandbox_built_before_a_credential_is_not_reused(tmp_path: Path,
                                                                      person: pwd.struct_passwd) -> None:
    """The same in a fast-lane worker (the launcher and its built sandboxes, run as root
    as a root pool's worker is): a sandbox built before the credential appeared is not
    used for the next task of its key; a new one hides it."""
    from corral.lanes.fast.launcher import Launcher, Slots
    from corral.sandbox.bwrap import build

    need_bwrap()
    home = Path(person.pw_dir)
    proj = home / "proj"
    proj.mkdir()
    os.chown(proj, person.pw_uid, person.pw_gid)
    box = build(["agent"], [], False, "nobody", [tmp_path], pids_max=64)
    assert box.why_not is None, box.why_not
    la = Launcher(Slots(4, 4000), sandbox=box)

    def spec(jid: int, command: str) -> dict[str, Any]:
        return {"job_id": jid, "command": command, "cpus": 1, "memory_mb": 200, "gpus": 0, "walltime_s": 60,
                "env": {"PATH": "/usr/bin:/bin", "HOME": str(home)}, "dir": str(tmp_path), "workdir": str(proj),
                "contain": {"kind": "agent", "user": person.pw_name, "principal": "cb",
                            "ident": [person.pw_uid, person.pw_gid], "readable": []}}

    try:
        first = la.run_batch([spec(1, "id -un")])[0]
        assert first["state"] == "COMPLETED" and (tmp_path / "1.out").read_text().strip() == person.pw_name, first
        _plant(home, person)
        second = la.run_batch([spec(2, _reads(home, 2))])[0]
        text = (tmp_path / "2.out").read_text()
        assert second["state"] == "COMPLETED" and not _leaked(text) and "ETON_ELBISIV" in text, (second, text)
    finally:
        la.kill_all()


# -- F18 -------------------------------------------------------------------------------


def test_two_installs_on_one_machine_never_share_a_dynamic_uid(tmp_path: Path, project: Path) -> None:
    """The review's F18: three homes gave 61184 to different principals, and one read
    another's 0600 file. Two gateways here, one machine record: each principal its own
    uid, and bot1's private file stays bot1's."""
    need_bwrap()
    registry = tmp_path / "machine" / "uids"
    registry.parent.mkdir(mode=0o700)
    env = {"CORRAL_SANDBOX__UID_REGISTRY": str(registry)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    uids: dict[str, int] = {}
    with running(tmp_path / "a", **env) as a, running(tmp_path / "b", **env) as b:
        ta = tokens(a, ("bot1", "halice"))
        tb = tokens(b, ("vbot", "hvictor"), ("vbot2", "hvictor"))
        job = run(a, ta["bot1"], {"command": "id -u; echo SECRET-F18 > mine.txt; chmod 600 mine.txt",
                                  "workdir": str(project)})
        assert job["state"] == "COMPLETED", job
        uids["bot1"] = int(job["out"].split()[0])
        for name in ("vbot", "vbot2"):
            job = run(b, tb[name], {"command": f"id -u; cat mine.txt; echo {name} > mine.txt",
                                    "workdir": str(project)})
            uids[name] = int(job["out"].split()[0])
            assert "SECRET-F18" not in job["out"], job
        assert len(set(uids.values())) == 3 and all(DYNAMIC[0] <= u <= DYNAMIC[1] for u in uids.values()), uids
        assert (project / "mine.txt").read_text() == "SECRET-F18\n"
    record = json.loads(registry.read_text())["uids"]
    assert {int(u) for u in record} >= set(uids.values()), record
    assert registry.stat().st_mode & 0o077 == 0 and registry.stat().st_uid == 0


def test_an_install_whose_old_record_collides_is_refused(tmp_path: Path, project: Path) -> None:
    """Homes that handed out uids before the machine's record existed: the first to run a
    principal claims its uid; the other install's principal with the same uid is refused
    (400, saying what the admin must do), never run as someone else's uid."""
    need_bwrap()
    registry = tmp_path / "machine" / "uids"
    registry.parent.mkdir(mode=0o700)
    env = {"CORRAL_SANDBOX__UID_REGISTRY": str(registry)}
    homes = [tmp_path / "a" / "home", tmp_path / "b" / "home"]
    for h in homes:
        h.parent.mkdir()
    homes[1].mkdir()
    with running(tmp_path / "a", **env) as a:
        ta = tokens(a, ("bot1", "halice"))
        first = run(a, ta["bot1"], {"command": "id -u", "workdir": str(project)})
        assert first["state"] == "COMPLETED", first
        taken = int(first["out"].split()[0])
    # The old record claims the same uid for another principal only if bot1 got it.
    (homes[1] / "identities.json").write_text(json.dumps({"next": taken + 1, "uids": {"vbot": taken}}))
    gw = Gateway(homes[1], 0, extra_env=env)
    from .conftest import free_port

    gw.port = free_port()
    gw.start()
    try:
        tb = tokens(gw, ("vbot", "hvictor"))
        r = submit(gw, tb["vbot"], {"command": "id -u", "workdir": str(project)})
        assert r.status_code == 400 and str(taken) in r.json()["error"]["message"], r.text
        assert r.json()["error"].get("hint"), r.text
    finally:
        gw.kill(15)


def test_a_uid_a_user_or_group_holds_is_skipped(tmp_path: Path, project: Path) -> None:
    """A uid that a group (gid = uid for a dynamic identity) or a user of the system has is
    never handed out, whatever the records say."""
    need_bwrap()
    registry = tmp_path / "machine" / "uids"
    registry.parent.mkdir(mode=0o700)
    low = DYNAMIC[0] + 4000
    name = f"corralg{os.getpid() % 100000}"
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["groupadd", "-g", str(low), name], check=True, capture_output=True)
    try:
        with running(tmp_path, CORRAL_SANDBOX__UID_REGISTRY=str(registry),
                     CORRAL_SANDBOX__DYNAMIC_UIDS=json.dumps([low, low + 10])) as gw:
            t = tokens(gw, ("bot1", "halice"))
            job = run(gw, t["bot1"], {"command": "id -u", "workdir": str(project)})
            assert job["state"] == "COMPLETED", job
            assert int(job["out"].split()[0]) == low + 1, job
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def test_a_batch_script_binds_its_working_directory_by_descriptor(tmp_path: Path, project: Path,
                                                                   private: Path) -> None:
    """What a batch script (Slurm's job.sh) runs: ``opendir.command`` before the wrapped
    command opens the directory at fd 7 as the job's identity, without following links,
    and bwrap binds that descriptor. A link in place of the directory or a parent stops
    it before bwrap starts (exit 125, saying why); a parent closed to the identity too."""
    from corral.sandbox import opendir
    from corral.sandbox.bwrap import build

    need_bwrap()
    box = build(["agent"], [], False, "nobody", [tmp_path], pids_max=64)
    assert box.why_not is None, box.why_not
    who = opendir.identity(DYNAMIC[0] + 4321, DYNAMIC[0] + 4321)
    work = project / "p" / "w"
    work.mkdir(parents=True)
    for d in (work.parent, work):
        d.chmod(0o777)

    def go(path: Path) -> subprocess.CompletedProcess[str]:
        argv = opendir.command(7, str(path), who) + box.wrap("agent", ["sh", "-c", "id -u; pwd; echo x > made"],
                                                             str(path), ident=who[:2], cwd_fd=7)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    ok = go(work)
    assert ok.returncode == 0 and ok.stdout.split() == [str(who[0]), str(work)], ok
    assert (work / "made").stat().st_uid == who[0]
    os.rename(work.parent, project / "p-old")
    (project / "p").symlink_to(private)
    (private / "w").mkdir()
    (private / "w").chmod(0o777)
    for path in (work, private / "w"):  # a parent swapped for a link; a parent closed to it
        bad = go(path)
        assert bad.returncode == 125 and "working directory" in bad.stderr, bad
        assert not (private / "w" / "made").exists()


def test_a_hidden_directory_made_again_after_a_cleaner_is_still_hidden(tmp_path: Path) -> None:
    """corral's node-local scratch can be removed by a cleaner (systemd-tmpfiles, another
    test session) and is made again when a job needs it. A sandbox whose hidden list was
    first worked out while it was missing still builds, and still hides it."""
    from corral.sandbox.bwrap import build

    need_bwrap()
    scratch = Path(tempfile.mkdtemp(prefix="corral-scr-", dir="/var/tmp"))
    try:
        (scratch / "workspaces").mkdir()
        box = build(["agent"], [], False, "nobody", [scratch / "workspaces"], pids_max=64)
        assert box.why_not is None, box.why_not
        shutil.rmtree(scratch / "workspaces")
        ident = (DYNAMIC[0] + 4444, DYNAMIC[0] + 4444)  # an identity with no home: a list not made before
        box.wrap("agent", ["true"], "/tmp", ident=ident)  # worked out now, while it is missing
        (scratch / "workspaces").mkdir()
        (scratch / "workspaces" / "canary").write_text("SCRATCH-CANARY\n")
        (scratch / "workspaces").chmod(0o755)
        (scratch / "workspaces" / "canary").chmod(0o644)
        r = subprocess.run(box.wrap("agent", ["sh", "-c", f"cat {scratch}/workspaces/canary; echo ran"], "/tmp",
                                    ident=ident),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "ran" in r.stdout and "SCRATCH-CANARY" not in r.stdout, r
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_workdir_under_a_closed_parent_answers_alike_whether_it_exists_or_not(fast: Gateway, private: Path) -> None:
    """issue 47 review: the preflight, run by root, answered "does not exist" for a path
    the caller's identity cannot look into and "not writable" for one that is there: a
    way to map root's closed directories. Both now get one answer, naming the parent."""
    t = tokens(fast, ("bot1", "alice"))
    said = {}
    for name in ("okwd", "no-such-dir", "ledger.txt"):
        r = submit(fast, t["bot1"], {"command": "true", "workdir": str(private / name)})
        assert r.status_code == 400, r.text
        said[name] = r.json()["error"]["message"].replace(str(private / name), "WD")
    assert said["okwd"] == said["no-such-dir"] == said["ledger.txt"], said
    assert f"lies under {private}, which that identity may not enter" in said["okwd"], said
    with fast.http(t["bot1"]) as h:  # plan_job and advice answer as submit does
        for name in ("okwd", "no-such-dir"):
            r = h.post("/v1/plan", json={"command": "true", "workdir": str(private / name)})
            assert "does not exist" not in r.text and "may not enter" in r.text, r.text
    # A link the caller planted in an open directory, pointing into the closed one, probes
    # nothing either: the walk follows it as the kernel would for the job's identity.
    links = Path(tempfile.mkdtemp(prefix="corral-links-", dir="/tmp"))
    try:
        links.chmod(0o777)
        for name in ("okwd", "no-such-dir"):
            (links / name).symlink_to(private / name)
            r = submit(fast, t["bot1"], {"command": "true", "workdir": str(links / name)})
            assert r.status_code == 400, r.text
            said[f"link-{name}"] = r.json()["error"]["message"].replace(str(links / name), "WD")
        assert said["link-okwd"] == said["link-no-such-dir"] == said["okwd"], said
    finally:
        shutil.rmtree(links, ignore_errors=True)
