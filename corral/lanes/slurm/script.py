"""The Slurm lane's batch script and job directory: what ``submit`` writes before it
calls sbatch (#SBATCH lines with corral's provenance, the work wrapped in its sandbox or
dropped to its identity, the signals passed on), and who the script runs as."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec, format_duration
from corral.lanes.backend import SubmitContext
from corral.lanes.slurm.base import SlurmBase
from corral.lanes.slurm.forwarding import run_and_wait
from corral.lanes.slurm.tiers import (NOTICE, TIER_LABEL, WALLTIME_LABEL, notice_of, order_nice, rerun_lines,
                                      tier_lines)
from corral.sandbox import door, opendir, starter as jobstart
from corral.sandbox.bwrap import JOB_DIR, RELAY_DIR, RELAY_SOCKET, system_python, tool
from corral.sandbox import egress_grants
from corral.sandbox.egress import relay_argv
from corral.sandbox.seccomp import apply_argv
from corral.storage import IMAGE_AT, IMAGE_FILE, META_LABEL, WS_DIR, WS_LOWER, meta

if TYPE_CHECKING:
    from corral.core.identity import Identity
    from corral.sandbox.bwrap import Sandbox


def job_name(ctx: SubmitContext, spec: JobSpec) -> str:
    """``corral-<id>``, then the user's ``--name`` (Slurm's own listings show both; the
    name's pattern, ``[A-Za-z0-9_.+-]``, is safe in a job name)."""
    return f"corral-{ctx.job_id}" + (f"-{spec.name}" if spec.name else "")



NICE_MAX = 2147483645
"""Slurm's largest nice value."""
ENV_FD = 6
"""The batch script opens the job's environment on this descriptor for the work's last step."""
WORKDIR_FD = 7
SCRIPT_FD = 3
LOCK_FD = 9
"""The batch shell holds its workspace's lock on this descriptor (closed for the work)."""
STARTER_FD = 8
"""The batch shell opens corral's compiled job starter here (corral/sandbox/starter.py): run
as ``/dev/fd/8``, it is reached inside a sandbox that hides corral's install too."""
SCRIPT = f"/dev/fd/{SCRIPT_FD}"


def relay_lines(targets: list[tuple[str, str]], who: tuple[int, int] | None) -> list[str]:
    """Lines of a batch script that start, on the node, the job's relays: for each (NAME,
    HOST:PORT) of ``targets``, a Unix socket NAME carried to HOST:PORT (proxy.sock: the
    egress proxy, [sandbox] egress_listen; gateway.sock: the gateway, the job's door,
    corral/sandbox/door.py), in a directory the script makes as it runs
    (``mktemp -d``: new, 0700, named at random then, never in the script: a run that Slurm
    ended before its cleanup leaves its own behind, and a name in the script, which every
    user of the node read in the relay's command line, could be made first by anyone, so
    that the run after a requeue stopped); the sandbox binds those sockets, which connect
    from the job's node (the gateway's own sockets connect only on the gateway's machine).
    ``who``: the identity the relays run as when root runs the script
    (the job's bytes never pass through root); the directory stays root's, ``who`` writing
    in it by group until its sockets are there, then closed and each socket checked to be
    one: the bwrap that binds it runs as root, and a link put there by anything running
    as ``who`` would be followed. Ready before the job starts."""
    drop = [tool("setpriv"), f"--reuid={who[0]}", f"--regid={who[1]}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"] if who else []
    where = f'"${RELAY_DIR}"'
    lines = [f"{RELAY_DIR}=$(mktemp -d /tmp/corral-egress.XXXXXXXXXXXX) || {{ echo \"corral: cannot make a directory "
             "in /tmp on $(hostname) for the job's relays\" >&2; exit 1; }",
             # root's throughout: the relay makes its socket there by group (a directory of its
             # identity's own, in /tmp, could be moved by it and a link put in its place)
             *([f"chgrp -h {who[1]} {where} && chmod 1730 {where} || exit 1"] if who else []), "corral_relays="]
    socks = [f'"${RELAY_DIR}/{name}"' for name, _ in targets]
    for name, listen in targets:
        socat, listening, target = relay_argv(f"${RELAY_DIR}/{name}", listen)
        # the socket's path is expanded here: mktemp's name is letters and digits
        lines += [f'{shlex.join([*drop, socat])} "{listening}" {shlex.quote(target)} 2>/dev/null &',
                  'corral_relays="$corral_relays $!"']
    for (_, listen), sock in zip(targets, socks):
        lines += [f"for i in $(seq 500); do [ -S {sock} ] && break; sleep 0.01; done",
                  f"[ -S {sock} ] || {{ echo \"corral: the job's relay to {listen} did not start on $(hostname)\" >&2; "
                  "exit 1; }"]
    if who:
        checks = " && ".join(f"[ ! -L {sock} ] && [ -S {sock} ]" for sock in socks)
        lines.append(f"chmod 0700 {where} && {checks} || {{ echo \"corral: a relay's socket on $(hostname) was "
                     "replaced\" >&2; exit 1; }")
    return lines


