"""The gate every action passes: it decides, and records nothing.

For one action of one caller, in this order:
1. the token's caveats (biscuit checks: expiry, actions, partitions, per-job caps);
2. the facility policy (Cedar) with the job's risk tags and the session's taint;
3. admission for submissions: rate buckets, budgets per token subtree, concurrency caps.

A refusal is an error carrying the rule that refused (``CorralError.rule``) and the risk
tags; the core records it in the audit chain (``safety.audit.Audit``), as it records the
actions it allowed. The guard on the way back (corral/safety/guard.py) taints a session
through ``taint``.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import logging
import shlex
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from corral.core import proc
from corral.core.clock import Clock
from corral.core.config import SafetySettings
from corral.core.errors import ApprovalNeeded, CorralError, Forbidden, RateLimited
from corral.core.jobs import JobSpec
from corral.core.lru import LRU
from corral.core.principals import Caller, Kind, Principal
from corral.core.lane_names import BATCH
from corral.safety.limits import Buckets, Want, take_stored
from corral.safety.policy import Policy, Request, refusal_nearest
from corral.safety.risk import facility_hosts, tags_of
from corral.safety.store import SafetyStore
from corral.safety.tokens import TokenAuthority

if TYPE_CHECKING:
    from corral.core.db import Database

log = logging.getLogger(__name__)

APPROVED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("approved", default=frozenset())
"""The ``@ask`` rules the submission being recorded now may pass: the service sets them
while it records a submission as waiting for its approval (gateway/approvals.py)."""

FORGET_S = 86400.0
"""A submission bucket untouched this long is dropped from the store (full again, unless
its refill takes more than a day: then an agent idle for a day has its burst back)."""

DECISIONS_KEPT = 4096
"""Decisions reused for ``cache_s``: at most this many kept, the expired ones dropped first.
Each read of a job's output is a decision on its own facts (the job's id): before issue 46
they were kept until 10,000 (~1 KB each) and then all cleared."""


def job_resource(spec: JobSpec, owner: str, contained: bool = False) -> dict[str, Any]:
    """A job as the policy and the token checks see it; ``contained``: it will run in the
    sandbox (corral/sandbox/bwrap.py)."""
    return {"owner": owner, "partition": spec.partition or "", "cpus": spec.cpus, "gpus": spec.gpus,
            "walltime_s": spec.walltime_s, "memory_mb": spec.memory_mb, "lane": spec.lane or BATCH,
            "paths": [spec.workdir] if spec.workdir else [], "contained": contained}


def job_text(spec: JobSpec) -> str:
    """What runs, for the risk tagger: the environment as assignments (a payload can hide
    in a variable the script then evals), then the command or script."""
    env = "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(spec.env.items()))
    return env + (spec.command or spec.script or "")


def _parser_start(hosts: list[str]) -> None:
    """In the parser process. Niced: parsing a hostile 256 KiB script takes a core for
    ~0.1 s, and the event loop that answers every other agent must get the CPU first.
    And it dies with the gateway. ``hosts``: the facility's egress allow-list."""
    os.nice(10)
    proc.die_with_parent()
    facility_hosts(hosts)


