"""``corral agent run -- COMMAND``: an agent (Claude Code, Codex, any program) started
as a corral agent session.

- Its token and session are in its environment (CORRAL_TOKEN, CORRAL_SESSION, CORRAL_URL).
- corral's MCP server is configured for it without touching the user's own files:
  Claude Code gets ``--mcp-config=FILE``, Codex ``-c mcp_servers.corral...`` overrides
  (the token by name, from the environment, never on the command line);
  any other program finds the same JSON at $CORRAL_MCP_CONFIG.
- Its PATH starts with corral's Slurm shims (corral/edges/shims), so its ``sbatch`` and
  ``squeue -j`` loops are served by the gateway.
- Inside bubblewrap (when the machine has it, unless ``--no-fence``): the munge socket's
  directory is an empty tmpfs, so no Slurm client (the real one, or one the agent
  builds) can authenticate to slurmctld; and the real Slurm binaries, wherever they are,
  are the shims, so even ``/usr/bin/sbatch`` goes through corral. The network, the
  user's files and the terminal are the agent's as before: this fences the scheduler,
  not the machine (docs/agents-at-the-login-node in README: what it stops and what not).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.core import proc
from corral.core.errors import InvalidRequest
from corral.core import paths
from corral.core.paths import gateway_homes
from corral.core.signals import GRACE_S
from corral.edges.cli.agent_session import PREFIX, mark, read_token, sweep
from corral.edges.cli.agent_workdir import start_dir
from corral.edges.shims import COMMANDS, REFUSED
from corral.edges import reads

SLURM_CLIENTS = COMMANDS + REFUSED + ("slurmrestd",)
MUNGE_DIRS = ("/run/munge", "/var/run/munge")


def munge_dirs(slurm_conf: str | None) -> list[str]:
    """Where munge's socket may be: the standard places and the one slurm.conf names."""
    out = [d for d in MUNGE_DIRS if os.path.isdir(d)]
    if slurm_conf and os.path.isfile(slurm_conf):
        m = re.search(r"^\s*AuthInfo\s*=.*socket=([^,\s]+)", Path(slurm_conf).read_text(errors="replace"), re.M)
        if m:
            out.append(os.path.dirname(m[1]))
    return sorted(set(out))


def shim_dir(root: Path) -> Path:
    """A directory of the shims: one symlink per Slurm command to a launcher that asks the
    session's resident helper (corral/edges/shims/helper.py), else runs the shim itself."""
    from corral.edges.shims.helper import install_launcher

    d = root / "bin"
    d.mkdir(parents=True, exist_ok=True)
    target = d / "corral-shim"
    if not target.exists():
        install_launcher(target, str(paths.CODE_ROOT))
    for name in COMMANDS + REFUSED:  # the refused ones say what to use instead
        link = d / name
        if not link.exists():
            link.symlink_to(target)
    return d


def start_helper(root: Path, session: bool = False) -> tuple[subprocess.Popen[bytes] | None, str | None]:
    """The session's resident shim helper (its process, its socket), or (None, None) when
    it did not come up: the shims then run on their own, only slower. ``session``: it
    ends with this process, however this ends, and removes ``root`` as it goes
    (helper.guard)."""
    sock = root / "shim.sock"
    guard = f"guard({str(root)!r}, {os.getpid()}); " if session else ""
    code = (f"import sys; sys.path.insert(0, {str(paths.CODE_ROOT)!r}); "
            f"from corral.edges.shims.helper import guard, serve; {guard}serve({str(sock)!r})")
    # Isolated (-I): started in the agent's working directory, which others may write.
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        if sock.exists():
            return proc, str(sock)
        time.sleep(0.02)
    stop_helper(proc)
    return None, None


