"""Shell text -> pipelines of simple commands (argv lists, quotes removed), through
tree-sitter-bash: a C parser, ~0.1 ms for a typical job script where bashlex (pure
Python) took ~6 ms. It never gives up on a text: what it cannot read becomes an ERROR
node, and the caller then also splits the text the simple way."""

from __future__ import annotations

import shlex

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

_PARSER = Parser(Language(tree_sitter_bash.language()))
SHELLS = {"bash", "sh", "zsh", "dash", "ksh"}
_SKIP = {"file_redirect", "heredoc_redirect", "herestring_redirect", "comment"}
_SUBST = {"command_substitution", "process_substitution"}


def parse(text: str) -> tuple[list[list[list[str]]], bool]:
    """-> (pipelines in order, whether all of it parsed)."""
    tree = _PARSER.parse(text.encode())
    out: list[list[list[str]]] = []
    _collect(tree.root_node, out)
    return out, not tree.root_node.has_error


def _text(n: Node) -> str:
    return n.text.decode("utf-8", "replace") if n.text is not None else ""


def unquote(raw: str) -> str:
    """A word's value after quote removal, as the shell reads its source text."""
    if "'" in raw or '"' in raw or "\\" in raw:
        try:
            parts = shlex.split(raw)
        except ValueError:
            return raw
        if len(parts) == 1:
            return parts[0]
    return raw


def _collect(node: Node, out: list[list[list[str]]]) -> None:
    t = node.type
    if t == "pipeline":
        cmds: list[list[str]] = []
        for c in node.named_children:
            if c.type in ("command", "redirected_statement", "declaration_command"):
                argv = _simple(c, out)
                if argv:
                    cmds.append(argv)
            else:
                _collect(c, out)
        if cmds:
            out.append(cmds)
        return
    if t in ("command", "redirected_statement", "declaration_command", "unset_command"):
        inner: list[list[list[str]]] = []
        argv = _simple(node, inner)
        if argv:
            out.append([argv])
        out.extend(inner)  # the command first, then what its substitutions run, as bashlex did
        return
    if t == "variable_assignment":  # a statement of its own: X=1; ...
        subs: list[list[list[str]]] = []
        _nested(node, subs)
        out.append([[unquote(_text(node))]])
        out.extend(subs)
        return
    for c in node.children:
        _collect(c, out)


def _simple(node: Node, out: list[list[list[str]]]) -> list[str]:
    """argv of a command (or of the command a redirected statement wraps); collects the
    pipelines of its command substitutions into ``out``. A here-doc or here-string fed
    to a shell becomes that shell's ``-c`` script."""
    if node.type == "redirected_statement":
        return _redirected(node, out)
    return _plain(node, out)


def _runs_shell(argv: list[str]) -> bool:
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in SHELLS


def _redirected(node: Node, out: list[list[list[str]]]) -> list[str]:
    """A command with redirections after it; anything else redirected (a loop, a
    group) is walked for the commands inside it and has no argv of its own."""
    body = node.child_by_field_name("body")
    if body is None or body.type not in ("command", "declaration_command"):
        for c in node.children:
            _collect(c, out)
        return []
    argv = _simple(body, out)
    for r in node.named_children:
        if r.type == "file_redirect":
            _shell_write(r, out)
        elif _runs_shell(argv):
            argv += _fed_script(r)
        _nested(r, out)
    return argv


def _shell_write(r: Node, out: list[list[list[str]]]) -> None:
    """A write by the shell itself: a pseudo-command ``>`` with its target, so that
    writes are judged by where they go, whatever the program."""
    if not any(">" in c.type for c in r.children):
        return
    dest = [c for c in r.named_children if c.type not in ("file_descriptor", "number")]
    if dest:
        out.append([[">", unquote(_text(dest[0]))]])


def _fed_script(r: Node) -> list[str]:
    """``-c SCRIPT`` for a here-doc or here-string redirection feeding a shell."""
    if r.type == "heredoc_redirect":
        return [x for b in r.named_children if b.type == "heredoc_body" for x in ("-c", _text(b))]
    if r.type == "herestring_redirect":
        words = [_text(w) for w in r.named_children]
        return ["-c", unquote(words[-1])] if words else []
    return []


def _plain(node: Node, out: list[list[list[str]]]) -> list[str]:
    """argv of a simple or declaration command; its redirections are not words."""
    argv = []
    if node.type in ("declaration_command", "unset_command") and node.children:
        argv.append(_text(node.children[0]))  # export, declare, local ...: an unnamed keyword node
    herestring = None
    for c in node.named_children:
        if c.type not in _SKIP:
            argv.append(unquote(_text(c)))
        elif c.type == "herestring_redirect" and c.named_children:
            herestring = unquote(_text(c.named_children[-1]))
        _nested(c, out)
    if herestring is not None and _runs_shell(argv):
        argv += ["-c", herestring]
    return argv


def _nested(node: Node, out: list[list[list[str]]]) -> None:
    """Command and process substitutions anywhere inside a word."""
    text = node.text or b""
    if b"$(" not in text and b"`" not in text and b"(" not in text:
        return  # no substitution can hide in it: skip the walk
    if node.type in _SUBST:
        for c in node.named_children:
            _collect(c, out)
        return
    for c in node.named_children:
        _nested(c, out)
