"""Control of one job after its submission (``job_control``) and what it used once
ended (``job_usage``). The service fetches the caller's job (visibility) and hands it
here; these verbs decide, record and act as every other verb does.

::

    Service.control ─▶ get_job ─▶ JobControl.control ─▶ gate.check("cancel") ─▶ audit
                                     ├─ not yet sent (held by a dependency, or never sent):
                                     │    hold/release in corral's own row (the Sender skips it)
                                     └─ sent: its lane (Slurm: scontrol/scancel; local:
                                          hold/release in its queue, signal by its supervisor)
    Service.usage ─▶ get_job ─▶ JobControl.usage ─▶ what the lane measured (stored, or
                                     asked of Slurm's accounting until both figures are in) ─▶ seff-like efficiency

A control is allowed where a cancel is: the same weight, on one's own job.
"""

from __future__ import annotations

import math
import signal as signals
from typing import Any

from corral.lanes.backend import CONTROLS, DONE, Usage
from corral.control.reconciler import Reconciler
from corral.core.db import HELD_REASON, Database
from corral.core.errors import Conflict, CorralError, Forbidden, InvalidRequest, NotFound
from corral.core.jobs import Job, JobState
from corral.lanes.registry import Lanes
from corral.core.principals import Caller
from corral.safety.audit import Audit
from corral.safety.gate import Gate, job_resource

from corral.core.signals import SIGNALS
from corral.gateway.approvals import Asking, not_asking


def parse_signal(value: str | int | None) -> int:
    """'USR1', 'SIGUSR1', 10 -> the signal's number; only ``SIGNALS``."""
    if value is None:
        raise InvalidRequest(f"signal needs a signal: one of {', '.join(SIGNALS)}")
    if isinstance(value, int) and not isinstance(value, bool):
        names = {getattr(signals, "SIG" + n).value: n for n in SIGNALS}
        if value in names:
            return value
    elif isinstance(value, str):
        name = value.upper().removeprefix("SIG")
        if name in SIGNALS:
            return int(getattr(signals, "SIG" + name))
        if name.isdigit():
            return parse_signal(int(name))
    raise InvalidRequest(f"signal {value!r} is not one corral sends; use one of {', '.join(SIGNALS)}")


class JobControl:
    def __init__(self, db: Database, lanes: Lanes, gate: Gate, audit: Audit, reconciler: Reconciler) -> None:
        self.db, self.lanes, self.gate, self.audit, self.reconciler = db, lanes, gate, audit, reconciler
        self.asking: Asking = not_asking
        """Where a rule that asks the sponsor holds the action (ApprovalVerbs.asking, set at assembly)."""

    async def control(self, caller: Caller, job: Job, action: str, signal: str | int | None = None) -> Job:
        """Hold, release, requeue or signal ``job`` (the caller's, already looked up)."""
        what = {"job_id": job.id, "action": action}
        with self.audit.refusals(caller, "control", what):
            if action not in CONTROLS:
                raise InvalidRequest(f"unknown action {action!r}; use one of {', '.join(CONTROLS)}")
            sig = parse_signal(signal) if action == "signal" else None
            if action != "signal" and signal is not None:
                raise InvalidRequest(f"a signal goes with action 'signal', not {action!r}; leave it out")
            with self.asking(caller, "control", {"job_id": job.id, "action": action, "signal": signal},
                             f"{action} job {job.id}" + (f" with {signal}" if signal is not None else "")):
                rule = self.gate.check(caller, "cancel", "Job", {"id": job.id, **job_resource(job.spec, job.principal)})
            if job.terminal:
                raise InvalidRequest(f"job {job.id} has ended ({job.state.value}); {action} applies to a pending "
                                     "or running job", hint="submit it again to run it again")
            waiting = self.db.approvals.waiting_for(job.id) if job.backend_id is None else None
            if waiting is not None and action == "release":
                raise Forbidden(f"job {job.id} waits for approval #{waiting['id']} by {waiting['sponsor']}; only "
                                "they can let it run", hint="wait for their answer: you are told when it comes "
                                "(or cancel the job)")
            if job.id in self.db.moves.open_ids():
                # Held by the move, then cancelled: released between the two, it could start
                # there, be killed by the cancel, and run again on the other cluster.
                raise Conflict(f"job {job.id} is being moved to another cluster; {action} it in a moment",
                               hint="its next event says where it waits")
        self.audit.record(caller, "control", "allow", rule, [{**what, "signal": sig, "backend_id": job.backend_id}])
        if job.backend_id is None:  # corral holds it (a dependency, or the scheduler was away)
            if action not in ("hold", "release"):
                raise InvalidRequest(f"job {job.id} has not been sent to its lane yet; it cannot be {DONE[action]}",
                                     hint="hold or cancel it now, or wait until it is RUNNING")
            why = (HELD_REASON if action == "hold"
                   else "released; waiting to be sent")
            if not self.db.set_held(job.id, action == "hold", why):
                raise InvalidRequest(f"job {job.id} was just sent to its lane; try again")
        else:
            lane = self.lanes.by_name.get(job.backend)
            if lane is None:
                raise NotFound(f"job {job.id}'s lane {job.backend!r} is not offered any more")
            await lane.control(job.backend_id, action, sig)
            self._shown_at_once(job, action)
        self.reconciler.kick()
        return self.db.get_job(job.id) or job

    def _shown_at_once(self, job: Job, action: str) -> None:
        """What corral just made its lane do, in the record at once (every edge reads it,
        and wakes on it), not one poll of the lane later: a held job waits JobHeldUser (Slurm's
        word for a user's hold), a released one waits on nothing of the user's, a requeued one
        waits again with one more run counted. The next poll writes whatever the lane says."""
        progress = self.reconciler.progress
        with self.db.transaction():
            if action in ("hold", "release") and job.state is JobState.PENDING:
                progress.write(job.id, JobState.PENDING, reason="JobHeldUser" if action == "hold" else None,
                               requeues=job.requeues, lost_s=job.lost_s)
            elif action == "requeue" and job.state is JobState.RUNNING:
                progress.write(job.id, JobState.PENDING, reason="requeued", requeues=job.requeues + 1,
                               lost_s=job.lost_s, start_time=job.start_time)
            else:
                return
        progress.changed([job.id])

    async def usage(self, caller: Caller, job: Job) -> dict[str, Any]:
        """What ``job`` used against what it asked, as ``seff`` reports it, and what to ask next time."""
        cpu_s, rss = self.db.usage_of(job.id)
        how = "recorded with its outcome"
        if job.terminal and job.backend_id and not settled(cpu_s, rss):
            lane = self.lanes.by_name.get(job.backend)
            if lane is not None:
                try:
                    got: Usage = await lane.usage(job.backend_id)
                except CorralError as e:
                    got = Usage(how=f"its lane could not say: {e.message}")
                # The lane's answer now over an earlier one: Slurm's accounting fills in a
                # job's figures over a few seconds (its MaxRSS once came before its CPU time,
                # which read 0 until then). Kept only once both are there, so a partial answer
                # is asked again rather than frozen.
                cpu_s = got.cpu_s if got.cpu_s is not None else cpu_s
                rss = got.max_rss_mb if got.max_rss_mb is not None else rss
                how = got.how
                if settled(cpu_s, rss):
                    self.db.set_usage(job.id, cpu_s, rss)
        return report(job, cpu_s, rss, how)


