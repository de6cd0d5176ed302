#!/usr/bin/python3 -IS
"""corral-submit: the one privileged step of a gateway run as a service account on Slurm.

Slurm 22.05 lets only root submit a job as someone else (``sbatch --uid``). A gateway run
as an unprivileged service account calls this program through one sudo rule
(``corral ALL=(root) NOPASSWD: /usr/local/libexec/corral-submit``) for that step alone,
as OpenSSH's monitor and Slurm's slurmstepd keep privilege to a few narrow requests.
It is standard library only, run isolated (``python3 -IS``: no environment, no site,
no script directory on ``sys.path``), and does the least:

::

    prepare JOB UID           JOBS_DIR/JOB/out.new and what it holds -> UID, the gateway's group
    submit JOB UID OPTION...  sbatch --parsable OPTION... --uid=UID --gid=<its group>, script on stdin
    cancel UID ID... | signal UID ID SIG full|batch | control UID ID uhold|release|requeue
                              scancel / scontrol as UID, never root: Slurm checks the job is UID's
    check                     the configuration it enforces (JSON)

It trusts only root's: its configuration (``CONFIG``, set at install; the file and every
directory above it root's, writable by no one else), ``/etc/login.defs``, the password and
group databases. Before touching anything it refuses: a caller not the configured gateway
(sudo's ``SUDO_UID``); a uid that is root, below ``UID_MIN``, outside the configured range
or group; an option not in ``OPTIONS`` or a value outside its pattern; a script not
``#!/bin/bash`` (never parsed: ``FENCE`` follows its first line, and sbatch reads no
``#SBATCH`` line after a command); a path through a link (``O_NOFOLLOW`` at each step
from ``/``; owners change through descriptors). Every request, refused or done, is one
JSON line in the audit log and in syslog. Exit: 0 done, 2 refused, 1 Slurm failed (why
on stderr). Decision 0021 says why each rule.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time

CONFIG = "/etc/corral/submit.toml"  # scripts/privsep-up sets this line at install

FENCE = b"true  # corral-submit: sbatch reads no #SBATCH line below this one\n"
MAX_SCRIPT = 4 << 20
PATH = "/usr/local/bin:/usr/bin:/bin"

_NAME = r"[A-Za-z0-9_.+-]{1,128}"
_DEP = r"(?:afterok|afterany|afternotok|after):[0-9]{1,12}(?::[0-9]{1,12})*"
OPTIONS: dict[str, str] = {
    "--job-name": r"corral-[0-9]{1,12}(?:-[A-Za-z0-9_.+-]{1,100})?",
    "--comment": r"[ -~]{0,1000}",  # printable ASCII, one line
    "--chdir": r"/[^\x00-\x1f\x7f%\\]{0,4095}",  # Slurm enters it as the job's user; no % patterns
    "--nodes": r"1",
    "--ntasks": r"1",
    "--cpus-per-task": r"[1-9][0-9]{0,5}",
    "--mem": r"[1-9][0-9]{0,9}M",
    "--time": r"[0-9]{2,6}:[0-5][0-9]:[0-5][0-9]",
    "--partition": _NAME,
    "--gres": r"gpu:[0-9]{1,3}",
    "--account": _NAME,
    "--dependency": rf"{_DEP}(?:,{_DEP})*",
    "--kill-on-invalid-dep": r"yes",
    "--nice": r"[0-9]{1,10}",  # never negative: that is an operator's
    "--qos": _NAME,
    "--open-mode": r"append",  # a requeued job's output grows on (decision 0022)
    "--mail-type": r"END|FAIL",  # Slurm's own mail, where the person chose it ([notify] slurm_mail)
    "--mail-user": r"[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9.-]{1,253}",
    "--signal": r"B:URG@[0-9]{1,5}",  # Slurm's notice to the batch shell alone (decision 0058)
}
FLAGS = ("--requeue",)
"""Options without a value a gateway may pass: an opportunistic job is requeued by Slurm
when a person's job preempts it (decision 0022)."""
"""The sbatch options a gateway may pass (what corral's Slurm backend renders), each
with the whole value it may take."""

_ID = re.compile(r"[1-9][0-9]{0,11}")
_UID = re.compile(r"[1-9][0-9]{0,9}")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9/_.+-]{0,1000}")


class Refused(Exception):
    """A request this program will not serve; nothing was changed."""


class Failed(Exception):
    """Slurm did not do it (its message)."""


