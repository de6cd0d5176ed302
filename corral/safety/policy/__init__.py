"""The facility policy: Cedar (via cedarpy) over principal, action, resource and context.

The policy is text an admin edits (``$CORRAL_HOME/policy.cedar``, else the packaged
default.cedar), validated against schema.cedarschema when loaded. ``decide`` answers
allow or deny and names the rule: the ``@id`` of each forbid that fired, or
``default-deny`` when no permit applied.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cedarpy

from corral.core.errors import InvalidRequest
from corral.core.lane_names import BATCH

HERE = Path(__file__).parent
DEFAULT_POLICY = HERE / "default.cedar"
SCHEMA_TEXT = (HERE / "schema.cedarschema").read_text()
KINDS = {"human": "Human", "agent": "Agent", "service": "Service"}
RESOURCES = ("Job", "Note", "Workspace", "Environment", "Facility", "Destination")


def is_off_hours(t: float) -> bool:
    """Night (22:00-07:00) or weekend on the gateway's clock, as the analytics count it."""
    lt = time.localtime(t)
    return lt.tm_wday >= 5 or lt.tm_hour < 7 or lt.tm_hour >= 22


@dataclass
class Request:
    """One question to the policy, in corral's terms (not Cedar's JSON)."""

    kind: str
    name: str
    action: str
    resource_type: str = "Job"
    resource: dict[str, Any] = field(default_factory=dict)
    sponsor: str | None = None
    account: str | None = None
    unix_user: str | None = None
    admin: bool = False
    groups: list[str] = field(default_factory=list)
    risk_tags: list[str] = field(default_factory=list)
    tainted: bool = False
    session: str | None = None
    at: float | None = None
    cluster: str | None = None
    """At a facility of several clusters, the one the job would run on ('' : not yet placed)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Request":
        """From a JSON request (``corral policy explain``/``test``): principal.kind/name/...,
        action, resource.type/attrs, context.risk_tags/tainted/at/cluster."""
        p, r, c = d.get("principal") or {}, dict(d.get("resource") or {}), d.get("context") or {}
        if not isinstance(p, dict) or not p.get("kind") or not d.get("action"):
            raise InvalidRequest("a request needs principal.kind, principal.name and action, e.g. "
                                 '{"principal": {"kind": "agent", "name": "bot", "sponsor": "alice"}, '
                                 '"action": "submit", "resource": {"cpus": 4}, "context": {"command": "make"}}')
        tags = list(c.get("risk_tags") or [])
        if c.get("command"):
            from corral.safety.risk import analyze

            tags += list(analyze(str(c["command"])).tags)
        rtype = r.pop("type", "Job")
        return cls(kind=str(p["kind"]), name=str(p.get("name", "someone")), action=str(d["action"]),
                   resource_type=str(rtype), resource=r, sponsor=p.get("sponsor"), account=p.get("account"),
                   unix_user=p.get("unix_user"), admin=bool(p.get("admin", False)), groups=list(p.get("groups") or []),
                   risk_tags=sorted(set(tags)), tainted=bool(c.get("tainted", False)), session=c.get("session"),
                   at=c.get("at"), cluster=c.get("cluster"))


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str
    """The forbid(s) that denied, else the permit(s) that allowed, else 'default-deny'."""
    errors: tuple[str, ...] = ()
    ask: str | None = None
    """Who may approve instead ('sponsor'): every forbid that fired says ``@ask`` (a rule
    without it is a refusal, whatever the others say)."""

    def to_dict(self) -> dict[str, Any]:
        out = {"decision": "allow" if self.allowed else "deny", "rule": self.rule, "errors": list(self.errors)}
        return {**out, "ask": self.ask} if self.ask else out


def _job_attrs(r: dict[str, Any]) -> dict[str, Any]:
    return {"owner": str(r.get("owner", "")), "partition": str(r.get("partition") or ""),
            "cpus": int(r.get("cpus", 1)), "gpus": int(r.get("gpus", 0)),
            "walltime_s": int(r.get("walltime_s", 3600)), "memory_mb": int(r.get("memory_mb", 0)),
            "lane": str(r.get("lane") or BATCH), "paths": [str(x) for x in r.get("paths") or []],
            "contained": bool(r.get("contained", False))}


ASKERS = frozenset({"sponsor"})
"""Who an ``@ask("...")`` annotation may name."""


class Policy:
    def __init__(self, text: str, source: str = "<text>") -> None:
        self.text, self.source = text, source
        result = cedarpy.validate_policies(text, SCHEMA_TEXT)
        if not result.validation_passed:
            errs = "; ".join(str(e) for e in result.errors[:5])
            raise InvalidRequest(f"policy {source} is not valid: {errs}",
                                 hint="fix it and run 'corral policy check FILE' until it passes")
        try:
            self._ps = cedarpy.PolicySet.from_str(text)
        except ValueError as e:
            raise InvalidRequest(f"policy {source} does not parse: {e}") from None
        static = json.loads(cedarpy.policies_to_json_str(text)).get("staticPolicies", {}).items()
        self.ids = [p.get("annotations", {}).get("id", k) for k, p in static]
        self.asks = {p.get("annotations", {}).get("id", k): p["annotations"]["ask"] for k, p in static
                     if p.get("annotations", {}).get("ask") in ASKERS}
        """Rules whose refusal a person may lift instead: @id -> who ('sponsor')."""

    @classmethod
    def load(cls, path: Path | None) -> "Policy":
        """The admin's file when it exists, else the packaged default."""
        chosen = path if path is not None and path.is_file() else DEFAULT_POLICY
        try:
            return cls(chosen.read_text(), str(chosen))
        except OSError as e:
            raise InvalidRequest(f"cannot read policy {chosen}: {e.strerror}") from None

    def decide(self, req: Request) -> Decision:
        kind = KINDS.get(req.kind)
        if kind is None:
            raise InvalidRequest(f"principal kind {req.kind!r} is unknown; use human, agent or service")
        if req.resource_type not in RESOURCES:
            raise InvalidRequest(f"resource type {req.resource_type!r} is unknown; use one of {', '.join(RESOURCES)}")
        attrs: dict[str, Any] = {"name": req.name, "account": req.account or "", "unix_user": req.unix_user or ""}
        if kind == "Agent":
            attrs["sponsor"] = req.sponsor or ""
        if kind == "Human":
            attrs["admin"] = req.admin
        groups = [{"type": "Corral::Group", "id": g} for g in req.groups]
        rid = str(req.resource.get("id", "new"))
        if req.resource_type == "Job":
            rattrs = _job_attrs(req.resource)
        elif req.resource_type == "Note":
            rattrs = {"scope": str(req.resource.get("scope", "user")), "author": str(req.resource.get("author", ""))}
        elif req.resource_type == "Workspace":
            rattrs = {"owner": str(req.resource.get("owner", "")), "base": str(req.resource.get("base", ""))}
        elif req.resource_type == "Environment":
            rattrs = {"owner": str(req.resource.get("owner", "")), "files": [str(x) for x in req.resource.get("files") or []]}
        elif req.resource_type == "Destination":
            rattrs = {"host": str(req.resource.get("host", "")), "port": int(req.resource.get("port", 0)),
                      "job": int(req.resource.get("job", 0)), "owner": str(req.resource.get("owner", ""))}
        else:
            rattrs = {}
        entities: list[dict[str, Any]] = [
            {"uid": {"type": f"Corral::{kind}", "id": req.name}, "attrs": attrs, "parents": groups},
            {"uid": {"type": f"Corral::{req.resource_type}", "id": rid}, "attrs": rattrs, "parents": []},
            *({"uid": g, "attrs": {}, "parents": []} for g in groups),
        ]
        at = req.at if req.at is not None else time.time()
        lt = time.localtime(at)
        context = {"hour": lt.tm_hour, "weekday": lt.tm_wday, "off_hours": is_off_hours(at),
                   "tainted": req.tainted, "risk_tags": list(req.risk_tags), "session": req.session or "",
                   "cluster": req.cluster or ""}
        result = cedarpy.is_authorized(
            {"principal": {"type": f"Corral::{kind}", "id": req.name},
             "action": {"type": "Corral::Action", "id": req.action},
             "resource": {"type": f"Corral::{req.resource_type}", "id": rid}, "context": context},
            self._ps, entities)
        d = result.diagnostics
        named = sorted(d.id_annotations_by_reason.get(r, r) for r in d.reasons)  # Cedar's order varies
        if result.allowed:
            return Decision(True, ",".join(named) or "allow", tuple(d.errors))
        asks = {self.asks.get(n) for n in named}
        ask = asks.pop() if named and len(asks) == 1 and None not in asks else None
        return Decision(False, ",".join(named) or "default-deny", tuple(d.errors), ask)


