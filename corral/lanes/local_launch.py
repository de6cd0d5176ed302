"""What a local job's ``launch.json`` says: how its supervisor runs it (corral/lanes/local.py's submit).

Who it runs as (corral/core/identity.py), its environment, its script as a descriptor,
and, when contained, its sandbox: a job with a working directory is sent to the sandbox
built for its (kind, user, principal, directory) (corral/sandbox/host.py); one without
works in its private /tmp, bounded and counted as its memory, never on corral's disk
(docs/decisions/0044-job-space.md). Called with the backend's lock held.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.jobs import JobSpec
from corral.lanes.backend import SubmitContext, base_env
from corral.sandbox import egress_grants, host as sandbox_host, opendir
from corral.storage import META_LABEL, meta

if TYPE_CHECKING:
    from corral.lanes.local import LocalBackend

SCRIPT = "/dev/fd/3"
"""A job's script, as the job finds it: a file descriptor its supervisor opened."""
WORKDIR_FD = 7
"""The job's working directory, opened by its supervisor without following links and
bound into the sandbox by descriptor (bwrap --bind-fd): a link swapped in meanwhile is
never followed."""
VENV_FD = 8
"""The submitter's venv under /tmp, opened as the job's identity (Sandbox.venv_to_bind)."""
ENV_FD = 6
"""A contained job's own environment reaches the last step before it on this descriptor."""
JOB_DIR = "/tmp/corral-job"
"""Inside its sandbox, the own directory of a job (corral/sandbox/bwrap.py's JOB_DIR)."""


def _open_as(pair: tuple[int, int] | None) -> list[Any] | None:
    """[uid, gid, groups] a root supervisor opens a job's working directory as."""
    if pair is None:
        return None
    uid, gid, groups = opendir.identity(*pair)
    return [uid, gid, groups]


