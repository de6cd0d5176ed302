"""Issue 53 item 5: corral leans on no library's private parts, except in one adapter per
library (ADAPTERS), whose own test here fails the day the library changes what it uses.

A private part is a name with a leading underscore that corral does not define itself:
an attribute (``request._json``, ``self._tool_manager`` on a subclass of the SDK's
server), a ``getattr(x, "_name")``, or a module (``mcp_types._types``). Found from the
source's syntax, so a new one anywhere in corral/ fails ``test_no_private_library_part``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import corral

ROOT = Path(corral.__file__).resolve().parent

ADAPTERS = {"corral/edges/mcp/sdk_adapter.py", "corral/edges/http/bounds.py"}
"""The one place each library's private parts may be used: the MCP SDK's, uvicorn's (its
HTTP protocol, subclassed, and its server's captured signals)."""

PUBLIC = {"_exit", "_replace", "_asdict", "_fields", "_make"}
"""Underscored and public: ``os._exit`` (documented), a NamedTuple's methods (documented
with the underscore so that they cannot clash with a field)."""


def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT.parent)): ast.parse(p.read_text()) for p in sorted(ROOT.rglob("*.py"))}


def _own(trees: dict[str, ast.Module]) -> tuple[set[str], set[str]]:
    """The underscored names corral defines -> (those an object of corral's carries: its
    classes' methods and attributes, ``self._x = ...``; every other it binds: its
    modules' functions, arguments, locals)."""
    members: set[str] = set()
    bound: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bound.add(node.name)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        members.add(item.name)
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                            members.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(
                    node.value, ast.Name) and node.value.id in ("self", "cls"):
                members.add(node.attr)
    return {n for n in members if n.startswith("_")}, {n for n in bound if n.startswith("_")}


def _corral_modules(tree: ast.Module) -> set[str]:
    """The names a module binds to corral's own modules (``from corral.edges.shims import sbatch``)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("corral") for a in node.names} | {
        (a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
        for a in node.names if a.name.startswith("corral")}


def _private_uses(path: str, tree: ast.Module, own: tuple[set[str], set[str]]) -> list[str]:
    members, bound = own
    both = members | bound
    ours = _corral_modules(tree)

    def foreign(name: str, known: set[str]) -> bool:
        return name.startswith("_") and not name.startswith("__") and name not in known and name not in PUBLIC

    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            of_module = isinstance(node.value, ast.Name) and node.value.id in ours
            if foreign(node.attr, both if of_module else members):
                name = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "setattr", "hasattr") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and foreign(node.args[1].value, members):
            name = node.args[1].value
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("corral") and any(
                foreign(part, set()) for part in (node.module or "").split(".")):
            name = node.module
        elif isinstance(node, ast.Import) and any(foreign(part, set()) for a in node.names
                                                  for part in a.name.split(".")):
            name = ",".join(a.name for a in node.names)
        if name is not None:
            found.append(f"{path}:{getattr(node, 'lineno', 0)} {name}")
    return found


def test_no_private_library_part_outside_its_adapter() -> None:
    trees = _trees()
    own = _own(trees)
    found = [use for path, tree in trees.items() if path not in ADAPTERS for use in _private_uses(path, tree, own)]
    assert found == [], "use the library's public API, or put it in its adapter (ADAPTERS): " + "; ".join(found)


def test_the_mcp_sdk_still_has_them() -> None:
    """What corral/edges/mcp/sdk_adapter.py reaches for, as it uses it: a new SDK that
    renames or reshapes one fails here, not in a gateway evicting a session."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    from corral.edges.mcp import sdk_adapter

    server = MCPServer("probe")
    server.streamable_http_app()
    manager = server.session_manager
    discard = getattr(manager, sdk_adapter.DISCARD)
    assert inspect.iscoroutinefunction(discard)
    assert list(inspect.signature(discard).parameters) == ["session_id", "transport"]

    async def scenario() -> None:
        async with manager.run():
            assert sdk_adapter.sessions(manager) == {}
            assert sdk_adapter.end_session(manager, "none") is None
            transport = StreamableHTTPServerTransport(mcp_session_id="s1")
            sdk_adapter.sessions(manager)["s1"] = transport
            ending = sdk_adapter.end_session(manager, "s1")
            assert ending is not None
            await ending
            assert "s1" not in sdk_adapter.sessions(manager) and transport.is_terminated

    anyio.run(scenario)


def test_uvicorn_still_has_them() -> None:
    """What corral/edges/http/bounds.py calls of uvicorn's, with the signatures it calls them with."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    for name in ("_unset_keepalive_if_required", "_should_upgrade", "_unsupported_upgrade_warning"):
        assert list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters) == ["self"], name
    server = uvicorn.Server(uvicorn.Config(app=lambda *a: None))
    assert server._captured_signals == []  # appended to by its handler, re-raised after shutdown
