"""The privileged submitter (corral/lanes/slurm/privsep_submit.py, decision 0021): a gateway run as
a service account submits each principal's Slurm job as that principal's Unix user
through one sudo rule, on the private Slurm, and the helper holds against a compromised
gateway account and against what jobs leave behind.

Each test installs the helper with scripts/privsep-up into a root-owned directory of its
own, writes its configuration and a sudoers rule for its own service account into
/etc/sudoers.d/, and removes them after. Every refusal is checked to leave no trace: no
Slurm job, no directory changed hands, nothing outside written."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from .conftest import SHARED_TURN, free_port
from .slurm_env import slurm_conf

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                 reason="installs a sudo rule and makes Unix users (CI runs as root)"),
              pytest.mark.usefixtures("slurm_turn"), SHARED_TURN]  # users and jobs of its own


def need_sudo() -> None:
    if shutil.which("sudo") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("sudo is required under CI; make test runs scripts/privsep-up --sudo-only first")
        pytest.skip("no sudo here: run scripts/privsep-up --sudo-only (as root)")


def useradd(name: str, *extra: str) -> pwd.struct_passwd:
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/tmp/{name}", *extra, name], check=True,
                   capture_output=True)
    os.chmod(f"/tmp/{name}", 0o711)  # its jobs' users reach corral's job directories under it by name
    return pwd.getpwnam(name)


@dataclass
class Site:
    svc: pwd.struct_passwd
    alice: pwd.struct_passwd
    carol: pwd.struct_passwd
    system: pwd.struct_passwd
    helper: str
    conf_dir: Path
    jobs: Path
    slurm_conf: str
    base: int
    """Job ids of this test run (other gateways on the shared Slurm name jobs corral-1, ...)."""

    def jid(self, n: int) -> str:
        return str(self.base + n)

    def call(self, *args: str, script: bytes | None = None, who: pwd.struct_passwd | None = None,
             env: dict[str, str] | None = None, cwd: str | None = None, sudo: tuple[str, ...] = ()) -> subprocess.CompletedProcess[bytes]:
        """The helper through sudo, run by the service account (or ``who``)."""
        u = who or self.svc
        return subprocess.run(["sudo", "-n", *sudo, self.helper, *args], input=script or b"", capture_output=True,
                              user=u.pw_uid, group=u.pw_gid, extra_groups=[], cwd=cwd or u.pw_dir,
                              env={"PATH": "/usr/bin:/bin", "HOME": u.pw_dir, **(env or {})}, timeout=90)

    def audit(self) -> list[dict[str, object]]:
        path = self.conf_dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def job_dir(self, job: str, run: bool = True) -> Path:
        """A job directory as the gateway makes it (its own, 0711), with out.new laid out
        (empty output files, the gateway's, 0600, in a 0700 directory)."""
        d = self.jobs / job
        d.mkdir(mode=0o711)
        os.chown(d, self.svc.pw_uid, self.svc.pw_gid)
        if run:
            (d / "out.new").mkdir(mode=0o700)
            for f in ("stdout", "stderr"):
                (d / "out.new" / f).touch(mode=0o600)
            for p in (d / "out.new", d / "out.new" / "stdout", d / "out.new" / "stderr"):
                os.chown(p, self.svc.pw_uid, self.svc.pw_gid)
        return d

    def hand(self, job: str, uid: int) -> subprocess.CompletedProcess[bytes]:
        """prepare, then out.new renamed into place, as the gateway does."""
        r = self.call("prepare", job, str(uid))
        if r.returncode == 0:
            (self.jobs / job / "out.new").rename(self.jobs / job / "out")
        return r


@pytest.fixture
def site() -> Iterator[Site]:
    need_sudo()
    conf = slurm_conf()
    tag = str(os.getpid() % 100000)
    names = [f"csvc{tag}", f"calice{tag}", f"ccarol{tag}", f"csys{tag}"]
    conf_dir = Path(tempfile.mkdtemp(prefix="corral-submitter-", dir="/tmp"))
    conf_dir.chmod(0o755)
    rule = Path(f"/etc/sudoers.d/corral-test-{tag}")
    try:
        svc, alice, carol = (useradd(n) for n in names[:3])
        system = useradd(names[3], "--system")
        jobs = Path(svc.pw_dir) / "state" / "slurm" / "jobs"
        jobs.mkdir(parents=True)
        for p in (jobs.parent.parent, jobs.parent, jobs):
            os.chown(p, svc.pw_uid, svc.pw_gid)
            p.chmod(0o711 if p == jobs.parent.parent else 0o755)
        helper = conf_dir / "corral-submit"
        subprocess.run([str(ROOT / "scripts" / "privsep-up"), "--dest", str(helper), "--config",
                        str(conf_dir / "submit.toml"), "--gateway", svc.pw_name], check=True, capture_output=True)
        (conf_dir / "submit.toml").write_text(
            f'gateway = "{svc.pw_name}"\njobs_dir = "{jobs}"\nslurm_conf = "{conf}"\n'
            f'log = "{conf_dir}/audit.log"\n')
        # the exact line README gives, for this test's account and helper; checked by visudo first
        text = f"{svc.pw_name} ALL=(root) NOPASSWD: {helper}\n"
        draft = conf_dir / "sudoers"
        draft.write_text(text)
        draft.chmod(0o440)
        subprocess.run(["visudo", "-cf", str(draft)], check=True, capture_output=True)
        shutil.move(draft, rule)
        yield Site(svc, alice, carol, system, str(helper), conf_dir, jobs, conf, 10**9 + int(tag) * 100)
    finally:
        rule.unlink(missing_ok=True)
        env = {**os.environ, "SLURM_CONF": conf}
        for n in names:
            subprocess.run(["scancel", "-u", n], env=env, capture_output=True)
            subprocess.run(["pkill", "-u", n], capture_output=True)
        time.sleep(0.3)
        for n in names:
            subprocess.run(["userdel", "-r", n], capture_output=True)
            shutil.rmtree(f"/tmp/{n}", ignore_errors=True)
        shutil.rmtree(conf_dir, ignore_errors=True)


def slurm_jobs(site: Site, name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-n", name, "-o", "%i"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": site.slurm_conf}).stdout
    return out.split()


