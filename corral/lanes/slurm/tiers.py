"""Agents' opportunistic tier on Slurm (docs/decisions/0022-preemptible-agents-tier.md):
whether this Slurm offers it, what an agent's job script says for it, and what a
requeue cost.

::

    offered  -> `scontrol show config` (PreemptType=preempt/qos) and `sacctmgr show qos
                NAME` (it exists), once; again when slurm.conf changes, and hourly
    render   -> `--qos=NAME --requeue` for an opportunistic job; `--open-mode=append`
                for every job, and one line in its output when Slurm runs it again
    requeues -> squeue's RestartCnt, in the one poll the backend makes anyway; the work
                lost from slurmdbd (`sacct -D`: Start and End of each earlier run),
                once per requeue seen

A requeued job stays one corral job: Slurm keeps its id, shows it PENDING again (after
its BeginTime, about two minutes on Slurm 22.05), runs it from the start, and corral
reports it PENDING, then RUNNING, then how it ended, with its requeue count and the
seconds of work the earlier runs lost.
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Callable, Sequence

from corral.core.errors import CorralError
from corral.core.jobs import format_duration
from corral.core.signals import DEFAULT_NOTICE, GRACE_S
from corral.lanes.slurm.vocab import slurm_epoch

log = logging.getLogger("corral.lanes.slurm.backend")

TIER_LABEL = "corral-tier"
"""The spec label where the gateway's placement (corral/lanes/placement.py) says how an
agent's batch job runs: ``opportunistic`` (preemptible, requeued) or ``guaranteed``."""
WALLTIME_LABEL = "corral-walltime-s"
"""The spec label with the walltime (seconds) asked of the scheduler, when the placement
tightened the agent's own (spec.walltime_s stays what the agent asked)."""
RERUN_LINE = ("corral: Slurm requeued this job (restart $corral_run); it runs again from the start, "
              "and the output above this line is from an earlier run that did not finish")
"""Written to stdout and stderr when a run starts again: the output is a stream that only
grows (append mode; the output guard pages it by offset), so the earlier run's lines
stay and this line says where the run that counts begins."""


class Tiers:
    """Whether this Slurm preempts the opportunistic QOS: asked again when slurm.conf
    changes, every ``RECHECK_S`` (a QOS added with sacctmgr changes no file), and
    ``RETRY_S`` after Slurm could not be asked."""

    RECHECK_S = 3600.0
    RETRY_S = 300.0

    def __init__(self, qos: str | None, run: Callable[..., str], conf_key: Callable[[], object]) -> None:
        self.qos = qos or None
        self._run = run
        self._conf_key = conf_key
        self._known: tuple[object, str | None, float] | None = None

    def offered(self) -> str | None:
        """The QOS agents' opportunistic work goes to, or None: none configured, or this
        Slurm does not preempt by QOS, or the QOS does not exist (then agents' jobs run
        as before: niced, in ``agent_qos``; logged once per slurm.conf)."""
        if self.qos is None:
            return None
        key = self._conf_key()
        if self._known is not None and self._known[0] == key and time.monotonic() < self._known[2]:
            return self._known[1]
        why, until = None, time.monotonic() + self.RECHECK_S
        try:
            config = self._run("scontrol", "show", "config")
            if "preempt/qos" not in next((ln for ln in config.splitlines() if ln.startswith("PreemptType")), ""):
                why = "slurm.conf has no PreemptType=preempt/qos"
            elif self.qos not in self._run("sacctmgr", "-n", "-P", "show", "qos", "format=Name").split():
                why = f"Slurm has no QOS {self.qos!r} (sacctmgr add qos {self.qos})"
        except CorralError as e:
            why, until = f"Slurm could not be asked ({e}); asked again in {self.RETRY_S:.0f} s", \
                time.monotonic() + self.RETRY_S
        if why:
            log.warning("agents' jobs are not preemptible: %s; docs/decisions/0022 has the configuration", why)
        self._known = (key, None if why else self.qos, until)
        return self._known[1]


