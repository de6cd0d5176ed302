"""`corral doctor` on this host as an admin runs it before serving: against the private
Slurm (scripts/slurm-up) every check of a good setup passes, read-only; and each setting
broken on purpose (no such slurm.conf, a store that does not answer, a uid corral gave
that the directory now gives a person, a network address without TLS) is a FAIL saying
what to do, with exit 1; invalid settings exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import SHARED_TURN
from .slurm_env import slurm_conf

CORRAL = [sys.executable, "-m", "corral.entry"]
ROOT = Path(__file__).resolve().parent.parent


def doctor(home: Path, *args: str, toml: str = "", **env: str) -> tuple[int, dict[str, Any], str]:
    home.mkdir(exist_ok=True)
    (home / "corral.toml").write_text(toml)
    full = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    full.update({"CORRAL_HOME": str(home), "CORRAL_SANDBOX__UID_REGISTRY": str(home / "no-uids"), **env})
    r = subprocess.run([*CORRAL, "--json", "doctor", *args], env=full, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def by_check(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {f["check"]: f for f in report["findings"]}


@SHARED_TURN
def test_a_good_host_passes_against_the_private_slurm(tmp_path: Path, slurm_turn: None) -> None:
    conf = slurm_conf()
    sdiag_before = subprocess.run(["sdiag"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True)
    code, report, _ = doctor(tmp_path / "home", "--backend", "slurm", SLURM_CONF=conf)
    found = by_check(report)
    assert code == 0 and report["ok"], report
    assert found["slurm"]["status"] == "ok" and "Slurm 22." in found["slurm"]["detail"]
    assert found["accounting"]["status"] == "ok" and "job_comment" in found["accounting"]["detail"]
    assert found["munge"]["status"] == "ok" and found["clock"]["status"] == "ok"
    assert found["store"]["status"] == "ok" and found["disk"]["status"] in ("ok", "warn")
    assert found["job_submit.lua"]["status"] in ("ok", "warn")  # the private cluster runs no plugin by default
    # what agents are told of preemption (SIGUSR1, 120 s, a requeue) is what this Slurm does
    assert found["preemption"]["status"] == "ok" and "120 s" in found["preemption"]["detail"], found["preemption"]
    assert all(f["fix"] for f in report["findings"] if f["status"] in ("warn", "fail"))
    # read-only: sdiag's counters were not reset (doctor runs sdiag without -r)
    since = [x for x in sdiag_before.stdout.splitlines() if x.startswith("Data since")]
    after = subprocess.run(["sdiag"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True)
    assert since and since[0] in after.stdout


def test_a_missing_slurm_conf_fails_and_says_what_to_set(tmp_path: Path) -> None:
    code, report, _ = doctor(tmp_path / "home", "--backend", "slurm",
                             toml='[slurm]\nconf = "/nonexistent/slurm.conf"\n')
    slurm = by_check(report)["slurm"]
    assert code == 1 and not report["ok"]
    assert slurm["status"] == "fail" and "does not answer" in slurm["detail"] and "[slurm] conf" in slurm["fix"]


def test_a_store_that_does_not_answer_fails(tmp_path: Path) -> None:
    code, report, _ = doctor(tmp_path / "home", toml='[store]\nurl = "postgresql://corral:pw@127.0.0.1:1/corral"\n')
    store = by_check(report)["store"]
    assert code == 1 and store["status"] == "fail" and "does not answer" in store["detail"]
    assert ":pw@" not in store["detail"] and "[store] url" in store["fix"]


def test_a_uid_corral_gave_that_the_directory_now_gives_a_person_fails(tmp_path: Path) -> None:
    registry = tmp_path / "uids"
    registry.write_text(json.dumps({"uids": {"0": {"home": str(tmp_path), "principal": "bot1"}}}))
    code, report, _ = doctor(tmp_path / "home", CORRAL_SANDBOX__UID_REGISTRY=str(registry))
    uids = by_check(report)["dynamic uids"]
    assert code == 1 and uids["status"] == "fail" and "0 (corral's bot1, NSS's root)" in uids["detail"]


def test_a_network_address_without_tls_fails_and_bad_settings_exit_2(tmp_path: Path) -> None:
    code, report, _ = doctor(tmp_path / "home", toml='host = "0.0.0.0"\n')
    listen = by_check(report)["listen"]
    assert code == 1 and listen["status"] == "fail" and "without TLS" in listen["detail"]
    code, report, stderr = doctor(tmp_path / "home", toml="[sandbox]\nseccom = false\n")
    assert code == 2 and "did you mean 'sandbox.seccomp'" in report["error"]["message"]


def test_a_missing_submitter_and_a_model_without_files_are_named(tmp_path: Path) -> None:
    empty = tmp_path / "model"
    empty.mkdir()
    code, report, _ = doctor(tmp_path / "home", "--backend", "slurm",
                             toml=f'[slurm]\nconf = "/nonexistent/slurm.conf"\nsubmitter = "{tmp_path}/no-such-helper"\n'
                                  f'[memory]\nembed_model = "{empty}"\n')
    found = by_check(report)
    assert code == 1 and found["submitter"]["status"] == "fail" and "corral slurm submitter" in found["submitter"]["fix"]
    assert found["memory model"]["status"] == "warn" and "by words alone" in found["memory model"]["detail"]


def test_an_unprivileged_account_that_would_run_jobs_as_itself_fails(tmp_path: Path) -> None:
    """The gateway's own refusal (decision 0046), found before the start, as that account."""
    import pwd


    if os.geteuid() != 0:
        assert os.environ.get("CI") != "true", "CI runs as root"
        return
    name = f"corraldoc{os.getpid() % 100000}"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", name], check=True, capture_output=True)
    u = pwd.getpwnam(name)
    try:
        site = next((ROOT / ".venv/lib").glob("python3*/site-packages")).resolve()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": u.pw_dir, "CORRAL_HOME": f"{u.pw_dir}/state",
               "PYTHONPATH": f"{site}:{ROOT}", "USER": name}
        r = subprocess.run(["/usr/bin/python3", "-m", "corral.entry", "--json", "doctor"], env=env, cwd=u.pw_dir,
                           capture_output=True, text=True, timeout=120, user=u.pw_uid, group=u.pw_gid, extra_groups=[])
        ident = by_check(json.loads(r.stdout))["identity"]
        assert r.returncode == 1 and ident["status"] == "fail" and "unprivileged account" in ident["detail"], r.stderr
        assert "root" in ident["fix"]
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)


