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
    usage   -> `sacct -j id -o TotalCPU,MaxRSS` (slurmdbd), once, when asked
    after   -> `--dependency=afterok:..` with `--kill-on-invalid-dep=yes`: Slurm holds
               a dependent job, and cancels it when a parent it needs did not complete
    limits  -> `scontrol show partition/node`, cached until slurm.conf changes

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

import json
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal as _signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from corral.core import proc
from corral.sandbox import opendir
from corral.sandbox.bwrap import system_python, tool
from corral.sandbox.seccomp import apply_argv
from corral.core.errors import BackendError, CorralError, InvalidRequest
from corral.core.jobs import JobSpec, JobState, format_duration
from corral.core.safe_read import read_small, read_tail
from corral.storage import IMAGE_AT, IMAGE_FILE, META_LABEL, meta
from corral.lanes.backend import CONTROLS, BackendStatus, OutputPaths, Partition, SubmitContext, Usage, base_env
from corral.lanes.slurm.tiers import (TIER_LABEL, WALLTIME_LABEL, Requeues, Tiers, extend, read_started, rerun_lines,
                          tier_lines)
from corral.lanes.slurm.submitter import Submitter, handed_to
from corral.lanes.slurm.vocab import (STATES, slurm_epoch, expand_nodes, parse_kv, min_job_age_s, parse_exit, parse_slurm_time,
                          translate)

if TYPE_CHECKING:
    from corral.core.identity import Identities, Identity
    from corral.sandbox.bwrap import Sandbox

log = logging.getLogger(__name__)

# Without cgroups (proctrack/linuxproc), Slurm's memory enforcement kills the step with
# SIGKILL and sacct says FAILED 0:9; the only trace of the reason is this line in stderr.
_OOM_MARK = re.compile(rb"exceeded (job )?memory limit|oom-kill|out of memory", re.IGNORECASE)


def job_name(ctx: SubmitContext, spec: JobSpec) -> str:
    """``corral-<id>``, then the user's ``--name`` (Slurm's own listings show both; the
    name's pattern, ``[A-Za-z0-9_.+-]``, is safe in a job name)."""
    return f"corral-{ctx.job_id}" + (f"-{spec.name}" if spec.name else "")


def _members(partition: dict[str, str], nodes: Iterable[str]) -> list[str]:
    """The nodes of a partition (its ``scontrol show partition`` line): all of them when
    its Nodes= names none of them (``ALL``)."""
    names, listed = list(nodes), expand_nodes(partition.get("Nodes", ""))
    return [n for n in names if n in listed] or names


FORWARDED = ("HUP", "INT", "QUIT", "USR1", "USR2", "CONT", "TSTP")
ENV_FD = 6
"""The batch script opens the job's environment on this descriptor for the work's last step."""
WORKDIR_FD = 7
SCRIPT_FD = 3
SCRIPT = f"/dev/fd/{SCRIPT_FD}"
"""Signals job_control may send a Slurm job, passed on by its batch shell to the work
(TERM and KILL are Slurm's own: a cancel, a walltime)."""

_SIZE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def _rss_mb(text: str) -> float | None:
    """sacct's MaxRSS ('204800K', '1.50G', '0') -> MB."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)([KMGT]?)\s*$", text or "")
    return float(m.group(1)) * _SIZE_MB.get(m.group(2) or "K", 1 / 1024) if m else None


def _cpu_s(text: str) -> float | None:
    """sacct's TotalCPU ('00:01.234', '01:02:03', '1-02:03:04') -> seconds."""
    m = re.match(r"^\s*(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)\s*$", text or "")
    if not m:
        return None
    d, h, mi, sec = m.groups()
    return int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + float(sec)