def wait_done(site: Site, jid: str, within: float = 90) -> dict[str, str]:
    """Slurm's own record of a job once it ended (slurmctld's: accounting may hold a job
    without its user for a moment): state, user, uid, group."""
    env = {**os.environ, "SLURM_CONF": site.slurm_conf}
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", "-o", jid], capture_output=True, text=True, env=env).stdout
        kv = dict(w.split("=", 1) for w in out.split() if "=" in w)
        if kv.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"):
            user, _, uid = kv["UserId"].rstrip(")").partition("(")
            return {"state": kv["JobState"], "user": user, "uid": uid, "group": kv["GroupId"].partition("(")[0]}
        time.sleep(0.5)
    raise AssertionError(f"Slurm job {jid} did not end within {within} s")


SCRIPT = b"#!/bin/bash\n#SBATCH --uid=0\n#SBATCH --gid=0\n#SBATCH --priority=4000000\nid -u; id -g; echo made > made.txt\n"
OPTS = ("--job-name=corral-{job}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=100M", "--time=00:01:00")


def test_submits_as_the_user_and_script_directives_cannot_change_it(site: Site) -> None:
    """prepare hands out.new (then out) to the user with the gateway's group; submit runs as the user
    whatever #SBATCH lines the script holds (--uid=0, --gid=0, --priority are fenced off);
    what the job writes is the user's, readable by the gateway's group."""
    d = site.job_dir(J := site.jid(11))
    assert site.hand(J, site.alice.pw_uid).returncode == 0
    for f, mode in (("", 0o2770), ("stdout", 0o640), ("stderr", 0o640)):
        st = (d / "out" / f).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (site.alice.pw_uid, site.svc.pw_gid, mode), f
    r = site.call("submit", J, str(site.alice.pw_uid), *(o.format(job=J) for o in OPTS),
                  f"--chdir={d / 'out'}", f"--comment=corral_job={J} principal=alice kind=human", script=SCRIPT)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.decode().strip()
    done = wait_done(site, jid)
    assert done == {"state": "COMPLETED", "user": site.alice.pw_name, "uid": str(site.alice.pw_uid),
                    "group": site.alice.pw_name}, done
    out = d / "out" / "stdout"
    assert out.read_text().split() == [str(site.alice.pw_uid), str(site.alice.pw_gid)]
    for f in (out, d / "out" / "made.txt"):
        st = f.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (site.alice.pw_uid, site.svc.pw_gid, 0o640), f
    # the gateway (its group) reads them without root
    r = subprocess.run(["cat", str(out)], user=site.svc.pw_uid, group=site.svc.pw_gid, extra_groups=[],
                       capture_output=True)
    assert r.returncode == 0 and r.stdout.split()[0] == str(site.alice.pw_uid).encode()
    assert site.audit()[-1]["result"] == "submitted" and site.audit()[-1]["uid"] == site.alice.pw_uid