class Gate:
    def __init__(self, settings: SafetySettings, home: Path, db: "Database", clock: Clock | None = None,
                 allow_hosts: Sequence[str] = ()) -> None:
        self.settings = settings
        self.allow_hosts = list(allow_hosts)
        """The facility's egress allow-list: fetching from it is not exfiltration (safety/risk.py)."""
        facility_hosts(self.allow_hosts)
        self.clock = clock or Clock()
        self.store = SafetyStore(db)
        self.db = db
        self.tokens = TokenAuthority(home / "token.key")
        self._policy_path = settings.policy_path(home)
        self.policy = Policy.load(self._policy_path)
        self._policy_seen = (self._mtime(), self.clock.monotonic())
        self._policy_version = 0
        self.buckets = Buckets()
        """Every other call's buckets (``api_call``), per replica: submissions' are in the store."""
        self._reserved = 0
        self.revoked = self.store.revoked()
        self._taint = self.store.taints()
        self._tags: OrderedDict[str, list[str]] = OrderedDict()
        self._decisions: LRU[tuple[Any, ...], tuple[float, Any]] = LRU(DECISIONS_KEPT)
        self._parser: ProcessPoolExecutor | None = None
        """Parses long texts for risk, started on the first one (``prepare``)."""
        self.cache_s = 1.0
        """How long a decision on identical facts is reused (0: never)."""

    # -- inputs to decisions ------------------------------------------------------------

    def _cached(self, key: tuple[Any, ...]) -> Any:
        """A decision taken on the very same facts less than ``cache_s`` ago. Agents repeat
        identical requests in bursts; one second keeps time-of-day rules and token expiry
        exact to that second, and a policy edit or a revocation starts afresh (the policy's
        version is part of the key; a revoked token no longer authenticates)."""
        hit = self._decisions.get(key)
        if hit is not None and hit[0] > self.clock.monotonic():
            return hit[1]
        return None

    def _remember(self, key: tuple[Any, ...], value: Any, ttl: float | None = None) -> None:
        ttl = self.cache_s if ttl is None else ttl
        if ttl <= 0:
            return
        now = self.clock.monotonic()
        self._decisions.put(key, (now + ttl, value))
        self._decisions.drop_oldest_while(lambda hit: hit[0] <= now)

    def _mtime(self) -> float:
        try:
            return self._policy_path.stat().st_mtime
        except OSError:
            return 0.0

    def _fresh_policy(self) -> Policy:
        """The policy, read again when its file changed (looked at every 2 s at most), so an
        admin's edit applies without a restart. An edit that does not validate is logged
        and the policy in force stays."""
        mtime, looked = self._policy_seen
        now = self.clock.monotonic()
        if now - looked > 2.0:
            current = self._mtime()
            if current != mtime:
                try:
                    self.policy = Policy.load(self._policy_path)
                    self._policy_version += 1
                    log.warning("policy reloaded from %s (rules: %s)", self.policy.source, ", ".join(self.policy.ids))
                except CorralError as e:
                    log.error("policy %s not reloaded, the one in force stays: %s", self._policy_path, e.message)
            self._policy_seen = (current, now)
        return self.policy

    def risk_tags(self, text: str) -> list[str]:
        """Tags of a command or script. Cached by content: agents resubmit the same script
        again and again, and parsing a long one costs milliseconds."""
        if not text:
            return []
        key = _content_key(text)
        tags = self._tags.get(key)
        if tags is None:
            tags = self._keep_tags(key, tags_of(text))
        else:
            self._tags.move_to_end(key)
        return tags

    async def prepare(self, text: str) -> None:
        """Parse a long text's risk in the parser process, so that ``check`` finds its tags
        cached: the parse is linear in the text, but 256 KiB of script still takes a
        second of CPU, and the event loop serves every other agent meanwhile. A process,
        not a thread: tree-sitter holds the GIL while it parses (a thread stalled the loop
        ~100 ms per 256 KiB script, measured)."""
        if len(text) < 4096:
            return
        key = _content_key(text)
        if key in self._tags:
            return
        if self._parser is None:
            self._parser = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=_parser_start, initargs=(self.allow_hosts,))
        try:
            tags = await asyncio.get_running_loop().run_in_executor(self._parser, tags_of, text)
        except BrokenProcessPool:  # the parser died (OOM, a kill): a fresh one next time, a thread now
            log.warning("the risk parser process died; parsing in a thread and starting a new one")
            self._parser = None
            tags = await asyncio.to_thread(tags_of, text)
        self._keep_tags(key, tags)

    def close(self) -> None:
        if self._parser is not None:
            self._parser.shutdown(wait=False, cancel_futures=True)
            self._parser = None

    def _keep_tags(self, key: str, tags: list[str]) -> list[str]:
        self._tags[key] = tags
        if len(self._tags) > 4096:
            self._tags.popitem(last=False)
        return tags

    @staticmethod
    def taint_key(token_id: str) -> str:
        return f"token:{token_id}"

    def taint_of(self, caller: Caller) -> tuple[str | None, str] | None:
        """(the token block that holds the taint, why) for the caller's credential; None
        when it is not tainted. The taint sits on a token block and covers every token
        narrowed from it: not on a session id the client chose, so a new session does
        not shed it."""
        for b in caller.cap.block_ids if caller.cap else (caller.token_id,):
            why = self._taint.get(self.taint_key(b))
            if why is not None:
                return b, why
        # Taints recorded by session before they moved to the credential still hold.
        legacy = f"session:{caller.name}:{caller.session}" if caller.session else f"principal:{caller.name}"
        why = self._taint.get(legacy)
        return (None, why) if why is not None else None

    def tainted_keys(self) -> set[str]:
        return set(self._taint)

    def tainted(self, caller: Caller) -> str | None:
        """Why the caller's credential is tainted (None: it is not)."""
        found = self.taint_of(caller)
        return found[1] if found else None

    def taint(self, caller: Caller, reason: str) -> bool:
        """Taint the credential in use and, when it was narrowed from another, that parent
        too (one taint on the parent's block covers both, and every token narrowed from
        it: a sub-agent's read must not leave the agent that spawned it clean);
        -> True if it was not already."""
        if self.tainted(caller) is not None:
            return False
        blocks = caller.cap.block_ids if caller.cap else (caller.token_id,)
        key = self.taint_key(blocks[-2] if len(blocks) > 1 else caller.token_id)
        self._taint[key] = reason
        self.store.taint(key, caller.name, reason)
        return True

    def clear_taint(self, token_id: str, owner: str) -> str | None:
        """Lift the taint of a token block, and any its ``owner`` still has from before
        taints moved to credentials (by session or principal); -> the reason it was
        tainted, or None if nothing was."""
        keys = [self.taint_key(token_id), f"principal:{owner}"]
        keys += [k for k in self._taint if k.startswith(f"session:{owner}:")]
        whys = [w for w in (self._taint.pop(k, None) for k in keys) if w is not None]
        for k in keys:
            self.store.clear_taint(k)
        return whys[0] if whys else None

    # -- the decision -----------------------------------------------------------------------

    def check(self, caller: Caller, action: str, resource_type: str = "Job",
              resource: dict[str, Any] | None = None, *, text: str = "", cluster: str | None = None) -> str:
        """Token caveats, then policy. Raises Forbidden naming the rule (and carrying it);
        -> the rule that allowed. ``cluster``: where the job would run (context.cluster)."""
        resource = resource or {}
        tags: list[str] = []
        rule = "token-caveat"
        try:
            if caller.cap is not None:
                facts: dict[str, str | int] = {}
                if action == "submit":
                    facts = {k: resource[k] for k in ("partition", "cpus", "gpus", "walltime_s")}
                key = (caller.cap.path, action, tuple(facts.items()))
                if not self._cached(key):
                    self.tokens.authorize(caller.cap, action, facts, self.clock.time())
                    self._remember(key, True)
            rule = "policy"
            tags = self.risk_tags(text)
            p = caller.principal
            tainted = self.tainted(caller) is not None
            policy = self._fresh_policy()
            req = Request(
                kind=p.kind.value, name=p.name, action=action, resource_type=resource_type, resource=resource,
                sponsor=p.sponsor, account=p.account, unix_user=p.unix_user, admin=p.is_admin,
                groups=self.settings.policy_groups_of(p.name, p.account), risk_tags=tags,
                tainted=tainted, session=caller.session, cluster=cluster)
            pkey = ("policy", self._policy_version, repr(req))
            decision = self._cached(pkey)
            if decision is None:
                decision = policy.decide(req)
                self._remember(pkey, decision)
            rule = decision.rule
            if not decision.allowed and decision.ask:
                return self._asked(caller, action, decision.rule, decision.ask)
            if not decision.allowed:
                nearest = self._cached(("nearest", pkey))
                if nearest is None:  # asked of the policy once per distinct refusal, not per retry
                    nearest = refusal_nearest(policy, req)
                    self._remember(("nearest", pkey), nearest)
                said, ask, fits = nearest
                refusal = Forbidden(
                    f"the facility policy denies {action}: rule '{decision.rule}'" + (f": {said}" if said else "")
                    + (f" (risk tags: {', '.join(tags)})" if tags and not said else "")
                    + (" (this session read content flagged as possible prompt injection)" if tainted else ""),
                    hint=f"ask for {ask}, or ask your sponsor or the facility for more" if ask else
                    "see 'corral policy explain' (the same flags as submit) for why; "
                    "ask your sponsor or the facility if this is wrong")
                refusal.nearest = fits or None
                raise refusal
        except CorralError as e:
            e.rule, e.tags = rule, tags
            raise
        return rule

    def refuses_at(self, p: Principal, spec: JobSpec, cluster: str) -> str | None:
        """Why the policy refuses ``p``'s job on ``cluster`` (None: it allows), asked with no
        request in hand: a pending job weighed for a move (control/rebalance.py). Only the
        policy: the token's caveats were checked when the job was submitted."""
        req = Request(kind=p.kind.value, name=p.name, action="submit", resource=job_resource(spec, p.name),
                      sponsor=p.sponsor, account=p.account, unix_user=p.unix_user, admin=p.is_admin,
                      groups=self.settings.policy_groups_of(p.name, p.account),
                      risk_tags=self.risk_tags(job_text(spec)), cluster=cluster)
        decision = self._fresh_policy().decide(req)
        if not decision.allowed:
            return f"the facility policy denies it there: rule '{decision.rule}'"
        return self.over_budget_at(p, spec, cluster)

    def over_budget_at(self, p: Principal, spec: JobSpec, cluster: str) -> str | None:
        """Whether the job would pass its sponsor's budget on ``cluster`` ([safety]
        cluster_budgets: a person and their agents together); None: within it."""
        limits = self.settings.cluster_budgets.get(cluster)
        if not limits:
            return None
        sponsor = p.sponsor if p.kind is Kind.AGENT and p.sponsor else p.name
        cpu_s, gpu_s = self.db.safety.used_on(cluster, [sponsor, *self.db.sponsored_by(sponsor)])
        for key, used, want, what in (("cpu_hours", cpu_s, spec.cpus * spec.walltime_s, "CPU"),
                                      ("gpu_hours", gpu_s, spec.gpus * spec.walltime_s, "GPU")):
            if key in limits and (used + want) / 3600 > limits[key]:
                return (f"{sponsor}'s {what}-hour budget on cluster {cluster}: {used / 3600:.2f} of "
                        f"{limits[key]:.2f} h used or reserved, and this asks {want / 3600:.2f} h more")
        return None

    def _asked(self, caller: Caller, action: str, rule: str, who: str) -> str:
        """A rule that asks a person: allowed when this is the approved action being carried
        out (``APPROVED``) or the sponsor approved the rule ahead for this session; else
        ApprovalNeeded, which the verb turns into its action waiting for that person
        (gateway/approvals.py); a verb that cannot wait (a read) lets it through as a refusal."""
        if rule in APPROVED.get():
            return f"{rule}:approved"
        by = self.db.approvals.allowed(caller.name, caller.session, rule, self.clock.time())
        if by is not None:
            return f"{rule}:approved-ahead-by-{by}"
        raise ApprovalNeeded(f"the facility policy's rule '{rule}' asks your {who} to approve {action}",
                             hint=f"your {who} can approve this rule ahead for your session (corral approvals "
                                  f"ahead {caller.name} --session {caller.session or 'SESSION'} --rule {rule})",
                             rule=rule)

    def check_status(self, caller: Caller) -> None:
        """``check`` for reading jobs, at the rate agents poll: the answer for a token,
        session and taint is reused for a few seconds. (So a status rule may not look at
        the job; the default policy's do not.)"""
        key = ("status", caller.token_id, caller.session, self.tainted(caller))
        if self._cached(key):
            return
        self.check(caller, "status", "Job", {"owner": caller.name})
        self._remember(key, True, ttl=5.0)

    def api_call(self, caller: Caller) -> None:
        """One request of a rate-limited kind of principal: per principal and per session."""
        s = self.settings
        if caller.principal.kind.value not in s.rate_limit_kinds or s.rate_api_per_s <= 0:
            return
        wants = [(f"api:{caller.name}", 1.0, s.rate_api_per_s, s.rate_api_burst, f"API calls of {caller.name}")]
        if caller.session:
            wants.append((f"api:{caller.name}:{caller.session}", 1.0, s.rate_api_per_s, s.rate_api_burst,
                          f"API calls of session {caller.session}"))
        self.buckets.take_all(wants, self.clock.monotonic())

    def admit(self, caller: Caller, specs: list[JobSpec], take: bool = True) -> None:
        """Rates, budgets and concurrency for ``specs`` about to be submitted together.
        Raises RateLimited (retry later) or Forbidden (a budget is spent). ``take``: the
        rates spent, in the store's transaction (joined if one is open: the caller's insert
        of the jobs belongs in it), under the principal's hold there, so that every
        replica's admissions of one principal take turns and none reads usage another has
        not yet recorded (decision 0043). ``take=False``: the answer only (a plan)."""
        wants, counted = self._wants(caller, len(specs)), self._counted(caller)
        try:
            if not take:
                self._within(caller, specs)
                if wants:
                    take_stored(self.store.buckets([w[0] for w in wants]), wants, self.clock.time())
                return
            if not wants and not counted:
                return  # nothing limits this caller: no lock, no read
            with self.store.db.transaction():
                self.store.hold(caller.name)
                self._within(caller, specs)
                if wants:
                    now = self.clock.time()
                    rows = take_stored(self.store.buckets([w[0] for w in wants]), wants, now)
                    self._reserved += 1
                    self.store.set_buckets(rows, now - FORGET_S if self._reserved % 1000 == 0 else None)
        except CorralError as e:
            e.rule = "rate-limit" if isinstance(e, RateLimited) else "budget"
            raise

    def _wants(self, caller: Caller, n: int) -> list[Want]:
        """The submission buckets a batch of ``n`` takes from: its principal's and session's,
        and each token block's that sets ``submits_per_min``."""
        s = self.settings
        wants: list[Want] = []
        if caller.principal.kind.value in s.rate_limit_kinds and s.rate_submit_per_min > 0:
            rate, burst = s.rate_submit_per_min / 60, s.rate_submit_burst
            wants.append((f"sub:{caller.name}", n, rate, burst, f"submissions of {caller.name}"))
            if caller.session:
                wants.append((f"sub:{caller.name}:{caller.session}", n, rate, burst,
                              f"submissions of session {caller.session}"))
        cap = caller.cap
        for block, limits in zip(cap.block_ids if cap else (), cap.limits if cap else ()):
            if "submits_per_min" in limits:
                per_min = limits["submits_per_min"]
                wants.append((f"tok:{block}", n, per_min / 60, max(1, per_min),
                              f"submissions allowed by token block {block}"))
        return wants

    def _counted(self, caller: Caller) -> bool:
        """Whether ``_within`` reads anything: an agent's active cap, or a token block's budget or cap."""
        if caller.principal.kind is Kind.AGENT and self.settings.agent_max_active_jobs > 0:
            return True
        return any({"budget_cpu_s", "budget_gpu_s", "max_active_jobs"} & set(limits)
                   for limits in (caller.cap.limits if caller.cap else ()))

    def _within(self, caller: Caller, specs: list[JobSpec]) -> None:
        """The caller's active jobs and its token blocks' budgets, read from the store, with
        ``specs`` added: raises the first limit they would pass."""
        s, n = self.settings, len(specs)
        if caller.principal.kind is Kind.AGENT and s.agent_max_active_jobs > 0:
            active = self.store.active(caller.name)
            if active + n > s.agent_max_active_jobs:
                raise RateLimited(f"{caller.name} has {active} unfinished jobs; the facility allows an agent "
                                  f"{s.agent_max_active_jobs} at once", retry_after=30.0,
                                  hint="wait for some to end (corral wait), then submit again")
        cap = caller.cap
        paths = [cap.block_ids[: i + 1] for i in range(len(cap.block_ids))] if cap else []
        cpu_s = sum(x.cpus * x.walltime_s for x in specs)
        gpu_s = sum(x.gpus * x.walltime_s for x in specs)
        for ids, limits in zip(paths, cap.limits if cap else ()):
            if not {"budget_cpu_s", "budget_gpu_s", "max_active_jobs"} & set(limits):
                continue
            used_cpu, used_gpu, active = self.store.used("/".join(ids))
            for key, used, want, what in (("budget_cpu_s", used_cpu, cpu_s, "CPU"), ("budget_gpu_s", used_gpu, gpu_s, "GPU")):
                if key in limits and used + want > limits[key]:
                    raise Forbidden(
                        f"{what}-hour budget of token block {ids[-1]}: {used / 3600:.2f} of {limits[key] / 3600:.2f} h "
                        f"used or reserved, and this asks {want / 3600:.2f} h more (reserved at walltime x {what}s)",
                        hint="ask for less walltime or fewer CPUs/GPUs, or ask your sponsor for a new budget")
            if "max_active_jobs" in limits and active + n > limits["max_active_jobs"]:
                raise RateLimited(f"token block {ids[-1]} allows {limits['max_active_jobs']} unfinished jobs at "
                                  f"once and has {active}", retry_after=30.0,
                                  hint="wait for some to end (corral wait), then submit again")


def budgets(store: Any, cap: Any) -> list[dict[str, Any]]:
    """What the caller's token limits, block by block, with what is used (or reserved)
    and what remains: the figures ``admit`` checks, as an agent should read them."""
    out: list[dict[str, Any]] = []
    if cap is None:
        return out
    for i, limits in enumerate(cap.limits):
        if not limits:
            continue
        ids = cap.block_ids[: i + 1]
        used_cpu, used_gpu, active = store.used("/".join(ids))
        row: dict[str, Any] = {"block": ids[-1]}
        for key, used, unit in (("budget_cpu_s", used_cpu, "cpu_hours"), ("budget_gpu_s", used_gpu, "gpu_hours")):
            if key in limits:
                row[unit] = {"limit": round(limits[key] / 3600, 3), "used": round(used / 3600, 3),
                             "left": round(max(0.0, limits[key] - used) / 3600, 3)}
        if "max_active_jobs" in limits:
            row["active_jobs"] = {"limit": limits["max_active_jobs"], "now": active}
        if "submits_per_min" in limits:
            row["submits_per_min"] = limits["submits_per_min"]
        out.append(row)
    return out


def _content_key(text: str) -> str:
    """What the tag cache knows a text by."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