SIZES: tuple[tuple[str, int], ...] = (("walltime_s", 60), ("cpus", 1), ("gpus", 0), ("memory_mb", 1))
"""A job's sizes a policy may limit, each with the least a job can ask, in the order a
refusal lowers them (time first: the cheapest to give up)."""


def _largest_passing(policy: Policy, req: Request, key: str, low: int, high: int) -> int:
    """The largest value of ``key`` in [low, high] the policy allows (``low`` allowed):
    a binary search, as a policy's size rules are thresholds."""
    while low < high:
        mid = (low + high + 1) // 2
        if policy.decide(replace(req, resource={**req.resource, key: mid})).allowed:
            low = mid
        else:
            high = mid - 1
    return low


def nearest_allowed(policy: Policy, req: Request) -> dict[str, tuple[int, int]] | None:
    """For a denied job, the nearest request the policy allows by lowering its sizes:
    {size: (asked, allowed)} for each size that must come down, or None when no smaller
    job would pass (the rule is about something else: the command, the taint, the hour).
    Works for any policy, not only the default's thresholds: it asks the policy itself."""
    if req.resource_type != "Job":
        return None
    asked = {k: int(v) for k, v in _job_attrs(req.resource).items() if k in dict(SIZES)}
    least = {k: min(m, asked[k]) for k, m in SIZES}
    if not policy.decide(replace(req, resource={**req.resource, **least})).allowed:
        return None
    fixed = dict(asked)
    for key, _ in SIZES:  # lower one size at a time, the later ones still at their least
        later = {k: least[k] for k, _ in SIZES[[k for k, _ in SIZES].index(key) + 1:]}
        trial = replace(req, resource={**req.resource, **fixed, **later})
        fixed[key] = _largest_passing(policy, trial, key, least[key], asked[key])
        if policy.decide(replace(req, resource={**req.resource, **fixed})).allowed:
            break
    return {k: (asked[k], fixed[k]) for k, _ in SIZES if fixed[k] != asked[k]}


