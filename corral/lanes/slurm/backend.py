"""The Slurm backend: jobs are Slurm batch jobs, driven through Slurm's CLIs.

::

    submit  -> write jobs/<id>/job.sh, then one `sbatch --parsable job.sh`
    status  -> jobs report their own start and normal end through marker files in
               their directory (no controller RPC); one `squeue` for the whole job
               table every ``poll_s`` (and right after a cancel) catches what dies
               without a word (killed, out of memory, timeout, node failure); one
               `sacct` (slurmdbd, not slurmctld) gives the outcome of what ended
    cancel  -> one `scancel id id ...`
    control -> `scontrol hold|release|requeue id`, `scancel --signal=S --full id`
    usage   -> `sacct -j id -o TotalCPU,MaxRSS` (slurmdbd), when asked, until both are in
    after   -> `--dependency=afterok:..` with `--kill-on-invalid-dep=yes`: Slurm holds
               a dependent job, and cancels it when a parent it needs did not complete
    limits  -> `scontrol show partition/node`, cached until slurm.conf changes

Made of four parts (corral/lanes/slurm/base.py draws them): the batch script
(script.py), job states (state.py), the facility's limits and usage (facility.py), and
here what acts on jobs.

Provenance: every job is named ``corral-<id>`` and carries ``--comment`` with the
principal, sponsor, session and kind, so ``sacct -o JobName,Comment`` alone tells agent
work from human work. Agents' jobs get ``--nice`` (and ``--qos`` when configured) so
people's interactive work keeps priority.

Who runs the job (a gateway run as a service account with ``[slurm] submitter``: the
same, through the privileged submitter, slurm_submitter.py): when the principal has a
``unix_user`` and the gateway runs as root,
``sbatch --uid/--gid`` submits as that user and the job directory is handed to it;
otherwise jobs run as the gateway's user. The job gets the gateway's basic environment
(PATH, HOME, LANG, ...), never its secrets, plus the spec's ``env``.
"""
from __future__ import annotations

import logging
import pwd
import secrets
import shlex
import signal as _signal
from pathlib import Path
from typing import Sequence

from corral.core import proc
from corral.core.errors import BackendError, InvalidRequest
from corral.core.jobs import JobSpec, JobState
from corral.core.safe_read import read_small
from corral.lanes.backend import CONTROLS, BackendStatus, OutputPaths, SubmitContext
from corral.lanes.slurm.base import out_dir, write_own
from corral.lanes.slurm.facility import Facility
from corral.lanes.slurm.forwarding import FORWARDED
from corral.lanes.slurm.script import Scripts, job_name
from corral.lanes.slurm.state import Polling
from corral.lanes.slurm.submitter import handed_to
from corral.lanes.slurm.tiers import WALLTIME_LABEL
from corral.lanes.slurm.vocab import STATES, parse_exit, parse_slurm_time, translate

log = logging.getLogger(__name__)