class SlurmBackend:
    name = "slurm"
    dependencies = True

    def __init__(self, jobs_dir: Path, slurm_conf: str | None = None, agent_nice: int = 100,
                 agent_qos: str | None = None, timeout_s: float = 30.0, poll_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, sandbox: "Sandbox | None" = None,
                 opportunistic_qos: str | None = None,
                 submitter: Submitter | None = None) -> None:
        self.jobs_dir = Path(jobs_dir).resolve()
        self.submitter = submitter
        """A service-account gateway's way to submit as a principal's Unix user (slurm_submitter.py)."""
        self.sandbox = sandbox
        """Contains the work of the kinds it names inside the batch script (corral/sandbox/bwrap.py)."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.slurm_conf = slurm_conf or os.environ.get("SLURM_CONF")
        self.agent_nice = agent_nice
        self.agent_qos = agent_qos
        self.timeout_s = timeout_s
        self._limits: list[Partition] | None = None
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
        self.controller_calls: dict[str, int] = {}
        """Slurm commands run, by command (sbatch, squeue, sacct, scancel, scontrol...)."""
        door = lambda *argv: self._run(*argv)  # noqa: E731  (through _run as it is when called: tests replace it)
        self.tiers = Tiers(opportunistic_qos, door, self._conf_key)
        """Agents' opportunistic tier, where this Slurm preempts its QOS (slurm_tiers.py)."""
        self.requeues = Requeues(door)

    # -- the one door, with Slurm's environment ------------------------------------

    def _env(self) -> dict[str, str]:
        env = base_env()
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run(self, *argv: str) -> str:
        self._counted(argv)
        return proc.run(argv, env=self._env(), inherit_env=False, timeout=self.timeout_s).stdout

    def _counted(self, argv: Sequence[str]) -> None:
        """Count one Slurm command: what the controller (or slurmdbd) was really asked.
        The dashboard sets it against what clients without corral would have asked;
        a status call answered from jobs' own reports asks nothing and is not counted."""
        self.controller_calls[argv[0]] = self.controller_calls.get(argv[0], 0) + 1

    def opportunistic(self) -> str | None:
        """The preemptible QOS agents' opportunistic jobs go to; None where Slurm has none."""
        return self.tiers.offered()

    # -- Backend Protocol --------------------------------------------------------------

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        self.preflight(spec)
        d = self.jobs_dir / str(ctx.job_id)
        recorded = d / "backend_id"
        if recorded.exists():
            return read_small(recorded).strip()
        if (d / "job.sh").exists():  # written before a crash or a failed sbatch: was it submitted?
            found = self._find_submitted(job_name(ctx, spec), read_small(d / "nonce").strip())
            if found:
                _write_own(recorded, found)
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
            _write_own(d / "nonce", secrets.token_hex(8))
        user = self._run_as(ctx)
        helped = self.submitter.applies(ctx.unix_user, ctx.kind) if self.submitter is not None and not user else None
        self._lay_out(d, ctx, spec, user, helped)
        _write_own(d / "job.sh", script := self.render(ctx, spec, d, read_small(d / "nonce").strip()))
        if helped is not None:  # a service-account gateway: sbatch --uid through the privileged submitter
            return self._submit_as(ctx, spec, d, helped, script)
        argv = ["sbatch", "--parsable", f"--chdir={self._chdir(ctx, spec, d)}"]
        if user:
            argv += [f"--uid={user[0]}", f"--gid={user[1]}"]
        out = self._run(*argv, str(d / "job.sh")).strip()
        backend_id = out.split(";")[0]
        if not backend_id.isdigit():
            raise BackendError(f"sbatch answered {out!r}, not a job id", argv=argv)
        _write_own(recorded, backend_id)
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
        _write_own(d / "backend_id", backend_id)
        self._index(backend_id, d)
        self._known[backend_id] = BackendStatus(backend_id, JobState.PENDING, reason="submitted")
        return backend_id

    def _lay_out(self, d: Path, ctx: SubmitContext, spec: JobSpec, user: tuple[int, int] | None,
                 helped: pwd.struct_passwd | None = None) -> None:
        """d/out, made whole once: empty output files, the script, the job's environment
        and (contained) its own directory, written by corral in a directory nobody else
        can reach yet, then handed to the job's user by descriptor and put in place with
        one rename. A retry after a failed sbatch finds it made and writes nothing there."""
        if (d / "out").exists():
            return
        new = d / "out.new"
        if new.exists():  # a crash mid-way: corral's alone (never handed out before the rename)
            shutil.rmtree(new)
        new.mkdir(mode=0o700)
        files = {"stdout": (b"", 0o600), "stderr": (b"", 0o600),
                 "env.json": (json.dumps(self._job_env(ctx, spec)).encode(), 0o600)}
        if spec.script:
            # 0755 in a 0700 directory: reached by the work through a descriptor only where
            # root runs the batch script for someone else (render)
            files["script"] = (spec.script.encode(), 0o755)
        who = user or self._contained_as(ctx)
        for name, (data, mode) in files.items():
            fd = os.open(new / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                os.write(fd, data)
                # The script is read by the contained work's identity; the rest by whoever
                # runs the batch script (the job's user, else corral).
                owner = user or (who if name == "script" else None)
                if owner is not None:
                    os.fchown(fd, *owner)
            finally:
                os.close(fd)
        if self._contains(ctx):
            os.mkdir(new / "work", 0o700)  # the contained work's own directory
            if who is not None:
                os.chown(new / "work", *who, follow_symlinks=False)
        if user is not None:
            os.chown(new, *user, follow_symlinks=False)
        if helped is not None:  # not root: the privileged submitter hands out.new and what corral put in it
            assert self.submitter is not None
            self.submitter.prepare(str(ctx.job_id), helped.pw_uid)
        os.rename(new, d / "out")

    @staticmethod
    def _job_env(ctx: SubmitContext, spec: JobSpec) -> dict[str, str]:
        return {"CORRAL_JOB_ID": str(ctx.job_id), "CORRAL_PRINCIPAL": ctx.principal,
                "CORRAL_SESSION": ctx.session or "", **spec.env}

    def _contains(self, ctx: SubmitContext) -> bool:
        return self.sandbox is not None and self.sandbox.applies(ctx.kind)

    def _root_runs(self, ctx: SubmitContext) -> bool:
        """Whether the batch script runs as the gateway's root (no Unix user to run as)."""
        return os.geteuid() == 0 and not ctx.unix_user

    def _dropped_to(self, ctx: SubmitContext) -> "Identity | None":
        """The identity a root-run batch script gives the work: a dynamic one of the
        principal's own (corral/core/identity.py); None: an admin's or corral's own work."""
        if not self._root_runs(ctx) or self.identities is None:
            return None
        return self.identities.of(ctx.principal, ctx.unix_user, ctx.admin, self._contains(ctx), ctx.kind == "service")

    def _contained_as(self, ctx: SubmitContext) -> tuple[int, int] | None:
        if not self._contains(ctx):
            return None
        assert self.sandbox is not None
        ident = self._dropped_to(ctx)
        return ident.pair if ident is not None else self.sandbox.owner(ctx.kind, ctx.unix_user, self._root_runs(ctx))

    def _chdir(self, ctx: SubmitContext, spec: JobSpec, d: Path) -> str:
        """The batch script's directory, on sbatch's command line (never a line of the
        script: a path is data, not code). A work dropped to a dynamic identity without a
        directory named starts in /tmp, as Slurm does when a job cannot enter its own."""
        if spec.workdir:
            return spec.workdir
        if not self._contains(ctx) and self._dropped_to(ctx) is not None:
            return "/tmp"
        return str(d / "out")

    def render(self, ctx: SubmitContext, spec: JobSpec, d: Path, nonce: str = "-") -> str:
        """The batch script: resources and provenance as #SBATCH lines, then the work.
        Every value here is corral's or checked by JobSpec; the job's own environment is
        not in it (it travels in d/out/env.json, read by the last step before the job)."""
        out = d / "out"
        # The placement's walltime (corral/lanes/placement.py), tightened from memory, else the agent's.
        walltime_s = int(spec.labels.get(WALLTIME_LABEL) or spec.walltime_s)
        comment = " ".join(f"{k}={v}" for k, v in (
            ("corral_job", ctx.job_id), ("principal", ctx.principal), ("kind", ctx.kind),
            ("sponsor", ctx.sponsor or "-"), ("session", ctx.session or "-"), ("nonce", nonce)))
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={job_name(ctx, spec)}",
            f"#SBATCH --comment={shlex.quote(comment)}",
            f"#SBATCH --output={out / 'stdout'}",
            f"#SBATCH --error={out / 'stderr'}",
            # A requeued job's output grows on, never truncated: the guarded copy an
            # agent pages through is append-only (safety/output_guard.py).
            "#SBATCH --open-mode=append",
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks=1",
            f"#SBATCH --cpus-per-task={spec.cpus}",
            f"#SBATCH --mem={spec.memory_mb}M",
            f"#SBATCH --time={format_duration(-(-walltime_s // 60) * 60)}",
        ]
        if spec.partition:
            lines.append(f"#SBATCH --partition={spec.partition}")
        if spec.gpus:
            lines.append(f"#SBATCH --gres=gpu:{spec.gpus}")
        if ctx.account:
            lines.append(f"#SBATCH --account={ctx.account}")
        if ctx.after:
            lines += [f"#SBATCH --dependency={ctx.after}", "#SBATCH --kill-on-invalid-dep=yes"]
        if ctx.kind == "agent":
            lines.append(f"#SBATCH --nice={self.agent_nice}")
            opportunistic = self.opportunistic() if spec.labels.get(TIER_LABEL) == "opportunistic" else None
            if opportunistic:
                lines += tier_lines(opportunistic)
            elif self.agent_qos:
                lines.append(f"#SBATCH --qos={self.agent_qos}")
        # The job tells corral itself when it starts and when it ends normally: no
        # controller RPC needed. The end is written only after the work returns; a job
        # killed by a signal (cancel, walltime, memory) dies before that line, and Slurm's
        # accounting says what happened. (An EXIT trap would run there with a wrong $?.)
        lines += [""] + rerun_lines(str(out / "started"), str(out / "ended")) + [""]
        if spec.labels.get(IMAGE_FILE):  # the job's environment image, mounted on this node (storage/mounts.py)
            lines += [f"corral_env=$({shlex.quote(sys.executable)} -I -m corral.storage.mounts image "
                      f"{shlex.quote(spec.labels[IMAGE_FILE])} {shlex.quote(spec.labels[IMAGE_AT])}) || exit 1",
                      'export PATH="$corral_env/bin:$PATH" VIRTUAL_ENV="$corral_env"', ""]
        work = ([str(out / "script")] if spec.script.startswith("#!") else ["bash", str(out / "script")]) \
            if spec.script else None
        if spec.labels.get(META_LABEL):  # sampled: its metadata calls counted (storage/meta.py)
            work = meta.traced(work or ["bash", "-c", spec.command or ""], str(out / "work"))
        sandbox = self.sandbox if self._contains(ctx) else None
        contained = sandbox is not None
        dropped = self._dropped_to(ctx)
        if sandbox is not None:
            # The script runs as the principal's Unix user (sbatch --uid), else as the
            # gateway's: when that is root, the sandbox makes the work someone else.
            # The contained work gets a directory of its own, d/out/work: nothing it
            # writes is read back as corral's state (docs/decisions/0010-privsep.md).
            root = self._root_runs(ctx)
            who = self._contained_as(ctx)
            own = out / "work"
            work = [str(own) if a == str(d) else a for a in (work or [])] or None
            if self.scratch:  # where the script may (as root): a cleaner's removal must not fail a rerun
                lines.append(f"mkdir -p {' '.join(shlex.quote(str(p)) for p in self.scratch)} 2>/dev/null")
            lines.append(f"exec {ENV_FD}< {out / 'env.json'}")
            # The working directory is bound by descriptor, opened without following links
            # (a link swapped in after the gateway's check is refused, not followed).
            # As the work's identity where root runs this script (the kernel's checks apply).
            opened = opendir.command(WORKDIR_FD, spec.workdir, opendir.identity(*who) if root and who else None) \
                if spec.workdir else []
            lines.append(shlex.join([*opened, *sandbox.wrap(
                ctx.kind, work or ["bash", "-c", spec.command or ""], spec.workdir or str(own), str(own),
                ctx.unix_user, root, readable=[str(out / "script")] if spec.script else (),
                ident=who if dropped is not None else None, env_fd=ENV_FD,
                cwd_fd=WORKDIR_FD if spec.workdir else None)]))
        elif dropped is not None:
            # Not contained, but root runs this script: the work becomes the principal's own
            # identity first, and only then takes its environment (seccomp.APPLY).
            lines.append(f"exec {ENV_FD}< {out / 'env.json'}")
            if spec.script and not spec.labels.get(META_LABEL):
                # out/ is root's: the work reads its script through a descriptor root opened
                lines.append(f"exec {SCRIPT_FD}< {out / 'script'}")
                work = [SCRIPT] if spec.script.startswith("#!") else ["bash", SCRIPT]
            lines.append(shlex.join([tool("setpriv"), f"--reuid={dropped.pair[0]}", f"--regid={dropped.pair[1]}",
                                     "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--",
                                     *apply_argv(system_python(), None, ENV_FD),
                                     *(work or ["bash", "-c", spec.command or ""])]))
        else:
            # Run as the job's own user (or an admin's work as the gateway): its environment is its own.
            lines += [f"export {k}={shlex.quote(v)}" for k, v in self._job_env(ctx, spec).items()]
            lines += [shlex.join(work)] if work else ["(", spec.command or "", ")"]
        # The work runs in the background so that this shell can pass on a signal that
        # job_control sends it (scancel --batch reaches this shell alone): to the work
        # itself, or inside a sandbox to what bwrap runs (bwrap dies of a signal it does
        # not handle, and the sandbox's init ignores one it has no handler for).
        lines[-1] += " &"
        target = "$(for p in $(pgrep -P $w); do pgrep -P $p; done)" if contained else "$w"
        lines += ["w=$!", f"_fwd() {{ kill -s \"$1\" {target} 2>/dev/null; }}",
                  "for s in " + " ".join(FORWARDED) + "; do trap \"_fwd $s\" $s; done",
                  "while :; do wait $w; rc=$?; kill -0 $w 2>/dev/null || break; done"]
        lines += [f"echo $rc > {out / 'ended'}", "exit $rc"]
        return "\n".join(lines) + "\n"

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
            told = self._final.get(jid) or self._self_report(jid)
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

    def _started(self, jid: str) -> tuple[float | None, int]:
        """The job's own record of its last run's start: (epoch, restarts before it)."""
        d = self._dir_of(jid)
        try:  # never through a link, never blocking (read_small)
            return read_started(read_small(_out(d) / "started", 64)) if d is not None else (None, 0)
        except OSError:
            return None, 0

    def _self_report(self, jid: str) -> BackendStatus | None:
        """A normal end, written by the job script after its work returned. A code over 128
        means the work died by a signal (a segfault, say): Slurm's accounting tells more."""
        d = self._dir_of(jid)
        if d is None:
            return None
        out = _out(d)
        try:
            if out.stat().st_uid != os.geteuid():
                # The batch script runs as the job's own user, who may write this marker
                # before its work is done: its end is Slurm's word, at the next poll.
                return None
            code = int(read_small(out / "ended").strip())
        except (OSError, ValueError):
            return None
        if code > 128:
            return None
        started, restarts = self._started(jid)
        self.requeues.note(jid, restarts)
        end = os.lstat(out / "ended").st_mtime
        if code == 0:
            return BackendStatus(jid, JobState.COMPLETED, 0, None, started, end, requeues=restarts)
        return BackendStatus(jid, JobState.FAILED, code, f"exited with code {code}", started, end, requeues=restarts)

    def _upgrade(self, jid: str, last: BackendStatus) -> BackendStatus:
        """Between full polls: a PENDING job whose script wrote 'started' is RUNNING (the
        marker of this run: a requeued job's last run left one too)."""
        if last.state is JobState.PENDING:
            started, restarts = self._started(jid)
            if started is not None and restarts >= self.requeues.count(jid):
                last = BackendStatus(jid, JobState.RUNNING, start_time=started, requeues=restarts)
                self._known[jid] = last
        return last

    def _poll(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        """One squeue for the whole table (the same RPCs as for one job), then one sacct."""
        wanted = set(backend_ids)
        out: dict[str, BackendStatus] = {}
        ended: dict[str, str] = {}
        for line in self._run("squeue", "-h", "-a", "-t", "all",
                              "-O", "JobID:|,State:|,Reason:|,StartTime:|,RestartCnt:").splitlines():
            jid, st, reason, start, restarts = (line.split("|") + ["", "", "", ""])[:5]
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
                requeues=again)
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
            out[jid] = BackendStatus(jid, state, exit_code, why, slurm_epoch(start), slurm_epoch(end))
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
            return bool(_OOM_MARK.search(read_tail(_out(d) / "stderr", 4096)))
        except OSError:
            return False

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
                    (_out(d) / marker).unlink(missing_ok=True)
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

    def usage(self, backend_id: str) -> Usage:
        """From accounting (slurmdbd, not the controller): the job's CPU time, and the
        largest MaxRSS of its steps (the batch step is the work; jobacct_gather samples)."""
        text = self._run("sacct", "-n", "-P", "-j", backend_id, "-o", "JobID,TotalCPU,MaxRSS")
        cpu, rss = None, None
        for line in text.splitlines():
            jid, total, maxrss = (line.split("|") + ["", ""])[:3]
            if jid == backend_id:
                cpu = _cpu_s(total)
            got = _rss_mb(maxrss)
            if got is not None and (rss is None or got > rss):
                rss = got
        return Usage(cpu, rss, "sacct TotalCPU and MaxRSS (sampled by jobacct_gather)")

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

    def free(self, partition: str | None) -> tuple[int, int] | None:
        """From the nodes' allocations now, asked of scontrol: nodes down, drained or not
        responding have none free."""
        parts = [parse_kv(p) for p in self._run("scontrol", "show", "partition", "-o").splitlines()]
        part = next((p for p in parts if (p.get("PartitionName") == partition if partition
                                          else p.get("Default") == "YES")), {})
        nodes = {kv.get("NodeName", ""): kv for kv in map(parse_kv, self._run("scontrol", "show", "node", "-o").splitlines())}
        best: tuple[int, int] | None = None
        for kv in (nodes[n] for n in _members(part, nodes)):
            if any(s in kv.get("State", "") for s in ("DOWN", "DRAIN", "NOT_RESPONDING", "FAIL")):
                continue
            room = (int(kv.get("CPUTot", 0)) - int(kv.get("CPUAlloc", 0)),
                    int(kv.get("RealMemory", 0)) - int(kv.get("AllocMem", 0)))
            best = room if best is None or room > best else best
        return best

    def estimate_start(self, spec: JobSpec) -> float | None:
        """``sbatch --test-only`` with the job's resources: Slurm's own answer (one RPC),
        'Job N to start at 2026-12-01T21:05:11 ...' in the controller's local time."""
        walltime_s = int(spec.labels.get(WALLTIME_LABEL) or spec.walltime_s)  # as it would be sent
        argv = ["sbatch", "--test-only", "--nodes=1", "--ntasks=1", f"--cpus-per-task={spec.cpus}",
                f"--mem={spec.memory_mb}M", f"--time={max(1, -(-walltime_s // 60))}", "--wrap=true"]
        if spec.partition:
            argv.append(f"--partition={spec.partition}")
        if spec.gpus:
            argv.append(f"--gres=gpu:{spec.gpus}")
        self._counted(argv)
        r = proc.run(argv, env=self._env(), inherit_env=False, timeout=self.timeout_s, check=False)
        m = re.search(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", (r.stderr or "") + (r.stdout or ""))
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) if m else None

    def output_paths(self, backend_id: str) -> OutputPaths:
        d = self._dir_of(backend_id)
        out = _out(d) if d is not None else self.jobs_dir / "missing"
        return OutputPaths(out / "stdout", out / "stderr")

    def close(self) -> None:
        """Slurm owns the jobs; nothing to stop."""

    # -- the facility's limits ----------------------------------------------------------

    def _conf_key(self) -> tuple[float, int] | None:
        """slurm.conf's mtime and size: what is read from Slurm's configuration is read again when they change."""
        if self.slurm_conf and Path(self.slurm_conf).exists():
            st = Path(self.slurm_conf).stat()
            return st.st_mtime, st.st_size
        return None

    def partitions(self) -> list[Partition]:
        """Read once, cached; re-read when slurm.conf changes (mtime and size)."""
        key = self._conf_key()
        if self._limits is None or key != self._limits_key:
            self._limits = self._read_limits()
            self._limits_key = key
        return self._limits

    def _read_limits(self) -> list[Partition]:
        nodes = {}
        for line in self._run("scontrol", "show", "node", "-o").splitlines():
            kv = parse_kv(line)
            gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", kv.get("Gres", "")))
            nodes[kv.get("NodeName", "")] = (int(kv.get("CPUTot", 0)), int(kv.get("RealMemory", 0)), gpus)
        parts = []
        for line in self._run("scontrol", "show", "partition", "-o").splitlines():
            kv = parse_kv(line)
            members = _members(kv, nodes)
            cpus = max((nodes[n][0] for n in members), default=0)
            mem = max((nodes[n][1] for n in members), default=0)
            gpus = max((nodes[n][2] for n in members), default=0)
            max_t = parse_slurm_time(kv.get("MaxTime", "")) or 365 * 86400
            parts.append(Partition(kv["PartitionName"], cpus, mem, gpus, max_t, default=kv.get("Default") == "YES",
                                   extra={"state": kv.get("State"), "nodes": sorted(members),
                                          "min_job_age_s": min_job_age_s(self.slurm_conf)}))
        return parts

    def facts(self) -> dict[str, Any]:
        """Node types (CPUs, memory, gres, features; counted) and QOS limits, for the
        facility facts. The QOS part needs slurmdbd; without it, it is None."""
        types: dict[tuple[int, int, str, str], int] = {}
        for line in self._run("scontrol", "show", "node", "-o").splitlines():
            kv = parse_kv(line)
            key = (int(kv.get("CPUTot", 0)), int(kv.get("RealMemory", 0)), kv.get("Gres", "(null)"),
                   kv.get("AvailableFeatures", "(null)"))
            types[key] = types.get(key, 0) + 1
        nodes = [{"count": n, "cpus": c, "memory_mb": m, "gres": g, "features": f} for (c, m, g, f), n in types.items()]
        qos: list[dict[str, str]] | None
        try:
            out = self._run("sacctmgr", "-n", "-P", "show", "qos", "format=Name,Priority,MaxWall,MaxTRESPU,MaxJobsPU")
            qos = [dict(zip(("name", "priority", "max_wall", "max_tres_per_user", "max_jobs_per_user"), ln.split("|"),
                            strict=False)) for ln in out.splitlines() if ln.strip()]
        except CorralError:
            qos = None
        return {"node_types": nodes, "qos": qos}

    def preflight(self, spec: JobSpec) -> None:
        """Refuse at once what no partition can ever run, naming the nearest valid request."""
        parts = self.partitions()
        names = [p.name for p in parts]
        if spec.partition is not None and spec.partition not in names:
            raise InvalidRequest(f"unknown partition {spec.partition!r}; this facility has: {', '.join(names)}")
        target = next((p for p in parts if p.name == spec.partition), None) or next((p for p in parts if p.default), parts[0])
        where = f"partition {target.name!r}"
        if spec.cpus > target.max_cpus:
            raise InvalidRequest(f"{spec.cpus} CPUs asked but the largest node in {where} has {target.max_cpus}; ask for cpus <= {target.max_cpus}")
        if spec.memory_mb > target.max_memory_mb:
            raise InvalidRequest(f"{spec.memory_mb}M of memory asked but the largest node in {where} has "
                                 f"{target.max_memory_mb}M; ask for memory <= {target.max_memory_mb}M")
        if spec.gpus > target.max_gpus:
            with_gpus = [p.name for p in parts if p.max_gpus >= spec.gpus]
            alt = f"use partition {with_gpus[0]!r}" if with_gpus else None
            limit = f"ask for gpus <= {target.max_gpus}" if target.max_gpus else "set gpus to 0"
            raise InvalidRequest(f"{spec.gpus} GPUs asked but {where} has nodes with {target.max_gpus}; "
                                 + (f"{alt}, or {limit}" if alt else limit))
        if spec.walltime_s > target.max_walltime_s:
            longer = [p for p in parts if p.max_walltime_s >= spec.walltime_s]
            alt = f", or use partition {longer[0].name!r} (max {format_duration(longer[0].max_walltime_s)})" if longer else ""
            raise InvalidRequest(f"walltime {format_duration(spec.walltime_s)} is over the limit of {where}, "
                                 f"{format_duration(target.max_walltime_s)}; ask for walltime <= "
                                 f"{format_duration(target.max_walltime_s)}{alt}")

    # -- helpers ----------------------------------------------------------------------------

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

    identities: "Identities | None" = None
    """Who a contained job of a principal without a Unix user runs as (corral/core/identity.py)."""
    scratch: list[Path] = []
    """Node-local directories the sandbox hides (the Sender makes them again at a send if a
    cleaner removed them); a contained job's script makes them too, for the run Slurm
    starts again after a requeue, minutes later and without a send."""

    def _run_as(self, ctx: SubmitContext) -> tuple[int, int] | None:
        """(uid, gid) that sbatch --uid runs the batch script as: the principal's Unix user,
        when the gateway is root; None: the gateway's own."""
        if not ctx.unix_user or os.geteuid() != 0:
            return None
        try:
            pw = pwd.getpwnam(ctx.unix_user)
        except KeyError:
            raise InvalidRequest(f"unix user {ctx.unix_user!r} of principal {ctx.principal!r} does not exist here") from None
        return pw.pw_uid, pw.pw_gid


def _write_own(path: Path, text: str) -> None:
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


def _out(d: Path) -> Path:
    """Where a job's output and markers lie: d/out (d itself for a job submitted before
    corral kept them apart)."""
    out = d / "out"
    return out if out.is_dir() else d


__all__ = ["SlurmBackend", "STATES", "translate", "parse_exit", "parse_slurm_time"]
