"""``corral slurm plugin``: a job_submit.lua that makes corral the only way agents'
accounts and users reach the queue: a second fence inside Slurm, behind the one
``corral agent run`` puts around the agent.

How the plugin knows a job came through corral, without a crypto library in
slurmctld's Lua: slurmctld passes ``submit_uid``, the uid that sent the submit RPC,
which munge authenticated (a client cannot claim another uid: the credential is
minted by munged from the caller's kernel identity). corral's gateway submits as its
own service account (``--uid`` to the job's owner: only root and SlurmUser may), so
a job owned by an agent user or charged to an agent account whose submit_uid is not
corral's was submitted from a login shell, and is refused with a message that says
what to do. A user cannot forge it: they would need corral's uid, i.e. to be corral.
"""

from __future__ import annotations

import pwd
from typing import Sequence

from corral.core.errors import InvalidRequest

TEMPLATE = """-- job_submit.lua, written by `corral slurm plugin`: agents reach Slurm through corral only.
-- Install: this file beside slurm.conf, and JobSubmitPlugins=lua in it.
-- A job for an agent user or account is accepted only when corral's gateway sent it:
-- submit_uid is the uid munge authenticated for the RPC, which a user cannot claim.

local CORRAL_UIDS = {{ {corral} }}
local AGENT_UIDS = {{ {users} }}
local AGENT_ACCOUNTS = {{ {accounts} }}
local MESSAGE = {message}

local function is_agent(job_desc)
  if AGENT_UIDS[job_desc.user_id] then
    return true
  end
  local account = job_desc.account or job_desc.default_account
  return account ~= nil and AGENT_ACCOUNTS[account] == true
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if is_agent(job_desc) and not CORRAL_UIDS[submit_uid] then
    slurm.log_info("corral: refused job %s of uid %d submitted by uid %d outside corral",
                   tostring(job_desc.name), job_desc.user_id, submit_uid)
    slurm.log_user(MESSAGE)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  -- moving a job onto an agent account is a submission too
  if job_desc.account ~= nil and AGENT_ACCOUNTS[job_desc.account] and not CORRAL_UIDS[modify_uid] then
    slurm.log_user(MESSAGE)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

return slurm.SUCCESS
"""

DEFAULT_MESSAGE = ("This account belongs to a coding agent: submit through corral (corral agent run -- YOUR_AGENT, "
                   "or its MCP tools), not with sbatch from a login shell. Ask your HPC admins if this is wrong.")


def _lua_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def uid_of(name: str) -> int:
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise InvalidRequest(f"no Unix user {name!r} on this machine",
                             hint="give users that exist where slurmctld runs, or their uids") from None


def render(corral_users: Sequence[str], agent_users: Sequence[str], agent_accounts: Sequence[str],
           message: str = DEFAULT_MESSAGE) -> str:
    if not agent_users and not agent_accounts:
        raise InvalidRequest("name the agents' users or accounts the plugin fences",
                             hint="corral slurm plugin --agent-account agents --agent-user alice-agent")
    if not corral_users:
        raise InvalidRequest("name the user corral's gateway runs as", hint="--corral-user corral")
    for a in agent_accounts:
        if not a or any(c in a for c in "\"'\\[]\n"):
            raise InvalidRequest(f"account {a!r} is not a Slurm account name")
    corral = ", ".join(f"[{uid_of(u)}] = true" for u in corral_users)
    users = ", ".join(f"[{uid_of(u)}] = true" for u in agent_users)
    accounts = ", ".join(f"[{_lua_string(a)}] = true" for a in agent_accounts)
    return TEMPLATE.format(corral=corral, users=users, accounts=accounts, message=_lua_string(message))


def command() -> "object":
    import getpass
    from pathlib import Path

    import click

    @click.group()
    def slurm() -> None:
        """Slurm-side pieces of corral.

        \b
        Example:
          corral slurm plugin --agent-account agents --corral-user corral > /etc/slurm/job_submit.lua
        """

    @slurm.command()
    @click.option("--agent-user", "agent_users", multiple=True, help="A Unix user (or uid) that is an agent's; repeatable.")
    @click.option("--agent-account", "agent_accounts", multiple=True, help="A Slurm account of agents; repeatable.")
    @click.option("--corral-user", "corral_users", multiple=True,
                  help="The user corral's gateway submits as (default: you, who run this); repeatable.")
    @click.option("--message", default=DEFAULT_MESSAGE, show_default=False, help="What a refused user reads.")
    @click.option("--out", type=click.Path(path_type=Path), help="Write here (default: stdout).")
    def plugin(agent_users: tuple[str, ...], agent_accounts: tuple[str, ...], corral_users: tuple[str, ...],
               message: str, out: Path | None) -> None:
        """Write a job_submit.lua that refuses agents' jobs not sent by corral.

        \b
        Install it beside slurm.conf with JobSubmitPlugins=lua, then
        scontrol reconfigure (Debian: slurm-wlm-basic-plugins ships job_submit_lua).
        scripts/slurm-up --job-submit FILE installs it on the private Slurm.

        \b
        Example:
          corral slurm plugin --agent-account agents --corral-user corral --out /etc/slurm/job_submit.lua
        """
        text = render(corral_users or (getpass.getuser(),), agent_users, agent_accounts, message)
        if out is None:
            click.echo(text, nl=False)
        else:
            try:
                out.write_text(text)
            except OSError as e:
                raise InvalidRequest(f"cannot write {out}: {e.strerror}") from None
            click.echo(f"wrote {out}", err=True)

    @slurm.command()
    @click.option("--dest", type=click.Path(path_type=Path), default=Path("/usr/local/libexec/corral-submit"),
                  show_default=True, help="Where the helper goes: root's, in a directory only root may write.")
    @click.option("--config", "config", default="/etc/corral/submit.toml", show_default=True,
                  help="The configuration it will read (root's, 0644; decision 0021 says what it holds).")
    @click.option("--gateway-user", default="corral", show_default=True, help="The gateway's service account.")
    def submitter(dest: Path, config: str, gateway_user: str) -> None:
        """Install the privileged submitter from this installation (as root), as scripts/privsep-up does.

        \b
        A gateway run as a service account submits each principal's jobs as its Unix
        user through it, behind one sudo rule (printed; never written here).

        \b
        Example:
          corral slurm submitter --dest /usr/local/libexec/corral-submit     # as root
        """
        from corral.lanes.slurm.privsep_install import install

        install(dest, config)
        click.echo(f"installed {dest} (configuration: {config}). Add with visudo -f /etc/sudoers.d/corral:\n"
                   f"{gateway_user} ALL=(root) NOPASSWD: {dest}", err=True)

    return slurm


slurm = command()