class SlurmBackend(Scripts, Polling, Facility):
    name = "slurm"
    dependencies = True

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        self.preflight(spec)
        d = self.jobs_dir / str(ctx.job_id)
        recorded = d / "backend_id"
        if recorded.exists():
            return read_small(recorded).strip()
        if (d / "job.sh").exists():  # written before a crash or a failed sbatch: was it submitted?
            found = self._find_submitted(job_name(ctx, spec), read_small(d / "nonce").strip())
            if found:
                write_own(recorded, found)
                self._index(found, d)
                return found
        # d is corral's alone (its owner writes it; jobs reach it by name only): job.sh, the
        # nonce and the record of the Slurm id. What the job writes (its output, its markers)
        # lies in d/out, handed to the job's user only once corral has written what it puts
        # there, so the gateway never writes, creates or chowns where a job could have put a
        # link (docs/decisions/0010-privsep.md).
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o711)
        if not (d / "nonce").exists():
            # Job ids restart with every corral install: the nonce tells this job from
            # another install's job of the same name.
            write_own(d / "nonce", secrets.token_hex(8))
        user = self._run_as(ctx)
        helped = self.submitter.applies(ctx.unix_user, ctx.kind) if self.submitter is not None and not user else None
        self._lay_out(d, ctx, spec, user, helped)
        write_own(d / "job.sh", script := self.render(ctx, spec, d, read_small(d / "nonce").strip()))
        if helped is not None:  # a service-account gateway: sbatch --uid through the privileged submitter
            return self._submit_as(ctx, spec, d, helped, script)
        argv = ["sbatch", "--parsable", f"--chdir={self._chdir(ctx, spec, d)}"]
        if user:
            argv += [f"--uid={user[0]}", f"--gid={user[1]}"]
        out = self._run(*argv, str(d / "job.sh")).strip()
        backend_id = out.split(";")[0]
        if not backend_id.isdigit():
            raise BackendError(f"sbatch answered {out!r}, not a job id", argv=argv)
        write_own(recorded, backend_id)
        self._index(backend_id, d)
        if spec.labels.get(WALLTIME_LABEL):  # tightened by the placement: given back before it is reached
            self._tightened(backend_id).parent.mkdir(mode=0o700, exist_ok=True)
            self._tightened(backend_id).write_text(f"{spec.labels[WALLTIME_LABEL]} {spec.walltime_s}")
        self._known[backend_id] = BackendStatus(backend_id, JobState.PENDING, reason="submitted")
        return backend_id

    def _submit_as(self, ctx: SubmitContext, spec: JobSpec, d: Path, user: pwd.struct_passwd, script: str) -> str:
        """sbatch as ``user`` through the privileged submitter: job.sh's own #SBATCH lines
        as its arguments (the helper fences the script's off; it fixes output and error)."""
        assert self.submitter is not None
        options = [shlex.split(line[len("#SBATCH "):])[0] for line in script.splitlines() if line.startswith("#SBATCH ")]
        options = [o for o in options if not o.startswith(("--output=", "--error="))]
        self._counted(["sbatch"])
        backend_id = self.submitter.submit(str(ctx.job_id), user.pw_uid,
                                           [*options, f"--chdir={self._chdir(ctx, spec, d)}"], script)
        write_own(d / "backend_id", backend_id)
        self._index(backend_id, d)
        self._known[backend_id] = BackendStatus(backend_id, JobState.PENDING, reason="submitted")
        return backend_id

    def cancel(self, backend_ids: Sequence[str]) -> None:
        if backend_ids:
            self._cancelled.update(backend_ids)
            plain, owned = self._by_owner(backend_ids)
            if plain:
                self._run("scancel", *plain)
            for uid, ids in owned.items():  # jobs of other users: scancel as their owner
                assert self.submitter is not None
                self._counted(["scancel"])
                r = self.submitter.as_owner("cancel", uid, *ids)
                if r.returncode != 0:
                    log.warning("scancel as uid %d of %s: %s", uid, ids, (r.stderr or r.stdout).strip()[-300:])
            self._last_poll = None  # a cancelled job says nothing itself: ask Slurm next tick

    def control(self, backend_id: str, action: str, signal: int | None = None) -> None:
        if action not in CONTROLS:
            raise InvalidRequest(f"unknown action {action!r}; use one of {', '.join(CONTROLS)}")
        # --batch: the job's shell alone, which passes the signal on (render); TERM, KILL
        # and STOP go to every process of the job, as a cancel's do.
        plain = signal in (_signal.SIGTERM, _signal.SIGKILL, _signal.SIGSTOP)
        if action == "signal" and signal is not None and not plain and _signal.Signals(signal).name[3:] not in FORWARDED:
            raise InvalidRequest(f"Slurm jobs take these signals: {', '.join(FORWARDED)}, TERM, KILL, STOP")
        argv = (["scancel", f"--signal={signal}", "--full" if plain else "--batch", backend_id] if action == "signal"
                # a hold asked by a principal is a user hold (JobHeldUser, as sbatch -H makes), which
                # its owner may release; root's plain hold would be the admin's
                else ["scontrol", "uhold" if action == "hold" else action, backend_id])
        self._counted(argv)
        owner = self._by_owner([backend_id])[1]
        if owner and self.submitter is not None:  # another user's job: as its owner
            uid = next(iter(owner))
            r = self.submitter.as_owner(*(("signal", uid, backend_id, str(signal), "full" if plain else "batch")
                                          if action == "signal" else ("control", uid, backend_id, argv[1])))
        else:
            r = proc.run(argv, env=self._env(), inherit_env=False, timeout=self.timeout_s, check=False)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).strip().splitlines()
            text = said[-1] if said else f"exit code {r.returncode}"
            if "Invalid job id" in text or "not found" in text.lower():
                raise BackendError(f"Slurm does not know job {backend_id} any more: {text}", argv=argv)
            raise InvalidRequest(f"Slurm refused to {action} the job: {text}",
                                 hint="hold and release apply to a pending job, requeue and signal to a running one")
        if action == "requeue":
            # It runs again from the start: its markers of the last run must not end it.
            d = self._dir_of(backend_id)
            for marker in ("started", "ended"):
                if d is not None:  # unlink removes a link, never what it names
                    (out_dir(d) / marker).unlink(missing_ok=True)
            self._final.pop(backend_id, None)
            self._known[backend_id] = BackendStatus(backend_id, JobState.PENDING, reason="requeued")
        self._last_poll = None  # its state changed: ask Slurm next tick

    def _by_owner(self, backend_ids: Sequence[str]) -> tuple[list[str], dict[int, list[str]]]:
        """Jobs the gateway acts on itself, and those submitted as another user through
        the privileged submitter, by that user's uid."""
        plain: list[str] = []
        owned: dict[int, list[str]] = {}
        for jid in backend_ids:
            d = self._dir_of(jid) if self.submitter is not None else None
            uid = handed_to(d) if d is not None else None
            if uid is None:
                plain.append(jid)
            else:
                owned.setdefault(uid, []).append(jid)
        return plain, owned

    def remembered(self) -> set[str]:
        """The jobs it holds anything of in memory (answers, directories): what ``forget``
        lets go once the core has recorded their ends, so that it does not grow with every
        job the gateway ever saw."""
        return set(self._final) | set(self._known) | set(self._dirs)

    def forget(self, backend_ids: Sequence[str]) -> None:
        """The core recorded these jobs' ends: their answers and directories need not be
        kept here (a directory is found again on disk if its output is read later)."""
        for jid in backend_ids:
            self._final.pop(jid, None)
            self._known.pop(jid, None)
            self._dirs.pop(jid, None)
            self._cancelled.discard(jid)
            self.requeues.forget(jid)
            self._tightened(jid).unlink(missing_ok=True)

    def output_paths(self, backend_id: str) -> OutputPaths:
        d = self._dir_of(backend_id)
        out = out_dir(d) if d is not None else self.jobs_dir / "missing"
        return OutputPaths(out / "stdout", out / "stderr")

    def close(self) -> None:
        """Slurm owns the jobs; nothing to stop."""

    def _find_submitted(self, name: str, nonce: str) -> str | None:
        """Only after a crash between sbatch and recording its answer, or a failed sbatch.
        squeue first: accounting lags a new job by seconds."""
        for argv in (("squeue", "-h", "-a", "-t", "all", "-n", name, "-o", "%i|%k"),
                     ("sacct", "-X", "-n", "-P", "--name", name, "-o", "JobID,Comment", "-S", "now-7days")):
            for line in self._run(*argv).splitlines():
                jid, _, comment = line.partition("|")
                if jid.strip().isdigit() and f"nonce={nonce}" in comment:
                    return jid.strip()
        return None


__all__ = ["SlurmBackend", "STATES", "translate", "parse_exit", "parse_slurm_time"]
