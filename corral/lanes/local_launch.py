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
    from corral.core.identity import Identity
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


def _open_as(b: "LocalBackend", ctx: SubmitContext, pair: tuple[int, int] | None, contained: bool) -> list[Any] | None:
    """[uid, gid, groups] a root supervisor opens a job's working directory as: the job's
    identity (``pair``), else whom its sandbox makes it."""
    if pair is None and contained and b.sandbox is not None:
        pair = b.sandbox.owner(ctx.kind, ctx.unix_user)
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
    contained = b.sandbox is not None and b.sandbox.applies(ctx.kind)
    ident = b.identities.of(ctx.principal, ctx.unix_user, ctx.admin, contained, ctx.kind == "service") \
        if b.identities is not None else None
    argv, reads = _command(spec, d)
    env = _environment(b, ctx, spec, ident, contained)
    work = d / "work"
    # Sampled for metadata accounting (storage/meta.py); not a job that runs uncontained as
    # another identity: its traces would lie in corral's directories, which it cannot enter.
    traced = bool(spec.labels.get(META_LABEL)) and not (ident is not None and not contained)
    cwd, own, apart, home = _places(b, ctx, spec, work, ident, contained, traced)
    if ident is not None and "HOME" not in env:
        env["HOME"] = home
    if traced:  # sampled: its metadata calls counted (storage/meta.py), so wrapped alone
        argv = meta.traced(argv, str(work))
    pair = ident.pair if ident is not None else None
    host, env_file, venv = None, None, None
    if contained and b.sandbox is not None:
        host, argv, env, env_file, venv = _contain(b, ctx, spec, d, argv, (cwd, own), env, pair, reads, traced)
    return {
        "host": host,
        "argv": argv,
        "cwd": str(d) if apart else cwd,  # where its supervisor starts bwrap (JOB_DIR is inside)
        "workdir": spec.workdir,
        # Who opens the working directory (corral/sandbox/opendir.py): the job's identity, not root.
        "open_as": _open_as(b, ctx, pair, contained),
        "reads": reads,
        "venv": venv,
        "identity": _identity(ident, contained),
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


def _command(spec: JobSpec, d: Path) -> tuple[list[str], list[str]]:
    """(the job's argv, what it reads from corral's directory ``d``: its script, written there)."""
    if not spec.script:
        return ["bash", "-c", spec.command or ""], []
    script = d / "script"
    write_private(script, spec.script.encode(), 0o755)  # read through its fd: d stays closed
    return ([SCRIPT] if spec.script.startswith("#!") else ["bash", SCRIPT]), [str(script)]


def _environment(b: "LocalBackend", ctx: SubmitContext, spec: JobSpec, ident: "Identity | None",
                 contained: bool) -> dict[str, str]:
    """The job's environment (its HOME is settled once its directories are)."""
    env = base_env()
    if ident is not None:  # who it is, not who the gateway is
        env.update({"USER": ident.user, "LOGNAME": ident.user})
        env.pop("HOME", None)
        if ident.home:
            env["HOME"] = ident.home
    if contained and b.sandbox is not None and b.sandbox.egress and b.egress_credential is not None:
        env.update(egress_grants.proxy_env(b.egress_credential(ctx.job_id)))  # its name at the proxy (its grants)
    env.update(spec.env)
    env.update({"CORRAL_JOB_ID": str(ctx.job_id), "CORRAL_PRINCIPAL": ctx.principal, "CORRAL_SESSION": ctx.session or ""})
    return env


def _places(b: "LocalBackend", ctx: SubmitContext, spec: JobSpec, work: Path, ident: "Identity | None",
            contained: bool, traced: bool) -> tuple[str, str | None, bool, str]:
    """(where the job starts, its own writable directory on corral's disk (None: it needs
    none), whether it works apart in its private /tmp, its HOME unless it has one)."""
    # A contained job without a working directory works in its private /tmp
    # (JOB_DIR), whose size is bounded and counted as its memory: nothing it writes
    # lands on corral's disk (docs/decisions/0044-job-space.md).
    apart = contained and b.sandbox is not None and not spec.workdir and not traced
    own = _own_dir(b, ctx, work, ident, contained) if (not spec.workdir or traced) and not apart else None
    cwd = spec.workdir or (JOB_DIR if apart else str(work))
    if ident is not None and not contained and not spec.workdir:
        # Not contained, no directory named: corral's own directories are closed to it
        # (their parents are 0700), so it starts in /tmp, as Slurm does when a job
        # cannot enter its directory.
        cwd, own = "/tmp", None
    return cwd, own, apart, (JOB_DIR if contained else str(work)) if own or apart else cwd


def _identity(ident: "Identity | None", contained: bool) -> list[Any] | None:
    """[uid, gid, with its groups, user] an uncontained job becomes (a contained one: its sandbox's)."""
    return None if ident is None or contained else list(ident.pair) + [not ident.dynamic, ident.user]


def _own_dir(b: "LocalBackend", ctx: SubmitContext, work: Path, ident: "Identity | None", contained: bool) -> str:
    """``work`` made in the job's directory, then given to whom the job runs as."""
    work.mkdir(mode=0o700, exist_ok=True)
    if ident is not None:
        os.chown(work, *ident.pair)
    elif contained and b.sandbox is not None:
        who = b.sandbox.owner(ctx.kind, ctx.unix_user)
        if who is not None:
            os.chown(work, *who)
    return str(work)


def _contain(b: "LocalBackend", ctx: SubmitContext, spec: JobSpec, d: Path, argv: list[str],
             at: tuple[str, str | None], env: dict[str, str], pair: tuple[int, int] | None, reads: list[str],
             traced: bool) -> tuple[dict[str, Any] | None, list[str], dict[str, str], str | None, str | None]:
    """A contained job's start: in the sandbox built for its working directory (``_host``),
    or in one of its own. ``at``: (its working directory, its own directory on corral's
    disk). -> (the supervisor's ``host``, the argv it runs, the environment it starts
    with, the file the job's own environment is in, the submitter's venv bound in)."""
    assert b.sandbox is not None
    cwd, own = at
    venv = b.sandbox.venv_to_bind(ctx.kind, env)
    bound = (venv, VENV_FD) if venv else None
    if spec.workdir and not traced:
        host, argv = _host(b, ctx, argv, cwd, pair, reads, bound, spec.memory_mb)
        return host, argv, env, None, venv
    # bwrap runs as root with corral's environment; the job's own (its PATH,
    # LD_PRELOAD ...) is read from a descriptor by the step that starts it.
    write_private(d / "env.json", json.dumps(env).encode(), 0o600)
    env, env_file = base_env(), str(d / "env.json")
    argv = b.sandbox.wrap(ctx.kind, argv, cwd, own, ctx.unix_user, ident=pair,
                          cwd_fd=WORKDIR_FD if spec.workdir else None, env_fd=ENV_FD, venv=bound,
                          memory_mb=spec.memory_mb)
    return None, argv, env, env_file, venv


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