@pytest.mark.parametrize("uid", ["0", "root", "-1", "1e3", "01000", " 1000", "59999"])
def test_a_forged_or_privileged_uid_is_refused(site: Site, uid: str) -> None:
    d = site.job_dir(J := site.jid(12))
    for verb in ("prepare", "submit"):
        r = site.call(verb, J, uid, *(o.format(job=J) for o in OPTS), script=SCRIPT)
        assert r.returncode == 2 and b"refused" in r.stderr, r.stderr
    assert (d / "out.new").stat().st_uid == site.svc.pw_uid and not slurm_jobs(site, f"corral-{J}")


def test_system_accounts_and_users_outside_the_allowed_set_are_refused(site: Site) -> None:
    """Below UID_MIN (a --system account) whatever the configuration says; outside the
    configured range; outside the configured group."""
    d = site.job_dir(J := site.jid(13))
    r = site.call("prepare", J, str(site.system.pw_uid))
    assert r.returncode == 2 and b"outside the allowed range" in r.stderr, r.stderr
    cfg = site.conf_dir / "submit.toml"
    base = cfg.read_text()
    cfg.write_text(base + "uids = [0, 60000]\n")  # a range reaching root: still never below UID_MIN
    assert site.call("prepare", J, str(site.system.pw_uid)).returncode == 2
    assert site.call("prepare", J, "0").returncode == 2
    cfg.write_text(base + f"uids = [{site.carol.pw_uid}, {site.carol.pw_uid}]\n")
    assert site.call("prepare", J, str(site.alice.pw_uid)).returncode == 2
    cfg.write_text(base + f'group = "{site.carol.pw_name}"\n')
    r = site.call("prepare", J, str(site.alice.pw_uid))
    assert r.returncode == 2 and b"not a member" in r.stderr, r.stderr
    assert (d / "out.new").stat().st_uid == site.svc.pw_uid
    cfg.write_text(base)
    # out/ is read by the gateway's group: a group shared with anyone else is refused
    subprocess.run(["gpasswd", "-a", site.carol.pw_name, site.svc.pw_name], check=True, capture_output=True)
    r = site.call("prepare", J, str(site.carol.pw_uid))
    assert r.returncode == 2 and b"group of its own" in r.stderr, r.stderr
    subprocess.run(["gpasswd", "-d", site.carol.pw_name, site.svc.pw_name], check=True, capture_output=True)
    cfg.write_text(base + f'group = "{site.carol.pw_name}"\n')
    assert site.call("prepare", J, str(site.carol.pw_uid)).returncode == 0
    assert (d / "out.new").stat().st_uid == site.carol.pw_uid


