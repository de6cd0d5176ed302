"""``/docs``: the API's reference as one server-rendered page, written from the OpenAPI
document the gateway serves (``/openapi.json``), with nothing fetched from anywhere.

FastAPI's own /docs page loads Swagger UI's script and stylesheet from a CDN: on a
cluster's service network, with no way out, it stayed blank. No pinned package ships
Swagger UI's assets here (decision 0042), and an operator's page needs none: every
operation with its parameters, body fields and answers, in HTML and inline CSS, opened
with ``<details>`` (no script at all). The Content-Security-Policy says so to the browser:
a page that tried to load anything from elsewhere would be refused by it."""

from __future__ import annotations

import html
import json
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'"

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:70rem;padding:1rem 2rem;color:#1b1f24}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ccd;padding-top:1rem} code,pre{font:13px ui-monospace,monospace}
details.op{border:1px solid #d0d7de;border-radius:6px;margin:.4rem 0;padding:.3rem .6rem}
details.op>summary{cursor:pointer;list-style:none} .m{display:inline-block;min-width:4.5rem;font-weight:700}
.GET{color:#0969da}.POST{color:#1a7f37}.DELETE{color:#cf222e}.PUT,.PATCH{color:#9a6700}
table{border-collapse:collapse;margin:.3rem 0} td,th{border:1px solid #d0d7de;padding:.2rem .5rem;text-align:left;
vertical-align:top} th{background:#f6f8fa} .muted{color:#57606a}
"""


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return dict(spec["components"]["schemas"].get(ref.rsplit("/", 1)[1], {}))
    return schema


def _type(spec: dict[str, Any], schema: dict[str, Any]) -> str:
    """A schema in a few words: 'integer', 'array of string', 'JobSpec', 'string or null'."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(spec, s) for s in schema[key])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if schema.get("type") == "array":
        return "array of " + _type(spec, schema.get("items") or {})
    return str(schema.get("type") or "any")


def _fields(spec: dict[str, Any], schema: dict[str, Any]) -> str:
    body = _resolve(spec, schema)
    props: dict[str, Any] = body.get("properties") or {}
    if not props:
        return f"<p>{_esc(_type(spec, schema))}</p>"
    required = set(body.get("required") or [])
    rows = "".join(
        f"<tr><td><code>{_esc(name)}</code>{' *' if name in required else ''}</td><td>{_esc(_type(spec, p))}</td>"
        f"<td>{_esc(p.get('description') or p.get('title') or '')}</td></tr>" for name, p in props.items())
    return f"<table><tr><th>field</th><th>type</th><th>meaning</th></tr>{rows}</table>"


def _operation(spec: dict[str, Any], path: str, method: str, op: dict[str, Any]) -> str:
    out = [f"<details class='op' id='{_esc(op.get('operationId', method + path))}'><summary>"
           f"<span class='m {method.upper()}'>{method.upper()}</span> <code>{_esc(path)}</code> "
           f"<span class='muted'>{_esc(op.get('summary', ''))}</span></summary>"]
    if op.get("description"):
        out.append("".join(f"<p>{_esc(p)}</p>" for p in str(op["description"]).split("\n\n")))
    params = op.get("parameters") or []
    if params:
        rows = "".join(f"<tr><td><code>{_esc(p['name'])}</code>{' *' if p.get('required') else ''}</td>"
                       f"<td>{_esc(p.get('in'))}</td><td>{_esc(_type(spec, p.get('schema') or {}))}</td>"
                       f"<td>{_esc(p.get('description') or '')}</td></tr>" for p in params)
        out.append(f"<h4>Parameters</h4><table><tr><th>name</th><th>in</th><th>type</th><th>meaning</th></tr>"
                   f"{rows}</table>")
    content = ((op.get("requestBody") or {}).get("content") or {})
    for kind, media in content.items():
        out.append(f"<h4>Body <span class='muted'>({_esc(kind)})</span></h4>{_fields(spec, media.get('schema') or {})}")
    answers = "".join(f"<tr><td>{_esc(code)}</td><td>{_esc(r.get('description', ''))}</td></tr>"
                      for code, r in sorted((op.get("responses") or {}).items()))
    out.append(f"<h4>Answers</h4><table><tr><th>status</th><th>meaning</th></tr>{answers}</table></details>")
    return "".join(out)


def render(spec: dict[str, Any]) -> str:
    """The page: operations grouped by their first tag, in the document's order."""
    groups: dict[str, list[str]] = {}
    for path, ops in (spec.get("paths") or {}).items():
        for method, op in ops.items():
            if method in ("get", "post", "put", "patch", "delete"):
                groups.setdefault((op.get("tags") or ["other"])[0], []).append(_operation(spec, path, method, op))
    info = spec.get("info") or {}
    sections = "".join(f"<h2 id='tag-{_esc(tag)}'>{_esc(tag)}</h2>{''.join(ops)}" for tag, ops in groups.items())
    intro = "".join(f"<p>{_esc(p)}</p>" for p in str(info.get("description", "")).split("\n\n"))
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_esc(info.get('title'))} API"
            f"</title><meta name='viewport' content='width=device-width,initial-scale=1'><style>{STYLE}</style>"
            f"</head><body><h1>{_esc(info.get('title'))} API <span class='muted'>{_esc(info.get('version'))}"
            f"</span></h1>{intro}<p>The machine-readable document: <a href='openapi.json'>openapi.json</a>. "
            f"Click an operation to open it; * marks what is required.</p>{sections}</body></html>")


def mount(app: FastAPI) -> None:
    """``GET /docs`` on ``app`` (created with ``docs_url=None``), rendered once per process."""
    page: list[str] = []

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        if not page:
            page.append(render(app.openapi()))
        return HTMLResponse(page[0], headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})
