"""What an environment request may name: packages of the facility's index, never a file
or a directory on the machine, nor another index (H4-report F2).

A build resolves and installs as its requester (build.py), so a path there could only
reach what the requester may read anyway; the check is what tells an agent, before any
job, what a request may hold, and keeps uv from ever being asked to open a path whose
content its error message would repeat. Checked on the gateway, on the request's text:

- requirements.txt: one requirement a line (``name[extras] specifiers ; marker``, or
  ``name @ https://URL``), each optionally followed by ``--hash=ALGO:HEX``; no option
  lines (``-r``, ``-c``, ``-e``, ``--index-url``, ``--extra-index-url``, ``-f``,
  ``--find-links``...), no paths, no ``file:`` URLs;
- pyproject.toml: the same for every dependency list (project, optional, groups, build
  system); a ``[tool.uv]`` table only with keys that name no index, source or path;
- uv.lock: packages from a registry or an https URL, the project itself (``virtual``);
  none from a path, a directory, an editable checkout or git.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from corral.core.errors import InvalidRequest

ALLOWED = ("a requirement is a package name with optional [extras], version specifiers and an environment "
           "marker (numpy>=1.26,<2; python_version >= '3.10'), or name @ https://URL, optionally followed by "
           "--hash=sha256:HEX; the index is the facility's")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPEC = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_MARKER = r"""[A-Za-z0-9_.<>=!~'"() ,*+-]*"""
_HEAD = rf"^\s*{_NAME}\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?\s*"
_REQ = re.compile(
    _HEAD + rf"(?:\(\s*{_SPEC}(?:\s*,\s*{_SPEC})*\s*\)|{_SPEC}(?:\s*,\s*{_SPEC})*)?\s*(?:;\s*{_MARKER})?$"
    + "|" + _HEAD + rf"@\s*https://[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,=%]+(?:\s+;\s*{_MARKER})?\s*$")
_HASH = re.compile(r"\s+--hash[= ](?:sha256|sha384|sha512):[0-9a-fA-F]+")
_ARCHIVES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".egg")
"""What pip and uv read as a file beside the requirements, not a package's name."""
_UV_KEYS = {"dev-dependencies", "constraint-dependencies", "override-dependencies", "environments",
            "required-environments", "conflicts", "default-groups", "package"}
"""[tool.uv] keys a request may carry: none names an index, a source or a path."""
_DEP_LISTS = {"dev-dependencies", "constraint-dependencies", "override-dependencies"}


def _say(where: str, text: str) -> str:
    shown = text.strip()
    return f"{where}: {shown[:120]!r}{'...' if len(shown) > 120 else ''}"


def requirement(text: str, where: str) -> None:
    """One requirement (a line of requirements.txt, an entry of a dependency list)."""
    core = _HASH.sub("", " " + text).strip() if "--hash" in text else text.strip()
    if core.startswith("-"):
        raise InvalidRequest(f"{_say(where, text)} is an option line; an environment request names packages "
                             "only (no -r, -c, -e, --index-url, --extra-index-url, -f or --find-links): " + ALLOWED)
    name = re.split(r"[\s\[(;@<>=!~]", core, maxsplit=1)[0].lower()
    if "file:" in core.lower() or core.startswith((".", "/", "~")) or name.endswith(_ARCHIVES) or not _REQ.match(core):
        raise InvalidRequest(f"{_say(where, text)} is not a package of the index (local paths, files and "
                             "other URLs are refused): " + ALLOWED)


def requirements_txt(text: str) -> None:
    joined = re.sub(r"\\\r?\n", " ", text)  # pip's line continuations
    for n, line in enumerate(joined.splitlines(), 1):
        body = re.sub(r"(^|\s)#.*$", "", line).strip()
        if body:
            requirement(body, f"requirements.txt line {n}")


def _deps(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(x, (str, dict)) for x in value):
        raise InvalidRequest(f"pyproject.toml {where} must be a list of requirements")
    for i, dep in enumerate(value):
        if isinstance(dep, str):  # a dependency group may also include another group ({include-group = ...})
            requirement(dep, f"pyproject.toml {where}[{i}]")


def pyproject_toml(text: str) -> dict[str, Any]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidRequest(f"pyproject.toml is not valid TOML: {e}") from None
    project = doc.get("project") or {}
    if not isinstance(project, dict):
        raise InvalidRequest("pyproject.toml [project] must be a table")
    _deps(project.get("dependencies", []), "project.dependencies")
    for group, deps in (project.get("optional-dependencies") or {}).items():
        _deps(deps, f"project.optional-dependencies.{group}")
    for group, deps in (doc.get("dependency-groups") or {}).items():
        _deps(deps, f"dependency-groups.{group}")
    _deps((doc.get("build-system") or {}).get("requires", []), "build-system.requires")
    uv = (doc.get("tool") or {}).get("uv") or {}
    bad = sorted(set(uv) - _UV_KEYS) if isinstance(uv, dict) else ["(not a table)"]
    if bad:
        raise InvalidRequest(f"pyproject.toml [tool.uv] may not set {', '.join(bad)}: the index and every package's "
                             "source are the facility's (no sources, indexes, find-links or paths)")
    for key in _DEP_LISTS & set(uv):
        _deps(uv[key], f"tool.uv.{key}")
    return doc


def uv_lock(text: str) -> None:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidRequest(f"uv.lock is not valid TOML: {e}") from None
    for p in doc.get("package") or []:
        source = p.get("source") if isinstance(p, dict) else None
        kind = next(iter(source), "") if isinstance(source, dict) and len(source) == 1 else ""
        value = str(source.get(kind, "")) if isinstance(source, dict) else ""
        if kind == "registry" or (kind == "url" and value.startswith("https://")) or \
                (kind == "virtual" and value == "."):
            continue
        name = p.get("name", "?") if isinstance(p, dict) else "?"
        raise InvalidRequest(f"uv.lock: package {str(name)[:64]!r} comes from {kind or 'an unknown source'}; "
                             "a locked environment takes packages from a registry or an https URL only "
                             "(no path, directory, editable or git sources)")


def check(files: dict[str, str]) -> None:
    """Every file of a request (already known to be one of the three kinds)."""
    if "requirements.txt" in files:
        requirements_txt(files["requirements.txt"])
    if "pyproject.toml" in files:
        pyproject_toml(files["pyproject.toml"])
    if "uv.lock" in files:
        uv_lock(files["uv.lock"])
