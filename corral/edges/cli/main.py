"""The command line: ``corral serve`` starts the gateway; every other command is a
thin client of it over HTTP. Tables for people, ``--json`` for agents. Exit status:
0 done, 2 bad input or refused (fix the request), 1 the gateway or scheduler failed,
3 ``wait`` timed out with the job not yet there (so ``corral wait 1 && corral logs 1``
reads only finished output). Under ``--json`` an error is also one JSON object on
stdout: ``{"error": {"code", "message", "hint"}}``.

Commands that need no gateway or heavy libraries (analytics, policy, risk) are
imported only when called: ``corral status`` starts without numpy, polars, Cedar or
tree-sitter."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from corral.edges.cli.job_commands import job_line, job_rows, notice_options, parse_kv
from corral.edges.cli.generated import commands
from corral.edges.cli.kit import Ctx, fail, table
from corral.core.errors import CorralError, InvalidRequest
from corral.core.lane_names import CHOICES
from corral.edges import acts, reads

EPILOG = """\b
Environment:
  CORRAL_URL     gateway URL (default http://127.0.0.1:8765)
  CORRAL_TOKEN   your token (default: the admin token of the gateway at CORRAL_URL,
                 when it runs on this machine and you may read it; else a person
                 is signed in by munge: see 'corral login')
  CORRAL_HOME    gateway state directory (default ./.corral)
  CORRAL_SESSION session id recorded with every job you submit
  CORRAL_CA_FILE CA certificate(s), PEM, to verify an https gateway with
                 (default: the system's store)
"""


EXIT_TIMEOUT = 3
"""``corral wait`` returned before the job ended (or reached --until)."""


INHERITED_ENV = ("PATH", "VIRTUAL_ENV")
"""What of the submitter's environment a job gets (see ``corral submit --help``)."""


LAZY = {
    "analyze": "corral.edges.cli.analytics_commands:analyze", "synth": "corral.edges.cli.analytics_commands:synth",
    "remember": "corral.edges.cli.memory_commands:remember", "recall": "corral.edges.cli.memory_commands:recall",
    "advice": "corral.edges.cli.memory_commands:advice", "risk": "corral.edges.cli.safety_commands:risk",
    "audit": "corral.edges.cli.audit_commands:audit", "token": "corral.edges.cli.token_commands:token",
    "policy": "corral.edges.cli.policy_commands:policy", "sandbox": "corral.edges.cli.sandbox_commands:sandbox",
    "control": "corral.edges.cli.job_commands:control", "usage": "corral.edges.cli.job_commands:usage",
    "plan": "corral.edges.cli.job_commands:plan",
    "simulate": "corral.edges.cli.simulate_commands:simulate", "agent": "corral.edges.cli.agent_run:agent",
    "slurm": "corral.edges.cli.slurm_plugin:slurm", "env": "corral.edges.cli.storage_commands:env",
    "workspace": "corral.edges.cli.storage_commands:workspace",
    "principal": "corral.edges.cli.principal_commands:principal", "config": "corral.edges.cli.config_commands:config",
    "doctor": "corral.edges.cli.doctor_commands:doctor",
    "login": "corral.edges.cli.signin_commands:login", "dashboard": "corral.edges.cli.signin_commands:dashboard",
    "backup": "corral.edges.cli.ops_commands:backup", "restore": "corral.edges.cli.ops_commands:restore",
    "migrate": "corral.edges.cli.ops_commands:migrate",
    "notify": "corral.edges.cli.notify_commands:notify", "approvals": "corral.edges.cli.approval_commands:approvals",
    "sponsor": "corral.edges.cli.sponsor_commands:sponsor", "saved": "corral.edges.cli.board_commands:saved",
}
"""Commands imported when called, not at start (they pull in polars, Cedar, tree-sitter)."""


class CorralGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY and name not in self.commands:
            import importlib

            module, attr = LAZY[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in sections (corral/edges/cli/help.py), summaries of lazy ones not imported."""
        from corral.edges.cli.help import SECTIONS, SUMMARIES

        width = (formatter.width or 80) - 6 - max(len(n) for n in self.list_commands(ctx))
        for title, names in SECTIONS:
            rows = []
            for name in names:
                loaded = self.commands.get(name)
                text = loaded.get_short_help_str(width) if loaded is not None else SUMMARIES[name]
                rows.append((name, text if len(text) <= width else text[:width - 3].rsplit(" ", 1)[0] + "..."))
            with formatter.section(title):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CorralError as e:
            from corral.edges.client import GatewayUnreachable

            fail(e.message, 1 if isinstance(e, GatewayUnreachable) or e.status >= 500 else 2, e.hint, e.code)
        except click.UsageError as e:
            if isinstance(ctx.obj, Ctx) and ctx.obj.as_json:
                where = e.ctx.command_path if e.ctx else "corral"
                fail(e.format_message(), 2, f"see '{where} --help'")
            raise


@click.group(cls=CorralGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", help="Gateway URL (env CORRAL_URL).")
@click.option("--token", help="Bearer token (env CORRAL_TOKEN).")
@click.option("--session", help="Session id to record with your jobs (env CORRAL_SESSION).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output (for agents and scripts).")
@click.version_option(package_name="corral")
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None, session: str | None, as_json: bool) -> None:
    """corral: the facility gateway through which AI coding agents (and people) run HPC jobs.

    \b
    Start here:
      corral serve                                  start the gateway (or: make run)
      corral principal add alice --kind human       register a person
      corral principal add bot --kind agent --sponsor alice
      corral token mint --for bot --expires 8h      a token for the agent (shown once)
      corral submit -- python train.py              run a job
      corral wait 1 && corral logs 1                wait for it, read its output
    """
    ctx.obj = Ctx(url, token, session, as_json)


@cli.command()
@click.option("--host", help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port (default 8765).")
@click.option("--home", type=click.Path(path_type=Path), help="State directory (default ./.corral; env CORRAL_HOME).")
@click.option("--backend", type=click.Choice(["local", "slurm"]), help="Where jobs run: local processes (default) or Slurm.")
@click.option("--tick", "tick_s", type=float, help="Seconds between backend status polls (default 0.5).")
@click.option("--cpus", "local_cpus", type=int, help="CPU slots of the local backend (default: this machine's cores).")
@click.option("--store", "store_url", help="The store: postgresql://USER@HOST:PORT/DB (several replicas share it) "
              "or a SQLite file (default HOME/corral.db); as [store] url.")
@click.option("--tls-cert", type=click.Path(path_type=Path), help="Serve HTTPS with this certificate (PEM, with its chain); as tls_cert.")
@click.option("--tls-key", type=click.Path(path_type=Path), help="The certificate's private key (PEM); as tls_key.")
@click.option("--insecure", is_flag=True, default=None, help="Allow plain HTTP on a non-loopback --host (tokens in clear).")
def serve(**opts: Any) -> None:
    """Start the gateway: HTTP API, reconciler and backend, in the foreground.

    Settings come from flags, CORRAL_* environment variables, then CORRAL_HOME/corral.toml.
    On first start it creates an admin principal and writes its token to CORRAL_HOME/admin.token (mode 0600).

    \b
    Examples:
      corral serve                                  # local backend, state in ./.corral (as make run)
      corral serve --backend slurm                  # jobs are Slurm jobs (SLURM_CONF)
      corral serve --home /var/lib/corral --host 0.0.0.0 --tls-cert cert.pem --tls-key key.pem
      corral serve --store postgresql://corral@db:5432/corral --port 8766   # one of N replicas
    """
    from corral.core.config import load_settings
    from corral.edges.http.serve import serve as run_server

    url = opts.pop("store_url", None)
    if url:
        opts["store"] = {"url": url}
    try:
        settings = load_settings(**opts)
    except InvalidRequest as e:
        fail(e.message)
    run_server(settings)


@cli.command()
@click.argument("command", nargs=-1, required=False)
@click.option("--script", "script_file", type=click.File("r"), help="Submit a job script file ('-' for stdin) instead of a command.")
@click.option("--cpus", type=int, help="CPU cores (default 1).")
@click.option("--memory", "--mem", help="Memory, e.g. 512M or 4G (default 1G).")
@click.option("--gpus", type=int, help="GPUs (default 0).")
@click.option("--walltime", "--time", "-t", help="Time limit as Slurm reads it: a bare number is minutes (-t 5), "
              "MM:SS, HH:MM:SS, D-HH[:MM[:SS]], UNLIMITED (the partition's maximum); or with a unit: 90s, 30m, 2h "
              "(default 1h).")
@click.option("--partition", "-p", help="Partition (default: the facility's default).")
@click.option("--name", "-J", help="A short job name.")
@click.option("--workdir", "-D", type=click.Path(), help="Working directory (absolute; default: the current directory).")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help="Environment variable; repeatable.")
@click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE", help="Label; repeatable.")
@click.option("--idempotency-key", help="Retry-safe key: the same key always yields the same single job.")
@click.option("--wait", "wait_s", type=float, help="Then wait up to this many seconds for the job to end.")
@click.option("--lane", type=click.Choice(CHOICES),
              help="fast: a warm pool starts it at once (short, small tasks); batch: the scheduler's queue; "
                   "auto: fast when it fits (give --time). Default: the facility's.")
@click.option("--cluster", help="At a facility of several clusters: a cluster's name, or 'auto' (the default): "
              "placed by the facility's objective ('corral plan' ranks them).")
@click.option("--movable", is_flag=True, default=None,
              help="At a facility of several clusters: corral may move it, while it waits, to a cluster where "
                   "it starts sooner (never run twice; you are told).")
@click.option("--idempotent", is_flag=True, default=None,
              help="The task may safely run twice: rerun it if its fast-lane allocation dies.")
@click.option("--force", is_flag=True, default=None,
              help="Run it even if this exact job just failed in a way that repeats (refused otherwise).")
@click.option("--clean-env", is_flag=True,
              help="Do not send your PATH and VIRTUAL_ENV: the job gets the facility's basic environment only.")
@click.option("--image", help="Run from this environment image (name or key, from 'corral env build'): mounted "
              "read-only, its python first on PATH.")
@click.option("--workspace", help="Run in this trial workspace (from 'corral workspace fork DIR') instead of a workdir.")
@click.option("--after-ok", "after_ok", metavar="ID[,ID..]", help="Start once these jobs have all COMPLETED "
              "(cancelled if one ends otherwise).")
@click.option("--after-any", "after_any", metavar="ID[,ID..]", help="Start once these jobs have ended, however.")
@notice_options
@click.option("--array", "-a", metavar="SPEC", help="Run it once per index, Slurm's syntax ('0-9', '1,3,5', '0-99:2'); "
              "the index is in $CORRAL_ARRAY_TASK_ID (and $SLURM_ARRAY_TASK_ID).")
@click.pass_obj
def submit(o: Ctx, command: tuple[str, ...], script_file: Any, env_pairs: tuple[str, ...],
           label_pairs: tuple[str, ...], idempotency_key: str | None, wait_s: float | None, clean_env: bool,
           after_ok: str | None, after_any: str | None, array: str | None, **res: Any) -> None:
    """Submit a job: a command (after --) or a script (--script FILE).

    \b
    Examples:
      corral submit -- echo hello
      corral submit --cpus 4 --mem 8G -t 2h --name train -- python train.py --epochs 3
      corral submit --script job.sh --idempotency-key run-42
      corral submit --lane fast -t 1m -- pytest -x tests/test_io.py     # a quick trial, no queue
      corral submit --array 0-9 -- python sweep.py --seed '$CORRAL_ARRAY_TASK_ID'
      corral submit --after-ok 41,42 -- python reduce.py                # once 41 and 42 completed
      corral submit --image np --workspace ws-0123abcd4567 -- pytest    # an image, in a trial workspace
      corral submit -t 2h --signal B:USR1@120 --tier guaranteed -- ./train.sh  # USR1 2 min before the end

    \b
    Environment: the job gets the facility's basic environment (HOME, USER, LANG ...),
    your PATH and VIRTUAL_ENV (so an activated venv is the job's too; --clean-env: not
    these), then each --env KEY=VALUE, which wins over both.
    """
    if bool(command) == bool(script_file):
        fail("give a command after '--' or a script with --script FILE (not both)")
    spec: dict[str, Any] = {k: v for k, v in res.items() if v is not None}
    if "walltime" in spec:
        spec["walltime"] = _cli_time(o, spec["walltime"], spec.get("partition"))
    if command:
        import shlex

        spec["command"] = command[0] if len(command) == 1 else shlex.join(command)
    else:
        spec["script"] = script_file.read()
    defaulted = not spec.get("workspace") and "workdir" not in spec
    if defaulted:
        spec["workdir"] = os.getcwd()
    env = {} if clean_env else {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(parse_kv(env_pairs, "--env"))
    if env:
        spec["env"] = env
    if label_pairs:
        spec["labels"] = parse_kv(label_pairs, "--label")
    for key, given in (("after_ok", after_ok), ("after_any", after_any)):
        if given:
            try:
                spec[key] = [int(x) for x in given.split(",") if x.strip()]
            except ValueError:
                fail(f"--{key.replace('_', '-')} takes job ids separated by commas, e.g. 41,42")
    if array is not None:
        if wait_s is not None:
            fail("--wait waits for one job; with --array, wait for the batch with 'corral wait' per job")
        batch = o.client.run(acts.submit_batch, [spec], idempotency_key, array=array)
        ids = [j["id"] for j in batch["jobs"]]
        o.out(batch, lambda r: f"submitted {len(ids)} jobs ({ids[0]}..{ids[-1]}) of array {array}")
        return
    try:
        job = o.client.run(acts.submit, spec, idempotency_key)
    except InvalidRequest as e:
        from corral.core.workdirs import NOT_WRITABLE

        if not defaulted or NOT_WRITABLE not in e.message:
            raise
        # As Slurm does when a job cannot enter its submit directory: it runs elsewhere
        # (its own directory) and you are told, rather than refused.
        print(f"corral: {e.message}; the job runs in its own directory instead (--workdir DIR to choose one)",
              file=sys.stderr)
        del spec["workdir"]
        job = o.client.run(acts.submit, spec, idempotency_key)
    if wait_s is not None:
        job = o.client.run(reads.wait, job["id"], wait_s)
    def human(j: dict[str, Any]) -> str:
        line = job_line(j) if wait_s is not None else f"submitted job {j['id']} ({j['state']})" + (
            "" if j.get("created", True) else " [existing job for this idempotency key]")
        return "\n".join([line, *(f"advice: {a}" for a in j.get("advice") or [])])

    o.out(job, human)
    if wait_s is not None and job.get("reached") is False:
        sys.exit(EXIT_TIMEOUT)


def _cli_time(o: Ctx, text: str, partition: str | None) -> Any:
    """--time as Slurm means it (corral.core.slurm_formats: a bare number is minutes, D-HH is
    days and hours); a unit ('90s', '2h') is passed on as written. UNLIMITED and 0 ask
    for the partition's maximum, as sbatch's do."""
    from corral.core import slurm_formats

    try:
        secs = slurm_formats.time_seconds(text, whole_minutes=False)
    except ValueError:
        return text  # '30m', '2h': corral's own units, checked by the gateway
    if secs != slurm_formats.NO_LIMIT:
        return secs
    parts = o.client.run(reads.facility).get("partitions") or []
    part = next((p for p in parts if p["name"] == partition or (partition is None and p.get("default"))), None)
    if part is None:
        fail(f"--time {text}: no partition {partition!r} to take the maximum of", hint="corral facility lists them")
    return int(part["max_walltime_s"])


@cli.command()
@click.argument("job_ids", nargs=-1, type=int, required=True)
@click.pass_obj
def status(o: Ctx, job_ids: tuple[int, ...]) -> None:
    """Show the state of one or more jobs (from the gateway's state, not the scheduler).

    \b
    Examples:
      corral status 7
      corral status 7 8 9
      corral --json status 7          # for agents and scripts: state, exit_code, reason ...
    """
    jobs = [o.client.run(reads.job, j) for j in job_ids]
    o.out(jobs if len(jobs) > 1 else jobs[0], lambda d: job_rows(d if isinstance(d, list) else [d]))


@cli.command()
@click.argument("job_id", type=int)
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait at most.")
@click.option("--until", help="Return once the job reaches this state (e.g. RUNNING), or at its next state change ('change'), instead of its end.")
@click.pass_obj
def wait(o: Ctx, job_id: int, timeout: float, until: str | None) -> None:
    """Wait for a job to end (or reach --until). A long-poll: costs the scheduler nothing extra.

    Exit status 0 when the job ended (or reached --until), 3 when --timeout passed first,
    so `corral wait 7 && corral logs 7` reads only finished output.

    \b
    Examples:
      corral wait 7 && corral logs 7
      corral wait 7 --until RUNNING         # started yet?
      corral wait 7 --timeout 600           # a long job: wait up to 10 minutes
    """
    job = o.client.run(reads.wait, job_id, timeout, until)
    o.out(job, lambda j: job_line(j) + ("" if j["reached"] else f" [still {j['state']} after {timeout:g}s]"))
    if not job["reached"]:
        sys.exit(EXIT_TIMEOUT)


@cli.command()
@click.argument("job_id", type=int)
@click.option("--stderr", "use_stderr", is_flag=True, help="Read stderr instead of stdout.")
@click.option("--tail", type=int, help="Only the last N lines.")
@click.option("--offset", type=int, default=0, show_default=True, help="Byte offset to read from.")
@click.option("--limit", type=int, default=65536, show_default=True, help="Bytes to read at most.")
@click.pass_obj
def logs(o: Ctx, job_id: int, use_stderr: bool, tail: int | None, offset: int, limit: int) -> None:
    """Print a job's output, bounded: a page from --offset, or the last --tail lines.

    \b
    Examples:
      corral logs 7
      corral logs 7 --tail 20
      corral logs 7 --stderr
      corral logs 7 --offset 65536          # the next page, as the first one says
    """
    page = o.client.run(reads.output, job_id, stream="stderr" if use_stderr else "stdout", offset=offset, limit=limit, tail=tail)
    if not use_stderr and page["size"] == 0:
        other = o.client.run(reads.output, job_id, stream="stderr", offset=0, limit=1)
        if other["size"]:
            page["stderr_size"] = other["size"]

    def human(p: dict[str, Any]) -> str:
        more = "" if p["eof"] else f"\n[{p['size'] - p['next_offset']} more bytes: --offset {p['next_offset']}]"
        return p["data"].rstrip("\n") + more

    o.out(page, human)
    if page.get("stderr_size") and not o.as_json:
        click.echo(f"(stdout is empty; stderr has {page['stderr_size']} bytes: corral logs {job_id} --stderr)",
                   err=True)


@cli.command()
@click.argument("job_ids", nargs=-1, type=int, required=True)
@click.pass_obj
def cancel(o: Ctx, job_ids: tuple[int, ...]) -> None:
    """Cancel one or more jobs.

    \b
    Example:
      corral cancel 7 8
    """
    res = o.client.run(acts.cancel_many, list(job_ids))
    o.out(res, lambda r: "\n".join(f"job {j['id']}: cancel requested ({j['state']})" for j in r["jobs"]))


@cli.command()
@click.option("--state", "states", multiple=True, help="Only jobs in this state; repeatable.")
@click.option("--session", help="Only jobs of this session.")
@click.option("--principal", help="Only jobs of this principal (yours or your agents').")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs per page (1-1000).")
@click.option("--offset", type=int, default=0, show_default=True, help="Skip this many jobs (for the next page).")
@click.pass_obj
def jobs(o: Ctx, states: tuple[str, ...], session: str | None, principal: str | None, limit: int, offset: int) -> None:
    """List jobs you may see (yours, your agents'; all for admins), newest first.

    \b
    Examples:
      corral jobs
      corral jobs --state RUNNING --state PENDING
      corral jobs --session tour-1 --principal claude-1
      corral jobs --limit 50 --offset 50     # the next page
    """
    res = o.client.run(reads.jobs, state=list(states) or None, session=session, principal=principal, limit=limit, offset=offset)
    o.out(res, lambda r: job_rows(r["jobs"]))


@cli.command()
@click.pass_obj
def whoami(o: Ctx) -> None:
    """Show the principal your token acts as.

    \b
    Example:
      corral whoami            # e.g. claude-1 (agent), sponsored by alice
    """
    o.out(o.client.run(reads.whoami), lambda p: f"{p['name']} ({p['kind']}{', admin' if p['admin'] else ''})"
          + (f", sponsored by {p['sponsor']}" if p.get("sponsor") else "") + _runs_as(p.get("runs_as")))


def _runs_as(r: dict[str, Any] | None) -> str:
    """Whose identity the jobs take, where the gateway changes identity (decision 0056)."""
    if not r:
        return ""
    return f"; its jobs run as uid {r['uid']}, its own" if r["dynamic"] else \
        f"; its jobs run as Unix user {r['user']} (uid {r['uid']})"


@cli.command()
@click.pass_obj
def facility(o: Ctx) -> None:
    """Show partitions, limits, queue pressure and your own usage.

    \b
    Example:
      corral facility
    """
    o.out(o.client.run(reads.facility), lambda f: table(f["partitions"], ["name", "default", "max_cpus", "max_memory_mb", "max_gpus", "max_walltime_s"])
          + f"\nqueue: {f['queue']['pending']} pending, {f['queue']['running']} running; you: {f['you']['active_jobs']} active jobs")


@cli.command("mcp")
@click.pass_obj
def mcp_stdio(o: Ctx) -> None:
    """Serve corral's MCP tools over stdio for a coding agent: a relay to the running
    gateway's MCP endpoint. Attach it with: claude mcp add corral -- corral mcp

    \b
    Needs CORRAL_TOKEN (the agent's token) and, unless the gateway is on
    http://127.0.0.1:8765, CORRAL_URL. The session id is CORRAL_SESSION, or the MCP
    session's own. A missing or bad token, or a gateway that does not answer, does not
    stop it: each tool call then answers with what is wrong and what to do.

    \b
    Example:
      claude mcp add corral -e CORRAL_TOKEN=$CORRAL_TOKEN -- corral mcp
    """
    from corral.edges.mcp.relay import serve

    # No fallback to the admin token file: an agent started in the gateway's directory
    # must not silently act as the admin.
    sys.exit(serve(o.url, o.token or os.environ.get("CORRAL_TOKEN"), o.session))


for _command in commands():  # the verbs whose command is their declaration (corral/edges/cli/generated.py)
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="corral")


if __name__ == "__main__":
    main()
