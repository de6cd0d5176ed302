"""Dynamic uids written where NSS reads them (corral/core/nss_users.py, decision 0063):
the lines, what is refused (a uid not dynamic, another's line, a link, a directory others
may write), and the Slurm lane's use of one only where NSS gives it the name corral wrote.
The job on the private Slurm: tests/test_gateway_slurm.py."""

from __future__ import annotations

import os
import pwd
import stat
import time

import pytest

from corral.core import nss_users
from corral.core.errors import InvalidRequest
from corral.core.identity import Identities, Identity
from corral.lanes.backend import SubmitContext
from corral.lanes.slurm.backend import SlurmBackend

FIRST, LAST = 61184, 65519


def test_a_uid_is_written_once_beside_others_lines_and_taken_out_only_as_corrals(tmp_path) -> None:
    d = tmp_path / "extrausers"
    d.mkdir(mode=0o755)
    (d / "passwd").write_text("snapuser:x:70001:70001::/home/snapuser:/bin/bash\n")
    assert nss_users.publish(d, 61190, "bot-a", FIRST, LAST) == "bot-a"
    assert nss_users.publish(d, 61190, "bot-a", FIRST, LAST) == "bot-a"  # once
    assert nss_users.publish(d, 61191, "root", FIRST, LAST) == "corral-61191"  # a name NSS gives another: not taken
    lines = (d / "passwd").read_text().splitlines()
    assert lines[0].startswith("snapuser:") and len(lines) == 3
    assert lines[1] == "bot-a:x:61190:61190:corral dynamic identity of bot-a:/nonexistent:/usr/sbin/nologin"
    assert (d / "group").read_text().splitlines() == ["bot-a:x:61190:", "corral-61191:x:61191:"]
    for name in ("passwd", "group"):
        st = (d / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
    nss_users.remove(d, {61190, 70001})  # the other tool's line stays, whatever its uid
    assert [line.split(":")[0] for line in (d / "passwd").read_text().splitlines()] == ["snapuser", "corral-61191"]
    assert (d / "group").read_text().splitlines() == ["corral-61191:x:61191:"]


def test_what_is_refused(tmp_path) -> None:
    d = tmp_path / "extrausers"
    d.mkdir(mode=0o755)
    for uid in (0, 1000, FIRST - 1, LAST + 1):  # root's, a person's, outside the range
        with pytest.raises(InvalidRequest, match="not a dynamic uid"):
            nss_users.publish(d, uid, "bot", FIRST, LAST)
    (d / "passwd").write_text("someone:x:61200:61200::/home/someone:/bin/sh\n")
    with pytest.raises(InvalidRequest, match="not corral's"):  # a uid another line names: never renamed
        nss_users.publish(d, 61200, "bot", FIRST, LAST)
    assert nss_users.publish(d, 61203, "bot-b", FIRST, LAST) == "bot-b"
    with pytest.raises(InvalidRequest, match="not corral's identity of 'bot-c'"):  # another principal's line
        nss_users.publish(d, 61203, "bot-c", FIRST, LAST)
    (d / "passwd").unlink()
    (d / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(InvalidRequest, match="link"):
        nss_users.publish(d, 61201, "bot", FIRST, LAST)
    (d / "passwd").unlink()
    d.chmod(0o777)
    with pytest.raises(InvalidRequest, match="only this gateway's user"):
        nss_users.publish(d, 61202, "bot", FIRST, LAST)
    assert not (d / "passwd").exists()


def test_only_a_uid_nss_names_as_corral_wrote_it_is_used(tmp_path) -> None:
    ids = Identities(tmp_path / "identities.json", FIRST, 65534, root=True, registry=tmp_path / "m" / "uids")
    nobody = pwd.getpwnam("nobody")
    # NSS names the uid otherwise (a forged or clashing line): not used
    assert not ids.resolves(Identity(nobody.pw_uid, nobody.pw_gid, "bot", None, dynamic=True))
    assert not nss_users.resolves(0, 0, ("root",))  # root's group never
    assert not ids.resolves(Identity(61300, 61300, "bot", None, dynamic=True))  # NSS does not know it
    assert ids.resolves(Identity(nobody.pw_uid, nobody.pw_gid, "nobody", None, dynamic=True))


def test_the_slurm_lane_submits_as_a_dynamic_uid_only_where_slurm_resolves_it(tmp_path) -> None:
    """No Slurm needed: the argv's identity. A uid written where no NSS reads (tests' own
    directory) keeps the job root's, dropping to the uid inside, as before."""
    if os.geteuid() != 0:
        pytest.skip("dynamic uids are a root gateway's")
    b = SlurmBackend(tmp_path / "jobs", None)
    b.identities = Identities(tmp_path / "identities.json", FIRST, LAST, root=True, registry=tmp_path / "m" / "uids",
                              nss=tmp_path / "extrausers")
    ctx = SubmitContext(int(time.time()) % 100000, f"bot-{os.getpid()}", "agent", "alice")
    assert b._run_as(ctx) is None and b._root_runs(ctx)
    uid = b.identities.of(ctx.principal, None)
    assert uid is not None and f"{ctx.principal}:x:{uid.uid}:" in (tmp_path / "extrausers" / "passwd").read_text()
    b._jobs_open = True  # as if the jobs' directory let others through; NSS still does not name the uid
    assert b._run_as(ctx) is None


def test_nss_is_asked_once_a_while_for_a_uid_it_does_not_name(tmp_path, monkeypatch) -> None:
    """Each submission's steps ask whether the uid resolves; a site's NSS may ask its
    directory for each: a "no" is believed for a while, a "yes" for good."""
    asked: list[int] = []
    answer = [False]

    def counted(uid: int, gid: int, names: tuple[str, ...]) -> bool:
        asked.append(uid)
        return answer[0]

    monkeypatch.setattr(nss_users, "resolves", counted)
    ids = Identities(tmp_path / "identities.json", FIRST, LAST, root=True, registry=tmp_path / "m" / "uids")
    ident = Identity(61400, 61400, "bot", None, dynamic=True)
    assert not any(ids.resolves(ident) for _ in range(5)) and asked == [61400]
    ids._unresolved.clear()  # as 30 s later
    answer[0] = True
    assert all(ids.resolves(ident) for _ in range(5)) and asked == [61400, 61400]
