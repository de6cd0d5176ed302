"""Risk tags for shell commands and job scripts, from a parse of the shell, not one
regular expression over the text.

The command is parsed (tree-sitter-bash, corral/safety/shparse.py; shlex as well
where it finds errors) into simple
commands, then *unwrapped* the way a shell would run them: ``bash -c``/``sh -c``/
``eval`` strings, ``sudo``/``env``/``nohup``/``timeout``/``xargs``/``find -exec``
prefixes, aliases and simple variables defined earlier in the same text, base64
payloads piped into a shell, and shell lines inside ``python -c``/``perl -e``
one-liners. Each simple command is then checked against what a facility cares about.
A tag is evidence for the policy to decide on; it is not a verdict by itself.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from corral.safety import shparse
from corral.sandbox.egress import allowed

TAGS = ("destructive_fs", "recursive_permissions", "fork_bomb", "credential_read", "exfiltration",
        "cryptomining", "privilege_escalation", "heavy_compute", "scheduler_polling", "obfuscated",
        "scheduler_admin", "persistence", "writes_outside", "outbound")
"""The last four are classes by effect, whatever the program: what acts on the scheduler
or on other people (scheduler_admin), what outlives the job (persistence), a write or
deletion outside the job's own directories (writes_outside), any outbound connection
(outbound). The sandbox contains the last two by itself; the first two it cannot."""
SHELLS = {"bash", "sh", "zsh", "dash", "ksh"}
PREFIXES = {"sudo", "doas", "env", "nohup", "timeout", "nice", "ionice", "time", "stdbuf", "command", "exec",
            "builtin", "srun", "chroot"}
PROTECTED_ROOTS = ("/scratch", "/project", "/projects", "/work", "/lustre", "/gpfs", "/home", "/data", "/shared")
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var", "/opt", "/dev", "/sys", "/proc")
SECRET_PATHS = re.compile(r"(\.ssh(?:/|\b)|id_rsa|id_ed25519|id_ecdsa|\.netrc|\.aws/credentials|\.kube/config|\.docker/config"
                          r"|\.git-credentials|\.config/gcloud|\.gnupg|keyring|/etc/shadow|\.corral/admin\.token"
                          r"|\.pypirc|\.npmrc)")
NET_TOOLS = {"curl", "wget", "scp", "sftp", "rsync", "nc", "ncat", "netcat", "socat", "ftp", "telnet"}
ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1", "github.com", "raw.githubusercontent.com", "pypi.org",
                 "files.pythonhosted.org", "huggingface.co", "conda.anaconda.org", "repo.anaconda.com")
MINERS = re.compile(r"\b(xmrig|minerd|cpuminer|ethminer|nbminer|t-rex|lolminer|phoenixminer)\b|stratum\+tcp://")
# Linear in the text: no backreference, no unbounded run followed by more pattern (a
# 30 KB command took 15 s on the first forms, and the gateway's loop with it).
_FUNC_DEF = re.compile(r"(?<![\w:])([\w]{1,64}|:)[ \t]*\(\)[ \t]*\{")
_LOOP_WORD = re.compile(r"\b(?:while|until|for)\b")
_SCHED_WORD = re.compile(r"\b(?:squeue|sacct|sinfo|scontrol)\b")
_WATCH = re.compile(r"\bwatch\b[^|;\n]{0,200}\b(?:squeue|sacct|sinfo)\b")
PERSIST = re.compile(r"authorized_keys|\.bashrc|\.bash_profile|\.bash_login|\.profile\b|\.zshrc|\.zprofile|\.login\b"
                     r"|\.ssh/rc|\.config/(?:systemd|autostart)|/etc/cron|/var/spool/cron|/etc/profile|/etc/rc\.local"
                     r"|/etc/systemd|/etc/init\.d")
INSIDE = ("/tmp", "/var/tmp", "/dev/null", "/dev/std", "/dev/fd", "/dev/shm", "/proc/self")
"""Writes there stay the job's own (its private /tmp when contained)."""
WRITES_LAST = {"cp", "mv", "install", "ln", "rsync", "scp"}
WRITES_ALL = {"tee", "touch", "mkdir", "truncate", "rm", "rmdir", "unlink", "shred", "chmod", "chown", "chgrp"}
SCONTROL_ADMIN = {"update", "delete", "create", "shutdown", "reconfigure", "takeover", "setdebug", "setdebugflags",
                  "reboot", "power", "write", "cancel_reboot"}
