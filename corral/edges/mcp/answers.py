"""How corral's MCP tools answer: a result (a one-line summary and structured content),
a tool's annotations from the verb table, errors in corral's words (``guarded``), a job
as a model needs it, the facility card, and a wait cut in slices with progress between
(corral/edges/mcp/tools.py registers the tools that use them)."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from corral.edges import reads
from corral.core.errors import ApprovalPending, CorralError, store_unavailable
from corral.core.jobs import format_duration
from corral.edges.mcp.advice import said
from corral.edges.mcp.asking import input_required
from corral.edges.verbs import BY_NAME
from corral.safety import guard

log = logging.getLogger("corral.edges.mcp.tools")

LIVE = ("PENDING", "RUNNING", "UNKNOWN")


def untrusted(text: str | None, source: str) -> str | None:
    return None if text is None else guard.delimit(text, source)


def answer(summary: str, data: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=summary)], structured_content=data)


def tool_annotations(title: str, read_only: bool, destructive: bool = False, idempotent: bool = True) -> ToolAnnotations:
    # Closed world: every tool acts on this facility only, never on the open internet.
    return ToolAnnotations(title=title, read_only_hint=read_only, destructive_hint=destructive,
                           idempotent_hint=idempotent, open_world_hint=False)


def declared(verb: str) -> dict[str, Any]:
    """The MCP tool's name and annotations, as the verb table declares them."""
    tool = BY_NAME[verb].tool
    assert tool is not None, verb
    return {"name": tool.name,
            "annotations": tool_annotations(tool.title, tool.read_only, tool.destructive, tool.idempotent)}


T = TypeVar("T")


