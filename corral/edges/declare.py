"""A verb declared once, typed (issue 53): ``@declare`` on the function that serves it in
the gateway. The function's own signature is the verb's: ``(service, caller, *args)``, its
arguments typed, so mypy checks every call an edge makes through it (``client.run(verb,
...)``, ``ops.run(verb, ...)``: ParamSpec carries the signature) and "go to definition"
lands on the one line that calls the service. The decorator also takes what each edge
needs to be generated from it:

    @declare ──▶ Declared.row (a ``Verb``) ──┬─▶ the HTTP route (corral/edges/http/routes.py)
                                           ├─▶ Client.run / Client.<name> (corral/edges/client.py)
                                           └─▶ ServiceOps.run, RemoteOps.run (corral/edges/mcp/ops.py)
             ──▶ Declared.tool  ──▶ the MCP tool, when no hand-written one speaks for it
                                   (corral/edges/mcp/generated.py)
             ──▶ Declared.cli   ──▶ the ``corral`` command, table or ``--json``
                                   (corral/edges/cli/generated.py)

Models are named (a name in corral/edges/inputs.py or schemas.py, or ``module:Name``
beside the behaviour), not imported: this module and the declarations load with the CLI,
which starts without pydantic (0.1 s of its 0.1 s start)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar, cast

if TYPE_CHECKING:
    from corral.core.principals import Caller
    from corral.gateway.service import Service

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M")

Serve = Callable[[Any, Any, dict[str, Any]], Any]
"""A row's serve: (service, caller, checked arguments) -> the answer's JSON data, or an
awaitable of it. The body's model (when the verb has one) is in the arguments as ``body``.
A declared verb's row adapts its typed function to this."""


class Tool(NamedTuple):
    """The MCP tool built on a verb: its name and its MCP annotations (closed world: every
    tool acts on this facility only)."""

    name: str
    title: str
    read_only: bool
    destructive: bool = False
    idempotent: bool = True


class Verb(NamedTuple):
    """One operation of the API as the edges' generators read it (a declared verb's
    ``row``, or a row of corral/edges/verbs.py not declared yet)."""

    name: str
    """Client.<name>, Ops.<name>."""
    method: str
    path: str
    serve: Serve
    args: tuple[str, ...] = ()
    """The Python arguments in order (positional calls map onto them)."""
    query: tuple[str, ...] = ()
    headers: dict[str, str] = {}
    """argument -> HTTP header."""
    body: str | None = None
    """The body's model (in schemas.py); its fields are the arguments not in path, query or headers."""
    whole: str | None = None
    """The argument that is the whole body (a job's spec), if not its fields."""
    params: str | None = None
    """The model (in inputs.py) that checks the path, query and header arguments."""
    out: str | None = None
    """The answer's model: a name in schemas.py, or ``module:Name``. It serializes the answer and documents it."""
    status: int = 200
    status_of: Callable[[Any], int] | None = None
    """The status from the answer, where it varies (a replay is 200, not 201)."""
    also: dict[int, str] = {}
    """Other statuses it answers with, documented: status -> description."""
    op: str | None = None
    """The route's name (the metrics' ``op`` label), if not ``name``."""
    tags: tuple[str, ...] = ()
    doc: str = ""
    public: bool = False
    """No token needed."""
    long: str | None = None
    """The argument that says how long the server may wait: the client's timeout grows by it."""
    keep_none: tuple[str, ...] = ()
    """Body fields sent even when None (None means something there: a token that never expires)."""
    wire: dict[str, str] = {}
    """Python argument -> its name on the wire ('for_' -> 'for')."""
    tool: Tool | None = None
    cli: str | None = None
    """The ``corral`` command that calls it, if one does (tests/test_verb_edges.py runs it)."""
    without: dict[str, str] = {}
    """edge ('mcp', 'cli') -> why the verb has none there (tests/test_verb_edges.py lists them)."""

    @property
    def route(self) -> str:
        return self.op or self.name

    @property
    def in_path(self) -> tuple[str, ...]:
        return tuple(m.split(":")[0] for m in re.findall(r"{([^}]+)}", self.path))

    def url(self, args: dict[str, Any]) -> str:
        """The path with its parameters filled in (a convertor such as ``:int`` dropped)."""
        return re.sub(r"{([^}:]+)(:[^}]+)?}", lambda m: str(args[m.group(1)]), self.path)