SACCTMGR_CHANGES = {"add", "create", "modify", "update", "delete", "remove", "load", "archive"}
NET_PROGRAMS = NET_TOOLS | {"ssh", "wget", "aria2c", "lftp"}
HEAVY = {"mpirun", "mpiexec", "torchrun", "deepspeed", "accelerate", "stress", "stress-ng", "hpl", "xhpl"}


@dataclass
class Risk:
    tags: dict[str, list[str]] = field(default_factory=dict)
    """tag -> evidence (the simple commands that earned it)."""
    unparsed: bool = False

    def add(self, tag: str, evidence: str) -> None:
        ev = self.tags.setdefault(tag, [])
        if evidence not in ev and len(ev) < 5:
            ev.append(evidence[:200])


def analyze(text: str) -> Risk:
    """Tag a command line or a whole job script."""
    risk = Risk()
    _walk(text, risk, {}, {}, depth=0)
    return risk


def tags_of(text: str) -> list[str]:
    """The sorted tags of ``text``: what the gate's parser process returns."""
    return sorted(analyze(text).tags)


def _fork_bomb(text: str) -> str | None:
    """A function whose body runs itself piped into itself in the background (``:(){ :|:& };:``):
    each definition's body (up to its first ``}``) is looked at once."""
    for n, m in enumerate(_FUNC_DEF.finditer(text)):
        if n >= 100:
            break
        name = re.escape(m.group(1))
        end = text.find("}", m.end())
        body = text[m.end(): end if end >= 0 else len(text)]
        if re.search(rf"(?<![\w:]){name}\s*\|\s*{name}\s*&", body):
            return text[m.start(): m.start() + 120]
    return None


def _poll_loop(text: str) -> str | None:
    """A loop keyword, then a scheduler query after it (anywhere later): one pass each."""
    loop = _LOOP_WORD.search(text)
    if loop is not None:
        sched = _SCHED_WORD.search(text, loop.end())
        if sched is not None:
            return text[loop.start(): min(sched.end(), loop.start() + 120)]
    watch = _WATCH.search(text)
    return watch.group(0) if watch else None


def _text_wide(text: str, risk: Risk) -> None:
    """What shows in the shape of the whole text rather than in one command."""
    for tag, find in (("fork_bomb", _fork_bomb), ("scheduler_polling", _poll_loop)):
        found = find(text)
        if found:
            risk.add(tag, found[:120])
    m = MINERS.search(text)
    if m:
        risk.add("cryptomining", m.group(0)[:120])


def _commands(text: str, risk: Risk) -> list[list[list[str]]]:
    """Pipelines of simple commands (argv lists), in order. What tree-sitter could not
    read is also split the simple way (shlex), so a parse error hides nothing."""
    cmds, complete = shparse.parse(text)
    if not complete:
        risk.unparsed = True
        cmds = cmds + _shlex_commands(text)
    return cmds


def _shlex_commands(text: str) -> list[list[list[str]]]:
    out = []
    for line in re.split(r"\n|;|&&|\|\|", text):
        cmds = []
        for seg in line.split("|"):
            try:
                argv = shlex.split(seg, comments=True)
            except ValueError:
                argv = seg.split()
            if argv:
                cmds.append(argv)
        if cmds:
            out.append(cmds)
    return out


_VAR = re.compile(r"\$\{?(\w+)\}?")


def _expand(word: str, variables: dict[str, str]) -> str:
    if "$" not in word:  # most words: no regex at all
        return word
    return _VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), word)


def _walk(text: str, risk: Risk, variables: dict[str, str], aliases: dict[str, str], depth: int) -> None:
    if depth > 6:
        risk.add("obfuscated", "nested too deep to follow")
        return
    _text_wide(text, risk)
    for pipeline in _commands(text, risk):
        for i, argv in enumerate(pipeline):
            argv = [_expand(w, variables) for w in argv]
            while argv and re.match(r"^\w+=", argv[0]):  # VAR=value prefix or a plain assignment
                name, _, value = argv[0].partition("=")
                variables[name] = value
                argv = argv[1:]
            if not argv:
                continue
            if argv[0] == "alias":
                for a in argv[1:]:
                    name, _, value = a.partition("=")
                    aliases[name] = value
                continue
            if argv[0] in aliases:
                _walk(aliases[argv[0]] + " " + " ".join(shlex.quote(a) for a in argv[1:]), risk, variables, aliases,
                      depth + 1)
                continue
            _check(argv, pipeline[:i], risk, variables, aliases, depth)