def stop_helper(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def mcp_config(corral_bin: str, env: dict[str, str]) -> dict[str, object]:
    return {"mcpServers": {"corral": {"command": corral_bin, "args": ["mcp"], "env": env}}}


def client_args(command: list[str], config_path: Path, corral_bin: str, env: dict[str, str]) -> list[str]:
    """The command with corral's MCP server added, by the client's own mechanism.

    Claude Code: ``--mcp-config=FILE`` in one word, since ``--mcp-config FILE`` takes
    every later word as another file (the prompt too). Codex: ``-c`` overrides naming
    the variables it forwards from its own environment (``env_vars``), never their
    values: a command line is readable by every user of a login node."""
    name = os.path.basename(command[0])
    if name == "claude":
        return [command[0], f"--mcp-config={config_path}", *command[1:]]
    if name == "codex":
        names = ", ".join(json.dumps(k) for k in env)
        return [command[0], "-c", f"mcp_servers.corral.command={json.dumps(corral_bin)}",
                "-c", 'mcp_servers.corral.args=["mcp"]', "-c", f"mcp_servers.corral.env_vars=[{names}]", *command[1:]]
    return command


def fence(argv: list[str], shims: Path, slurm_conf: str | None) -> tuple[list[str], list[str]]:
    """(the argv under bubblewrap, what it hides), or the argv alone when bwrap is missing."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return argv, []
    hidden: list[str] = []
    args = [bwrap, "--dev-bind", "/", "/", "--die-with-parent"]
    for d in munge_dirs(slurm_conf):
        args += ["--tmpfs", d]
        hidden.append(d)
    # The admin tokens and state of every gateway this user runs: the agent runs as that
    # user, and a file it can read would make it the admin (issue 32's review, F12).
    for home in gateway_homes():
        args += ["--tmpfs", str(home)]
        hidden.append(str(home))
    args, hidden = _hide_signin(args, hidden)
    target = os.path.realpath(shims / "sbatch")
    path_dirs = [p for p in os.environ.get("PATH", "").split(":") if p and os.path.realpath(p) != str(shims)]
    for name in SLURM_CLIENTS:
        for d in dict.fromkeys(path_dirs + ["/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin"]):
            real = os.path.join(d, name)
            if os.path.isfile(real) and os.path.realpath(real) != target:
                if name in COMMANDS + REFUSED:
                    args += ["--ro-bind", str(shims / name), real]
                else:
                    args += ["--ro-bind", "/dev/null", real]
                hidden.append(real)
    return args + ["--", *argv], hidden


def _hide_signin(args: list[str], hidden: list[str]) -> tuple[list[str], list[str]]:
    """What signs the person in (decision 0060), out of the agent's reach: its kept
    tokens, the gateway's sign-in socket and a munge socket named to corral; the agent
    runs as the person, and any of them would make it the person."""
    from corral.edges.signin_client import DEFAULT_SOCKET, cache_dir

    kept = cache_dir()
    kept.mkdir(parents=True, exist_ok=True, mode=0o700)  # hidden even if the person signs in later
    args, hidden = args + ["--tmpfs", str(kept)], hidden + [str(kept)]
    for sock in dict.fromkeys([os.environ.get("CORRAL_SIGNIN_SOCKET") or DEFAULT_SOCKET, DEFAULT_SOCKET]):
        if os.path.exists(sock):
            args, hidden = args + ["--ro-bind", "/dev/null", sock], hidden + [sock]
    named = os.environ.get("CORRAL_MUNGE_SOCKET")
    if named and os.path.isdir(os.path.dirname(named)):
        args, hidden = args + ["--tmpfs", os.path.dirname(named)], hidden + [os.path.dirname(named)]
    return args, hidden


def banner(session: str, url: str, hidden: list[str], fenced: bool) -> str:
    """What the session's start says: where Slurm's commands go, what the fence hides (in
    kinds and counts: the gateway homes it hides are every one this user's gateways ever
    recorded, test gateways' included, thousands of characters as a list), and what a job
    does that an agent would otherwise learn by failing (issue 49 item 6)."""
    if hidden:
        homes = len({str(h) for h in gateway_homes()} & set(hidden))
        slurm = len([h for h in hidden if os.path.basename(h) in SLURM_CLIENTS])
        from corral.edges.signin_client import cache_dir

        signin = len([h for h in hidden if h == str(cache_dir()) or h.endswith(".sock")])
        munge = len(hidden) - homes - slurm - signin
        fence = ("hidden from the agent: " + ("the munge socket, " if munge else "")
                 + ("your corral sign-in, " if signin else "")
                 + f"Slurm's own {slurm} commands (the shims stand in), "
                 f"{homes} corral gateway home{'s' if homes != 1 else ''}")
    else:
        fence = "not fenced (no bubblewrap)" if fenced else "not fenced (--no-fence)"
    return (f"corral: agent session {session}; Slurm commands go through {url}; {fence}\n"
            "corral: a job without workdir runs in an empty private /tmp/corral-job: give workdir to run your files; "
            f"agents' Slurm batch jobs may be preemptible (plan_job says the tier): then SIGUSR1 "
            f"(--signal=B:USR1@{GRACE_S}) and {GRACE_S} s grace to checkpoint, requeued and run again from the start; "
            "tier=guaranteed asks for the other tier")


def run(command: list[str], url: str, token: str | None, session: str | None, fenced: bool, quiet: bool,
        token_file: str | None = None) -> int:
    token = read_token(token, token_file)
    if not command:
        raise InvalidRequest("give the agent's command after --", hint="corral agent run -- claude")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise InvalidRequest(f"{command[0]!r} is not a program on PATH",
                             hint="install it (Claude Code: npm install -g @anthropic-ai/claude-code; Codex: "
                                  "npm install -g @openai/codex) or give its full path")
    if not token or not token.strip() or token.startswith("-"):
        # `--token $TOKEN` with TOKEN empty reaches here as --token '' or as --token -- (the
        # shell drops an empty unquoted word): never start an agent on that.
        raise InvalidRequest("no token for the agent" + (f" (--token took {token!r}: is $TOKEN empty?)" if token else ""),
                             hint="ask your sponsor for one (people mint them: corral token mint --for AGENT), "
                             "save it in a file only you may read, then corral agent run --token-file FILE -- COMMAND "
                             "(or --token - to type it, or set CORRAL_TOKEN)")
    from corral.edges.client import Client

    # The token is asked of the gateway before the agent starts: a wrong one fails here, in
    # one line, not at the agent's first sbatch.
    me = Client(url, token.strip(), session).run(reads.whoami)
    where, said = start_dir(me, os.getcwd())  # where the agent's jobs may write (decision 0056)
    if said:
        print(said, file=sys.stderr)
    os.chdir(where)
    session = session or f"agent-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    sweep()  # what an earlier session killed outright left (its mcp.json holds a token)
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    os.chmod(root, 0o700)
    mark(root, None)
    shims = shim_dir(root)
    corral_bin = shutil.which("corral") or str(Path(sys.executable).with_name("corral"))
    agent_env = {"CORRAL_URL": url, "CORRAL_TOKEN": token, "CORRAL_SESSION": session}
    if os.environ.get("CORRAL_CA_FILE"):  # an https gateway under a site CA: its relay must verify it too
        agent_env["CORRAL_CA_FILE"] = os.environ["CORRAL_CA_FILE"]
    cfg = root / "mcp.json"
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(mcp_config(corral_bin, agent_env), f, indent=2)
    (root / "cache").mkdir()
    env = {**os.environ, **agent_env, "CORRAL_MCP_CONFIG": str(cfg), "CORRAL_AGENT": "1",
           "CORRAL_SHIM_CACHE": str(root / "cache"),
           "PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    # CORRAL_SHIM_HELPER=0: each shim runs on its own (slower, the same answers)
    helper, sock = start_helper(root, session=True) if os.environ.get("CORRAL_SHIM_HELPER", "1") != "0" \
        else (None, None)
    if sock:
        env["CORRAL_SHIM_SOCKET"] = sock
    if helper is not None:
        mark(root, helper.pid)
    argv = client_args(command, cfg, corral_bin, agent_env)
    hidden: list[str] = []
    if fenced:
        argv, hidden = fence(argv, shims, os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    if not quiet:
        print(banner(session, url, hidden, fenced), file=sys.stderr)
    try:
        code = proc.attach(argv, env=env)  # SIGHUP, SIGTERM: passed on to the agent, then on to here
        return code if code >= 0 else 128 - code  # ended by a signal: as a shell says it
    finally:
        stop_helper(helper)
        shutil.rmtree(root, ignore_errors=True)


def _command() -> "object":
    import click

    @click.group()
    def agent() -> None:
        """Run coding agents as corral agent sessions.

        \b
        Examples:
          corral agent run --token-file ~/.corral/agent.token -- claude   # sbatch, squeue ... are corral's
          corral agent run --token - -- bash      # the token typed (not echoed); a shell as the agent sees it
        """

    @agent.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @click.option("--token", envvar="CORRAL_TOKEN", help=(
        "The agent's token (default: $CORRAL_TOKEN); '-': read it from stdin (typed, not echoed, at a terminal). "
        "A token written here stays readable in /proc by every user for the whole session: prefer "
        "--token-file, '-' or the environment."))
    @click.option("--token-file", type=click.Path(dir_okay=False, allow_dash=True),
                  help="Read the agent's token from this file ('-': stdin).")
    @click.option("--session", help="Session name (default: agent-DATE-PID).")
    @click.option("--url", envvar="CORRAL_URL", default="http://127.0.0.1:8765", show_default=True,
                  help="The gateway.")
    @click.option("--no-fence", is_flag=True, help="Do not hide munge and Slurm's own binaries (bubblewrap).")
    @click.option("--quiet", is_flag=True, help="Say nothing before starting the agent.")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED)
    def run_cmd(token: str | None, token_file: str | None, session: str | None, url: str, no_fence: bool,
                quiet: bool, command: tuple[str, ...]) -> None:
        """Start COMMAND (claude, codex, any program) as a corral agent session.

        \b
        Its token and session are set; corral's MCP server is configured for it
        (Claude Code: --mcp-config=FILE, Codex: -c mcp_servers.corral...; others:
        $CORRAL_MCP_CONFIG); its sbatch, squeue, sacct, scancel, sinfo, scontrol and
        srun are corral's; and, with bubblewrap, the munge socket and Slurm's own
        binaries are hidden, so the scheduler is reached through corral only.

        \b
        Its session's files (mcp.json holds the token) and helper go when it ends:
        exit, SIGHUP, SIGTERM; on SIGKILL the helper's death signal removes them, and
        the next run sweeps what is left.

        \b
        Examples:
          corral agent run --token-file ~/.corral/agent.token -- claude
          corral agent run -- codex                 # the token from $CORRAL_TOKEN
          corral agent run -- bash -c 'sbatch --wrap "make test"; squeue --me'
        """
        if token and token != "-" and token != os.environ.get("CORRAL_TOKEN") and not quiet:
            print("corral: warning: a token on the command line is readable in /proc by every user of this "
                  "machine while the session runs; use --token-file FILE, --token - or CORRAL_TOKEN", file=sys.stderr)
        sys.exit(run(list(command), url, token, session, not no_fence, quiet, token_file))

    run_cmd.name = "run"
    return agent


agent = _command()