class Cli(NamedTuple):
    """The ``corral`` command of a declared verb. ``generated``: made from the declaration
    (arguments from the function's signature, a table or ``--json`` from the answer);
    else a hand-written command that says why, and only its name is declared."""

    name: str
    section: str = "Jobs"
    """Its section of ``corral --help`` (corral/edges/cli/help.py)."""
    example: str = ""
    rows: str | None = None
    """The answer's list shown as a table (its ``columns``); else the answer's fields, one a line."""
    columns: tuple[str, ...] = ()
    generated: bool = True


class Declared(Generic[P, R]):
    """A verb: its typed function, and the row and edges generated from it."""

    def __init__(self, fn: Callable[Concatenate[Service, Caller, P], R], row: Verb, words: str, cli: Cli | None,
                 said: Callable[[Any], str] | None, hand_tool: bool) -> None:
        self.fn, self.row, self.words, self.cli, self.said, self.hand_tool = fn, row, words, cli, said, hand_tool
        self.name = row.name
        self.__doc__ = fn.__doc__

    def __call__(self, service: Service, caller: Caller, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(service, caller, *args, **kwargs)


# Why a verb has no tool or command (``without``), where several verbs share the reason.
PERSON = "a person's or an admin's task, not an agent's"
SERVICE = "for services that verify corral's tokens (GET /v1/tokens/public-key)"
ASKED = "an agent is asked in the tool call that needs the approval (URL elicitation), never lists or answers them"
TOLD = "people are told on their notify channels (corral notify), not through a ledger"
ENV = "people's housekeeping: an agent builds (build_environment) and names an image"
WS = "the workspace tool, its action argument (corral/edges/mcp/storage_tools.py)"


DECLARED: list[Declared[Any, Any]] = []
"""Every declared verb, in the order declared (corral/edges/reads.py and others)."""


def declare(method: str, path: str, *, summary: str, out: str, words: str | None = None,
            params: str | None = None, tool: Tool | None = None, hand_tool: bool = False, cli: Cli | None = None,
            said: Callable[[Any], str] | None = None, without: dict[str, str] | None = None,
            **row: Any) -> Callable[[Callable[Concatenate[Service, Caller, P], R]], Declared[P, R]]:
    """Declare the decorated ``(service, caller, *args)`` function a verb. ``summary``: for
    people (the OpenAPI, ``--help``); ``words``: for models (the MCP tool's description;
    default the summary); ``hand_tool``: the tool is written by hand in corral/edges/mcp
    (its wording needs it) and only named here. The arguments after the caller are the
    verb's, in order: in the path where ``path`` names them; with a ``body`` model, in
    ``query`` or ``headers`` where ``row`` says so and else the body's fields (``whole``:
    the argument that is the whole body); without, in the query; checked by ``params``.
    ``row``: the rest of ``Verb``'s fields (tags, long, op, status...)."""

    def make(fn: Callable[Concatenate[Service, Caller, P], R]) -> Declared[P, R]:
        code = fn.__code__  # not inspect.signature: the shims and the CLI start without importing inspect
        args = code.co_varnames[2:code.co_argcount + code.co_kwonlyargcount]
        verb = Verb(fn.__name__, method, path, _serve(fn, args), args=args, params=params, out=out, doc=summary,
                    tool=tool, cli=cli.name if cli else None, without=without or {}, **row)
        if verb.body is None:
            verb = verb._replace(query=tuple(a for a in args if a not in verb.in_path))
        assert tool is None or hand_tool or words, f"{fn.__name__}: a generated tool needs its words for models"
        declared = Declared(fn, verb, words or summary, cli, said, hand_tool)
        DECLARED.append(declared)
        return declared

    return make


def _serve(fn: Callable[..., Any], args: tuple[str, ...]) -> Serve:
    """The row's serve: the route's (or ServiceOps') checked arguments to the function, by
    the names its signature gives: from the path, query and headers as checked, from the
    body's model its fields (or the model itself, for the argument that is the whole body)."""

    def serve(s: Any, c: Any, a: dict[str, Any]) -> Any:
        body = a.get("body")
        return _plain(fn(s, c, **{k: a[k] if k in a else body if k not in getattr(type(body), "model_fields", ())
                                  else getattr(body, k) for k in args}))  # by name: keyword-only ones too

    return serve


def sent(body: M | dict[str, Any]) -> M:
    """The whole body (``whole``: a job) as the verb's function is given it: an edge may
    send its fields, but the route and ServiceOps check them into the body's model first."""
    return cast(M, body)


def _plain(data: Any) -> Any:
    """A model's answer as the JSON data every edge sends; an awaitable's, once awaited."""
    if hasattr(data, "__await__"):
        return _await_plain(data)
    dump = getattr(data, "model_dump", None)
    return dump(mode="json") if dump is not None else data


async def _await_plain(data: Awaitable[Any]) -> Any:
    return _plain(await data)