NOTICE = "URG"
"""What Slurm sends the batch shell alone (``--signal=B:URG@N``) at a preemption and N s
before the walltime; the shell passes the job's own signal (USR1 unless it chose) on
into the sandbox. URG, not USR1, so that the shell tells Slurm's notice from a USR1
that job_control sends (the same shell), and since a stray URG is ignored by default."""


def notice_of(signal: str | None, opportunistic: bool, walltime_s: int) -> tuple[str, int, bool] | None:
    """(signal, seconds, asked) a job's batch shell is told of by Slurm, or None: the job's
    own ``signal``; else an opportunistic job's default, when its walltime leaves room
    for it (Slurm may send it up to 60 s early: at a shorter walltime, at its start)."""
    if signal:
        name, _, at = signal.partition("@")
        return name, int(at), True
    if opportunistic and walltime_s > GRACE_S + 60:
        name, _, at = DEFAULT_NOTICE.partition("@")
        return name, int(at), False
    return None


def tier_lines(opportunistic: str | None) -> list[str]:
    """#SBATCH lines of an opportunistic job (none for others): requeued, not cancelled,
    when a job of a QOS that preempts this one needs its cores."""
    return [f"#SBATCH --qos={opportunistic}", "#SBATCH --requeue"] if opportunistic else []


ORDER_NICE_MAX = 10_000_000
"""The most core-minutes an opportunistic job's order adds to its nice (a 32-core node
for 200 days), far below Slurm's bound of 2^31 - 3 whatever agent_nice is."""


