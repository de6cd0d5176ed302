"""A contained Slurm job's door to the gateway: how Slurm's commands typed inside the job
(``squeue --me``, ``scontrol show job $SLURM_JOB_ID``, ``sacct -j``, ``srun``) are
corral's shims there, answering about the job's own principal (decision 0057).

Slurm's own commands cannot work inside the sandbox, and must not: they need the
network, munge's socket and slurm.conf, and with them the job would speak to slurmctld
as its Unix identity, see every user's jobs (no PrivateData here) and submit past
corral. Instead, what the sandbox gets:

- ``SHIM_BIN`` first on its PATH: one link per Slurm command to corral's shims
  (``corral-slurm``, which reads its name from argv[0]); made by bwrap, before the job;
- a Unix socket at ``INSIDE``, bound from the batch script's relay on the node, which
  carries each connection to the gateway's HTTP address (``[slurm] gateway_address``);
- a loopback port ``PORT`` carried to that socket by a socat started before the
  system-call filter (which refuses the job Unix sockets of its own), as the egress
  bridge is; the job's CORRAL_URL names it, its CORRAL_TOKEN is its own credential
  (corral/safety/job_credentials.py: reads, as its principal, while it runs).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from corral.sandbox.profile import Mount

INSIDE = "/tmp/corral-gateway.sock"
PORT = 3129
URL = f"http://127.0.0.1:{PORT}"
SHIM_BIN = "/tmp/.corral-slurm"
"""The shims' directory inside the job, on its private /tmp (made by bwrap, so the job
finds it as corral left it; later, it is the job's own to change)."""
SOCKET = '"${corral_relay_dir}/gateway.sock"'
"""The node relay's socket as a bash word (the batch script's relay directory)."""
BRIDGE = (f"(socat TCP-LISTEN:{PORT},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{INSIDE} &); "
          f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && break; sleep 0.005; "
          'done; exec "$@"')
"""Inside the job: its loopback port to the door's socket, ready before the job starts
(from a subshell: not a child of what the job execs, as the egress bridge)."""


def shims() -> str | None:
    """The shims' entry point beside this interpreter (a console script of corral's), or
    None where it is not installed (the door then has no commands to offer)."""
    found = Path(sys.executable).parent / "corral-slurm"
    return str(found) if os.access(found, os.X_OK) else None


NAMES = ("sbatch", "squeue", "sacct", "scancel", "sinfo", "scontrol", "srun",
         "salloc", "sstat", "sprio", "sshare", "sacctmgr", "sreport", "sbcast", "sattach", "strigger",
         "scrontab", "sdiag", "smap", "sview")
"""Slurm's commands the job finds as corral's: the shims' COMMANDS and REFUSED
(corral/edges/shims/__init__.py; a floor below cannot import them: tests/test_door.py
holds the two lists equal). A refused one says corral's words, not Slurm's 60 s stall."""


def mounts(socket: str, entry: str) -> list[Mount]:
    """The Slurm commands' links to the shims, and the door's socket bound in ("": no
    door, [slurm] gateway_address unset: srun still runs its tasks)."""
    return [*([Mount("bind", INSIDE, socket, word=True)] if socket else []), *install(),
            Mount("dir", SHIM_BIN, perms="0755"), *(Mount("symlink", f"{SHIM_BIN}/{name}", entry) for name in NAMES)]


def install() -> list[Mount]:
    """corral's own install, read-only at its path, where the job's private /tmp would hide
    it: from a checkout under /tmp (where people clone, and CI does), the links above
    pointed into nothing and the job's srun was Slurm's own, which stalls there."""
    import corral

    hidden = sorted(d for d in {Path(sys.prefix).resolve(), Path(corral.__file__).resolve().parent}
                    if d.is_relative_to("/tmp"))
    made = sorted({p for d in hidden for p in d.parents[:-2]}, key=lambda p: len(p.parts))
    return [*(Mount("dir", str(p), perms="0755") for p in made if p not in hidden),
            *(Mount("ro-bind", str(d), str(d)) for d in hidden)]


def usable() -> bool:
    """socat is where the bridge needs it (the egress bridge needs it too)."""
    return shutil.which("socat") is not None