def test_a_grace_other_than_the_one_agents_are_told_is_named() -> None:
    """Read by the same code as doctor's preemption check: Slurm's GraceTime forms."""
    from corral.gateway.doctor import _seconds

    assert [_seconds(t) for t in ("00:02:00", "2:00", "120", "1-00:00:00", "", "x", "1:2:3:4")] == \
        [120, 120, 120, 86400, None, None, None]



def test_a_uid_corral_published_for_nss_is_no_clash(tmp_path: Path) -> None:
    """A root gateway writes its dynamic uids where NSS reads them (decision 0063): NSS then
    knows each one, by the line corral wrote for its principal. That is not a uid the site's
    directory took from corral (it failed 'dynamic uids' before) nor a site user in the range."""
    import secrets

    from corral.core import nss_users
    from corral.core.identity import Identities

    if os.geteuid() != 0:
        pytest.skip("dynamic uids are a root gateway's")
    assert "extrausers" in Path("/etc/nsswitch.conf").read_text(), "scripts/slurm-up names extrausers in nsswitch.conf"
    registry = tmp_path / "m" / "uids"
    ids = Identities(tmp_path / "identities.json", root=True, registry=registry, nss=nss_users.DEFAULT_DIR)
    uid = ids.of(f"bot-{secrets.token_hex(3)}", None)
    assert uid is not None
    try:
        assert ids.resolves(uid)  # NSS knows it now
        code, report, _ = doctor(tmp_path / "home", CORRAL_SANDBOX__UID_REGISTRY=str(registry))
        found = by_check(report)["dynamic uids"]
        assert found["status"] != "fail" and f"{uid.uid} (" not in found["detail"], found
    finally:
        nss_users.remove(nss_users.DEFAULT_DIR, {uid.uid})


def test_whether_agents_slurm_jobs_run_as_their_uids_is_said(tmp_path: Path) -> None:
    """A root gateway on Slurm: NSS here reads [sandbox] nss_users (libnss-extrausers, which
    scripts/slurm-up sets up), so agents' jobs run as their own uids (decision 0063); off, or
    a directory NSS does not read, is a warning saying sacct will name root."""
    if os.geteuid() != 0:
        pytest.skip("dynamic uids are a root gateway's")
    toml = '[slurm]\nconf = "/nonexistent/slurm.conf"\n'
    found = {}
    for label, nss in (("default", None), ("off", ""), ("elsewhere", str(tmp_path / "extrausers"))):
        env = {} if nss is None else {"CORRAL_SANDBOX__NSS_USERS": nss}
        _, report, _ = doctor(tmp_path / "home", "--backend", "slurm", toml=toml, **env)
        found[label] = by_check(report)["dynamic uids in Slurm"]
    assert found["default"]["status"] == "ok" and "/var/lib/extrausers" in found["default"]["detail"], found
    assert found["off"]["status"] == "warn" and "nss_users is off" in found["off"]["detail"]
    assert found["elsewhere"]["status"] == "warn" and "not what NSS reads" in found["elsewhere"]["detail"]
    assert "sacct says root" in found["off"]["detail"] and "libnss-extrausers" in found["off"]["fix"]