def main(argv: list[str]) -> int:
    os.umask(0o027)  # the job's files: its own, readable by the gateway's group, by no one else
    record: dict[str, object] = {"t": round(time.time(), 3), "caller": os.environ.get("SUDO_UID"),
                                 "argv": [a[:200] for a in argv[:40]]}
    log_fd = None
    try:
        if os.getuid() != 0 or os.geteuid() != 0 or "SUDO_UID" not in os.environ:
            raise Refused("run through sudo by the gateway's account (see README, 'The gateway as a service account')")
        cfg = load_config(CONFIG)
        log_fd = open_log(cfg)
        try:
            gw = pwd.getpwnam(str(cfg["gateway"]))
        except KeyError:
            raise Refused(f"the configured gateway account {cfg['gateway']!r} does not exist") from None
        if not _UID.fullmatch(os.environ["SUDO_UID"]) or int(os.environ["SUDO_UID"]) != gw.pw_uid:
            raise Refused(f"only {cfg['gateway']!r} may use corral-submit")
        os.chdir("/")
        verb, args = (argv[0], argv[1:]) if argv else ("", [])
        if verb == "check":
            print(json.dumps({"gateway": gw.pw_name, "uids": allowed_range(cfg), "group": cfg.get("group"),
                              "jobs_dir": cfg["jobs_dir"]}))
            return 0
        if verb not in ("prepare", "submit", "cancel", "signal", "control") or len(args) < 2:
            raise Refused("usage: corral-submit prepare|submit JOB UID ... | cancel|signal|control UID ID ...")
        if verb in ("prepare", "submit"):
            job, user = args[0], target(args[1], cfg)
            if not _ID.fullmatch(job):
                raise Refused(f"job {job[:40]!r} is not a corral job id")
            record.update(job=job, uid=user.pw_uid)
            if verb == "prepare":
                prepare(cfg, gw, job, user)
                record["result"] = "handed"
            else:
                record.update(result="submitted", slurm_id=submit(cfg, gw, job, user, args[2:],
                                                                  sys.stdin.buffer.read(MAX_SCRIPT + 1)))
                print(record["slurm_id"])
            return 0
        user = target(args[0], cfg)
        record["uid"] = user.pw_uid
        return as_user(cfg, user, slurm_command(verb, args[1:]), record)
    except Refused as e:
        record["result"] = f"refused: {e}"
        print(f"corral-submit: refused: {e}", file=sys.stderr)
        return 2
    except Failed as e:
        record["result"] = f"failed: {e}"
        print(f"corral-submit: {e}", file=sys.stderr)
        return 1
    finally:
        audit(log_fd, record)


# -- what root trusts ------------------------------------------------------------------


def open_beneath_root(path: str, *, trusted: bool) -> int:
    """A directory opened one component at a time from ``/`` with ``O_NOFOLLOW``. With
    ``trusted``: every directory on the way is root's and writable by no one else
    (or sticky, like /tmp: then only root renames root's entries in it)."""
    if not _SAFE_PATH.fullmatch(path) or "/../" in path + "/" or "/./" in path + "/":
        raise Refused(f"{path!r} is not a plain absolute path")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            _trusted_dir(fd, trusted, path)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        _trusted_dir(fd, trusted, path)
        return fd
    except Refused:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        raise Refused(f"cannot open {path} without following a link: {e.strerror}") from e


def _trusted_dir(fd: int, trusted: bool, path: str) -> None:
    st = os.fstat(fd)
    if trusted and (st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)):
        raise Refused(f"a directory on the way to {path} is not root's alone")


