"""Where the gateway's state lives: the one place ``CORRAL_HOME`` is read (the CLI's
light commands use it too, so it imports nothing heavy)."""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """``$CORRAL_HOME``, else ``./.corral``."""
    return Path(os.environ.get("CORRAL_HOME") or ".corral")
