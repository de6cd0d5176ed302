"""The Slurm lane's job states: jobs report their own start and normal end through
marker files in their directory (no controller RPC); one ``squeue`` for the whole job
table every ``poll_s`` (and right after a cancel) catches what dies without a word
(killed, out of memory, timeout, node failure); one ``sacct`` (slurmdbd, not slurmctld)
gives the outcome of what ended. A terminal answer is kept and never asked again."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from corral.core.errors import CorralError
from corral.core.jobs import JobState
from corral.core.safe_read import read_small, read_tail
from corral.lanes.backend import BackendStatus
from corral.lanes.slurm.base import SlurmBase, out_dir
from corral.lanes.slurm.tiers import extend, read_ended, read_node, read_started
from corral.lanes.slurm.vocab import parse_exit, slurm_epoch, translate

# Without cgroups (proctrack/linuxproc), Slurm's memory enforcement kills the step with
# SIGKILL and sacct says FAILED 0:9; the only trace of the reason is this line in stderr.
_OOM_MARK = re.compile(rb"exceeded (job )?memory limit|oom-kill|out of memory", re.IGNORECASE)


TABLE = "JobID:|,State:|,Reason:|,StartTime:|,RestartCnt:|,NodeList:"
"""squeue's fields for the job table (-O), one line per job."""