MOUNTS = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r}); "
          "from corral.storage.mounts import main; sys.exit(main(sys.argv[1:]))")
"""The node's mount step, from the corral that wrote the script (not whichever one the
interpreter's site-packages hold: a gateway run from a checkout), still isolated (-I)."""
SCRATCH = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r}); "
           "from corral.storage.scratch import main; sys.exit(main(sys.argv[1:]))")
"""Scratch made or checked before every contained job: the module alone, without site
(-S), 30-50 ms where the mount step's imports cost 150-400 ms a job on a busy node."""


def scratch_line(top: Path, subs: list[str], python: str = sys.executable) -> str:
    """The batch script's line (run as root) that makes or checks scratch ``top`` and its
    ``subs`` as storage/scratch.py's ``prepare`` does. Python (tens of ms a job) runs only
    when something is not as ``prepare`` would leave it unchanged: ``top`` and each sub a
    real directory of root's that nobody else may write, and every parent root's, no link,
    and written by nobody else unless sticky (one ``find``, a few ms). Anything else, a
    path gone or that find cannot read included, goes to ``prepare``, which makes it, or
    refuses it in words."""
    mine = [str(top), *(str(top / s) for s in subs)]
    parents = [str(p) for p in reversed(top.parents)]
    check = (f"find {shlex.join(mine)} -maxdepth 0 \\( -type l -o ! -type d -o ! -uid 0 -o -perm /022 \\) -print 2>&1; "
             f"find {shlex.join(parents)} -maxdepth 0 \\( -type l -o ! -uid 0 -o \\( -perm /022 ! -perm -1000 \\) \\) "
             "-print 2>&1")
    slow = shlex.join([python, "-I", "-S", "-c", SCRATCH, str(top), *subs])
    return f'[ -z "$({check})" ] || {slow} || exit 1'


def starter_line(lines: list[str]) -> str | None:
    """Opens corral's compiled job starter at ``STARTER_FD`` (a line added to ``lines``) ->
    how the script's steps run it; None where none was built (the Python steps run)."""
    built = jobstart.compiled()
    if built is None:
        return None
    lines.append(f"exec {STARTER_FD}< {shlex.quote(built)} || {{ echo \"corral: cannot read corral's job starter "
                 f"{built} on $(hostname)\" >&2; exit 1; }}")
    return f"/dev/fd/{STARTER_FD}"


def mount_argv() -> list[str]:
    """How the script runs the node's mount step (``MOUNTS``)."""
    return [sys.executable, "-I", "-c", MOUNTS]


def image_lines(spec: JobSpec) -> list[str]:
    """The job's environment image, mounted on this node (storage/mounts.py), first on its PATH."""
    if not spec.labels.get(IMAGE_FILE):
        return []
    return [f"corral_env=$({shlex.quote(sys.executable)} -I -m corral.storage.mounts image "
            f"{shlex.quote(spec.labels[IMAGE_FILE])} {shlex.quote(spec.labels[IMAGE_AT])}) || exit 1",
            'export PATH="$corral_env/bin:$PATH" VIRTUAL_ENV="$corral_env"', ""]


def workspace_lines(job_id: int, ws: str, lower: str, workdir: str | None) -> list[str]:
    """The job's workspace ``ws``, locked and mounted on this node over its shared layers
    ``lower`` (decision 0036); the work starts in ``workdir``, else at its top."""
    # One job of a workspace at a time, whatever the gateway let through at once (a
    # sweep, two requests racing): the lock in its layers, held by this shell to the end.
    lock = shlex.quote(f"{ws}/lock")
    # Root's alone (0600): flock needs only an open file, and anyone who could open it
    # (its directory is on the layers every node shares) could hold it for good.
    # (the holder writes who it is just after it locks: a moment for it to have done so)
    return ["corral_umask=$(umask); umask 077",
            f"exec {LOCK_FD}>>{lock} && chmod 0600 {lock} && {tool('flock')} -n {LOCK_FD} || {{ "
            f"for i in $(seq 100); do [ -s {lock} ] && break; sleep 0.02; done; echo \"corral: workspace "
            f"{Path(ws).name} is in use by job $(cat {lock} 2>/dev/null) (one job of a workspace runs at a "
            "time, on one node): submit this one with after_any on that job\" >&2; exit 1; }",
            f"echo \"{job_id} (Slurm $SLURM_JOB_ID) on $(hostname)\" > {lock}", 'umask "$corral_umask"',
            shlex.join([*mount_argv(), "workspace", ws, lower]) + " > /dev/null || exit 1",
            # sbatch's --chdir entered the bare mount point
            f"cd {shlex.quote(workdir or ws)} || exit 1", ""]


