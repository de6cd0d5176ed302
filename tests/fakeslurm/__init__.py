"""Install the fake Slurm (fake_slurm.py) for a test: shims on PATH and a slurm.conf
shaped like the private Slurm of scripts/slurm-up (one 32-CPU node with 4 GPUs;
partitions debug, batch, gpu), so the same tests read the same limits."""

from __future__ import annotations

import sys
from pathlib import Path

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo")
CONF = """\
NodeName=localhost CPUs=32 RealMemory=64000 Gres=gpu:4
PartitionName=debug Nodes=localhost Default=YES MaxTime=01:00:00
PartitionName=batch Nodes=localhost MaxTime=2-00:00:00
PartitionName=gpu Nodes=localhost MaxTime=1-00:00:00
FakeSecondsPerMinute=3
"""


def install(root: Path) -> tuple[Path, Path]:
    """-> (the bin directory to put first on PATH, the slurm.conf to point SLURM_CONF at)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("fake_slurm.py")
    for name in COMMANDS:
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" {name} "$@"\n')
        shim.chmod(0o755)
    conf = root / "etc" / "slurm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(CONF)
    return bin_dir, conf