@dataclass
class _Call:
    """One command being judged, with what it was reached through."""

    argv: list[str]
    upstream: list[list[str]]
    """The commands piped into it."""
    risk: Risk
    variables: dict[str, str]
    aliases: dict[str, str]
    depth: int

    @property
    def name(self) -> str:
        return self.argv[0].rsplit("/", 1)[-1]

    @property
    def line(self) -> str:
        return " ".join(self.argv)

    def again(self, argv: list[str], upstream: list[list[str]] | None = None) -> None:
        """Judge a command this one runs (a prefix's, find's -exec)."""
        _check(argv, self.upstream if upstream is None else upstream, self.risk, self.variables, self.aliases,
               self.depth + 1)

    def code(self, text: str) -> None:
        """Judge shell code this one runs (sh -c, eval, a one-liner's system())."""
        _walk(text, self.risk, dict(self.variables), self.aliases, self.depth + 1)


def _check(argv: list[str], upstream: list[list[str]], risk: Risk, variables: dict[str, str],
           aliases: dict[str, str], depth: int) -> None:
    c = _Call(argv, upstream, risk, variables, aliases, depth)
    if c.name in ("sudo", "doas", "su", "pkexec") or (c.name == "chmod" and re.search(r"[ug]\+s|\b[2467][0-7]{3}\b", c.line)):
        risk.add("privilege_escalation", c.line)
    for runs_another in (_prefixed, _shell, _interpreter):
        if runs_another(c):  # judged as what it runs
            return
    for rule in _RULES:
        rule(c)
    _effects(c.name, argv, c.line, risk)


def _prefixed(c: _Call) -> bool:
    """``nohup``, ``timeout 60``, ``env X=1``, ``xargs``: the command after them."""
    if c.name not in PREFIXES and c.name != "xargs":
        return False
    argv, k = c.argv, 1  # skip the prefix's own options, VAR=value pairs and (timeout) the duration
    while k < len(argv) and (argv[k].startswith("-") or re.match(r"^\w+=", argv[k])):
        k += 1
    if c.name == "timeout" and k < len(argv):
        k += 1
    if k < len(argv):
        c.again(argv[k:])
    return True


def _shell(c: _Call) -> bool:
    """``sh -c CODE``, ``eval CODE``, and what is piped into a shell, decoded where it can be."""
    if c.name not in SHELLS and c.name != "eval":
        return False
    argv, code = c.argv, None
    if c.name == "eval":
        code = " ".join(argv[1:])
    elif "-c" in argv[1:]:
        k = argv.index("-c")
        code = argv[k + 1] if k + 1 < len(argv) else None
    elif c.upstream:
        code = _decoded(c.upstream, c.risk)
    if code:
        c.code(code)
    return True


def _interpreter(c: _Call) -> bool:
    if c.name not in ("python", "python3", "perl", "ruby", "node") or not any(f in c.argv for f in ("-c", "-e")):
        return False
    k = c.argv.index("-c" if "-c" in c.argv else "-e") + 1
    _one_liner(c.argv[k] if k < len(c.argv) else "", c.risk, c.variables, c.aliases, c.depth)
    return True


def _find(c: _Call) -> None:
    if c.name != "find":
        return
    argv = c.argv
    paths = [a for a in argv[1:] if not a.startswith("-") and a not in ("{}", ";", "+", "\\;")][:1]
    if "-delete" in argv and paths and _protected(paths[0]):
        c.risk.add("destructive_fs", c.line)
    if "-exec" in argv or "-execdir" in argv:
        k = argv.index("-exec") if "-exec" in argv else argv.index("-execdir")
        sub = [a for a in argv[k + 1:] if a not in (";", "\\;", "+")]
        if sub and sub[0].rsplit("/", 1)[-1] in ("rm", "shred", "chmod", "chown") and paths and _protected(paths[0]):
            c.risk.add("destructive_fs" if sub[0].endswith(("rm", "shred")) else "recursive_permissions", c.line)
        elif sub:
            c.again([s.replace("{}", paths[0] if paths else "x") for s in sub], [])