def test_a_user_whose_primary_group_is_roots_is_refused(site: Site) -> None:
    """A uid in the allowed range whose primary group is gid 0 would run its job in root's
    group: refused by the helper whatever the gateway asks (the gateway refuses it too)."""
    d = site.job_dir(J := site.jid(14))
    subprocess.run(["usermod", "-g", "0", site.carol.pw_name], check=True, capture_output=True)
    try:
        r = site.call("prepare", J, str(site.carol.pw_uid))
        assert r.returncode == 2 and b"gid 0 (root's group)" in r.stderr, r.stderr
        assert (d / "out.new").stat().st_uid == site.svc.pw_uid
    finally:
        subprocess.run(["usermod", "-g", site.carol.pw_name, site.carol.pw_name], check=True, capture_output=True)
    assert site.call("prepare", J, str(site.carol.pw_uid)).returncode == 0


@pytest.mark.parametrize("bad", [
    "--uid=0", "--gid=0", "--priority=4000000", "--nice=-10000", "--export=ALL,LD_PRELOAD=/tmp/x.so",
    "--output=/etc/corral-pwned", "--get-user-env", "--wrap=id", "job.sh", "--comment=a\nb", "--chdir=/tmp/%u",
    "--time=00:01:00", "--partition=debug --uid=0", "--dependency=afterok:1;id", "--account=a b", "-u0",
])
def test_sbatch_options_outside_the_allow_list_are_refused(site: Site, bad: str) -> None:
    """Argument injection: only corral's own options, once each, with values of their own
    pattern (--time appears twice here: OPTS has it)."""
    d = site.job_dir(J := site.jid(14))
    assert site.hand(J, site.alice.pw_uid).returncode == 0
    r = site.call("submit", J, str(site.alice.pw_uid), *(o.format(job=J) for o in OPTS), bad, script=SCRIPT)
    assert r.returncode == 2 and b"refused" in r.stderr, (bad, r.stderr)
    assert not slurm_jobs(site, f"corral-{J}") and not Path("/etc/corral-pwned").exists()
    assert (d / "out" / "stdout").stat().st_size == 0
    assert site.audit()[-1]["result"].startswith("refused")  # type: ignore[union-attr]


@pytest.mark.parametrize("script", [b"#!/bin/sh\nid\n", b"id\n", b"#!/bin/bash\nid\0\n", b"#!/bin/bash\r\nid\n",
                                    b"#!/bin/bash\n" + b"#" * (4 << 20)])
def test_scripts_it_does_not_take(site: Site, script: bytes) -> None:
    site.job_dir(J := site.jid(15))
    assert site.hand(J, site.alice.pw_uid).returncode == 0
    r = site.call("submit", J, str(site.alice.pw_uid), *(o.format(job=J) for o in OPTS), script=script)
    assert r.returncode == 2 and b"refused" in r.stderr, r.stderr
    assert not slurm_jobs(site, f"corral-{J}")