class Scripts(SlurmBase):
    mail_for: Callable[[SubmitContext], tuple[str, str] | None] | None = None
    """Who gets Slurm's own mail of a job, and of what (NotifyVerbs.slurm_mail); None: nobody."""

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
                 "env.json": (json.dumps(self._job_env(ctx, spec) | self._door_env(ctx)).encode(), 0o600)}
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

    def _door_env(self, ctx: SubmitContext) -> dict[str, str]:
        """A contained job's way to corral from inside (its Slurm commands, decision 0057):
        its id as corral's, the door's URL and the job's own credential (reads, as its
        principal, while it runs), over whatever the job's environment says of them."""
        if not self._contains(ctx):
            return {}
        # one job id inside, corral's (decision 0008): what the shims there know it by
        ids = {"SLURM_JOB_ID": str(ctx.job_id), "SLURM_JOBID": str(ctx.job_id)}
        if self.egress_credential is not None and self.sandbox is not None and self.sandbox.egress:
            ids |= egress_grants.proxy_env(self.egress_credential(ctx.job_id))  # its name at the proxy (its grants)
        if self.door is None:
            return ids
        return {**ids, "CORRAL_URL": door.URL, "CORRAL_TOKEN": self.door.credential(ctx.job_id)}

    def _contains(self, ctx: SubmitContext) -> bool:
        return self.sandbox is not None and self.sandbox.applies(ctx.kind)

    def _root_runs(self, ctx: SubmitContext) -> bool:
        """Whether the batch script runs as the gateway's root (no Unix user to run as, nor
        a dynamic identity Slurm resolves)."""
        return os.geteuid() == 0 and not ctx.unix_user and self._published(ctx) is None

    def _published(self, ctx: SubmitContext) -> "Identity | None":
        """The principal's dynamic identity where NSS resolves it as corral published it
        (decision 0063): Slurm starts the job as it (``sbatch --uid``), as a Unix user's.
        None: none, or not resolved (the batch script runs as root and drops to it)."""
        if ctx.unix_user or os.geteuid() != 0 or self.identities is None or not self.jobs_open():
            return None
        ident = self.identities.of(ctx.principal, None, ctx.admin, self._contains(ctx), ctx.kind == "service")
        return ident if ident is not None and ident.dynamic and self.identities.resolves(ident) else None

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
        lines = self._header(ctx, spec, out, nonce, walltime_s)
        opportunistic = self.opportunistic() if ctx.kind == "agent" and spec.labels.get(TIER_LABEL) == \
            "opportunistic" else None
        notice = notice_of(spec.signal, opportunistic is not None, walltime_s)
        if notice:  # Slurm tells the batch shell alone (B:), which passes the job's own signal on
            lines.append(f"#SBATCH --signal=B:{NOTICE}@{notice[1]}")
        lines += self._priority(ctx, spec, walltime_s, opportunistic)
        # The job tells corral itself when it starts and when it ends normally: no
        # controller RPC needed. The end is written only after the work returns; a job
        # killed by a signal (cancel, walltime, memory) dies before that line, and Slurm's
        # accounting says what happened. (An EXIT trap would run there with a wrong $?.)
        lines += [""] + rerun_lines(str(out / "started"), str(out / "ended")) + [""]
        lines += image_lines(spec)
        ws = spec.labels.get(WS_DIR)
        if ws:  # its workspace, mounted on this node over the shared layers (decision 0036)
            lines += workspace_lines(ctx.job_id, ws, spec.labels[WS_LOWER], spec.workdir)
        contained = self._contains(ctx)
        run, cleanup = self._contained_work(ctx, spec, d) if contained else (self._bare_work(ctx, spec, out), [])
        lines += run
        # The work runs in the background so that this shell can pass on a signal that
        # job_control sends it (scancel --batch reaches this shell alone): to the work
        # itself, or inside a sandbox to what bwrap runs (bwrap dies of a signal it does
        # not handle, and the sandbox's init ignores one it has no handler for).
        lines[-1] += (f" {LOCK_FD}>&-" if ws else "") + " &"
        lines += run_and_wait(lines.pop(), contained, notice, ENV_FD)
        if ws:  # written through before the job is seen to end (a killed job's is dropped by the next mount here)
            lines += [shlex.join([*mount_argv(), "release", ws]), f": > {shlex.quote(f'{ws}/lock')}"]  # nobody holds it now
        # the end names its run (SLURM_RESTART_COUNT): an end written by a run Slurm has since
        # superseded (requeued while its node was lost and the run went on) is not believed
        lines += [*cleanup, f"echo \"$rc $corral_run\" > {out / 'ended'}", "exit $rc"]
        return "\n".join(lines) + "\n"

    def _header(self, ctx: SubmitContext, spec: JobSpec, out: Path, nonce: str, walltime_s: int) -> list[str]:
        """The #SBATCH lines of resources and provenance (corral's job, its principal, its
        sponsor and session in the comment), Slurm's mail and the dependency."""
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
        mail = self.mail_for(ctx) if self.mail_for is not None else None
        if mail:  # Slurm's own mail, to the person who chose it ([notify] slurm_mail)
            lines += [f"#SBATCH --mail-user={mail[0]}", f"#SBATCH --mail-type={mail[1]}"]
        if ctx.after:
            lines += [f"#SBATCH --dependency={ctx.after}", "#SBATCH --kill-on-invalid-dep=yes"]
        return lines

    def _priority(self, ctx: SubmitContext, spec: JobSpec, walltime_s: int, opportunistic: str | None) -> list[str]:
        """An agent's #SBATCH lines of priority: its nice, and its QOS (an opportunistic
        job's tier, else [slurm] agent_qos). None for people's jobs."""
        if ctx.kind != "agent":
            return []
        # People keep priority (agent_nice); among opportunistic jobs the smallest first.
        order = order_nice(spec.cpus, walltime_s) if opportunistic else 0
        lines = [f"#SBATCH --nice={min(self.agent_nice + order, NICE_MAX)}"]
        if opportunistic:
            lines += tier_lines(opportunistic)
        elif self.agent_qos:
            lines.append(f"#SBATCH --qos={self.agent_qos}")
        return lines

    @staticmethod
    def _work_argv(spec: JobSpec, out: Path) -> list[str] | None:
        """The work's command line where it is a script (run by its #! line, else bash) or
        traced; None: ``spec.command``, run by bash -c where it runs."""
        work = ([str(out / "script")] if spec.script.startswith("#!") else ["bash", str(out / "script")]) \
            if spec.script else None
        if spec.labels.get(META_LABEL):  # sampled: its metadata calls counted (storage/meta.py)
            work = meta.traced(work or ["bash", "-c", spec.command or ""], str(out / "work"))
        return work

    def _contained_work(self, ctx: SubmitContext, spec: JobSpec, d: Path) -> tuple[list[str], list[str]]:
        """The lines that run a contained job's work in its sandbox (the last one runs it),
        and those that clean its relays up after (none: no relay)."""
        # The script runs as the principal's Unix user (sbatch --uid), else as the
        # gateway's: when that is root, the sandbox makes the work someone else.
        # The contained work's own directory is its private /tmp (JOB_DIR), bounded and
        # memory, never corral's shared disk (docs/decisions/0044-job-space.md); a traced
        # one's traces go to d/out/work, read back as data only (storage/meta.py).
        out = d / "out"
        dropped = self._dropped_to(ctx)
        assert self.sandbox is not None
        root = self._root_runs(ctx)
        who = self._contained_as(ctx)
        own = out / "work"
        traced = bool(spec.labels.get(META_LABEL))
        work = [str(own) if a == str(d) else a for a in (self._work_argv(spec, out) or [])] or None
        lines = self._scratch_lines(root)
        lines.append(f"exec {ENV_FD}< {out / 'env.json'}")
        # Its two steps around bwrap by the compiled starter where one was built (no Python start each)
        starter = starter_line(lines)
        # The working directory is bound by descriptor, opened without following links
        # (a link swapped in after the gateway's check is refused, not followed).
        # As the work's identity where root runs this script (the kernel's checks apply).
        opened = opendir.command(WORKDIR_FD, spec.workdir, opendir.identity(*who) if root and who else None,
                                 starter) if spec.workdir else []
        sandbox, relays = self._relays(replace(self.sandbox, starter=starter), who if root else None)
        cleanup: list[str] = []
        if relays:
            lines += relays
            cleanup = [f'kill $corral_relays 2>/dev/null; rm -rf "${RELAY_DIR}"']
            # A cancel or the walltime is Slurm's SIGTERM to every process of the job,
            # this shell too (its SIGKILL follows): the relay's directory is removed
            # then as well, not left in the node's /tmp by every job that did not end.
            lines.append(f"trap '{cleanup[0]}; exit 143' TERM")
        lines.append(sandbox.shell(
            ctx.kind, work or ["bash", "-c", spec.command or ""], spec.workdir or (str(own) if traced else JOB_DIR),
            opened, job_dir=str(own) if traced else None, user=ctx.unix_user, root=root,
            readable=[str(out / "script")] if spec.script else (), ident=who if dropped is not None else None,
            env_fd=ENV_FD, cwd_fd=WORKDIR_FD if spec.workdir else None, memory_mb=spec.memory_mb))
        return lines, cleanup

    def _scratch_lines(self, root: bool) -> list[str]:
        """A contained job's lines that make its node's scratch again, or check it."""
        if self.scratch and root:
            # A cleaner's removal must not fail a rerun: made again, or checked, as the gateway
            # makes them (storage/scratch.py). Scratch's name is predictable in a directory
            # everyone writes: a `mkdir -p` by root went through a link anyone had put there.
            return [scratch_line(top, [p.name for p in self.scratch if p.parent == top])
                    for top in dict.fromkeys(p.parent for p in self.scratch)]
        if self.scratch:  # as the job's own user: what it may make anyway
            return [f"mkdir -p {' '.join(shlex.quote(str(p)) for p in self.scratch)} 2>/dev/null"]
        return []

    def _bare_work(self, ctx: SubmitContext, spec: JobSpec, out: Path) -> list[str]:
        """The lines that run a job's work outside a sandbox (the last one runs it)."""
        work = self._work_argv(spec, out)
        dropped = self._dropped_to(ctx)
        if dropped is None:
            # Run as the job's own user (or an admin's work as the gateway): its environment is its own.
            return [*(f"export {k}={shlex.quote(v)}" for k, v in self._job_env(ctx, spec).items()),
                    *([shlex.join(work)] if work else ["(", spec.command or "", ")"])]
        # Not contained, but root runs this script: the work becomes the principal's own
        # identity first, and only then takes its environment (seccomp.APPLY).
        lines = [f"exec {ENV_FD}< {out / 'env.json'}"]
        starter = starter_line(lines)
        if spec.script and not spec.labels.get(META_LABEL):
            # out/ is root's: the work reads its script through a descriptor root opened
            lines.append(f"exec {SCRIPT_FD}< {out / 'script'}")
            work = [SCRIPT] if spec.script.startswith("#!") else ["bash", SCRIPT]
        lines.append(shlex.join([tool("setpriv"), f"--reuid={dropped.pair[0]}", f"--regid={dropped.pair[1]}",
                                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--",
                                 *apply_argv(system_python(), None, ENV_FD, starter),
                                 *(work or ["bash", "-c", spec.command or ""])]))
        return lines

    def _relays(self, sandbox: "Sandbox", who: tuple[int, int] | None) -> tuple["Sandbox", list[str]]:
        """The node's own ways out of a contained job: to the egress proxy (its allow-list)
        and to the gateway (its door: Slurm's commands inside, corral/sandbox/door.py), as
        relays the script starts (``relay_lines``) and the sandbox binds. -> the sandbox
        that binds them, and the lines (none: no relay)."""
        targets = []
        if sandbox.egress and sandbox.relay and not sandbox.network:
            targets.append(("proxy.sock", sandbox.relay))
            sandbox = replace(sandbox, egress=RELAY_SOCKET)
        if self.door is not None:
            targets.append(("gateway.sock", self.door.address))
        sandbox = replace(sandbox, door=door.SOCKET if self.door is not None else "")
        return sandbox, relay_lines(targets, who) if targets else []

    def _run_as(self, ctx: SubmitContext) -> tuple[int, int] | None:
        """(uid, gid) that sbatch --uid runs the batch script as: the principal's Unix user,
        when the gateway is root, else its dynamic identity where Slurm resolves it; None:
        the gateway's own."""
        if not ctx.unix_user or os.geteuid() != 0:
            published = self._published(ctx)
            return published.pair if published is not None else None
        try:
            pw = pwd.getpwnam(ctx.unix_user)
        except KeyError:
            raise InvalidRequest(f"unix user {ctx.unix_user!r} of principal {ctx.principal!r} does not exist here") from None
        return pw.pw_uid, pw.pw_gid
