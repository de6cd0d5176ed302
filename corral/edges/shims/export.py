"""sbatch's ``--export``: what of the submitting shell's environment reaches the batch
job (decision 0042). Slurm's default, ALL, exports every variable; through corral the
job gets every variable too, except:

- what names or holds a secret (a name with key, secret, token, pass, pwd, auth, cred,
  bearer or jwt in it; a value the output guard would redact): a contained job's
  environment is written into its directory and its script, which its agent may read
  back, and a credential of the agent's session must not outlive it there;
- corral's own (CORRAL_*: the session's token) and Slurm's (SLURM_*: set for the job
  anew, as Slurm does);
- the shell's own bookkeeping (PWD, OLDPWD, SHLVL, _ , BASH_FUNC_*) and PATH: the job's
  PATH is the sandbox's own, where the submitting session's directories (its shims, its
  virtualenv) do not lie; TMPDIR and XDG_RUNTIME_DIR (the job's are its own); where a
  credential lies (KRB5CCNAME, SSH_AUTH_SOCK); BASH_ENV and ENV.

``--export=NONE`` exports nothing (the job starts from the node's basic environment,
with Slurm's variables); ``--export=A,B=x`` exports A (if set) and B=x alone;
``--export=ALL,B=x`` all and B=x. A name given explicitly is exported even if it looks
like a secret: the agent asked for it by name.
"""

from __future__ import annotations

import os
import re
import shlex

_SECRETISH = re.compile(r"key|secret|token|pass|pwd|auth|cred|bearer|jwt", re.IGNORECASE)
_SKIP = {"PWD", "OLDPWD", "SHLVL", "_", "PATH", "PS1", "PS2", "PROMPT_COMMAND", "HOSTNAME", "USER", "HOME", "LOGNAME",
         # the job's own: its private /tmp (decision 0044) and its session's runtime directory,
         # which the submitter's name a place the sandbox does not have (mktemp would fail)
         "TMPDIR", "TMP", "TEMP", "TEMPDIR", "XDG_RUNTIME_DIR",
         # a credential's place, not its value: a Kerberos cache, an agent's socket
         "KRB5CCNAME", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO",
         # what every bash of the job would read first, from the submitter's files
         "BASH_ENV", "ENV"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
MAX_TOTAL = 64 * 1024
MAX_ONE = 8 * 1024
"""At most this much of the environment travels, and no one variable over MAX_ONE (the
job's script has a size limit; a large value is data, better in a file)."""


def _secret_value(value: str) -> bool:
    from corral.safety.secrets import redact

    return redact(value)[0] != value


def _inherited(name: str, value: str) -> bool:
    return bool(_NAME.fullmatch(name)) and name not in _SKIP and not name.startswith(("CORRAL_", "SLURM_", "BASH_FUNC_")) \
        and not _SECRETISH.search(name) and "\0" not in value and not _secret_value(value)


def chosen(spec: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables ``--export=spec`` sends, by name."""
    env = dict(os.environ if environ is None else environ)
    words = [w for w in (spec or "ALL").split(",") if w]
    upper = [w.upper() for w in words]
    out: dict[str, str] = {}
    if "NONE" in upper and len(words) == 1:
        return out
    if "ALL" in upper or not words:
        total = 0
        for k, v in sorted(env.items()):
            if len(v) > MAX_ONE or total + len(k) + len(v) > MAX_TOTAL or not _inherited(k, v):
                continue
            total += len(k) + len(v)
            out[k] = v
    for w in words:
        if w.upper() in ("ALL", "NONE"):
            continue
        name, eq, value = w.partition("=")
        if not _NAME.fullmatch(name):
            continue
        if eq:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    return out


def exported(spec: str | None) -> list[str]:
    """The script's lines that set them, ahead of Slurm's own variables."""
    return [f"export {k}={shlex.quote(v)}" for k, v in chosen(spec).items()]