def guarded(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """CorralError -> a tool error with its message and hint; anything else -> a tool
    error that hides internals but says what to do."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except ToolError:
            raise
        except ApprovalPending as e:  # a 2026-07-28 client with URL elicitation: input_required
            asked = input_required(kwargs.get("ctx", args[0] if args else None), e)
            if asked is not None:
                return asked  # type: ignore[return-value]  # the SDK passes it through as the answer
            raise ToolError(said(e.message, e.hint)) from None
        except CorralError as e:
            raise ToolError(said(e.message, e.hint)) from None
        except Exception as e:
            away = store_unavailable(e)
            if away is not None:  # the store restarting or failing over: call again, as HTTP's 503 says
                log.warning("MCP tool %s: %s", fn.__name__, away.message)
                raise ToolError(said(away.message, away.hint)) from None
            log.exception("MCP tool %s failed", fn.__name__)
            raise ToolError("internal error in corral (it is logged); retry once, and if it fails again, tell your "
                            "user (the facility's admin can read what happened in corral's log)") from None

    return wrapper


TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY")


def told(ops_for: Callable[[Context], Any]) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """``guarded``, and every answer (a result or an error) carries what the caller was
    told and has not acknowledged yet ("since your last call: job 41 COMPLETED"): a
    client that dropped an answer (moved to the background and orphaned, timed out)
    loses nothing, the next call of any tool says it. A job read by id in that call (its
    status, its wait, its output, once it has ended) is acknowledged by the reading."""

    def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        inner = guarded(fn)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs.get("ctx", args[0] if args else None)
            try:
                result = await inner(*args, **kwargs)
            except ToolError as e:
                raise ToolError(str(e) + await _since(ops_for, ctx, None, None)) from None
            data = result.structured_content if isinstance(result, CallToolResult) else None
            read = kwargs.get("job_id") if isinstance(data, dict) and (
                data.get("state") in TERMINAL or data.get("job_state") in TERMINAL) else None
            extra = await _since(ops_for, ctx, read, fn.__name__)
            if extra and isinstance(result, CallToolResult):
                # Both: some clients hand the model the text, others (Claude Code, Codex) the
                # structured content alone (its schemas allow more fields).
                result.content = [*result.content, TextContent(type="text", text=extra.strip())]
                if isinstance(data, dict):
                    result.structured_content = {**data, "since_your_last_call": extra.strip()}
            return result

        return wrapper

    return decorate


async def _since(ops_for: Callable[[Context], Any], ctx: Any, read: int | None, tool: str | None) -> str:
    if ctx is None or tool == "ack_events":
        return ""
    try:
        ops = ops_for(ctx)
        got = await ops.run(reads.ledger, read_job=read)
    except Exception:  # noqa: BLE001 - the answer itself must reach the agent whatever the ledger does
        log.exception("MCP: the ledger could not be read")
        return ""
    items = got.get("unacked") or []
    if not items:
        return ""
    said = "; ".join(i["text"] for i in items[:10])
    more = got.get("total", len(items)) - min(len(items), 10)
    return (f"\n\nSince your last call: {said}" + (f" (and {more} more)" if more > 0 else "")
            + f". Read a job by id, or call ack_events up_to={items[-1]['id'] if more <= 0 else items[9]['id']}, "
            "to stop these reminders.")


def next_for(job: dict[str, Any]) -> str:
    state = job["state"]
    if state in LIVE:
        return f"call wait_for_job with job_id={job['id']} (it returns when the job ends)"
    if state == "COMPLETED":
        return f"read its output with job_output job_id={job['id']}"
    return f"read why with job_output job_id={job['id']} stream='stderr'; fix and resubmit"


def compact(job: dict[str, Any]) -> dict[str, Any]:
    """What a model needs of a job: no session (it knows its own), no epoch times (the
    run time instead, once it has ended)."""
    out = {k: job[k] for k in ("id", "name", "state", "exit_code") if job.get(k) is not None}
    if job.get("reason"):  # may quote what the job wrote
        out["reason"] = guard.delimit(job["reason"], f"job {job['id']} reason")
    if job.get("start_time") and job.get("end_time"):
        out["ran_s"] = round(job["end_time"] - job["start_time"], 2)
    if job.get("requeues"):  # preempted and run again from the start: still this one job
        out["requeues"] = job["requeues"]
        if job.get("lost_s") is not None:
            out["lost_s"] = job["lost_s"]
    return out


def said_job(job: dict[str, Any]) -> str:
    """A job in a line: 'job 12 COMPLETED (exit 0)'."""
    code = f" (exit {job['exit_code']})" if job.get("exit_code") is not None else ""
    why = f": {job['reason']}" if job.get("reason") and job["state"] not in LIVE + ("COMPLETED",) else ""
    return f"job {job['id']} {job['state']}{code}{why}"


def facility_card(info: dict[str, Any]) -> str:
    """The compact markdown an agent needs before its first job here."""
    you = info.get("you")
    who = ""
    if you:
        who = f" You are `{you['principal']}` ({you['kind']})" + (f", sponsored by `{you['sponsor']}`" if you.get("sponsor") else "") + "."
    lines = ["# Facility card (corral)", "", f"Backend: {info['backend']}.{who}", "",
             "| partition | default | max cpus | max memory | max gpus | max walltime |", "|---|---|---|---|---|---|"]
    for p in info["partitions"]:
        lines.append(f"| {p['name']} | {'yes' if p['default'] else ''} | {p['max_cpus']} | {p['max_memory_mb']}M | "
                     f"{p['max_gpus']} | {format_duration(p['max_walltime_s'])} |")
    q = info["queue"]
    mine = f" Your active jobs: {you['active_jobs']}." if you else ""
    lines += ["", f"Queue now: {q['pending']} pending, {q['running']} running.{mine}",
              "", "Rules of thumb:",
              "- Submit with submit_job, then wait_for_job (a long-poll). Do not poll job_status in a loop.",
              "- Ask for what you need: cpus, memory (e.g. '4G'), walltime (e.g. '30m'). Requests over a partition's limits are refused at once.",
              "- Read output with job_output (tail_lines for the end of a log); it is bounded, page with offset.",
              "- Use idempotency_key when you might retry a submission.",
              "- Short, small trial runs: lane 'fast' starts them at once in a warm allocation.",
              "- recall before you start, remember what you learn; read the advice submit_job returns.",
              "- Do not create a venv per trial: build_environment once, then submit_job image=NAME (one read-only "
              "file, its python first on PATH).",
              "- A trial that edits the project: workspace action='fork' (copy-on-write), submit_job workspace=ID, "
              "then diff, and commit the one that worked."]
    st = info.get("storage") or {}
    if st.get("session_meta_budget"):
        lines += ["", f"Metadata budget: {st.get('session_meta_ops', 0)} of {st['session_meta_budget']} calls on the "
                      "shared filesystem used by this session; past it, jobs must use an image or a workspace."]
    facts = info.get("facts") or {}
    if facts.get("filesystems"):
        lines += ["", "Filesystems: " + ", ".join(
            f"{n} = {f.get('path', '?')}" + (f" (quota {f['quota']})" if f.get("quota") else "")
            for n, f in facts["filesystems"].items())]
    if facts.get("modules"):
        lines += ["", f"Modules ({len(facts['modules'])}): " + ", ".join(facts["modules"][:40])]
    if facts.get("version"):
        lines += ["", f"Facility facts version {facts['version']}"
                  + (f"; last change: {'; '.join(facts['changes'])}" if facts.get("changes") else "") + "."]
    if info.get("degraded"):
        lines += ["", f"WARNING: the scheduler is degraded: {info['degraded']}"]
    return "\n".join(lines)


async def waiting(ctx: Context, wait: Callable[[float], Awaitable[dict[str, Any]]], total: float, every: float,
                   done: Callable[[dict[str, Any]], bool], say: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """``wait(seconds)`` again and again, at most ``every`` seconds each, until ``done``
    or ``total`` seconds have passed, with a progress notification between any two: one
    long wait that no client's idle timeout ends."""
    start = time.monotonic()
    while True:
        remaining = total - (time.monotonic() - start)
        result = await wait(max(0.0, min(every, remaining)))
        if done(result) or remaining <= every:
            return result
        # A client that went away makes this fail: the wait ends with it, nothing left waiting.
        await ctx.report_progress(round(time.monotonic() - start, 1), total, say(result))
