"""The ``corral`` commands made from verb declarations (``Cli(generated=True)`` in
corral/edges/declare.py): the function's arguments after the caller become the command's
(those in the path positional, the rest ``--options`` with the function's defaults), and
the answer is printed as a table of its ``rows`` (or its fields, one a line), or as JSON
under ``--json``. Nothing is imported to build them: they start with ``corral --help``."""

from __future__ import annotations

from typing import Any

import click

from corral.edges.cli.kit import Ctx, table
from corral.edges.declare import DECLARED, Declared

_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def commands() -> list[click.Command]:
    """A command for each declared verb whose CLI is generated (corral/edges/reads.py loaded)."""
    import corral.edges.verbs  # noqa: F401  # the declarations register themselves (reads, acts)

    return [command(d) for d in DECLARED if d.cli is not None and d.cli.generated]


def command(verb: Declared[Any, Any]) -> click.Command:
    assert verb.cli is not None
    cli = verb.cli

    @click.pass_obj
    def run(o: Ctx, **args: Any) -> None:
        data = o.client.call(verb.name, **{k: v for k, v in args.items() if v is not None})
        o.out(data, lambda d: shown(d, cli.rows, cli.columns))

    text = f"{verb.row.doc}\n\n\b\nExample:\n  {cli.example}" if cli.example else verb.row.doc
    return click.Command(cli.name, callback=run, params=parameters(verb), help=text)


def parameters(verb: Declared[Any, Any]) -> list[click.Parameter]:
    """The function's arguments after the caller: in the path, an argument; else an option."""
    fn = verb.fn
    defaults = dict(zip(reversed(verb.row.args), reversed(fn.__defaults__ or ())))
    out: list[click.Parameter] = []
    for name in verb.row.args:
        kind = str(fn.__annotations__.get(name, "str")).split(" |")[0]
        if name in verb.row.in_path:
            out.append(click.Argument([name], type=_TYPES.get(kind, str)))
        elif kind == "bool":
            out.append(click.Option([f"--{name.replace('_', '-')}"], is_flag=True, default=None))
        else:
            out.append(click.Option([f"--{name.replace('_', '-')}", name], type=_TYPES.get(kind, str),
                                    default=None, show_default=str(defaults.get(name))))
    return out


def shown(data: dict[str, Any], rows: str | None, columns: tuple[str, ...]) -> str:
    """The answer for a person: its list as a table, or its fields one a line."""
    if rows is not None:
        return table([{k: cell(v) for k, v in r.items()} for r in data[rows]], list(columns))
    return "\n".join(f"{k}: {cell(v)}" for k, v in data.items())


def cell(value: Any) -> Any:
    """A nested answer (a budget's {limit, used, left}) as one cell: 'limit 5, used 1, left 4'."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items()) or "-"
    return "-" if value is None else value
