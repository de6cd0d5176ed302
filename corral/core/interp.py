"""How corral starts a Python of its own: isolated, its code found by a path it states.

``python -m corral.x`` puts the working directory first on ``sys.path`` and honours
``PYTHONPATH``, ``PYTHONSTARTUP``'s kin and the user's site directory: a pilot started in
/tmp imported whatever anyone had planted there as ``corral.py`` (or ``json.py``), as
the pool's user (issue 47). Every interpreter corral starts therefore runs with ``-I``
(no ``PYTHON*`` variables, no user site, neither the working directory nor a script's
directory on the path), and finds corral at ``CODE_ROOT`` given in its argv, never in
its environment: the corral that started it, whichever one the interpreter's
site-packages hold (a gateway run from a checkout). ``CODE_ROOT`` is then the one
directory outside the interpreter's own that is imported from; ``unsafe`` says whether
someone besides its owner and root may write there.

Processes started by path with ``-I -S -c SOURCE`` (corral/sandbox/host.py, opendir.py,
seccomp.py, storage/basework.py, safe_read.py) import only the standard library and
need nothing here.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

from corral.core.paths import CODE_ROOT

BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); m = sys.argv[2]; del sys.argv[1:3]; "
        "runpy.run_module(m, run_name='__main__', alter_sys=True)")
"""Runs the module named after corral's directory, as ``-m`` would, with only that
directory added to the isolated path."""


def module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -I`` running ``module`` with ``args``. ``python``: an interpreter with
    corral installed (a node's, ``[fastlane] python``), which then imports its own;
    else this interpreter with this corral."""
    if python:
        return [python, "-I", "-m", module, *args]
    return [sys.executable, "-I", "-c", BOOT, str(CODE_ROOT), module, *args]


def module_command(module: str, *args: str, python: str | None = None) -> str:
    """``module_argv`` as one shell command line (a job's command)."""
    return shlex.join(module_argv(module, *args, python=python))


def unsafe(path: Path = CODE_ROOT) -> Path | None:
    """The first of ``path`` and its parents that a user other than its owner and root
    may write (a group- or world-writable directory without the sticky bit, or one owned
    by another user than the one below it trusts), or None."""
    for p in (path, *path.parents):
        try:
            st = p.stat()
        except OSError:
            return p
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return p
        if st.st_uid not in (0, os.geteuid()):
            return p
    return None