def _span(seconds: int) -> str:
    for unit, n in (("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


_SAY: dict[str, tuple[str, str, Any]] = {
    # size: (what it is called, the submit flag, how its values read)
    "walltime_s": ("walltime", "--time", lambda v: _span(v)),
    "cpus": ("cpus", "--cpus", str),
    "gpus": ("gpus", "--gpus", str),
    "memory_mb": ("memory", "--mem", lambda v: f"{v // 1024}G" if v % 1024 == 0 else f"{v}M"),
}


def refusal_sizes(policy: Policy, req: Request) -> tuple[str, str]:
    """What a refusal says of sizes, in the caller's terms: ("walltime 100h asked; an agent
    may ask at most 48h", "--time <= 48:00:00"), or ("", "") when no smaller job passes."""
    said, ask, _ = refusal_nearest(policy, req)
    return said, ask


def refusal_nearest(policy: Policy, req: Request) -> tuple[str, str, dict[str, int]]:
    """``refusal_sizes`` and the nearest request itself ({size: allowed}, JobSpec's fields),
    which plan_job checks in the same call."""
    nearest = nearest_allowed(policy, req)
    if not nearest:
        return "", "", {}
    who = {"agent": "an agent", "human": "a person", "service": "a service"}.get(req.kind, req.kind)
    said, ask = [], []
    for key, (asked, allowed) in nearest.items():
        name, flag, fmt = _SAY[key]
        said.append(f"{name} {fmt(asked)} asked; {who}{' in this session' if req.tainted else ''} may ask at "
                    f"most {fmt(allowed)}")
        h, rest = divmod(allowed, 3600)
        ask.append(f"{flag} <= {h:02d}:{rest // 60:02d}:{rest % 60:02d}" if key == "walltime_s"
                   else f"{flag} <= {fmt(allowed)}")
    return "; ".join(said), " ".join(ask), {k: allowed for k, (_, allowed) in nearest.items()}


_DEFAULT: Policy | None = None


def agent_verdict(tags: list[str], policy: Policy | None = None, contained: bool = False) -> Decision:
    """The decision on an agent submitting a job with these risk tags (default policy
    unless given): what ``corral risk`` reports and the red-team suite counts."""
    global _DEFAULT
    if policy is None:
        _DEFAULT = _DEFAULT or Policy.load(None)
        policy = _DEFAULT
    return policy.decide(Request(kind="agent", name="agent", action="submit", sponsor="someone",
                                 resource={"cpus": 1, "walltime_s": 600, "contained": contained},
                                 risk_tags=sorted(tags), at=0.0))
