"""Installs the privileged submitter (privsep_submit.py) from the installed package, as
scripts/privsep-up does from a checkout: root's, 0755, its ``CONFIG`` line set, put in
place by rename so no half-written helper is ever run. A site that installed corral as a
wheel has no scripts/ directory; ``corral slurm submitter`` calls this.

The helper runs as root through sudo: whoever could replace it, or rename the directory
that holds it, would be root. So the directory and each one above it must be root's and
writable by no one else, or the install is refused."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from corral.core.errors import InvalidRequest

SOURCE = Path(__file__).with_name("privsep_submit.py")


def _root_only(directory: Path) -> None:
    for d in (directory, *directory.parents):
        st = d.stat()
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise InvalidRequest(f"{d} is not root's alone (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
                                 "whoever may write there could replace the helper and be root",
                                 hint="install it under /usr/local/libexec (root's, 0755)")


def install(dest: Path, config: str) -> None:
    if os.geteuid() != 0:
        raise InvalidRequest("the submitter is root's: run this as root (sudo)")
    if not dest.is_absolute() or not re.fullmatch(r"[A-Za-z0-9/_.+-]+", f"{dest}{config}") \
            or not config.startswith("/"):
        raise InvalidRequest("--dest and --config must be plain absolute paths")
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    _root_only(dest.parent)
    text, n = re.subn(r'(?m)^CONFIG = .*$', f'CONFIG = "{config}"  # set by corral slurm submitter', SOURCE.read_text())
    if n != 1:
        raise InvalidRequest(f"{SOURCE} has no CONFIG line to set: this installation is damaged")
    fd, tmp = tempfile.mkstemp(prefix=".corral-submit.", dir=dest.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chown(tmp, 0, 0)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
