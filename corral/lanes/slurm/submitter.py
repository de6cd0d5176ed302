"""The gateway's side of the privileged submitter (corral/lanes/slurm/privsep_submit.py).

A gateway run as a service account cannot give a Slurm job another identity: ``sbatch
--uid`` is root's alone. With ``[slurm] submitter`` set (the helper's installed path),
such a gateway sends the job of a principal with a Unix user through ``sudo -n
SUBMITTER``, which hands the job's ``out/`` directory to that user and submits it as
that user; cancel, signal, hold, release and requeue of that job go through it too, run
as the job's user (Slurm lets a job's owner act on it, and the service account not).
Everything else (squeue, sacct, scontrol show, the gateway's own jobs) stays plain.

The layout of such a job's directory ``d`` (docs/decisions/0021-privileged-submitter.md):
``d`` is the gateway's (``job.sh``, ``nonce``, ``backend_id``, 0600); ``d/out`` is laid out
whole by the gateway as ``out.new`` (empty output files, ``env.json``, the script, the
contained work's ``work/``), then handed by the helper to the job's user with the
gateway's group (2770, its files 0640/0750), then renamed into place. The job's own
writes there (markers) are 0640 under the umask the helper gives sbatch, so the gateway
reads them by group, never through a link (``read_small``, ``open_output``).
"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any, Sequence

from corral.core import proc
from corral.core.errors import BackendError, InvalidRequest

OUT = "out"
"""The job user's directory inside corral's job directory (slurm.py lays it out)."""


class Submitter:
    """``sudo -n <path>``: the one privileged command a service-account gateway runs."""

    def __init__(self, path: str, timeout_s: float = 60.0) -> None:
        self.argv = ["sudo", "-n", path]
        self.timeout_s = timeout_s

    def applies(self, unix_user: str | None, kind: str) -> pwd.struct_passwd | None:
        """The Unix user a job is submitted as through the helper, or None: submitted
        as the gateway itself (it is root and needs no helper; the principal has no Unix
        user, or the gateway's own; corral's own fast-lane pilots keep the gateway's)."""
        if os.geteuid() == 0 or not unix_user or kind == "service":
            return None
        try:
            user = pwd.getpwnam(unix_user)
        except KeyError:
            raise InvalidRequest(f"unix user {unix_user!r} does not exist here",
                                 hint="an admin gives the principal a Unix user this cluster knows") from None
        return None if user.pw_uid == os.geteuid() else user

    def _call(self, *args: str, script: str | None = None, check: bool = True) -> Any:
        # stdin always a pipe: sudo's use_pty would otherwise give it the gateway's terminal
        r = proc.run([*self.argv, *args], input=script or "", timeout=self.timeout_s, check=False)
        if check and r.returncode != 0:
            said = (r.stderr or r.stdout).strip()
            if said.startswith("sudo:"):  # sudo itself would not: the admin's setup, not a scheduler outage
                raise InvalidRequest(f"the gateway's account may not run the privileged submitter: {said[:300]}",
                                     hint=f"the admin adds '{pwd.getpwuid(os.geteuid()).pw_name} ALL=(root) NOPASSWD: "
                                          f"{self.argv[-1]}' to /etc/sudoers.d/corral (README, 'The gateway as a "
                                          "service account')")
            if r.returncode == 2 and "refused" in said:
                raise InvalidRequest(f"the privileged submitter {said.removeprefix('corral-submit: ')}",
                                     hint="the admin's [slurm] submitter setup: see README, 'The gateway as a service account'")
            raise BackendError(f"{' '.join(self.argv)} {args[0]} failed (exit {r.returncode}): {said[-500:]}",
                               argv=[*self.argv, *args], returncode=r.returncode, stderr=r.stderr)
        return r

    def check(self) -> dict[str, Any]:
        """What the helper enforces (its configuration), or BackendError saying why not."""
        return dict(json.loads(self._call("check").stdout))

    def prepare(self, job: str, uid: int) -> None:
        self._call("prepare", job, str(uid))

    def submit(self, job: str, uid: int, options: Sequence[str], script: str) -> str:
        out = str(self._call("submit", job, str(uid), *options, script=script).stdout).strip()
        if not out.isdigit():
            raise BackendError(f"the privileged submitter answered {out!r}, not a job id")
        return out

    def as_owner(self, verb: str, uid: int, *args: str) -> Any:
        """cancel, signal or control, run by the helper as the job's user; the result
        unchecked (the caller reads Slurm's answer as it reads scancel's own)."""
        return self._call(verb, str(uid), *args, check=False)


def handed_to(d: Path) -> int | None:
    """The uid a job's ``out/`` was handed to, or None when it was not (a job the
    gateway submitted as itself). ``d`` is the gateway's own: no job can swap ``out``."""
    try:
        st = os.lstat(d / OUT)
    except OSError:
        return None
    return st.st_uid if st.st_uid != os.geteuid() and (st.st_mode & 0o170000) == 0o040000 else None
