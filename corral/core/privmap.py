"""The privilege map (issue 47 item 1), as data: every process corral runs and the
identity it runs as, the modules that run with privilege, and every crossing, a place
where a more privileged process reads, writes, creates, chowns, binds, deserializes or
waits on something a less privileged one can influence, with the mechanism that makes it
safe. OpenSSH keeps its monitor's requests in one table (``mon_dispatch_proto20[]``);
this is corral's.

docs/security.md ("Privilege map") says the same in prose. tests/test_privilege_map.py
holds it true: it walks every module of ``PRIVILEGED`` and fails on a file operation,
deserialization or unbounded wait (the ops below) that neither goes through a helper of
``HELPERS`` nor is declared here with its mechanism, on a declared op no longer there,
and on an identity change (setuid, setgid, setgroups, initgroups, chown, a child's
``user=``) in any module not listed in ``PRIVILEGED``. The list is the layout's
statement of what runs privileged: the modules stay where their floor is
(docs/architecture.md), named here rather than moved.

Ops, as the test names them: ``open`` (the builtin), ``os.<name>`` (open without
``O_NOFOLLOW`` in its flags as written, chown, chmod, rename, replace, unlink, remove,
rmdir, mkdir, makedirs, symlink, link, mkfifo, mknod, truncate, lchown), ``path.<name>``
(a Path's write_text, write_bytes, read_text, read_bytes, mkdir, touch, chmod, unlink,
rename, rmdir, symlink_to, hardlink_to), ``shutil.<name>`` (but ``which``), ``pickle``
(pickle, marshal, shelve, dill, cloudpickle, ``yaml.load``), and ``wait`` (a
subprocess run without a timeout, a process's ``wait()``/``communicate()`` without one,
``os.waitpid``, ``os.wait4``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Process:
    """A process corral runs."""

    name: str
    program: str
    identity: str
    started_by: str
    isolation: str
    """How it is started so that nothing less privileged steers it (interpreter, cwd, env)."""


@dataclass(frozen=True)
class Crossing:
    """One function's crossing: the ops it does, who can influence what they act on, and
    the mechanism that makes them safe."""

    module: str
    function: str
    """Qualified within its module (``Class.method``, ``outer.inner``; ``<module>``)."""
    ops: tuple[str, ...]
    by: str
    """Who, less privileged, can influence it (``nobody``: corral's own state, listed because the op is one
    the test watches)."""
    mechanism: str


ISOLATED = "python -I (corral/core/interp.py): no PYTHON* variables, no user site, no cwd on sys.path; env given whole"

PROCESSES: tuple[Process, ...] = (
    Process("gateway", "corral serve (corral/edges/http/serve.py, corral/gateway/runtime.py)",
            "root, or a service account (then privileged steps go through corral-submit)", "the admin / systemd",
            "its state in its home, 0711, files 0600; warns when others may write its code"),
    Process("local supervisor", "python -I -m corral.lanes.local_runner DIR (local_child.py)", "root (the gateway's)",
            "gateway (corral/core/proc.py spawn)", ISOLATED + "; its job directory corral's alone (0700)"),
    Process("sandbox host", "bwrap ... python3 -I -S -c <corral/sandbox/host.py>", "root in bwrap, each job setpriv "
            "to its identity", "local supervisor, fast-lane worker (corral/sandbox/hostctl.py, lanes/fast/hosts.py)",
            "standard library only, its source by path; talks over a socketpair, descriptors passed"),
    Process("fast-lane pilot / worker", "python -I -m corral.lanes.fast.worker", "the pool's Unix user (root on a "
            "local backend whose pool has none)", "a pilot job of the batch lane (lanes/fast/pilots.py)",
            ISOLATED + "; cwd /; its TLS key its own, issued by the pool's CA (trust.py)"),
    Process("fast-lane launcher", "a thread of the worker (lanes/fast/launcher.py)", "the worker's",
            "the worker", "posix_spawn per task; a fork that drops to the task's identity (spawning.py)"),
    Process("corral-submit", "sudo -n corral-submit (corral/lanes/slurm/privsep_submit.py)", "root, then the job's "
            "Unix user for sbatch", "a service-account gateway (lanes/slurm/submitter.py)",
            "sudo's env_reset; refuses a caller other than the gateway's account, uids outside the range"),
    Process("Slurm batch script", "the script corral writes (lanes/slurm/script.py)", "root where slurmd runs it as "
            "root, else the job's user; the job itself setpriv to its identity", "slurmd",
            "corral's own script, in out/ corral's until handed over"),
    Process("env builder, stage", "python -I stage.py (storage/stage.py)", "the requester's identity, in its sandbox",
            "a job of the requester (storage/staging.py)", "stage.py copied into a directory of corral's, read-only"),
    Process("env builder, pack", "python -I -m corral.storage.build REQUEST", "root (corral's own job)",
            "gateway (gateway/images.py)", ISOLATED + "; copies the stage's output by descriptor, links never followed"),
    Process("egress proxy", "python -I -m corral.sandbox.egress", "the gateway's", "gateway (sandbox/egress.py)",
            ISOLATED + "; dies with the gateway (PR_SET_PDEATHSIG)"),
    Process("egress relay", "python -I -m corral.sandbox.relay SOCKET HOST:PORT --uid N", "root, then the worker's "
            "user (setuid before serving)", "fast-lane worker (sandbox/egress.py Relay)", ISOLATED),
    Process("input hasher", "python3 -I -S -c <safe_read._hash_inputs>", "the job's identity", "gateway",
            "standard library only; env {}; cwd /; a timeout"),
    Process("directory opener", "python3 -I -S -c <sandbox/opendir.py>", "the job's identity", "local supervisor, "
            "gateway", "standard library only; answers a descriptor over a socketpair"),
    Process("job starter", "/dev/fd/8 opendir|apply ... (sandbox/jobstart.c, built by sandbox/starter.py)",
            "root, its walk as the job's identity (opendir); the job's identity (apply)", "a contained Slurm job's "
            "batch script", "corral's build, in a directory only root or the gateway may write; the filter is the "
            "gateway's libseccomp program, as hex; no file of the job's is opened as root"),
    Process("shims", "sbatch, squeue, ... (corral/edges/shims, launcher.c)", "the job's or agent's identity",
            "an agent, inside its sandbox; a contained job", "speak HTTP to the gateway with the agent's token, or "
            "in a job through its door with the job's own read-only credential (decision 0057): no privilege"),
)

PRIVILEGED: tuple[str, ...] = (
    # the gateway's crossings into what pools, jobs and builds write
    "corral.lanes.fast.lane", "corral.lanes.fast.trust", "corral.lanes.fast.journals", "corral.lanes.fast.engine",
    "corral.lanes.fast.wire", "corral.lanes.local", "corral.lanes.local_launch", "corral.lanes.slurm.script",
    "corral.lanes.slurm.submitter", "corral.gateway.images", "corral.core.identity", "corral.storage.workspaces",
    # a root gateway's dynamic uids written where NSS reads them (decision 0063)
    "corral.core.nss_users",
    "corral.storage.staging", "corral.storage.basework", "corral.sandbox.egress", "corral.sandbox.egress_grants",
    # processes that run as root and change identity, or hold a job
    "corral.lanes.local_runner", "corral.lanes.local_child", "corral.lanes.local_records", "corral.sandbox.host",
    "corral.sandbox.hostctl", "corral.sandbox.opendir", "corral.sandbox.relay", "corral.lanes.slurm.privsep_submit",
    "corral.lanes.slurm.privsep_install", "corral.storage.build", "corral.storage.mounts",
    "corral.lanes.fast.worker", "corral.lanes.fast.launcher", "corral.lanes.fast.books", "corral.lanes.fast.contained",
    "corral.lanes.fast.spawning", "corral.lanes.fast.hosts",
    # corral agent run as root: a working directory made for the agent's identity (decision 0056)
    "corral.edges.cli.agent_workdir",
    # the sign-in socket a root gateway binds where the admin says (decision 0060)
    "corral.edges.http.peer_signin",
    # corral backup / restore, run by root on the gateway's state (decision 0059)
    "corral.gateway.backup",
    # the helpers
    "corral.core.safe_read", "corral.core.proc",
)
"""Every module that runs with privilege over something a less privileged party can
influence. Nothing else in the tree changes identity or chowns (the test checks)."""

IN_MOTION: frozenset[str] = frozenset()
"""Modules being moved or split by concurrent work while the map is edited: their crossings
may be declared for both layouts, and one absent is not stale (every op found in them is
still checked). Empty once the move is in (the local supervisor's split into local_child,
local_launch and local_records, and the sandbox host's control into hostctl, are)."""

HELPERS: dict[str, str] = {
    "corral.core.safe_read": "the one reader of a file a job or agent can influence: O_NOFOLLOW|O_NONBLOCK, "
                             "fstat must say a plain file with one name, a bound on bytes; a job's inputs read as "
                             "its identity in a child with a timeout",
    "corral.core.proc": "the one door for the gateway's short commands (run: always a timeout) and detached "
                        "starts (spawn: its own session, descriptors closed)",
}
"""The safe helpers: their own ops are the mechanism, described here, not listed per call."""

OWN = "corral's own state, under its home (0711/0700), which no job, agent or pool user can write"
NOFOLLOW = "opened with O_NOFOLLOW (O_EXCL where it creates) in a directory of corral's"
DESCRIPTOR = "a descriptor the privileged side opened (O_NOFOLLOW), handed over; nothing by path afterwards"
REAPED = "waits on a child already ended (its pidfd was readable, or its exec pipe read empty): never blocks"
KERNEL = "the kernel's own files (/proc, /dev/null): no party can put a link, FIFO or file there"
SOURCE = "corral's own installed source, root's (interp.unsafe warns otherwise)"

CROSSINGS: tuple[Crossing, ...] = (
    # -- fast lane, in the gateway -------------------------------------------------------------
    Crossing("corral.lanes.fast.lane", "FastLane._pool", ("path.mkdir", "path.chmod"), "nobody: fastlane/ is root's "
             "(0711); the pool's own directory fastlane/<slug>/ is its user's", "names in root's fastlane/, which "
             "the pool's user cannot replace; the slug is injective (model.PoolKey.slug)"),
    Crossing("corral.lanes.fast.lane", "_give", ("os.chown",), "the pool's user (owns what is chowned)",
             "follow_symlinks=False on a name in root's fastlane/"),
    Crossing("corral.lanes.fast.lane", "_write_script", ("os.unlink",), "the pool's user (its directory)",
             "unlink never follows a link; the script is then made O_CREAT|O_EXCL|O_NOFOLLOW and fchown'd"),
    Crossing("corral.lanes.fast.trust", "_write", ("os.unlink",), "nobody", "fastlane/pilots/<slug>/, root's "
             "(own_dir checks it by lstat), written O_EXCL|O_NOFOLLOW and fchown'd"),
    Crossing("corral.lanes.fast.trust", "own_dir", ("path.mkdir", "path.chmod"), "nobody", "made or refused: lstat "
             "must say a directory of the gateway's own, never a link"),
    Crossing("corral.lanes.fast.trust", "issue", ("os.unlink",), "nobody", "a name in root's own_dir"),
    Crossing("corral.lanes.fast.journals", "read_journals", (), "the pool's user (writes journals/)",
             "directory O_NOFOLLOW, each file through safe_read.open_regular (plain, no FIFO), at most MAX_FILES "
             "of MAX_ENTRIES names and MAX_TOTAL bytes, JSON rebuilt by wire.outcome; off the event loop "
             "(read_off_loop)"),
    Crossing("corral.lanes.fast.engine", "Engine._serve", (), "anyone who reaches the pool's address; a worker "
             "(the pool's user)", "at most MAX_PENDING before TLS (the oldest of the busiest address shed), TLS "
             "and hello within HELLO_S, a silent worker closed after IDLE_S, lines of at most MAX_LINE"),
    Crossing("corral.lanes.fast.wire", "parse", (), "a worker (the pool's user)", "JSON of plain data only "
             "(no pickle); outcomes rebuilt from known fields for tasks sent to that worker"),
    # -- fast lane, in the worker (the pool's user; root on a local backend's userless pool) ----------
    Crossing("corral.lanes.fast.worker", "run", ("path.read_text",), "nobody: the less privileged reads root's "
             "file", "fastlane/pilots/<slug>/sandbox.json, root's, 0644"),
    Crossing("corral.lanes.fast.books", "Books._flush", ("os.makedirs",), "the task's identity, when the "
             "worker is root (a task's dir is the pool's)", "the pool's directory is the worker's own; the journal "
             "is opened O_APPEND|O_NOFOLLOW"),
    Crossing("corral.lanes.fast.contained", "Contained._start_contained", ("os.open",), "the pool's user, who owns "
             "the directory", "OUT carries O_NOFOLLOW; the descriptors go to the sandbox host"),
    Crossing("corral.lanes.fast.launcher", "Launcher._reap", ("wait",), "the task", REAPED),
    Crossing("corral.lanes.fast.spawning", "start_as", ("os.open", "open", "wait"), "the task's identity, which "
             "the fork becomes", "outputs with OUT (O_NOFOLLOW) before the fork drops to the identity; /dev/null; "
             "the exec pipe read to its end (closes on exec); waitpid only after the exec failed"),
    Crossing("corral.lanes.fast.hosts", "Host.why_ended", (), "the sandbox's host (the task's identity) writes "
             "its log", "safe_read.read_tail: a plain file, its last 4 KiB"),
    # -- local lane ------------------------------------------------------------------------------
    Crossing("corral.lanes.local", "_read_json", ("path.read_text",), "nobody", OWN + " (ROOT/jobs/<id>/)"),
    Crossing("corral.lanes.local", "LocalBackend.__init__", ("path.mkdir", "os.chmod"), "nobody", OWN),
    Crossing("corral.lanes.local", "LocalBackend.submit", ("path.mkdir",), "nobody", OWN),
    Crossing("corral.lanes.local", "LocalBackend.cancel", ("path.touch",), "nobody", OWN),
    Crossing("corral.lanes.local", "LocalBackend.control", ("path.touch", "path.unlink"), "nobody", OWN),
    Crossing("corral.lanes.local", "LocalBackend._start", ("os.open",), "nobody", OWN + "; the claim O_CREAT|O_EXCL "
             "(fails on any name there, a link too)"),
    Crossing("corral.lanes.local_launch", "_own_dir", ("path.mkdir", "os.chown"), "nobody until handed over",
             OWN + " (ROOT/jobs/<id>/work, made new in the job's directory, then given to its identity)"),
    Crossing("corral.lanes.local_launch", "_host", ("path.mkdir",), "nobody", OWN + " (the sandboxes' sockets)"),
    Crossing("corral.lanes.local", "LocalBackend.collect", ("shutil.rmtree",), "nobody", OWN + "; rmtree by "
             "descriptor never follows a link"),
    Crossing("corral.lanes.local_runner", "main", ("path.read_text", "os.open", "open"), "nobody", OWN +
             "; outputs O_APPEND|O_CREAT|O_NOFOLLOW (its flags), open() wraps those descriptors"),
    Crossing("corral.lanes.local_runner", "main.on_usr1", ("path.read_text",), "nobody", OWN),
    Crossing("corral.sandbox.host", "_spawn", ("open", "wait"), "the job (its identity, after the fork)",
             "the exec pipe read to its end (closes on exec); waitpid only after the exec failed"),
    Crossing("corral.sandbox.host", "_Host.ended", ("wait",), "the job", REAPED),
    Crossing("corral.sandbox.host", "command", ("open",), "nobody", SOURCE),
    # the local supervisor's child and records, and the sandbox host's control
    Crossing("corral.lanes.local_records", "write_json", ("path.write_bytes", "os.replace"), "nobody", OWN),
    Crossing("corral.lanes.local_records", "_in_slot", ("os.replace",), "nobody", OWN),
    Crossing("corral.lanes.local_child", "Popened.ended", ("wait",), "the job", REAPED),
    Crossing("corral.lanes.local_child", "Popened.force", ("wait",), "the job", "its process group SIGKILLed "
             "first: the kernel ends it, stopped or not"),
    *(Crossing(m, f, ops, "a job of the sandbox (its host, as the job's identity)", OWN + " (ROOT/sandboxes/, "
               "0700: the socket, its pid, lock and log files); a host that answers nothing is ended after "
               "ANSWER_S")
      for m in ("corral.sandbox.hostctl",)
      for f, ops in (("built", ("open",)), ("_kill", ("open",)), ("last_words", ("open",)),
                     ("end", ("open", "os.unlink")), ("connect", ("open", "os.unlink", "os.chmod")))),
    Crossing("corral.sandbox.opendir", "_walk_as", ("wait",), "the job's identity (the child becomes it)",
             "the child answers over a socketpair and exits; the socket closed first"),
    Crossing("corral.sandbox.opendir", "walk", ("os.open",), "the job (its working directory's path)",
             "O_PATH of /, then each component openat O_NOFOLLOW (what openat2 RESOLVE_NO_SYMLINKS does)"),
    Crossing("corral.sandbox.opendir", "command", ("open",), "nobody", SOURCE),
    # -- Slurm -----------------------------------------------------------------------------------
    Crossing("corral.lanes.slurm.privsep_submit", "open_beneath_root", ("os.open",), "the caller (its paths)",
             "O_PATH of /, then each component O_NOFOLLOW; the paths a strict pattern"),
    Crossing("corral.lanes.slurm.privsep_install", "install", ("path.mkdir", "path.read_text", "os.chown", "os.chmod",
                                                              "os.replace", "path.unlink"),
             "whoever may write the destination's directory", "refused unless that directory is root's alone "
             "(_root_only); a mkstemp name there (O_EXCL), renamed into place; the source is corral's installed code"),
    Crossing("corral.lanes.slurm.script", "Scripts._lay_out", ("shutil.rmtree", "path.mkdir", "os.mkdir", "os.chown",
                                                               "os.rename"),
             "the job's user, once out/ is handed over", "built in out.new, corral's alone and never handed out "
             "before the rename; chown follow_symlinks=False"),
    # -- storage ---------------------------------------------------------------------------------
    Crossing("corral.storage.basework", "_may_write", ("os.open",), "the identity (its tree)",
             "PATH_FLAGS carry O_NOFOLLOW; each component by dir_fd"),
    Crossing("corral.storage.basework", "_write", ("os.unlink", "os.symlink", "os.chown", "os.rename"),
             "the identity (its tree)", "everything by dir_fd of a directory opened without links; chown "
             "follow_symlinks=False"),
    Crossing("corral.storage.basework", "_extract", ("os.mkdir", "os.symlink", "wait"), "the repository's "
             "content", "by dir_fd, a link made, never followed; git cat-file killed before its wait"),
    Crossing("corral.storage.workspaces", "<module>", ("path.read_text",), "nobody", SOURCE),
    Crossing("corral.storage.workspaces", "Workspaces.fork", ("os.mkdir", "shutil.rmtree"), "nobody", OWN),
    Crossing("corral.storage.workspaces", "Workspaces._export", ("os.mkdir", "os.chown", "path.rename",
                                                                 "shutil.rmtree"),
             "the owner (the export runs as it)", "in corral's own 0711 trees/, a fresh random name; rmtree by "
             "descriptor"),
    Crossing("corral.storage.workspaces", "Workspaces._drop", ("shutil.rmtree",), "the agent (its view)",
             "unmounted first; rmtree by descriptor never follows a link"),
    Crossing("corral.storage.staging", "_dir", ("os.mkdir", "os.chown", "os.chmod"), "nobody: the parent is "
             "corral's", "lstat must say a directory of corral's or the identity's, else refused; chown "
             "follow_symlinks=False"),
    Crossing("corral.storage.staging", "_uv_copy", ("shutil.copyfile", "os.chmod", "os.replace", "path.unlink"),
             "nobody", "a temporary name in the scope's directory, corral's (0711)"),
    Crossing("corral.storage.staging", "make", ("os.mkdir", "shutil.copyfile", "os.chmod", "open"), "nobody",
             "b-DIGEST-NONCE/ made new in the scope's directory, corral's; request.json O_EXCL|O_NOFOLLOW"),
    Crossing("corral.storage.staging", "drop", ("shutil.rmtree", "path.unlink"), "the requester (out/, cache/)",
             "rmtree by descriptor never follows a link"),
    Crossing("corral.storage.build", "sha256_file", ("open",), "nobody", "the image corral packed"),
    Crossing("corral.storage.build", "Copy.tree", ("os.symlink", "os.mkdir"), "the requester (what it installed)",
             "copied by descriptor; a link kept as a link, never followed; owners checked"),
    Crossing("corral.storage.build", "build", ("open", "os.chmod", "path.unlink", "path.rename", "path.write_text",
                                               "path.mkdir"),
             "nobody", "its own temporary directory and corral's image store"),
    Crossing("corral.storage.build", "main", ("path.read_text", "shutil.rmtree", "path.unlink"), "the requester "
             "(its stage)", "the request is corral's (requests/, 0700); the stage removed by descriptor"),
    Crossing("corral.storage.mounts", "mount_image", ("path.mkdir", "shutil.rmtree", "path.write_text", "path.rmdir",
                                                      "path.rename"),
             "nobody", "the mount point is corral's (images' mounts/<key>, from labels only corral sets: "
             "storage_verbs refuses an agent's own OWN_LABELS); a temporary name per pid beside it"),
    Crossing("corral.storage.mounts", "on_nodes", ("open",), "nobody", "os.open O_EXCL|O_NOFOLLOW, wrapped"),
    Crossing("corral.storage.mounts", "_layers", ("path.mkdir", "os.chown", "os.chmod"), "nobody",
             "the workspace's layers in corral's own directory"),
    Crossing("corral.storage.mounts", "unmount", ("shutil.rmtree",), "the agent (its view)",
             "the kernel's mountinfo asked first; rmtree by descriptor"),
    # -- the gateway's own registries --------------------------------------------------------------
    Crossing("corral.gateway.images", "Images.request", ("path.mkdir", "os.chmod", "open"), "nobody", OWN +
             "; the request O_NOFOLLOW"),
    Crossing("corral.gateway.images", "Images.refresh", ("path.read_text",), "nobody", OWN + " (written by the "
             "pack job, root's)"),
    Crossing("corral.gateway.images", "Images.gc", ("path.unlink",), "nobody", OWN),
    Crossing("corral.core.identity", "Identities.known", ("path.read_text",), "nobody", OWN),
    Crossing("corral.core.identity", "Identities._record", ("path.mkdir", "path.read_text"), "nobody",
             OWN + " (every read and write of it: _dynamic's and _saw's); written by _write"),
    Crossing("corral.core.identity", "Identities._refuse_if_gone", ("path.read_text",), "nobody", OWN),
    Crossing("corral.core.identity", "_write", ("os.replace",), "nobody",
             OWN + "; written O_NOFOLLOW then renamed"),
    Crossing("corral.core.identity", "nss_sources", ("path.read_text",), "nobody",
             "/etc/nsswitch.conf, root's (or bound there by root)"),
    Crossing("corral.core.identity", "Identities._machine", ("path.mkdir", "os.replace"), "nobody",
             "the machine's registry, root's 0700; written O_NOFOLLOW then renamed"),
    Crossing("corral.core.nss_users", "_open_dir", ("path.mkdir",), "nobody",
             "[sandbox] nss_users (/var/lib/extrausers), made 0755; opened O_DIRECTORY|O_NOFOLLOW and checked root's "
             "and writable by no one else before anything is read or written in it"),
    Crossing("corral.core.nss_users", "_read", ("open",), "nobody",
             "passwd and group beneath the checked directory, by dir_fd, O_NOFOLLOW|O_NONBLOCK; fstat'd a regular "
             "file of root's no one else may write, read to 16 MiB"),
    Crossing("corral.core.nss_users", "_write", ("os.unlink", "open", "os.rename"), "nobody",
             "by dir_fd of the checked directory under its flock: a new file O_EXCL|O_NOFOLLOW, 0644, fsync'd, "
             "renamed over passwd or group (never a link followed, never written in place)"),
    Crossing("corral.edges.http.peer_signin", "serving", ("path.mkdir", "os.unlink"), "nobody",
             "[signin] socket's directory, the admin's, checked closed to others (or sticky) before use; at the end "
             "the socket's own name there"),
    Crossing("corral.edges.http.peer_signin", "_clear", ("os.unlink",), "whoever may write the socket's directory",
             "lstat'd a socket first (a link or a file stops the start); the directory is closed or sticky"),
    Crossing("corral.edges.http.peer_signin", "_open_to_all", ("os.chmod",), "whoever may write the "
             "socket's directory", "opened O_PATH|O_NOFOLLOW, checked a socket of the gateway's, chmod'd through "
             "/proc/self/fd (never through a link)"),
    # corral backup DEST / restore SRC as root: DEST and SRC are the admin's to name, and
    # another user may own or write what they name (a /tmp path made ahead of the admin).
    Crossing("corral.gateway.backup", "backup", ("path.mkdir", "os.chmod", "path.write_text"), "whoever owns or may write DEST",
             "DEST is lstat'd a directory (not a link) of root's or the runner's before anything is written "
             "(_private), then closed 0700; its files are new names in it"),
    Crossing("corral.gateway.backup", "_copy", ("open", "os.open", "shutil.copyfileobj"), "whoever could write SRC (restore)",
             "both ends opened O_NOFOLLOW, the copy O_EXCL (a backup) and 0600 from creation; SRC checked _private"),
    Crossing("corral.gateway.backup", "_digest", ("open",), "whoever could write SRC",
             "SRC and SRC/audit checked _private (root's or the runner's, not writable by others) before reading"),
    Crossing("corral.gateway.backup", "read_manifest", ("path.read_text",), "whoever could write SRC",
             "SRC checked _private first; the manifest is JSON, its audit file names matched to audit(-N).jsonl"),
    Crossing("corral.gateway.backup", "restore", ("path.mkdir",), "nobody", "the home the admin names, before it is checked fresh"),
    Crossing("corral.gateway.backup", "_store_out", ("os.chmod",), "nobody", "the store's copy, made O_EXCL 0600 in DEST (_private)"),
    Crossing("corral.gateway.backup", "_pg_dump", ("os.chmod",), "nobody", "pg_dump's file in DEST (_private)"),
    Crossing("corral.gateway.backup", "_audit_out", ("path.unlink",), "nobody", "files this backup wrote in DEST/audit (_private)"),
    Crossing("corral.gateway.backup", "_copy_whole_records", ("open", "os.open"), "nobody",
             "the gateway's own audit files (its home, root's 0700) into DEST/audit, O_CREAT|O_EXCL"),
    Crossing("corral.gateway.backup", "_refuse_live", ("open",), "nobody", "the home's gateway.lock, to flock it"),
    Crossing("corral.edges.cli.agent_workdir", "_own_dir", ("path.mkdir", "os.mkdir"), "the agent's "
             "identity (owns NAME-UID once made)", "/var/lib/corral-agents is checked root's and closed to others "
             "(lstat); NAME-UID in it is opened O_DIRECTORY|O_NOFOLLOW and fchown'd by descriptor"),
    Crossing("corral.sandbox.egress", "Egress.__init__", ("path.mkdir", "path.chmod", "path.unlink", "path.read_text"),
             "nobody", OWN + " (the proxy's socket directory)"),
    Crossing("corral.sandbox.egress", "Relay.__init__", ("path.chmod",), "nobody", "a fresh mkdtemp of the worker's"),
    Crossing("corral.sandbox.egress", "Relay.close", ("shutil.rmtree",), "the relay's user (its socket)",
             "rmtree by descriptor never follows a link"),
    Crossing("corral.sandbox.egress_grants", "prepare", ("path.mkdir", "path.chmod"), "nobody",
             OWN + " (the proxy's directory: asks/ made 0700)"),
    Crossing("corral.sandbox.egress_grants", "read_asks", ("os.unlink",), "a contained job (the host and port it "
             "asked the proxy for, the credential it presented), through the proxy that filed the ask",
             "asks/ is corral's 0700, written by its proxy alone; each opened O_NOFOLLOW|O_NONBLOCK, at most 4 KiB "
             "read, JSON data only, each field's type and shape checked, the credential's HMAC checked by the "
             "gateway before anything is asked (gateway/egress_asks.py)"),
    Crossing("corral.sandbox.egress_grants", "write_decisions", ("os.unlink", "os.replace"), "nobody",
             OWN + " (a new file O_EXCL|O_NOFOLLOW, renamed over decisions.json; the proxy reads it O_NOFOLLOW "
             "and matches a presented credential's digest, never a path or code)"),
    Crossing("corral.sandbox.egress", "bridge_binary", ("shutil.copyfile", "path.chmod", "os.replace"), "nobody",
             OWN),
)


def crossings_of(module: str) -> list[Crossing]:
    return [c for c in CROSSINGS if c.module == module]


__all__ = ["Process", "Crossing", "PROCESSES", "PRIVILEGED", "HELPERS", "CROSSINGS", "crossings_of"]