def test_links_and_foreign_directories_are_never_followed_or_handed(site: Site, tmp_path: Path) -> None:
    """Symlink swaps in the gateway's tree: the job directory, out.new, the jobs directory
    itself; an out.new holding what the gateway never lays out (a planted file, a hard
    link to root's file, a link), another user's, or a job directory others may
    write; job ids that are paths. Root's and another user's directories stay theirs."""
    uid = str(site.alice.pw_uid)
    victim = Path(tempfile.mkdtemp(prefix="corral-victim-", dir="/tmp"))  # root's
    carols = Path(site.carol.pw_dir) / "project"
    carols.mkdir()
    os.chown(carols, site.carol.pw_uid, site.carol.pw_gid)
    before = {p: p.stat() for p in (victim, Path("/etc"), carols, site.conf_dir / "submit.toml")}
    try:
        def refused(job: str) -> None:
            r = site.call("prepare", job, uid)
            assert r.returncode == 2 and b"refused" in r.stderr, (job, r.stderr)

        for job, target in (("21", victim), ("22", Path("/etc")), ("23", carols)):
            d = site.job_dir(job, run=False)
            os.symlink(target, d / "out.new")  # out.new swapped for a link
            os.lchown(d / "out.new", site.svc.pw_uid, site.svc.pw_gid)
            refused(job)
        os.symlink(victim, site.jobs / "24")  # the job directory itself a link
        refused("24")
        for job in ("../24", "24/out.new", "0", "-1", "abc", ""):
            refused(job)
        d = site.job_dir("25")
        (d / "out.new" / "planted").write_text("x")  # what the gateway never lays out
        d = site.job_dir("29")
        os.link(site.conf_dir / "submit.toml", d / "out.new" / "env.json")  # a hard link to root's file
        refused("29")
        d = site.job_dir("30")
        (d / "out.new" / "stdout").unlink()
        os.symlink("/etc/shadow", d / "out.new" / "stdout")  # a link inside
        refused("30")
        refused("25")
        d = site.job_dir("26")
        os.chown(d / "out.new", site.carol.pw_uid, site.carol.pw_gid)  # another user's
        refused("26")
        d = site.job_dir("27")
        d.chmod(0o777)  # a job directory anyone could swap out.new in
        refused("27")
        # the jobs directory replaced by a link to a copy the gateway controls
        site.job_dir("28")
        real = site.jobs.with_name("jobs.real")
        site.jobs.rename(real)
        os.symlink(real, site.jobs)
        try:
            refused("28")
        finally:
            site.jobs.unlink()
            real.rename(site.jobs)
        for path, st in before.items():
            now = path.stat()
            assert (now.st_uid, now.st_gid, now.st_mode) == (st.st_uid, st.st_gid, st.st_mode), path
        assert site.call("prepare", "28", uid).returncode == 0  # the same, without the links: served
    finally:
        shutil.rmtree(victim, ignore_errors=True)