def order_nice(cpus: int, walltime_s: float) -> int:
    """What an opportunistic job adds to its nice: its core-minutes at the walltime Slurm
    is asked for (the tightened one), so that among agents' opportunistic jobs the
    smallest goes first, not the oldest (decision 0023's ``order``; it outweighs age:
    one a job under priority/basic, at most PriorityWeightAge under multifactor)."""
    return min(ORDER_NICE_MAX, max(1, cpus) * max(1, -(-int(walltime_s) // 60)))


def rerun_lines(started: str, ended: str) -> list[str]:
    """The job script's first lines: a run that Slurm started again (after a requeue)
    says so in its output and clears the last run's end; every run records its start
    and which run it is, on which node (``started``: 'EPOCH RESTARTS NODE')."""
    return ["corral_run=${SLURM_RESTART_COUNT:-0}",
            f'if [ "$corral_run" -gt 0 ]; then rm -f {shlex.quote(ended)}; m="{RERUN_LINE}"; echo "$m"; '
            'echo "$m" >&2; fi',
            # the shell's own clock (printf's %T), not a date process: every job starts here
            f'printf -v corral_now "%(%s)T" -1; echo "$corral_now $corral_run ${{SLURMD_NODENAME:-$(hostname)}}" '
            f'> {shlex.quote(started)}']


def read_node(text: str) -> str | None:
    """The node a ``started`` marker names (its third word; none in an older corral's)."""
    parts = text.split()
    return parts[2] if len(parts) > 2 and len(parts[2]) <= 255 and parts[2].isprintable() else None


def read_ended(text: str) -> tuple[int, int | None]:
    """An ``ended`` marker ('STATUS RUN', the run its SLURM_RESTART_COUNT names) -> (status,
    run); an older corral's has no run (None). ValueError if it is not one."""
    parts = text.split()
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else None


def read_started(text: str) -> tuple[float | None, int]:
    """A ``started`` marker -> (epoch, restarts); a marker of an older corral has no count."""
    parts = text.split()
    try:
        return float(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (IndexError, ValueError):
        return None, 0


class Requeues:
    """Per Slurm job: the restarts seen, and the seconds of work lost in runs that
    Slurm requeued (None until measured)."""

    def __init__(self, run: Callable[..., str]) -> None:
        self._run = run
        self.seen: dict[str, tuple[int, float | None]] = {}
        self.causes: dict[str, tuple[str, str]] = {}
        """Per job: how Slurm ended its latest requeued run, and on which node(s)."""

    def why(self, jid: str, restarts: int) -> str:
        """What the agent is told while a requeued job waits to run again: what ended
        the run it lost (once accounting has it), so a node that died is not mistaken for
        a preemption."""
        state, nodes = self.causes.get(jid, ("", ""))
        nodes = nodes if nodes and nodes != "None assigned" else "a node"
        if state == "NODE_FAIL":
            return (f"requeued by Slurm {restarts}x: the node it ran on ({nodes}) failed (NODE_FAIL); "
                    "it runs again from the start, on a node that is up")
        if state == "PREEMPTED":
            return (f"requeued by Slurm {restarts}x (preempted on {nodes}: a job that may take its cores "
                    "needed them); it runs again from the start")
        return (f"requeued by Slurm {restarts}x (preempted: a job that may take its cores needed them, or a "
                "requeue was asked); it runs again from the start")

    def count(self, jid: str) -> int:
        return self.seen.get(jid, (0, None))[0]

    def lost(self, jid: str) -> float | None:
        return self.seen.get(jid, (0, None))[1]

    def note(self, jid: str, restarts: int) -> None:
        """A restart count read from Slurm: more than was known, the work lost is
        measured again (``measure``)."""
        if restarts > self.count(jid):
            self.seen[jid] = (restarts, None)

    def measure(self, jids: Sequence[str]) -> None:
        """One `sacct -D` (slurmdbd, not the controller) for jobs requeued since last
        asked: each run before the latest lost End - Start seconds. Until accounting
        has every earlier run with its end (it lags by seconds), asked again."""
        if not jids:
            return
        try:
            text = self._run("sacct", "-D", "-X", "-n", "-P", "-j", ",".join(jids), "-o",
                             "JobID,State,Start,End,NodeList")
        except CorralError as e:
            log.warning("the work lost by requeued jobs %s is not known yet: %s", list(jids)[:5], e)
            return
        runs: dict[str, list[tuple[float | None, float | None]]] = {}
        ends: dict[str, list[tuple[str, str]]] = {}
        for line in text.splitlines():
            jid, state, start, end, nodes = (line.split("|") + ["", "", "", ""])[:5]
            runs.setdefault(jid.strip(), []).append((slurm_epoch(start), slurm_epoch(end)))
            ends.setdefault(jid.strip(), []).append(((state.split() or [""])[0], nodes))
        for jid in jids:
            # Every row but the latest is a run Slurm ended and requeued (PREEMPTED,
            # REQUEUED, NODE_FAIL ...); sacct lists them oldest first.
            earlier = runs.get(jid, [])[:-1]
            if len(earlier) < self.count(jid) or any(e is None for _, e in earlier):
                continue
            self.causes[jid] = ends[jid][-2]
            lost = sum(max(0.0, e - s) for s, e in earlier if s is not None and e is not None)
            self.seen[jid] = (max(self.count(jid), len(earlier)), round(lost, 1))

    def forget(self, jid: str) -> None:
        self.seen.pop(jid, None)
        self.causes.pop(jid, None)


def extend(record: Path, backend_id: str, start: float, poll_s: float, run: Callable[..., str]) -> None:
    """A running job whose walltime the placement tightened (``record``: 'APPLIED ASKED'
    seconds, in corral's own directory) gets the agent's own back once it is within 5
    minutes (or 3 polls) of the tightened one: `scontrol update TimeLimit`, as root or a
    Slurm operator. It is opportunistic, so no job that may preempt it counted on its
    end. Asked once: the record is removed whatever Slurm answers."""
    try:
        applied, asked = (int(x) for x in record.read_text().split())
    except (OSError, ValueError):
        return
    # before the notice Slurm sends GRACE_S (+60) s before the tightened end
    if time.time() - start < applied - max(120.0 + GRACE_S + 60, 3 * poll_s):
        return
    record.unlink(missing_ok=True)
    try:
        run("scontrol", "update", f"JobId={backend_id}", f"TimeLimit={format_duration(-(-asked // 60) * 60)}")
        log.info("job %s near its tightened walltime (%d s): given the agent's %d s back", backend_id, applied, asked)
    except CorralError as e:
        log.warning("job %s keeps its tightened walltime (%d s): %s", backend_id, applied, e)