def write_private(path: Path, data: bytes, mode: int) -> None:
    """A new file of corral's, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def prepare(b: "LocalBackend", ctx: SubmitContext, spec: JobSpec, d: Path) -> dict[str, object]:
    """The job's launch (its script and environment files written into ``d``, corral's own)."""
    bid = str(ctx.job_id)
    contained = b.sandbox is not None and b.sandbox.applies(ctx.kind)
    ident = b.identities.of(ctx.principal, ctx.unix_user, ctx.admin, contained, ctx.kind == "service") \
        if b.identities is not None else None
    reads: list[str] = []
    if spec.script:
        script = d / "script"
        write_private(script, spec.script.encode(), 0o755)  # read through its fd: d stays closed
        reads = [str(script)]
        argv = [SCRIPT] if spec.script.startswith("#!") else ["bash", SCRIPT]
    else:
        argv = ["bash", "-c", spec.command or ""]
    env = base_env()
    if ident is not None:  # who it is, not who the gateway is
        env.update({"USER": ident.user, "LOGNAME": ident.user})
        env.pop("HOME", None)
        if ident.home:
            env["HOME"] = ident.home
    if contained and b.sandbox is not None and b.sandbox.egress and b.egress_credential is not None:
        env.update(egress_grants.proxy_env(b.egress_credential(ctx.job_id)))  # its name at the proxy (its grants)
    env.update(spec.env)
    env.update({"CORRAL_JOB_ID": bid, "CORRAL_PRINCIPAL": ctx.principal, "CORRAL_SESSION": ctx.session or ""})
    work = d / "work"
    # Sampled for metadata accounting (storage/meta.py); not a job that runs uncontained as
    # another identity: its traces would lie in corral's directories, which it cannot enter.
    traced = bool(spec.labels.get(META_LABEL)) and not (ident is not None and not contained)
    own: str | None = None  # the job's own writable directory on corral's disk, when it needs one
    # A contained job without a working directory works in its private /tmp
    # (JOB_DIR), whose size is bounded and counted as its memory: nothing it writes
    # lands on corral's disk (docs/decisions/0044-job-space.md).
    apart = contained and b.sandbox is not None and not spec.workdir and not traced
    if (not spec.workdir or traced) and not apart:
        work.mkdir(mode=0o700, exist_ok=True)
        own = str(work)
        if ident is not None:
            os.chown(work, *ident.pair)
        elif contained and b.sandbox is not None:
            who = b.sandbox.owner(ctx.kind, ctx.unix_user)
            if who is not None:
                os.chown(work, *who)
    cwd = spec.workdir or (JOB_DIR if apart else str(work))
    if ident is not None and not contained and not spec.workdir:
        # Not contained, no directory named: corral's own directories are closed to it
        # (their parents are 0700), so it starts in /tmp, as Slurm does when a job
        # cannot enter its directory.
        cwd, own = "/tmp", None
    if ident is not None and "HOME" not in env:
        env["HOME"] = (JOB_DIR if contained else str(work)) if own or apart else cwd
    host, env_file = None, None
    if traced:  # sampled: its metadata calls counted (storage/meta.py), so wrapped alone
        argv = meta.traced(argv, str(work))
    fd = WORKDIR_FD if spec.workdir else None
    pair = ident.pair if ident is not None else None
    venv = b.sandbox.venv_to_bind(ctx.kind, env) if contained and b.sandbox is not None else None
    bound = (venv, VENV_FD) if venv else None
    if contained and b.sandbox is not None and spec.workdir and not traced:
        host, argv = _host(b, ctx, argv, cwd, pair, reads, bound, spec.memory_mb)
    elif contained and b.sandbox is not None:
        # bwrap runs as root with corral's environment; the job's own (its PATH,
        # LD_PRELOAD ...) is read from a descriptor by the step that starts it.
        write_private(d / "env.json", json.dumps(env).encode(), 0o600)
        env, env_file = base_env(), str(d / "env.json")
        argv = b.sandbox.wrap(ctx.kind, argv, cwd, own, ctx.unix_user, ident=pair, cwd_fd=fd,
                                 env_fd=ENV_FD, venv=bound, memory_mb=spec.memory_mb)
    launch: dict[str, object] = {
        "host": host,
        "argv": argv,
        "cwd": str(d) if apart else cwd,  # where its supervisor starts bwrap (JOB_DIR is inside)
        "workdir": spec.workdir,
        # Who opens the working directory (corral/sandbox/opendir.py): the job's identity, not root.
        "open_as": _open_as(pair if pair is not None else (
            b.sandbox.owner(ctx.kind, ctx.unix_user) if contained and b.sandbox is not None else None)),
        "reads": reads,
        "venv": venv,
        "identity": None if ident is None or contained else list(ident.pair) + [not ident.dynamic, ident.user],
        "env": env,
        "env_file": env_file,
        "cpus": spec.cpus,
        "memory_mb": spec.memory_mb,
        "walltime_s": spec.walltime_s,
        "notice": spec.signal,  # 'USR1@30': sent that long before the walltime, as Slurm's --signal
        "output_max": b.output_max,
        "contained": contained,  # its private /tmp counts as its memory (job_memory.py)
        "principal": ctx.principal,
        "session": ctx.session,
    }
    return launch


def _host(b: "LocalBackend", ctx: SubmitContext, argv: list[str], cwd: str, ident: tuple[int, int] | None,
          reads: list[str], venv: tuple[str, int] | None = None,
          memory_mb: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """A contained job with a working directory starts in the sandbox built for its
    (kind, user, principal, directory), shared with the principal's other jobs there
    (corral/sandbox/host.py): ~1 ms instead of ~14 ms per job. Its output files and
    script reach it as file descriptors. -> (the supervisor's ``host``, the job's argv)."""
    assert b.sandbox is not None
    # setsid waits on it, as the parent it dies with: it outlives the supervisor that
    # built it, and killing that one process (its pid is kept beside the socket) ends it.
    wrapped = ["setsid", "--fork", "--wait", *b.sandbox.wrap(
        ctx.kind, sandbox_host.command(b.sandbox.pids_max, listening=True, seccomp=b.sandbox.seccomp,
                             fsize=b.sandbox.file_max),
        cwd, None, ctx.unix_user, limit=False, ident=ident, filtered=False, cwd_fd=WORKDIR_FD, venv=venv,
        memory_mb=memory_mb)]
    key = hashlib.sha256(json.dumps([ctx.principal, wrapped]).encode()).hexdigest()[:20]
    b.hosts_dir.mkdir(mode=0o700, exist_ok=True)
    d = b.jobs_dir / str(ctx.job_id)
    # Relative to the supervisor's directory (the job's): a socket's path has at most 107 bytes.
    sock = os.path.relpath(b.hosts_dir / f"{key}.sock", d)
    host = {"socket": sock, "argv": wrapped, "log": str(b.hosts_dir / f"{key}.log"), "reads": reads}
    return host, argv
