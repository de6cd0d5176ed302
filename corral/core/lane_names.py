"""The lane vocabulary: the names a submission may give its lane. The registry
(corral/lanes/registry.py) owns it and is where code asks about lanes; the names sit in
this module of their own, importing nothing, so that core's records (JobSpec, Settings)
and the edges' choices (CLI, MCP) can name them without importing the registry, which
imports those records.

- ``batch``: the facility's scheduler queue (the local or Slurm backend).
- ``fast``: a warm allocation of the fast lane starts it at once (short, small tasks).
- ``auto``: fast when it fits and the fast lane is on, else batch.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

LaneChoice = Literal["fast", "batch", "auto"]
"""What a submission (or the facility's default) may name."""
CHOICES: Final[tuple[str, ...]] = get_args(LaneChoice)
BATCH: Final = "batch"
FAST: Final = "fast"
AUTO: Final = "auto"
