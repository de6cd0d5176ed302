"""Drop-in Slurm commands that talk to corral: sbatch, squeue, sacct, scancel, sinfo,
scontrol show job and srun (batch-style). ``corral agent run`` puts a directory of
them first on an agent's PATH; each is this one entry point under the command's name
(``main`` reads argv[0]), so an agent's habits (``sbatch job.sh``, then
``while squeue -h -j $ID | grep -q .; do sleep 2; done``) are served by the gateway's
shared view and never reach slurmctld. In an agent session each command is a launcher
that hands the call to the session's resident helper (helper.py, decision 0008); the
code that runs is the same. Slurm's formats are parsed by corral/slurm_formats.py.
"""

from __future__ import annotations

import os
import sys

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol", "srun")
REFUSED = ("salloc", "sstat", "sprio", "sshare", "sacctmgr", "sreport", "sbcast", "sattach", "strigger",
           "scrontab", "sdiag", "smap", "sview")
"""Slurm commands corral does not serve: each prints one line naming corral's way (shims/known.py)."""


def dispatch(name: str, argv: list[str]) -> int:
    if name in REFUSED:
        from corral.edges.shims.known import INSTEAD

        print(f"{name}: error: corral's agent session does not serve {name}: {INSTEAD[name]}", file=sys.stderr)
        return 1
    from corral.edges.shims.base import run

    if name == "sbatch":
        from corral.edges.shims.sbatch import main as fn
    elif name == "srun":
        from corral.edges.shims.srun import srun as fn
    elif name == "squeue":
        from corral.edges.shims.queue import squeue as fn
    elif name == "scontrol":
        from corral.edges.shims.control import scontrol as fn
    elif name == "sacct":
        from corral.edges.shims.acct import sacct as fn
    elif name == "scancel":
        from corral.edges.shims.misc import scancel as fn
    elif name == "sinfo":
        from corral.edges.shims.misc import sinfo as fn
    else:
        print(f"corral shims: {name} is not one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return run(name, fn, argv)


def main() -> None:
    name = os.path.basename(sys.argv[0])
    if name in ("corral-slurm", "__main__.py") and len(sys.argv) > 1:
        name, argv = sys.argv[1], sys.argv[2:]
    else:
        argv = sys.argv[1:]
    sys.exit(dispatch(name, argv))