def _removal(c: _Call) -> None:
    if c.name not in ("rm", "shred", "unlink", "rmdir"):
        return
    argv = c.argv
    flags = "".join(a[1:] for a in argv[1:] if a.startswith("-") and not a.startswith("--"))
    recursive = "r" in flags.lower() or "--recursive" in argv or c.name == "shred"
    targets = [a for a in argv[1:] if not a.startswith("-") and a != "{}"]
    if (not targets or "{}" in argv) and c.upstream:  # xargs rm (-I{}): the targets come down the pipe
        targets = [w for cmd in c.upstream for w in cmd[1:] if not w.startswith("-")]
    if recursive and any(_protected(t) for t in targets):
        c.risk.add("destructive_fs", c.line)


def _by_name(c: _Call) -> None:
    """The classes a command's name and words give away alone."""
    name, line, argv, risk = c.name, c.line, c.argv, c.risk
    if name in ("mkfs", "wipefs") or name.startswith("mkfs.") or (name == "dd" and re.search(r"\bof=/dev/", line)):
        risk.add("destructive_fs", line)
    if name in ("chmod", "chown", "chgrp", "setfacl") and re.search(r"\s-(\w*R\w*)\b|--recursive", line):
        risk.add("recursive_permissions", line)
    if (SECRET_PATHS.search(line) or re.search(r"\$\{?\w*(TOKEN|SECRET|API_KEY|PASSWORD)\w*\}?", line)) and \
            name not in ("ssh-keygen", "ssh-add"):
        risk.add("credential_read", line)
    if name in NET_TOOLS and _external(argv):
        risk.add("exfiltration", line)
    if name in ("base64", "xxd") and ("-d" in argv or "--decode" in argv or "-r" in argv):
        risk.add("obfuscated", line)
    if name in HEAVY or (name == "make" and re.search(r"-j\s*(\d{2,}|\b)", line) and "-j1" not in line):
        risk.add("heavy_compute", line)


_RULES = (_find, _removal, _by_name)


def _effects(name: str, argv: list[str], line: str, risk: Risk) -> None:
    """The classes by effect: where a command writes, whom it acts on, whether it connects."""
    args = [a for a in argv[1:] if not a.startswith("-")]
    _writes(name, argv, args, line, risk)
    _acts(name, argv, args, line, risk)


def _writes(name: str, argv: list[str], args: list[str], line: str, risk: Risk) -> None:
    """Where it writes: a socket, a start-up file, outside the job's own places."""
    written: list[str] = []
    if name == ">":  # a redirect, by the shell (corral/safety/shparse.py)
        written = args[:1]
    elif name in WRITES_LAST and len(args) >= 2:
        written = args[-1:]
    elif name in WRITES_ALL or (name == "sed" and any(a.startswith("-i") for a in argv)):
        written = args if name != "sed" else args[1:]
    elif name == "dd":
        written = [a[3:] for a in argv if a.startswith("of=")]
    for target in written:
        if target.startswith(("/dev/tcp/", "/dev/udp/")):
            risk.add("outbound", line)
        elif PERSIST.search(target):
            risk.add("persistence", line)
        elif target.startswith(("/", "~", "$HOME", "${HOME}")) and not target.startswith(INSIDE):
            risk.add("writes_outside", line)


def _acts(name: str, argv: list[str], args: list[str], line: str, risk: Risk) -> None:
    """Whom it acts on (the scheduler, other users, later runs) and whether it connects."""
    if (name == "crontab" and "-l" not in argv) or name in ("at", "batch") or \
            (name == "systemctl" and "--user" in argv and any(a in argv for a in ("enable", "start", "link"))):
        risk.add("persistence", line)
    sub = args[0] if args else ""
    if (name == "scontrol" and sub in SCONTROL_ADMIN) or (name == "sacctmgr" and sub in SACCTMGR_CHANGES) or \
            (name == "scancel" and _other_user(argv)):
        risk.add("scheduler_admin", line)
    if name in NET_PROGRAMS or (name == "git" and sub in ("clone", "fetch", "pull", "push", "ls-remote")) or \
            (name in ("pip", "pip3", "uv", "conda", "mamba") and "install" in argv and "--no-index" not in argv) or \
            (name in ("apt", "apt-get") and sub in ("install", "update")):
        risk.add("outbound", line)