def settled(cpu_s: float | None, rss_mb: float | None) -> bool:
    """Both figures measured (a job that ran used some CPU time and some memory: a zero is
    accounting not yet caught up, asked again next time)."""
    return bool(cpu_s) and bool(rss_mb)


def report(job: Job, cpu_s: float | None, rss_mb: float | None, how: str) -> dict[str, Any]:
    s = job.spec
    elapsed = (job.end_time - job.start_time) if job.start_time and job.end_time else None
    out: dict[str, Any] = {
        "job_id": job.id, "state": job.state.value, "final": job.terminal,
        "asked": {"cpus": s.cpus, "memory_mb": s.memory_mb, "walltime_s": s.walltime_s, "gpus": s.gpus},
        "elapsed_s": None if elapsed is None else round(elapsed, 3),
        "cpu_s": None if cpu_s is None else round(cpu_s, 3),
        "max_rss_mb": None if rss_mb is None else round(rss_mb, 1),
        "efficiency": {}, "how": how, "advice": [],
    }
    if not job.terminal:
        out["advice"].append("the job has not ended: its usage is known once it has (wait_for_job)")
        return out
    eff = out["efficiency"]
    if elapsed and cpu_s is not None:
        eff["cpu"] = round(cpu_s / (elapsed * s.cpus), 3)
        used = cpu_s / elapsed
        if s.cpus > 1 and used < 0.5 * s.cpus:
            out["advice"].append(f"used {used:.1f} of {s.cpus} CPUs on average: ask cpus={max(1, round(used + 0.3))}")
    if rss_mb is not None:
        eff["memory"] = round(rss_mb / s.memory_mb, 3)
        if job.state is JobState.OUT_OF_MEMORY:
            out["advice"].append(f"ran out of its {s.memory_mb}M: ask memory='{s.memory_mb * 2}M' or more")
        elif s.memory_mb > 512 and rss_mb < 0.5 * s.memory_mb:
            out["advice"].append(f"peaked at {rss_mb:.0f}M of {s.memory_mb}M: ask memory='{_round_mb(rss_mb * 1.5)}M'")
    if elapsed:
        eff["time"] = round(elapsed / s.walltime_s, 3)
        if job.state is JobState.TIMEOUT:
            out["advice"].append(f"hit its walltime of {s.walltime_s}s: ask more, or checkpoint")
        elif s.walltime_s > 900 and elapsed < 0.25 * s.walltime_s:
            # A shorter limit lets the scheduler backfill it sooner.
            out["advice"].append(f"ran {elapsed:.0f}s of {s.walltime_s}s asked: walltime='{math.ceil(elapsed * 2 / 60)}m' "
                                 "starts sooner")
    return out


def _round_mb(mb: float) -> int:
    return max(64, math.ceil(mb / 64) * 64)