class Polling(SlurmBase):
    def _dir_of(self, backend_id: str) -> Path | None:
        d = self._dirs.get(backend_id)
        if d is None:  # forgotten, or after a restart: the index on disk
            link = self.jobs_dir / "by-slurm-id" / backend_id
            if link.is_symlink():
                d = self._dirs[backend_id] = link.resolve()
            elif not self._indexed:  # directories of jobs submitted before the index existed: once
                self._indexed = True
                for rec in self.jobs_dir.glob("*/backend_id"):
                    self._dirs.setdefault(read_small(rec).strip(), rec.parent)
                d = self._dirs.get(backend_id)
        return d

    def _index(self, backend_id: str, d: Path) -> None:
        self._dirs[backend_id] = d
        link = self.jobs_dir / "by-slurm-id" / backend_id
        link.parent.mkdir(exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(d)

    def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        out: dict[str, BackendStatus] = {}
        unsure: list[str] = []
        for jid in backend_ids:
            told = self._final.get(jid)
            if told is None and (told := self._self_report(jid)) is not None:
                # the job's own word, before Slurm's: watched until Slurm agrees (``reopened``)
                self._unconfirmed[jid] = (told.requeues, self.clock(), told.start_time)
            if told is not None:
                out[jid] = told
            else:
                unsure.append(jid)
        if unsure and (self._last_poll is None or self.clock() - self._last_poll >= self.poll_s):
            # Stamped before polling: _poll resets it to ask again next tick when
            # accounting lags, and that reset must not be overwritten.
            self._last_poll = self.clock()
            out.update(self._poll(unsure))
        for jid in unsure:
            if jid not in out and jid in self._known:
                out[jid] = self._upgrade(jid, self._known[jid])
        # A job Slurm requeued: the work its earlier runs lost, from accounting, once.
        self.requeues.measure([jid for jid, st in out.items() if st.requeues and self.requeues.lost(jid) is None])
        for jid, st in out.items():
            if st.requeues:
                out[jid] = st = replace(st, requeues=self.requeues.count(jid), lost_s=self.requeues.lost(jid))
            if st.state.terminal:  # the one place a job moves from live to final
                self._final[jid] = st
                self._known.pop(jid, None)
        return out

    CONFIRM_S = 1800.0
    """How long an end taken from a job's own marker is watched for Slurm running the job
    again, at most (it is dropped sooner once Slurm shows the job ended, or no longer has it)."""

    def reopened(self) -> list[BackendStatus]:
        """Jobs whose end corral took from their own marker and that Slurm has since run
        again: their run was orphaned (its node's slurmd lost, the controller failing over)
        and Slurm requeued the job, NODE_FAIL, after the orphan ended; or a backup
        controller recovered the job from a state saved before that run began and runs it
        again as if for the first time (its restart count unmoved: ``_rerun``). Each is
        answered once, live as Slurm says, its requeues counted; one squeue per poll, only
        while such ends are unconfirmed (issue 50)."""
        if not self._unconfirmed or (self._last_confirm is not None
                                     and self.clock() - self._last_confirm < self.poll_s):
            return []
        self._last_confirm = self.clock()
        text = self._confirming_table()
        if text is None:  # the controller away: asked again at the next poll
            return []
        out: list[BackendStatus] = []
        seen: set[str] = set()
        for line in text.splitlines():
            jid, st, _, start, restarts, nodes = [x.strip() for x in (line.split("|") + [""] * 5)[:6]]
            if jid not in self._unconfirmed:
                continue
            seen.add(jid)
            live = self._confirm(jid, st, start, int(restarts) if restarts.isdigit() else 0, nodes)
            if live is not None:
                out.append(live)
        for jid in [j for j in self._unconfirmed if j not in seen]:
            del self._unconfirmed[jid]  # gone from Slurm's table: its end stands
        return out

    def _confirming_table(self) -> str | None:
        """Slurm's job table for ``reopened``; None: the controller did not answer."""
        newest = max(since for _, since, _ in self._unconfirmed.values())
        if self._table is not None and self.clock() - self._table[0] < self.poll_s and self._table[0] >= newest:
            # the status poll's own table, this poll: no RPC more (never one from before an
            # end was taken: it could show the job still pending from before its run)
            return self._table[1]
        try:
            return self._run("squeue", "-h", "-a", "-t", "all", "-O", TABLE)
        except (CorralError, OSError):
            return None

    def _confirm(self, jid: str, st: str, start: str, again: int, nodes: str) -> BackendStatus | None:
        """One unconfirmed end against its job's row in Slurm's table (``again``: Slurm's
        restart count): the job's live status where Slurm runs it again, else None (its
        end confirmed, or still watched)."""
        run, since, began = self._unconfirmed[jid]
        state = translate(st)
        if again == run and self._rerun(jid, st, state, slurm_epoch(start), began):
            del self._unconfirmed[jid]
            running = state is not JobState.PENDING  # one that already ended again: its new marker ends it
            return self._live(jid, running, start, again, nodes, None if running else "Slurm runs it again: its "
                              "controller recovered it from a state saved before its last run began")
        if again > run:
            del self._unconfirmed[jid]
            self.requeues.note(jid, again)
            running = state is JobState.RUNNING
            return self._live(jid, running, start, again, nodes, None if running else self.requeues.why(jid, again))
        if (state.terminal and not st.startswith("COMPLETING")) or self.clock() - since > self.CONFIRM_S:
            del self._unconfirmed[jid]  # Slurm agrees that this run ended the job
        return None

    @staticmethod
    def _live(jid: str, running: bool, start: str, again: int, nodes: str, reason: str | None) -> BackendStatus:
        """A reopened job: RUNNING since Slurm's ``start`` on ``nodes``, else PENDING for ``reason``."""
        return BackendStatus(jid, JobState.RUNNING if running else JobState.PENDING, reason=reason,
                             start_time=slurm_epoch(start) if running else None, requeues=again,
                             node=(nodes or None) if running else None)

    def _rerun(self, jid: str, st: str, state: JobState, start: float | None, began: float | None) -> bool:
        """Whether Slurm runs again, under the same restart count, a job whose end corral
        took from its run's own marker: pending again (a job that ended never is), or
        started after that run began (Slurm's start of the run that wrote the marker is
        at or before the marker's own start; 2 s for the node's clock against the
        controller's). Then that marker is the superseded run's: removed (never one the
        new run wrote since, which is later than its start), so the job's record follows
        Slurm's and then the new run's own end."""
        pending = state is JobState.PENDING and not st.startswith(("COMPLETING", "REQUEUE"))
        again = pending or (start is not None and began is not None and start > began + 2)
        d = self._dir_of(jid) if again else None
        if d is not None:
            self._final.pop(jid, None)
            marker = out_dir(d) / "ended"
            try:  # unlink removes a link, never what it names
                if pending or start is None or os.lstat(marker).st_mtime <= start:
                    marker.unlink()
            except OSError:
                pass
        return again

    def _started(self, jid: str) -> tuple[float | None, int]:
        """The job's own record of its last run's start: (epoch, restarts before it),
        believed only where corral's own script wrote it (root ran it). A script run as the
        job's own user could write any start while the job waits: the first start recorded
        is kept, and a start ahead of the end charged the job nothing of its budget."""
        d = self._dir_of(jid)
        try:  # never through a link, never blocking (read_small)
            if d is None or out_dir(d).stat().st_uid != os.geteuid():
                return None, 0
            return read_started(read_small(out_dir(d) / "started", 64))
        except OSError:
            return None, 0

    def _self_report(self, jid: str) -> BackendStatus | None:
        """A normal end, written by the job script after its work returned. A code over 128
        means the work died by a signal (a segfault, say): Slurm's accounting tells more."""
        d = self._dir_of(jid)
        if d is None:
            return None
        out = out_dir(d)
        try:
            if out.stat().st_uid != os.geteuid():
                # The batch script runs as the job's own user, who may write this marker
                # before its work is done: its end is Slurm's word, at the next poll.
                return None
            code, run = read_ended(read_small(out / "ended"))
        except (OSError, ValueError):
            return None
        if code > 128:
            return None
        started, restarts = self._started(jid)
        if run is not None and (run < restarts or run < self.requeues.count(jid)):
            # The end of a run Slurm has superseded (requeued after NODE_FAIL or a preemption,
            # its node's slurmd gone while the run went on): not this job's end. Slurm's word,
            # at the next poll, says where the job is.
            return None
        self.requeues.note(jid, restarts)
        end = os.lstat(out / "ended").st_mtime
        node = self._node(jid) or (last.node if (last := self._known.get(jid)) else None)
        if code == 0:
            return BackendStatus(jid, JobState.COMPLETED, 0, None, started, end, requeues=restarts, node=node)
        return BackendStatus(jid, JobState.FAILED, code, f"exited with code {code}", started, end, requeues=restarts,
                             node=node)

    def _ended_code(self, jid: str) -> int | None:
        """The status the job's script wrote at its end (``ended``), believed only where
        corral's own script wrote it (root ran it)."""
        d = self._dir_of(jid)
        try:
            if d is None or out_dir(d).stat().st_uid != os.geteuid():
                return None
            return read_ended(read_small(out_dir(d) / "ended", 64))[0]
        except (OSError, ValueError):
            return None

    def _node(self, jid: str) -> str | None:
        """The node the job's script said it started on, believed only where corral's own
        script wrote it (root ran it): a script run as the job's own user could name any."""
        d = self._dir_of(jid)
        if d is None:
            return None
        try:
            if out_dir(d).stat().st_uid != os.geteuid():
                return None
            return read_node(read_small(out_dir(d) / "started", 300))
        except OSError:
            return None

    def _upgrade(self, jid: str, last: BackendStatus) -> BackendStatus:
        """Between full polls: a PENDING job whose script wrote 'started' is RUNNING (the
        marker of this run: a requeued job's last run left one too)."""
        if last.state is JobState.PENDING:
            started, restarts = self._started(jid)
            if started is not None and restarts >= self.requeues.count(jid):
                last = BackendStatus(jid, JobState.RUNNING, start_time=started, requeues=restarts,
                                     node=self._node(jid) or last.node)
                self._known[jid] = last
        return last

    def _poll(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        """One squeue for the whole table (the same RPCs as for one job), then one sacct."""
        wanted = set(backend_ids)
        out: dict[str, BackendStatus] = {}
        ended: dict[str, str] = {}
        text = self._run("squeue", "-h", "-a", "-t", "all", "-O", TABLE)
        self._table = (self.clock(), text)
        for line in text.splitlines():
            jid, st, reason, start, restarts, nodes = (line.split("|") + ["", "", "", "", ""])[:6]
            jid = jid.strip()
            if jid not in wanted:
                continue
            again = int(restarts) if restarts.strip().isdigit() else 0
            self.requeues.note(jid, again)
            state = translate(st)
            if again and (st.split() or [""])[0] in ("COMPLETING", "PREEMPTED", "REQUEUED", "REQUEUE_HOLD"):
                # Being requeued: Slurm keeps the job (same id) and runs it again.
                state = JobState.PENDING
            elif state.terminal or st.startswith("COMPLETING"):
                ended[jid] = st
                continue
            why = None if reason in ("None", "") else reason
            if again and state is JobState.PENDING:
                why = self.requeues.why(jid, again) + (f" ({why})" if why else "")
            out[jid] = self._known[jid] = BackendStatus(
                jid, state, reason=why, start_time=slurm_epoch(start) if state is JobState.RUNNING else None,
                requeues=again, node=nodes.strip() or None if state is JobState.RUNNING else None)
        self._extend([st for st in out.values() if st.state is JobState.RUNNING and st.start_time is not None])
        missing = [j for j in backend_ids if j not in out]
        if missing:
            final = self._accounting(missing)
            for jid in missing:
                if jid in final:
                    out[jid] = replace(final[jid], requeues=self.requeues.count(jid))
                elif jid in ended:  # accounting lags squeue by a few seconds
                    out[jid] = BackendStatus(jid, JobState.RUNNING, reason="ended; waiting for accounting",
                                             requeues=self.requeues.count(jid))
                    self._last_poll = None  # look again next tick, not in poll_s
        return out

    def _tightened(self, backend_id: str) -> Path:
        """Where a tightened job's walltimes are kept: corral's own directory, never the
        job's (its user writes that one; decision 0010)."""
        return self.jobs_dir / "tightened" / backend_id

    def _extend(self, running: Sequence[BackendStatus]) -> None:
        """Jobs near the walltime the placement tightened get the agent's own back (slurm_tiers.extend)."""
        for st in running:
            if st.start_time is not None:
                extend(self._tightened(st.backend_id), st.backend_id, st.start_time, self.poll_s, self._run)

    def _accounting(self, ids: Sequence[str]) -> dict[str, BackendStatus]:
        text = self._run("sacct", "-X", "-n", "-P", "-j", ",".join(ids),
                         "-o", "JobID,State,ExitCode,Start,End,Reason,NodeList")
        out: dict[str, BackendStatus] = {}
        for line in text.splitlines():
            jid, st, code, start, end, reason, nodes = (line.split("|") + [""] * 7)[:7]
            state = translate(st)
            if not state.terminal:
                continue  # squeue is the authority for live jobs
            exit_code, sig = parse_exit(code)
            if state is JobState.FAILED and not sig and exit_code and self._ended_code(jid) == exit_code + 128:
                # Slurm 22.05 shows a batch script's exit status over 128 less 128 (137 -> 9:0):
                # the script's own end marker tells the work died of signal 9 from an exit 9
                exit_code, sig = exit_code + 128, exit_code
            why = None
            if st.startswith("NODE_FAIL"):  # not the job's doing: no exit code of its own
                why, exit_code = (f"the node it ran on ({nodes}) failed (Slurm: NODE_FAIL) and the job was not "
                                  "requeued: submit it again"), None
            elif state is JobState.FAILED and sig == 9 and self._stderr_says_oom(jid):
                state, why = JobState.OUT_OF_MEMORY, "killed for using more memory than it asked for"
            elif state is JobState.FAILED:
                why = f"killed by signal {sig}" if sig else f"exited with code {exit_code}"
            elif state is JobState.TIMEOUT:
                why = "killed after its walltime"
            elif state is JobState.CANCELLED and jid not in self._cancelled and (
                    reason.startswith("Dependency") or (slurm_epoch(start) is None and self._waited(jid))):
                # Slurm's kill-on-invalid-dep ended it, not a cancel of corral's. sacct's
                # Reason says so only when accounting caught the job while it waited
                # ("None" otherwise, seen in CI): a job sent with a dependency that
                # never started and that corral did not cancel is the same case.
                why, exit_code = "dependency never satisfied: a job it waited for did not complete (after_ok)", None
            elif state is JobState.CANCELLED:
                why, exit_code = "cancelled", None  # the one rule: a cancelled job has no exit code
            ran_on = nodes.strip() if nodes.strip() not in ("", "None assigned") else None
            out[jid] = BackendStatus(jid, state, exit_code, why, slurm_epoch(start), slurm_epoch(end), node=ran_on)
        return out

    def _waited(self, backend_id: str) -> bool:
        """Whether this job was sent with a Slurm dependency (its job.sh says so)."""
        d = self._dir_of(backend_id)
        try:
            return d is not None and "#SBATCH --dependency=" in read_small(d / "job.sh", 1 << 20)
        except OSError:
            return False

    def _stderr_says_oom(self, backend_id: str) -> bool:
        d = self._dir_of(backend_id)
        if d is None:
            return False
        try:  # a job of a Unix user writes its own directory: never through a link
            return bool(_OOM_MARK.search(read_tail(out_dir(d) / "stderr", 4096)))
        except OSError:
            return False
