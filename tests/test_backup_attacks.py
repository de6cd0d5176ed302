"""`corral backup` and `corral restore` run by root against another local user (the
adversarial review of decision 0059): a directory that user made ahead of the admin at
the path the admin names, or a backup left where that user may write, is refused, so
the user can neither swap the keys the restored gateway would take, nor read them."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from .conftest import Gateway, free_port, temporary_user
from .test_backup import _corral, _refused

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                                reason="root's backup against another Unix user: run as root")


def test_a_backup_into_or_restored_from_a_directory_another_user_controls_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "gw" / "home"
    home.mkdir(parents=True)
    gw = Gateway(home, free_port())
    gw.start()
    shared = Path(tempfile.mkdtemp(prefix="corral-bk-", dir="/tmp"))
    shared.chmod(0o755)
    try:
        with temporary_user("corrbk") as u:
            # The user made /tmp/.../nightly (empty, theirs) before the admin's cron job ran.
            theirs = shared / "nightly"
            theirs.mkdir()
            os.chown(theirs, u.pw_uid, u.pw_gid)
            _refused(_corral(gw, "backup", str(theirs)), "another user could change the keys")
            assert not any(theirs.iterdir())
            # ... or a link there to a directory of theirs.
            (shared / "link").symlink_to(theirs)
            _refused(_corral(gw, "backup", str(shared / "link")), "not a directory")
            # A backup of the admin's own, then left open to others' writes: it is refused as
            # a restore's source (anyone could have swapped token.key and rewritten the manifest).
            mine = shared / "mine"
            assert _corral(gw, "backup", str(mine)).returncode == 0
            assert (mine / "token.key").stat().st_mode & 0o777 == 0o600
            mine.chmod(0o777)
            _refused(_corral(gw, "restore", str(mine), "--home", str(tmp_path / "fresh")), "another user could")
            assert not (tmp_path / "fresh").exists()
    finally:
        gw.kill(signal.SIGTERM)
        shutil.rmtree(shared, ignore_errors=True)