def _other_user(argv: list[str]) -> bool:
    """``scancel -u NAME`` for someone else (Slurm lets only operators do it: an attempt)."""
    for i, a in enumerate(argv):
        who = a.split("=", 1)[1] if a.startswith("--user=") else argv[i + 1] if a in ("-u", "--user") and \
            i + 1 < len(argv) else None
        if who is not None and who not in ("$USER", "${USER}", "$(whoami)", "`whoami`", "$LOGNAME"):
            return True
    return False


def _decoded(upstream: list[list[str]], risk: Risk) -> str | None:
    """``echo B64 | base64 -d | sh``: the payload, decoded, so that it can be checked."""
    literal = next((a for cmd in upstream if cmd and cmd[0] in ("echo", "printf") for a in cmd[1:]
                    if not a.startswith("-")), None)
    if literal is None:
        return None
    if any(cmd and cmd[0] in ("base64", "openssl") for cmd in upstream):
        risk.add("obfuscated", "encoded payload piped into a shell")
        try:
            return base64.b64decode(literal + "=" * (-len(literal) % 4)).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return None
    return literal


def _one_liner(code: str, risk: Risk, variables: dict[str, str], aliases: dict[str, str], depth: int) -> None:
    """Shell strings inside python/perl one-liners, and their own destructive calls."""
    for m in re.finditer(r"""(?:system|popen|run|call|check_output|Popen|exec)\s*\(\s*(?:\[)?\s*(['"])(.+?)\1""", code):
        _walk(m.group(2), risk, dict(variables), aliases, depth + 1)
    for m in re.finditer(r"""(?:rmtree|remove|unlink|rmdir)\s*\(\s*(?:os\.path\.expanduser\()?\s*(['"])(.+?)\1""", code):
        if _protected(m.group(2)):
            risk.add("destructive_fs", m.group(0))
    if SECRET_PATHS.search(code):
        risk.add("credential_read", code[:200])
    if re.search(r"b64decode|base64", code) and re.search(r"exec|system|eval", code):
        risk.add("obfuscated", code[:200])
    if re.search(r"\b(socket|urllib|requests|http\.client|httpx|aiohttp|paramiko)\b", code):
        risk.add("outbound", code[:200])


def _protected(path: str) -> bool:
    """Root, system directories, a home directory itself, or a shared filesystem's top."""
    p = path.strip("'\"")
    if p in ("/", "/*", "~", "~/", "~/*", "$HOME", "${HOME}", "$HOME/", "$HOME/*", "*", ".*", "/.", ".."):
        return True
    p = p.rstrip("/*") or "/"
    if p in ("/", "~", "$HOME", "${HOME}"):
        return True
    if any(p == d or p.startswith(d + "/") for d in SYSTEM_DIRS):
        return True
    for root in PROTECTED_ROOTS:
        if p == root or (p.startswith(root + "/") and p.count("/") <= root.count("/") + 1):
            return True
    return bool(re.fullmatch(r"~\w*|\$\{?HOME\}?", p))


_FACILITY_HOSTS: list[str] = []
"""What the facility's egress lets sandboxed jobs reach ([sandbox] allow_hosts): no exfiltration either."""


def facility_hosts(hosts: Sequence[str]) -> None:
    """Tell the tagger the facility's own allow-list (in the gateway, and in its parser
    process): a job fetching from the site's mirror is doing what the site allows."""
    _FACILITY_HOSTS[:] = list(hosts)


def _external(argv: list[str]) -> bool:
    """Does this network command reach a host off the allow-list?"""
    for a in argv[1:]:
        m = re.match(r"^(\w+://)?(?:[^@/\s]+@)?([A-Za-z0-9.-]+\.[A-Za-z]{2,}|\d+\.\d+\.\d+\.\d+|localhost)(?::(\d+))?(?:[/:]|$)",
                     a)
        if m and not a.startswith("-"):
            host = m.group(2).lower()
            port = int(m.group(3)) if m.group(3) else 443 if (m.group(1) or "").lower() == "https://" else 80
            if not any(host == h or host.endswith("." + h) for h in ALLOWED_HOSTS) \
                    and not allowed(host, port, _FACILITY_HOSTS):
                return True
    return False
