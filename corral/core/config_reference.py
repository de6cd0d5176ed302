"""docs/config.md, written from the settings' own declarations (corral/core/config.py):
every key of corral.toml with its type, bounds, default, environment variable, meaning
and an example. ``corral config reference`` prints it; tests/test_config_reference.py
fails when the committed file differs from what this writes, so the reference cannot
drift from the code. A key's example is its declared ``examples[0]``, else its default;
a default computed on the machine (``home``, ``local_cpus``) is shown as the declaration's
``shown_default`` says, so the page is the same on every machine."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from corral.core.config import PARTS, Settings

HEADER = """\
# Configuration reference

<!-- Written by `corral config reference > docs/config.md` from corral/core/config.py;
     tests/test_config_reference.py fails when this file differs. Edit the declarations, not this. -->

The gateway reads its settings from, highest first: `corral serve`'s flags, `CORRAL_*`
environment variables, the TOML file (`$CORRAL_CONFIG`, else `$CORRAL_HOME/corral.toml`),
then the defaults below. A key of a table (`[fastlane] cpus`) is `CORRAL_FASTLANE__CPUS` in
the environment; lists and tables are given there as JSON. An unknown key in the file stops
the gateway with the closest valid one (`corral config check` tries a file without starting
anything). The flat spelling of before (`fastlane_cpus = 4`) is still taken.

A minimal production file (docs/deploy.md walks the rest):

```toml
home = "/var/lib/corral"
host = "0.0.0.0"
backend = "slurm"
tls_cert = "/etc/corral/tls/fullchain.pem"
tls_key = "/etc/corral/tls/privkey.pem"

[slurm]
conf = "/etc/slurm/slurm.conf"
```
"""


@dataclass(frozen=True)
class Entry:
    table: str | None
    key: str
    type: str
    bounds: str
    default: str
    example: str
    env: str
    meaning: str


def type_name(t: Any) -> str:
    """An annotation in TOML's words: 'integer', 'list of string', 'one of "a", "b"'."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + (", optional" if len(inner) < len(args) else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if origin in (list, tuple):
        return ("list of " + type_name(args[0])) if origin is list else f"pair of {type_name(args[0])}"
    if origin is dict:
        return f"table of {type_name(args[0])} -> {type_name(args[1])}"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    return names.get(t, getattr(t, "__name__", str(t)))


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {v!r}")


def _bounds(f: FieldInfo) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(f"{words[name]} {getattr(m, name)}" for m in f.metadata for name in words if hasattr(m, name))


def _default(f: FieldInfo) -> Any:
    """The declared default; PydanticUndefined where it is computed on the machine."""
    if f.default is not PydanticUndefined:
        return f.default
    if f.default_factory in (dict, list):
        return f.default_factory()
    return PydanticUndefined


def entry(table: str | None, key: str, f: FieldInfo) -> Entry:
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    default = _default(f)
    shown = str(extra.get("shown_default") or "")
    if not shown:
        shown = "unset" if default is None else f"`{toml_value(default)}`"
    example = f.examples[0] if f.examples else default
    if example is None or example is PydanticUndefined:
        raise ValueError(f"{table or ''}.{key}: declare an example (Field(examples=[...]))")
    env = f"CORRAL_{table.upper()}__{key.upper()}" if table else f"CORRAL_{key.upper()}"
    return Entry(table, key, type_name(f.annotation), _bounds(f), shown, f"{key} = {toml_value(example)}",
                 env, " ".join((f.description or "").split()))


def entries() -> list[Entry]:
    out = [entry(None, k, f) for k, f in Settings.model_fields.items() if k not in PARTS]
    for table, model in PARTS.items():
        out += [entry(table, k, f) for k, f in model.model_fields.items()]
    return out


def _section(title: str, doc: str | None, items: list[Entry]) -> list[str]:
    lines = [f"## {title}", ""]
    if doc:
        lines += [" ".join(doc.split()), ""]
    for e in items:
        name = f"{e.table}.{e.key}" if e.table else e.key
        where = f" in `[{e.table}]`" if e.table else ""
        lines += [f"### `{name}`", "", e.meaning, "",
                  f"type: {e.type}" + (f" ({e.bounds})" if e.bounds else "") + f"; default: {e.default}; "
                  f"environment: `{e.env}`; example{where}: `{e.example}`", ""]
    return lines


def render() -> str:
    all_entries = entries()
    lines = [HEADER, "## Contents", ""]
    lines += ["- [The gateway's own keys](#the-gateways-own-keys)"]
    lines += [f"- [`[{t}]`](#{t})" for t in PARTS]
    lines.append("")
    lines += _section("The gateway's own keys", None, [e for e in all_entries if e.table is None])
    for table, model in PARTS.items():
        lines += _section(f"[{table}]", _doc(model), [e for e in all_entries if e.table == table])
    return "\n".join(lines).rstrip("\n") + "\n"


def _doc(model: type[BaseModel]) -> str | None:
    return model.__doc__