def test_only_the_gateway_account_through_sudo_and_nothing_from_its_environment(site: Site, tmp_path: Path) -> None:
    """Another account, even one a (mistaken) sudo rule lets run it, is refused; sudo
    passes no environment (PYTHONPATH, LD_PRELOAD, SLURM_CONF); a module planted in the
    caller's directory is never imported (python3 -IS); run without sudo, it refuses."""
    extra = Path(f"/etc/sudoers.d/corral-test-{os.getpid() % 100000}-carol")
    extra.write_text(f"{site.carol.pw_name} ALL=(root) NOPASSWD: {site.helper}\n")
    extra.chmod(0o440)
    try:
        r = site.call("check", who=site.carol)
        assert r.returncode == 2 and b"only" in r.stderr, r.stderr
    finally:
        extra.unlink()
    canary = Path(site.svc.pw_dir) / "imported"
    for mod in ("tomllib", "json", "pwd", "subprocess"):
        (Path(site.svc.pw_dir) / f"{mod}.py").write_text(f"open({str(canary)!r}, 'w').write('x')\n")
    r = site.call("check", cwd=site.svc.pw_dir, env={"PYTHONPATH": site.svc.pw_dir, "PYTHONSTARTUP": "/dev/null",
                                                     "LD_PRELOAD": "/nonexistent.so", "SLURM_CONF": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gateway"] == site.svc.pw_name and not canary.exists()
    r = site.call("check", sudo=("PYTHONPATH=" + site.svc.pw_dir,))
    assert r.returncode != 0 and not canary.exists()  # sudo refuses to set it
    # submitted with a forged SLURM_CONF in the caller's environment: the helper's own is used
    site.job_dir(J := site.jid(31))
    assert site.hand(J, site.alice.pw_uid).returncode == 0
    r = site.call("submit", J, str(site.alice.pw_uid), *(o.format(job=J) for o in OPTS), script=SCRIPT,
                  env={"SLURM_CONF": "/nonexistent", "SBATCH_EXPORT": "NONE", "SLURM_EXPORT_ENV": "NONE"})
    assert r.returncode == 0, r.stderr
    assert wait_done(site, r.stdout.decode().strip())["user"] == site.alice.pw_name
    r = subprocess.run(["/usr/bin/python3", "-IS", site.helper, "check"], capture_output=True,
                       user=site.svc.pw_uid, group=site.svc.pw_gid)
    assert r.returncode == 2 and b"through sudo" in r.stderr
    # the configuration must be root's alone
    (site.conf_dir / "submit.toml").chmod(0o666)
    r = site.call("check")
    assert r.returncode == 2 and b"root owns" in r.stderr, r.stderr


def test_cancel_and_control_act_as_the_jobs_owner_only(site: Site) -> None:
    """A gateway cannot use the helper to cancel or hold another user's job: it runs
    scancel and scontrol as the uid it names, and Slurm checks ownership."""
    site.job_dir(J := site.jid(41))
    assert site.hand(J, site.carol.pw_uid).returncode == 0
    r = site.call("submit", J, str(site.carol.pw_uid), *(o.format(job=J) for o in OPTS), script=b"#!/bin/bash\nsleep 120\n")
    assert r.returncode == 0, r.stderr
    jid = r.stdout.decode().strip()
    assert site.call("cancel", str(site.alice.pw_uid), jid).returncode != 0  # alice's identity: not her job
    assert site.call("control", str(site.alice.pw_uid), jid, "uhold").returncode != 0
    for bad in (("cancel", "0", jid), ("cancel", str(site.carol.pw_uid), f"{jid};id"),
                ("signal", str(site.carol.pw_uid), jid, "9", "all"), ("control", str(site.carol.pw_uid), jid, "hold")):
        r = site.call(*bad)
        assert r.returncode == 2 and b"refused" in r.stderr, (bad, r.stderr)
    assert slurm_jobs(site, f"corral-{J}") == [jid]
    env = {**os.environ, "SLURM_CONF": site.slurm_conf}
    state = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True, text=True, env=env).stdout
    assert state.strip() in ("PENDING", "RUNNING"), state
    assert site.call("cancel", str(site.carol.pw_uid), jid).returncode == 0
    assert wait_done(site, jid)["state"] == "CANCELLED"


def test_a_service_account_gateway_runs_each_job_as_its_principal(site: Site) -> None:
    """The whole deployment: the gateway runs as the service account on Slurm with
    [slurm] submitter set. An agent (sponsored by alice, so alice's Unix user) and a
    person (carol) submit through the normal API with their own tokens; Slurm's record
    and the files each job writes show each job's own identity; outputs and states
    reach the gateway without root; a cancel of carol's job reaches it."""
    svc, alice, carol = site.svc, site.alice, site.carol
    alias = f"{svc.pw_name[:20]}a"  # a second passwd name for the service account's uid
    subprocess.run(["userdel", alias], capture_output=True)
    subprocess.run(["useradd", "-o", "-u", str(svc.pw_uid), "-g", str(svc.pw_gid), "--no-create-home", alias],
                   check=True, capture_output=True)
    projects = {}
    for u in (alice, carol):  # projects outside homes (the sandbox hides homes)
        p = Path(tempfile.mkdtemp(prefix=f"corral-proj-{u.pw_name}-", dir="/tmp"))
        p.chmod(0o755)
        os.chown(p, u.pw_uid, u.pw_gid)
        projects[u.pw_name] = p
    home = Path(svc.pw_dir) / "state"
    port = free_port()
    site_packages = next((ROOT / ".venv" / "lib").glob("python3*/site-packages")).resolve()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": svc.pw_dir, "CORRAL_HOME": str(home), "USER": svc.pw_name,
           "PYTHONPATH": f"{site_packages}:{ROOT}", "CORRAL_BACKEND": "slurm", "SLURM_CONF": site.slurm_conf,
           "CORRAL_SLURM__SUBMITTER": site.helper, "CORRAL_SLURM__POLL_S": "1",
           "CORRAL_FASTLANE__ENABLED": "false"}  # its workers would be the gateway's account (own_account.py)
    log = open(Path(svc.pw_dir) / "gateway.log", "ab")
    gw = subprocess.Popen(["/usr/bin/python3", "-m", "corral.edges.cli.main", "serve", "--port", str(port), "--tick", "0.2"],
                          env=env, stdout=log, stderr=log, cwd=svc.pw_dir, user=svc.pw_uid, group=svc.pw_gid,
                          extra_groups=[])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert gw.poll() is None, (Path(svc.pw_dir) / "gateway.log").read_text()
            time.sleep(0.1)
        admin = (home / "admin.token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as h:
            for body in ({"name": "alice", "kind": "human", "unix_user": alice.pw_name},
                         {"name": "carol", "kind": "human", "unix_user": carol.pw_name},
                         {"name": "bot1", "kind": "agent", "sponsor": "alice"},
                         {"name": "dave", "kind": "human"}, {"name": "bot2", "kind": "agent", "sponsor": "dave"},
                         {"name": "eve", "kind": "human", "unix_user": alias}):
                assert h.post("/v1/principals", json=body).status_code == 201
            tok = {n: h.post("/v1/tokens", json={"for": n, "expires": "1h"}).json()["token"]
                   for n in ("bot1", "carol", "dave", "bot2", "eve")}
        # issue 47: dave has no Unix user, and this gateway cannot give him a uid of his own.
        # Before, his job ran uncontained as the service account and read its admin token
        # past the output guard; now nobody's job runs as that account.
        # eve's Unix user is a second name for the service account's uid: the same account.
        for name, why in (("dave", "has no Unix user"), ("bot2", "has no Unix user"),
                          ("eve", f"its Unix user {alias} is the gateway's account")):
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok[name]}"}, timeout=90) as h:
                for cmd in (f"cat {home}/admin.token | base64 | rev", f"cat {home}/corral.db"):
                    r = h.post("/v1/jobs", json={"command": cmd, "walltime": "60s"})
                    assert r.status_code == 403, r.text
                    said = r.json()["error"]
                    assert f"no job runs as the gateway's own account '{svc.pw_name}'" in said["message"], said
                    assert why in said["message"] and "--unix-user" in said["hint"], said
        jobs = {}
        for name, user, cmd in (("bot1", alice, "id -u; echo made > made.txt; stat -c %U made.txt"),
                                ("carol", carol, "id -u; echo hers > hers.txt")):
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok[name]}"}, timeout=90) as h:
                r = h.post("/v1/jobs", json={"command": cmd, "workdir": str(projects[user.pw_name]), "walltime": "60s"})
                assert r.status_code == 201, r.text
                job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
                out = h.get(f"/v1/jobs/{job['id']}/output").json()["data"]
                err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
            assert job["state"] == "COMPLETED" and job["backend"] == "slurm", (job.get("reason"), job, out, err,
                                                                              (Path(svc.pw_dir) / "gateway.log").read_text()[-3000:])
            assert out.split() == [str(user.pw_uid)] + ([user.pw_name] if name == "bot1" else []), (out, err)
            run = home / "slurm" / "jobs" / str(job["id"]) / "out"
            assert (run / "stdout").stat().st_uid == user.pw_uid and (run.parent / "job.sh").stat().st_uid == svc.pw_uid
            jobs[name] = job
        assert (projects[alice.pw_name] / "made.txt").stat().st_uid == alice.pw_uid
        assert (projects[carol.pw_name] / "hers.txt").stat().st_uid == carol.pw_uid
        for name, user in (("bot1", alice), ("carol", carol)):
            done = wait_done(site, jobs[name]["backend_id"])
            assert (done["user"], done["uid"]) == (user.pw_name, str(user.pw_uid)), done
        scripts = list((home / "slurm" / "jobs").glob("*/job.sh"))
        assert any("bwrap" in s.read_text() for s in scripts)  # the agent's work was contained
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok['carol']}"}, timeout=90) as h:
            r = h.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(projects[carol.pw_name]),
                                         "walltime": "10m"})
            jid = r.json()["id"]
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60, "until": "RUNNING"}).json()["state"] == "RUNNING"
            assert h.post(f"/v1/jobs/{jid}/cancel").status_code in (200, 202)
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
        # carol, from her own shell, swaps her job's output for links to the gateway's admin
        # token and to /etc/shadow before reading it through the API: the gateway reads no link
        admin_token = (home / "admin.token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok['carol']}"}, timeout=90) as h:
            r = h.post("/v1/jobs", json={"command": "echo mine; echo err >&2", "workdir": str(projects[carol.pw_name]),
                                         "walltime": "60s"})
            jid = r.json()["id"]
            assert h.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
            run = home / "slurm" / "jobs" / str(jid) / "out"
            assert (run.parent / "job.sh").stat().st_mode & 0o077 == 0  # the gateway's alone
            swap = f"ln -sfn {home / 'admin.token'} {run}/stdout && ln -sfn /etc/shadow {run}/stderr"
            subprocess.run(["bash", "-c", swap], check=True, user=carol.pw_uid, group=carol.pw_gid, extra_groups=[])
            got = [h.get(f"/v1/jobs/{jid}/output", params={"stream": st}).json()["data"] for st in ("stdout", "stderr")]
        assert admin_token not in "".join(got) and "root:" not in "".join(got), got
        audit = [a for a in site.audit() if a.get("result") == "submitted"]
        assert {a["uid"] for a in audit} == {alice.pw_uid, carol.pw_uid}
    finally:
        gw.terminate()
        try:
            gw.wait(20)
        except subprocess.TimeoutExpired:
            gw.kill()
        for p in projects.values():
            shutil.rmtree(p, ignore_errors=True)
        subprocess.run(["userdel", alias], capture_output=True)


