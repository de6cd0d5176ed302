"""corral's compiled job starter (jobstart.c): the two steps of a contained Slurm job
that were Python starts (opendir.py's walk as the job's identity before bwrap, and
seccomp.py's APPLY after setpriv and unshare), as one small program (decision 0055).

Built at install (``python -m corral.sandbox.starter``, as root where root owns the venv:
docs/deploy.md; ``make``), else by the gateway the first time a batch script wants it, with
the C compiler (``cc``, else ``gcc``), into corral's own install (``<venv>/libexec/corral``,
where the nodes already find corral's Python), keyed by what went into it. Used only where nobody
but its owner and root may write it or any directory above it: root runs it. Where no
compiler is found, the build fails, that place is not safe, or ``CORRAL_JOBSTART_COMPILED=0``,
the Python steps run as before: slower, the same checks.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import sys
from pathlib import Path

from corral.core import proc

SOURCE = Path(__file__).with_name("jobstart.c")
FLAGS = ("-O2", "-std=c99", "-D_GNU_SOURCE")


def compiled() -> str | None:
    """The built starter's path, or None: the Python steps serve."""
    if os.environ.get("CORRAL_JOBSTART_COMPILED") == "0":
        return None
    return _build(Path(sys.prefix) / "libexec" / "corral")


def _safe(path: Path) -> bool:
    """``path`` and every directory above it are root's or ours, and nobody else may
    write them (a parent may be sticky, as /tmp): what root execs may not be swapped."""
    for p in [path, *path.parents]:
        try:
            st = p.lstat()
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, os.geteuid()):
            return False
        if st.st_mode & 0o022 and not (p != path and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return False
    return True


@functools.lru_cache(maxsize=4)
def _build(where: Path) -> str | None:
    cc = proc.c_compiler()
    if cc is None:
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, os.fsencode(cc), *map(str.encode, FLAGS),
                                     os.uname().machine.encode()])).hexdigest()[:16]
    built = where / f"jobstart-{key}"
    try:
        where.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError:
        return None
    if not _safe(where.resolve()):
        return None
    if not built.is_file() and not proc.compile_c(cc, FLAGS, source, built, 120):
        return None
    return str(built) if _safe(built.resolve()) else None


def main() -> int:
    """Builds the starter now (an install step); says where, or why the Python steps serve."""
    built = compiled()
    print(f"corral's job starter: {built}" if built else
          "corral's job starter not built (no C compiler, a failed build, or a place others may write): "
          "contained Slurm jobs run the Python steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