def read_trusted(path: str, limit: int = 1 << 16) -> bytes:
    """A root-owned file no one else may write, in directories no one else may change."""
    head, _, name = path.rpartition("/")
    dfd = open_beneath_root(head or "/", trusted=True)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise Refused(f"{path} must be a file root owns and no one else may write")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def load_config(path: str) -> dict[str, object]:
    import tomllib

    try:
        cfg = tomllib.loads(read_trusted(path).decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise Refused(f"{path}: {e}") from None
    known = {"gateway", "jobs_dir", "slurm_conf", "uids", "group", "log", "bin"}
    if set(cfg) - known or not {"gateway", "jobs_dir", "slurm_conf"} <= set(cfg):
        raise Refused(f"{path} takes {', '.join(sorted(known))} (gateway, jobs_dir and slurm_conf required)")
    for key in ("jobs_dir", "slurm_conf", "log", "bin"):
        if key in cfg and not (isinstance(cfg[key], str) and _SAFE_PATH.fullmatch(cfg[key])):
            raise Refused(f"{path}: {key} must be an absolute path of plain characters")
    return cfg


def login_defs() -> tuple[int, int]:
    """UID_MIN and UID_MAX of /etc/login.defs (Debian's defaults where absent)."""
    found = {"UID_MIN": 1000, "UID_MAX": 60000}
    for line in read_trusted("/etc/login.defs").decode(errors="replace").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in found and words[1].isdigit():
            found[words[0]] = int(words[1])
    return found["UID_MIN"], found["UID_MAX"]


def allowed_range(cfg: dict[str, object]) -> list[int]:
    low, high = login_defs()
    want = cfg.get("uids", [low, high])
    if not (isinstance(want, list) and len(want) == 2 and all(isinstance(u, int) for u in want)):
        raise Refused("uids must be [first, last]")
    return [max(low, 1, int(want[0])), int(want[1])]  # never below UID_MIN, whatever it says


def target(text: str, cfg: dict[str, object]) -> pwd.struct_passwd:
    """The job's user: a uid in the allowed set, known to the password database."""
    if not _UID.fullmatch(text):
        raise Refused(f"uid {text!r} is not a plain positive number")
    (low, high), uid = allowed_range(cfg), int(text)
    if not low <= uid <= high:
        raise Refused(f"uid {uid} is outside the allowed range {low}-{high} (root and system accounts never)")
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        raise Refused(f"uid {uid} has no entry in the password database (Slurm needs one)") from None
    if user.pw_gid == 0:  # the job would run in root's group (setgid below, and sbatch --gid)
        raise Refused(f"{user.pw_name}'s primary group is gid 0 (root's group): give it another")
    if "group" in cfg:
        try:
            g = grp.getgrnam(str(cfg["group"]))
        except KeyError:
            raise Refused(f"the configured group {cfg['group']!r} does not exist") from None
        if user.pw_gid != g.gr_gid and user.pw_name not in g.gr_mem:
            raise Refused(f"{user.pw_name} is not a member of {g.gr_name}")
    return user


def _job_dir(cfg: dict[str, object], gw: pwd.struct_passwd, job: str, name: str) -> int:
    """JOBS_DIR/JOB/NAME, opened without following a link; JOBS_DIR and JOB the gateway's
    and writable by no one else (so no one else can swap NAME)."""
    fd = open_beneath_root(str(cfg["jobs_dir"]), trusted=False)
    try:
        for step in (job, name):
            st = os.fstat(fd)
            if st.st_uid != gw.pw_uid or st.st_mode & 0o022:
                raise Refused(f"{cfg['jobs_dir']} and {job} in it must be the gateway's and writable by no one else")
            nxt = os.open(step, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except Refused:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        raise Refused(f"{job}/{name}: {e.strerror} (the gateway lays it out)") from e


HANDED = {"stdout": 0o640, "stderr": 0o640, "env.json": 0o640, "script": 0o750, "work": 0o2750}
"""What the gateway lays out in out.new, and the mode each gets once its job user's."""


def prepare(cfg: dict[str, object], gw: pwd.struct_passwd, job: str, user: pwd.struct_passwd) -> None:
    # out/ is the job user's with the gateway's group: that group must be the gateway's alone
    if grp.getgrgid(gw.pw_gid).gr_mem or any(p.pw_gid == gw.pw_gid for p in pwd.getpwall() if p.pw_uid != gw.pw_uid):
        raise Refused(f"the gateway's group (gid {gw.pw_gid}) has other members: give {gw.pw_name} a group of its own")
    fd = _job_dir(cfg, gw, job, "out.new")
    handed = []
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) == (user.pw_uid, gw.pw_gid):
            return  # handed already (a retried submission)
        if st.st_uid != gw.pw_uid or st.st_mode & 0o077:
            raise Refused(f"{job}/out.new must be the gateway's alone")
        for name in os.listdir(fd):  # every entry checked before any changes hands
            if name not in HANDED:
                raise Refused(f"{job}/out.new holds {name[:40]!r}, which the gateway never lays out")
            efd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            handed.append((efd, HANDED[name]))
            est = os.fstat(efd)
            kind_ok = stat.S_ISDIR(est.st_mode) and not os.listdir(efd) if name == "work" else \
                stat.S_ISREG(est.st_mode) and est.st_nlink == 1  # no hard link to a file elsewhere
            if not kind_ok or est.st_uid != gw.pw_uid:
                raise Refused(f"{job}/out.new/{name} is not what the gateway lays out there")
        for efd, mode in [*handed, (fd, 0o2770)]:  # setgid: what the job makes there is the gateway's group
            os.fchown(efd, user.pw_uid, gw.pw_gid)
            os.fchmod(efd, mode)
    except OSError as e:
        raise Refused(f"{job}/out.new: {e.strerror}") from None
    finally:
        for efd, _ in handed:
            os.close(efd)
        os.close(fd)


def submit(cfg: dict[str, object], gw: pwd.struct_passwd, job: str, user: pwd.struct_passwd,
           options: list[str], script: bytes) -> str:
    argv = [f"{cfg.get('bin', '/usr/bin')}/sbatch", "--parsable"] + checked_options(options)
    if len(script) > MAX_SCRIPT or not script.startswith(b"#!/bin/bash\n") or b"\0" in script or b"\r" in script:
        raise Refused("the script must start with #!/bin/bash, be under 4 MiB, and hold no NUL or CR")
    fd = _job_dir(cfg, gw, job, "out")
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (user.pw_uid, gw.pw_gid):
            raise Refused(f"{job}/out is not handed to uid {user.pw_uid} (prepare first)")
    finally:
        os.close(fd)
    out = f"{cfg['jobs_dir']}/{job}/out"
    argv += [f"--output={out}/stdout", f"--error={out}/stderr", f"--uid={user.pw_uid}", f"--gid={user.pw_gid}"]
    fenced = b"#!/bin/bash\n" + FENCE + script[len(b"#!/bin/bash\n"):]
    try:
        cp = subprocess.run(argv, input=fenced, capture_output=True, env=job_env(cfg, user), timeout=60)
    except subprocess.TimeoutExpired:
        raise Failed("sbatch did not answer within 60 s") from None
    said = cp.stdout.decode(errors="replace").strip()
    if cp.returncode != 0 or not re.fullmatch(r"[0-9]{1,12}(;[A-Za-z0-9_.-]+)?", said):
        raise Failed(cp.stderr.decode(errors="replace").strip()[-500:] or f"sbatch answered {said[:100]!r}")
    return said.split(";")[0]


def checked_options(words: list[str]) -> list[str]:
    seen: set[str] = set()
    for word in words:
        if word in FLAGS and word not in seen:
            seen.add(word)
            continue
        name, eq, value = word.partition("=")
        pattern = OPTIONS.get(name)
        if not eq or pattern is None:
            raise Refused(f"{word[:60]!r} is not an option corral-submit passes to sbatch "
                          f"(it takes {', '.join(OPTIONS)}, each as --name=value, and {', '.join(FLAGS)})")
        if name in seen or not re.fullmatch(pattern, value):
            raise Refused(f"{name} given twice or with a value it does not take: {value[:60]!r}")
        seen.add(name)
    return list(words)


def slurm_command(verb: str, args: list[str]) -> list[str]:
    if verb == "cancel" and args and all(_ID.fullmatch(a) for a in args):
        return ["scancel", *args]
    if verb == "signal" and len(args) == 3 and _ID.fullmatch(args[0]) and re.fullmatch(r"[1-9][0-9]?", args[1]) \
            and args[2] in ("full", "batch"):
        return ["scancel", f"--signal={args[1]}", f"--{args[2]}", args[0]]
    if verb == "control" and len(args) == 2 and _ID.fullmatch(args[0]) and args[1] in ("uhold", "release", "requeue"):
        return ["scontrol", args[1], args[0]]
    raise Refused(f"{verb} takes: cancel UID ID... | signal UID ID SIG full|batch | control UID ID uhold|release|requeue")


def as_user(cfg: dict[str, object], user: pwd.struct_passwd, argv: list[str], record: dict[str, object]) -> int:
    """Run a Slurm command as ``user``, not root: Slurm lets a job's owner act on it and
    nobody else's."""
    os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    if os.getuid() != user.pw_uid or os.geteuid() != user.pw_uid:
        raise Refused("could not become the job's user")
    argv[0] = f"{cfg.get('bin', '/usr/bin')}/{argv[0]}"
    try:
        cp = subprocess.run(argv, capture_output=True, env=job_env(cfg, user), timeout=60)
    except subprocess.TimeoutExpired:
        raise Failed(f"{argv[0]} did not answer within 60 s") from None
    sys.stdout.buffer.write(cp.stdout[:1 << 16])
    sys.stderr.buffer.write(cp.stderr[:1 << 16])
    record["result"] = f"{argv[0].rsplit('/', 1)[1]} exit {cp.returncode}"
    return cp.returncode


def job_env(cfg: dict[str, object], user: pwd.struct_passwd) -> dict[str, str]:
    """Made here, never passed through: sbatch exports it to the job."""
    return {"PATH": PATH, "LANG": "C.UTF-8", "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
            "SHELL": user.pw_shell or "/bin/sh", "SLURM_CONF": str(cfg["slurm_conf"])}


def open_log(cfg: dict[str, object]) -> int | None:
    if "log" not in cfg:
        return None
    head, _, name = str(cfg["log"]).rpartition("/")
    dfd = open_beneath_root(head or "/", trusted=True)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError as e:
        raise Refused(f"cannot open the audit log {cfg['log']}: {e.strerror}") from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
        os.close(fd)
        raise Refused(f"the audit log {cfg['log']} must be a file of root's")
    return fd


def audit(fd: int | None, record: dict[str, object]) -> None:
    line = json.dumps(record, sort_keys=True)
    if fd is not None:
        os.write(fd, (line + "\n").encode())
        os.close(fd)
    import syslog  # where no syslogd listens, this sends nothing and says nothing

    syslog.openlog("corral-submit", 0, syslog.LOG_AUTHPRIV)
    syslog.syslog(syslog.LOG_NOTICE, line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