def test_a_root_gateway_reads_no_link_a_users_job_left(site: Site, tmp_path: Path) -> None:
    """The same attack on the other deployment: under a root gateway a person's Slurm job
    directory is handed to their Unix user (sbatch --uid by root), who swaps its output
    for links to /etc/shadow and to the gateway's admin token; reading the output through
    the API (the guard, run as root) follows neither."""
    from .conftest import running

    carol = site.carol
    project = Path(tempfile.mkdtemp(prefix="corral-proj-", dir="/tmp"))
    os.chown(project, carol.pw_uid, carol.pw_gid)
    try:
        with running(tmp_path, CORRAL_BACKEND="slurm", SLURM_CONF=site.slurm_conf, CORRAL_TICK_S="0.3") as gw:
            with gw.http() as h:
                assert h.post("/v1/principals", json={"name": "carol", "kind": "human",
                                                      "unix_user": carol.pw_name}).status_code == 201
                tok = h.post("/v1/tokens", json={"for": "carol", "expires": "1h"}).json()["token"]
            admin = (gw.home / "admin.token").read_text().strip()
            with gw.http(tok) as h:
                r = h.post("/v1/jobs", json={"command": "echo mine", "workdir": str(project), "walltime": "60s"})
                assert r.status_code == 201, r.text
                job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 90}).json()
                assert job["state"] == "COMPLETED", (job["reason"], h.get(f"/v1/jobs/{job['id']}/output",
                                                                          params={"stream": "stderr"}).text)
                d = gw.home / "slurm" / "jobs" / str(job["id"]) / "out"
                assert d.stat().st_uid == carol.pw_uid  # hers: the batch script ran as her
                swap = f"ln -sfn /etc/shadow {d}/stdout && ln -sfn {gw.home / 'admin.token'} {d}/stderr"
                subprocess.run(["bash", "-c", swap], check=True, user=carol.pw_uid, group=carol.pw_gid, extra_groups=[])
                got = [h.get(f"/v1/jobs/{job['id']}/output", params={"stream": s}).json()["data"]
                       for s in ("stdout", "stderr")]
        assert "root:" not in "".join(got) and admin not in "".join(got), got
    finally:
        shutil.rmtree(project, ignore_errors=True)
