"""A scripted stand-in for a model service, so that a real agent client (Claude Code,
Codex) can be run against corral and what it hands the model can be read.

It speaks the Anthropic Messages API (``POST /v1/messages``, streamed as server-sent
events or not) and the OpenAI Responses API (``POST /v1/responses``, streamed). Each
request that offers tools is one turn of the agent's loop: turn N answers with the
script's Nth tool call (a tool named by its bare name, matched to the client's own
spelling, e.g. ``mcp__corral__submit_job``), and past the script's end with a final
text. Every request is recorded whole; ``tool_results()`` gives what the client sent
back for each call, as the model would read it.

A step of the script is ``(tool, arguments)``, where ``arguments`` may be a function
of the tool results so far (to use a job id an earlier call returned).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Step = tuple[str, dict[str, Any] | Callable[[list[str]], dict[str, Any]]]


def job_id_in(results: list[str]) -> int:
    """The job id the last submission answered."""
    for text in reversed(results):
        m = re.search(r'"job_id"\s*:\s*(\d+)', text) or re.search(r"\bjob (\d+)\b", text)
        if m:
            return int(m[1])
    raise AssertionError(f"no job id in the tool results: {results}")


class StandIn:
    def __init__(self, script: list[Step], final: str = "All done.") -> None:
        self.script = script
        self.final = final
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what the client sent -------------------------------------------------------
    def agent_turns(self) -> list[dict[str, Any]]:
        """The requests of the agent's loop (those offering tools)."""
        return [r for r in self.requests if r["body"].get("tools")]

    def tool_names(self) -> list[str]:
        turns = self.agent_turns()
        return _names(turns[0]["body"]["tools"]) if turns else []

    def tool_results(self) -> list[str]:
        """What the client handed the model for each tool call, in order, as text."""
        turns = self.agent_turns()
        return _results(turns[-1]["body"]) if turns else []

    def tool_definitions_chars(self, prefix: str = "corral") -> int:
        turns = self.agent_turns()
        if not turns:
            return 0
        return sum(len(json.dumps(t)) for t in turns[0]["body"]["tools"] if prefix in _tool_name(t))

    # -- the loop -------------------------------------------------------------------
    def next_call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        results = _results(body)
        step = len(results)
        if step >= len(self.script):
            return None
        name, args = self.script[step]
        names = _names(body.get("tools") or [])
        full = next((n for n in names if n == name or n.endswith("__" + name) or n.endswith("." + name)), name)
        try:
            return full, (args(results) if callable(args) else args)
        except AssertionError:
            return None  # the script cannot go on (what it needed is missing): end the turn

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._json(200, {"data": [], "models": []})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                path = self.path.split("?")[0]
                with standin.lock:
                    standin.requests.append({"path": path, "body": body, "headers": dict(self.headers)})
                if path.endswith("/messages/count_tokens"):
                    self._json(200, {"input_tokens": 100})
                elif path.endswith("/messages"):
                    self._anthropic(body)
                elif path.endswith("/responses"):
                    self._openai(body)
                else:
                    self._json(404, {"error": {"type": "not_found", "message": path}})

            def _json(self, status: int, data: Any) -> None:
                out = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
                out = b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _anthropic(self, body: dict[str, Any]) -> None:
                call = standin.next_call(body) if body.get("tools") else None
                mid = f"msg_{uuid.uuid4().hex[:20]}"
                if call:
                    block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}",
                                             "name": call[0], "input": call[1]}
                    stop = "tool_use"
                else:
                    block = {"type": "text", "text": standin.final if body.get("tools") else "ok"}
                    stop = "end_turn"
                usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0}
                message = {"id": mid, "type": "message", "role": "assistant", "model": body.get("model", "stand-in"),
                           "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
                if not body.get("stream"):
                    self._json(200, message)
                    return
                start = {**block, "input": {}} if call else {**block, "text": ""}
                delta = ({"type": "input_json_delta", "partial_json": json.dumps(call[1])} if call else
                         {"type": "text_delta", "text": block["text"]})
                self._sse([
                    ("message_start", {"type": "message_start", "message": {**message, "content": [],
                                                                            "stop_reason": None}}),
                    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
                    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                       "usage": {"output_tokens": 5}}),
                    ("message_stop", {"type": "message_stop"}),
                ])

            def _openai(self, body: dict[str, Any]) -> None:
                call = standin.next_call(body) if body.get("tools") else None
                rid = f"resp_{uuid.uuid4().hex[:20]}"
                if call:
                    item: dict[str, Any] = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:20]}",
                                            "call_id": f"call_{uuid.uuid4().hex[:20]}", "name": call[0],
                                            "arguments": json.dumps(call[1]), "status": "completed"}
                    if "." in call[0]:  # a namespaced tool: namespace.name
                        ns, _, name = call[0].rpartition(".")
                        item.update(name=name, namespace=ns)
                else:
                    item = {"type": "message", "id": f"msg_{uuid.uuid4().hex[:20]}", "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": standin.final, "annotations": []}]}
                usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
                response = {"id": rid, "object": "response", "status": "in_progress", "model": body.get("model"),
                            "output": []}
                self._sse([
                    ("response.created", {"type": "response.created", "response": response}),
                    ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                                    "item": item}),
                    ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                                   "item": item}),
                    ("response.completed", {"type": "response.completed",
                                            "response": {**response, "status": "completed", "output": [item],
                                                         "usage": usage}}),
                ])

        return Handler


def _tool_name(tool: dict[str, Any]) -> str:
    return str(tool.get("name") or (tool.get("function") or {}).get("name"))


def _names(tools: list[dict[str, Any]]) -> list[str]:
    """Every tool's name; a namespace's tools (Codex: MCP servers) as namespace.name."""
    out = []
    for t in tools:
        if t.get("type") == "namespace":
            out += [f"{t['name']}.{_tool_name(x)}" for x in t.get("tools") or []]
        else:
            out.append(_tool_name(t))
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c.get("content", "")) if isinstance(c, dict) else c) for c in content)
    return json.dumps(content)


def _results(body: dict[str, Any]) -> list[str]:
    """The tool results in a request, in order: Anthropic's tool_result blocks, or the
    Responses API's function_call_output items."""
    out: list[str] = []
    for m in body.get("messages") or []:
        if isinstance(m.get("content"), list):
            out += [_text(b.get("content")) for b in m["content"] if b.get("type") == "tool_result"]
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output",
                                                          "mcp_tool_call_output"):
            out.append(_text(item.get("output")))
    return out
