"""The Slurm lane's common ground: its settings and state, the one door every Slurm
command goes through (``_run``: tests replace it), and the small file helpers of a
job's directory. The backend (corral/lanes/slurm/backend.py) is this base and three
concerns, each a module of its own:

::

    SlurmBackend ── submit, cancel, control, forget          backend.py
       ├── Scripts   the batch script and the job's directory  script.py
       ├── Polling   status: markers, squeue, sacct            state.py
       └── Facility  limits, preflight, free cores, usage      facility.py
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from corral.core import proc
from corral.lanes.backend import BackendStatus, Partition, base_env
from corral.lanes.slurm.submitter import Submitter
from corral.lanes.slurm.preemption import Preemptions
from corral.lanes.slurm.tiers import Requeues, Tiers

log = logging.getLogger("corral.lanes.slurm.backend")

if TYPE_CHECKING:
    from corral.core.identity import Identities
    from corral.sandbox.bwrap import Sandbox


class SlurmBase:
    def __init__(self, jobs_dir: Path, slurm_conf: str | None = None, agent_nice: int = 100,
                 agent_qos: str | None = None, timeout_s: float = 30.0, poll_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, sandbox: "Sandbox | None" = None,
                 opportunistic_qos: str | None = None,
                 submitter: Submitter | None = None, run: Callable[..., str] | None = None,
                 partitions: list[Partition] | None = None) -> None:
        self.jobs_dir = Path(jobs_dir).resolve()
        self._answers = run
        """In place of Slurm's commands (argv -> their stdout): answers the caller recorded
        (tests of how corral reads Slurm, without one). Still counted as the controller's."""
        self.submitter = submitter
        """A service-account gateway's way to submit as a principal's Unix user (slurm_submitter.py)."""
        self.sandbox = sandbox
        """Contains the work of the kinds it names inside the batch script (corral/sandbox/bwrap.py)."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.slurm_conf = slurm_conf or os.environ.get("SLURM_CONF")
        self.agent_nice = agent_nice
        self.agent_qos = agent_qos
        self.timeout_s = timeout_s
        self._limits: list[Partition] | None = partitions
        """The partitions and their limits, read from scontrol when slurm.conf changes."""
        self._given_limits = partitions is not None
        """The caller gave them: they are this facility's, whatever slurm.conf says."""
        self._limits_key: tuple[float, int] | None = None
        self._dirs: dict[str, Path] = {}  # Slurm job id -> corral's job directory, while corral asks
        self._indexed = False
        self.poll_s = poll_s
        self.clock = clock
        self._last_poll: float | None = None
        """When squeue was last asked (``clock``); None: ask at the next status call. (Not
        0.0: the monotonic clock counts from boot, and a host up for less than poll_s
        would wait for its first poll.)"""
        self._known: dict[str, BackendStatus] = {}  # last answer per live job, between full polls
        self._final: dict[str, BackendStatus] = {}  # a terminal answer never changes
        self._cancelled: set[str] = set()  # cancelled by corral (not by Slurm, for a dependency)
        self._unconfirmed: dict[str, tuple[int, float, float | None]] = {}
        """Ends taken from a job's own marker, not yet Slurm's: id -> (the run that wrote
        it, when, that run's start by its own marker): watched for a requeue Slurm decides
        after, or a run Slurm starts again without counting it (Polling.reopened)."""
        self._last_confirm: float | None = None
        self._table: tuple[float, str] | None = None  # the last job table squeue gave (when, text)
        self.controller_calls: dict[str, int] = {}
        """Slurm commands run, by command (sbatch, squeue, sacct, scancel, scontrol...)."""
        self.tiers = Tiers(opportunistic_qos, self._run, self.conf_key)
        """Agents' opportunistic tier, where this Slurm preempts its QOS (slurm_tiers.py)."""
        self.requeues = Requeues(self._run)
        self.preemptions = Preemptions(self._run)
        """How often the opportunistic QOS is preempted here (slurmdbd), for placement's cost."""

    # -- the one door, with Slurm's environment ------------------------------------

    def _env(self) -> dict[str, str]:
        env = base_env()
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run(self, *argv: str) -> str:
        self._counted(argv)
        if self._answers is not None:
            return self._answers(*argv)
        return proc.run(argv, env=self._env(), inherit_env=False, timeout=self.timeout_s).stdout

    def _counted(self, argv: Sequence[str]) -> None:
        """Count one Slurm command: what the controller (or slurmdbd) was really asked.
        The dashboard sets it against what clients without corral would have asked;
        a status call answered from jobs' own reports asks nothing and is not counted."""
        self.controller_calls[argv[0]] = self.controller_calls.get(argv[0], 0) + 1

    _jobs_open: bool | None = None

    def jobs_open(self) -> bool:
        """Whether others may pass through every directory down to jobs_dir (o+x): Slurm
        opens a job's output as the job's user. Where they may not (a root gateway's home
        0700), dynamic uids' jobs start as root and drop to the uid, as before (said once)."""
        if self._jobs_open is None:
            closed = [p for p in (self.jobs_dir, *self.jobs_dir.parents) if not os.stat(p).st_mode & 0o001]
            self._jobs_open = not closed
            if closed:
                log.warning("%s is closed to others: jobs of dynamic uids start as root, which drops to the uid "
                            "(sacct says root); chmod o+x it to have Slurm start them as their own", closed[0])
        return self._jobs_open

    def opportunistic(self) -> str | None:
        """The preemptible QOS agents' opportunistic jobs go to; None where Slurm has none."""
        return self.tiers.offered()

    def conf_key(self) -> tuple[float, int] | None:
        """slurm.conf's mtime and size: what is read from Slurm's configuration is read again when they change."""
        if self.slurm_conf and Path(self.slurm_conf).exists():
            st = Path(self.slurm_conf).stat()
            return st.st_mtime, st.st_size
        return None

    door: "Door | None" = None
    """Where a contained job's Slurm commands reach the gateway from its node ([slurm]
    gateway_address) and the job's credential there (corral/sandbox/door.py); None: they
    say they cannot reach corral."""
    egress_credential: "Callable[[int], str] | None" = None
    """A contained job's name at the egress proxy, for the grants its sponsor approves
    (safety/job_credentials.py EgressCredentials, sandbox/egress_grants.py); None: no proxy."""
    identities: "Identities | None" = None
    """Who a contained job of a principal without a Unix user runs as (corral/core/identity.py)."""
    scratch: list[Path] = []
    """Node-local directories the sandbox hides (the Sender makes them again at a send if a
    cleaner removed them); a contained job's script makes them too, for the run Slurm
    starts again after a requeue, minutes later and without a send."""


@dataclass(frozen=True)
class Door:
    """A contained job's door to the gateway: the gateway's HOST:PORT as the nodes reach
    it, and the credential each job gets (corral/safety/job_credentials.py)."""

    address: str
    credential: Callable[[int], str]


def write_own(path: Path, text: str) -> None:
    """One of corral's own files in a job's directory (which only corral writes): created
    or replaced, never through a link, 0600."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def out_dir(d: Path) -> Path:
    """Where a job's output and markers lie: d/out (d itself for a job submitted before
    corral kept them apart)."""
    out = d / "out"
    return out if out.is_dir() else d
