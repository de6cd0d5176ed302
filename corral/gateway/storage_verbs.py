"""The storage verbs the service calls (``service.storage``): environment images,
workspaces, and what a job's spec becomes once its image and workspace are resolved.

A verb that changes something (fork, commit, discard, build) passes the gate as submit
does: the token's caveats, then the facility policy with the session's taint, each verb
its own action (``workspace_fork``, ``workspace_commit``, ``workspace_discard``,
``env_build``); the decision is audited before the act, then what it did (``done``), or
a refusal or a failure.
Reading (list, show, diff, an image's status) is checked as ``status``.

Resolution happens in a worker thread (it may mount): a job naming ``image`` gets the
image mounted on this node, its ``bin`` first on PATH and VIRTUAL_ENV set, and labels
that let a Slurm job mount it on its own node; a job naming ``workspace`` runs in the
workspace's merged view, mounted here for a job of this machine, or by a Slurm job's
batch script on its node (labels name the layers), one job of a workspace at a time and
never in the fast lane (docs/decisions/0036-workspaces-on-nodes.md). A session past its
metadata budget must use one or the other.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral.core.config import StorageSettings
from corral.core.errors import Forbidden, InvalidRequest
from corral.core.jobs import JobSpec
from corral.core.principals import Caller
from corral.storage import IMAGE_AT, IMAGE_FILE, IMAGE_KEY, META_LABEL, OWN_LABELS, WS_DIR, WS_LOWER, meta
from corral.gateway.approvals import Asking, not_asking
from corral.gateway.images import Images
from corral.storage.workspaces import Workspaces

if TYPE_CHECKING:
    from corral.control.metrics import Metrics
    from corral.control.intake import Intake
    from corral.core.db import Database
    from corral.core.identity import Identity
    from corral.lanes.registry import Lanes
    from corral.safety.audit import Audit
    from corral.safety.gate import Gate
    from corral.sandbox.bwrap import Sandbox

log = logging.getLogger(__name__)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
SCRATCH_DIRS = ("workspaces", "trees", "uv-cache", "envbuild")
"""Scratch's directories the sandbox hides (each trial's own is bound back)."""
WORKSPACE_DIRS = SCRATCH_DIRS[:2]
"""The workspaces' own, in [storage] workspaces where the admin named one."""


def scratch_dir(settings: StorageSettings, home: Path) -> Path:
    """Node-local scratch: never under HOME (jobs see HOME's contents as empty). Where it
    really lies: paths in it are walked without following links, and hidden by bwrap."""
    if settings.scratch is not None:
        return Path(os.path.realpath(settings.scratch))
    return Path(os.path.realpath("/var/tmp")) / f"corral-{hashlib.sha256(str(home).encode()).hexdigest()[:10]}"


def workspaces_dir(settings: StorageSettings, home: Path) -> Path:
    """Where workspaces' layers and forked trees lie (its WORKSPACE_DIRS): [storage]
    workspaces, shared with the nodes on a cluster, else scratch."""
    if settings.workspaces is not None:
        return Path(os.path.realpath(settings.workspaces))
    return scratch_dir(settings, home)


class StorageVerbs:
    def __init__(self, settings: StorageSettings, home: Path, db: "Database", lanes: "Lanes", intake: "Intake",
                 audit: "Audit", gate: "Gate", sandbox: "Sandbox | None" = None, metrics: "Metrics | None" = None,
                 owner: "Callable[[Caller], Identity | None] | None" = None) -> None:
        self.settings, self.db, self.lanes, self.audit, self.metrics = settings, db, lanes, audit, metrics
        self.gate = gate
        self.asking: Asking = not_asking
        """Where a rule that asks the sponsor holds a workspace's change (ApprovalVerbs.asking)."""
        self.scratch = scratch_dir(settings, home)
        self.store = db.storage
        self.images = Images(settings, home, self.scratch, db, self.store, lanes, intake, owner, sandbox, gate.admit)
        hidden = (lambda c: sandbox.hidden_from(c.principal.kind.value, c.principal.unix_user)) \
            if sandbox is not None else (lambda c: [])
        # On Slurm a job runs on a node, which mounts its workspace itself (a mount is one kernel's).
        self.on_nodes = lanes.batch.kind == "slurm"
        self.workspaces = Workspaces(settings, workspaces_dir(settings, home), self.store, hidden,
                                     owner or (lambda c: None), self.on_nodes)
        self.shared = [os.path.normpath(str(p)) for p in settings.shared_paths]
        self.pending: set[asyncio.Task[None]] = set()

    # -- images -------------------------------------------------------------------------

    def _decide(self, caller: Caller, action: str, rtype: str, resource: dict[str, Any], audited: str,
                facts: dict[str, Any]) -> str:
        """The gate on one storage verb (token caveats, policy, taint), its allow recorded
        before the act (what the act did follows as ``done``); a refusal raises (recorded by
        the caller's ``refusals``). -> the rule that allowed."""
        rule = self.gate.check(caller, action, rtype, {"owner": caller.name, **resource})
        self.audit.record(caller, audited, "allow", rule, [facts])
        return rule

    async def env_build(self, caller: Caller, files: dict[str, str], name: str | None = None,
                        rebuild: bool = False) -> dict[str, Any]:
        content = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:32]
        facts = {"files": sorted(files), "content": content, "name": name, "rebuild": rebuild}
        with self.audit.refusals(caller, "env.build", facts):
            rule = self._decide(caller, "env_build", "Environment", {"files": sorted(files)}, "env.build", facts)
            out = await self.images.request(caller, files, name, rebuild, rule)
        self.audit.record(caller, "env.build", "done", rule, [{"digest": out["digest"], "state": out["state"],
                                                               "job_id": out.get("job"), "image": out.get("image")}])
        return out

    async def env_status(self, caller: Caller, ref: str) -> dict[str, Any]:
        self.gate.check_status(caller)
        return await asyncio.to_thread(self._status, caller, ref)

    def _status(self, caller: Caller, ref: str) -> dict[str, Any]:
        if self.images._request_row(ref) is not None:  # a build request's digest (find refreshes for the rest)
            self.images.refresh()
            return self.images.status_of(ref)
        return {**self.images.describe(self.images.find(ref, caller)), "state": "ready"}

    async def env_list(self, caller: Caller) -> list[dict[str, Any]]:
        self.gate.check_status(caller)
        return await asyncio.to_thread(self.images.listing)

    async def env_gc(self, caller: Caller, older_than_s: float | None, only: str | None,
                     dry_run: bool) -> list[str]:
        with self.audit.refusals(caller, "env.gc", {"only": only, "dry_run": dry_run}):
            if not caller.principal.is_admin:
                raise Forbidden("only the facility's admin collects images", rule="admin-only")
            self.gate.check(caller, "manage", "Facility", {})  # an admin's token narrowed away from manage
            keys = await asyncio.to_thread(self.images.gc, older_than_s, only, dry_run)
        self.audit.record(caller, "env.gc", "allow", "admin", [{"collected": keys, "dry_run": dry_run}])
        return keys

    # -- workspaces ---------------------------------------------------------------------

    async def workspace(self, caller: Caller, verb: str, **args: Any) -> Any:
        """fork, diff, commit, discard, list, show: each off the event loop, changes audited."""
        verbs: dict[str, Callable[..., Any]] = {"fork": self.workspaces.fork, "diff": self.workspaces.diff,
                                  "commit": self.workspaces.commit, "discard": self.workspaces.discard,
                                  "list": self.workspaces.listing, "show": self.workspaces.describe}
        fn = verbs[verb]
        if verb in ("diff", "list", "show"):
            self.gate.check_status(caller)
            return await asyncio.to_thread(fn, caller, **args)
        with self.audit.refusals(caller, f"workspace.{verb}", args):
            base = args.get("base") if verb == "fork" else \
                (await asyncio.to_thread(self.workspaces._row, caller, args["ws_id"]))["base"]
            with self.asking(caller, f"workspace_{verb}", args, f"{verb} workspace "
                             + str(args.get("ws_id") or args.get("base")) + (f" into {base}" if verb == "commit" else "")):
                rule = self._decide(caller, f"workspace_{verb}", "Workspace", {"base": str(base or "")},
                                    f"workspace.{verb}", {**args, "base": base})
            out = await asyncio.to_thread(fn, caller, **args)
        self.audit.record(caller, f"workspace.{verb}", "done", rule,  # what the act did (a commit: the files)
                          [{k: out.get(k) for k in ("workspace", "base", "state", "added", "modified", "deleted")
                            if k in out}])
        return out

    # -- jobs ---------------------------------------------------------------------------

    def _may_use(self, caller: Caller, key: str) -> None:
        """Another principal's image runs its builder's code in the caller's job: it is
        reached only by naming it (OWNER/NAME or its key; a bare name is the caller's own,
        Images.find) and only when the policy allows ``env_use`` of it (its owner is the
        builder). One's own, one's agents' and corral's are one's own to use."""
        row = self.images.store.image(key)
        builder = row[3] if row is not None else None
        if builder is None or caller.sees(builder):
            return
        self.gate.check(caller, "env_use", "Environment", {"owner": builder, "files": []})

    def applies(self, spec: JobSpec) -> bool:
        """Whether ``resolve`` has anything to do (a worker thread hop) for this spec."""
        return bool(spec.image or spec.workspace or any(k in OWN_LABELS for k in spec.labels)) or \
            (bool(self.shared) and (self.settings.meta_sample > 0 or self.settings.session_meta_budget > 0))

    def resolve(self, caller: Caller, spec: JobSpec) -> JobSpec:
        """The spec as it will run, decided before the policy sees it, with no side effect
        (``prepare`` mounts, once the job is allowed). Reads the disk: in a worker thread."""
        own = [k for k in spec.labels if k in OWN_LABELS]
        if own:
            raise InvalidRequest(f"the label {own[0]!r} is corral's own; name the image with 'image' (or env: NAME)")
        update: dict[str, Any] = {}
        labels = dict(spec.labels)
        if not spec.image and not spec.workspace:
            self._check_budget(caller)
        if spec.workspace:
            path = self.workspaces.path(caller, spec.workspace, mount=False)
            if spec.workdir and spec.workdir != path and not spec.workdir.startswith(path + "/"):
                raise InvalidRequest(f"a job of workspace {spec.workspace} runs inside it ({path}); leave out "
                                     "workdir, or give a directory inside the workspace")
            update["workdir"] = spec.workdir or path
            if self.on_nodes:
                update["lane"] = self._one_node(spec)
                d, lower = self.workspaces.on_node(caller, spec.workspace)
                labels.update({WS_DIR: d, WS_LOWER: lower})
        if spec.image:
            key = self.images.find(spec.image, caller)
            self._may_use(caller, key)
            at = str(self.images.mounts / key)  # mounted or unpacked, there
            env = dict(spec.env)
            env["PATH"] = f"{at}/bin:{env.get('PATH') or DEFAULT_PATH}"
            env["VIRTUAL_ENV"] = at
            env.pop("PYTHONHOME", None)
            update["env"] = env
            labels.update({IMAGE_KEY: key, IMAGE_FILE: str(self.images.images_dir / f"{key}.sqsh"), IMAGE_AT: at})
        if self.shared and self.settings.meta_sample > 0 and random.random() < self.settings.meta_sample:
            labels[META_LABEL] = "1"
        if labels != spec.labels:
            update["labels"] = labels
        return spec.model_copy(update=update) if update else spec

    def _one_node(self, spec: JobSpec) -> str:
        """A workspace used on a cluster's nodes: its batch job mounts it on its node, so it
        runs in the batch lane (a fast-lane worker mounts nothing), and after every live job
        of the workspace (one upper layer mounted on two machines at once is undefined:
        each would miss, or corrupt, what the other writes). -> the lane."""
        assert spec.workspace is not None
        if spec.lane == "fast":
            raise InvalidRequest(f"a job of workspace {spec.workspace} runs in the batch lane on this cluster (its "
                                 "batch script mounts the workspace on the node it runs on; a fast-lane worker "
                                 "does not)", hint="submit it with lane 'batch', or leave the lane out")
        waits = set(spec.after_ok or ()) | set(spec.after_any or ())
        live = [j for j in self.store.jobs_in_workspace(spec.workspace) if j not in waits]
        if live:
            raise InvalidRequest(
                f"job{'s' if len(live) > 1 else ''} {', '.join(map(str, live[:10]))} of workspace {spec.workspace} "
                f"{'have' if len(live) > 1 else 'has'} not ended: on this cluster a workspace is mounted on one node "
                "at a time, by the job running in it, so its jobs run one after another",
                hint=f"submit with after_any: {live[:10]} to run when they end, or fork another workspace for work "
                     "in parallel (corral workspace fork)")
        return "batch"

    def prepare(self, caller: Caller, specs: list[JobSpec]) -> None:
        """Allowed jobs' images mounted on this node (each checked whole the first time:
        a corrupt one is refused here, before anything is recorded) and their workspaces'
        overlays mounted again if this node lost them. Blocking: in a worker thread."""
        named = [s.workspace for s in specs if s.workspace]
        twice = sorted({w for w in named if named.count(w) > 1})
        if self.on_nodes and twice:  # one job of a workspace at a time (_one_node); a sweep meets the node's lock
            raise InvalidRequest(f"this submission runs {named.count(twice[0])} different jobs in workspace "
                                 f"{twice[0]} at once; on this cluster a workspace is mounted on one node at a time, "
                                 "by the job running in it", hint="submit them one after another (after_any), or "
                                 "fork a workspace for each")
        for key in dict.fromkeys(s.labels[IMAGE_KEY] for s in specs if s.labels.get(IMAGE_KEY)):
            self.images.attach(key)
        for ws in dict.fromkeys(s.workspace for s in specs if s.workspace):
            self.workspaces.path(caller, ws)

    def needs(self, specs: list[JobSpec]) -> bool:
        return any(s.image or s.workspace for s in specs)

    def _check_budget(self, caller: Caller) -> None:
        budget = self.settings.session_meta_budget
        if not budget or not self.shared or caller.session is None:
            return
        used = self.session_ops(caller.principal.name, caller.session)
        if used >= budget:
            raise Forbidden(f"session {caller.session} has made {used} file-metadata operations on the shared "
                            f"filesystem (its budget is {budget}); run its next jobs from an environment image "
                            "(image: NAME, built with corral env build requirements.txt) or in a workspace "
                            "(workspace: ID, from corral workspace fork DIR)", rule="metadata-budget")

    def session_ops(self, principal: str, session: str) -> int:
        return self.store.session_ops(principal, session)

    def job_ops(self, job_id: int) -> dict[str, Any] | None:
        r = self.store.job_ops(job_id)
        if r is None:
            return None
        return {"calls": r[0], "on_shared_paths": r[1], "by_call": r[2], "shared_paths": self.shared}

    def ended(self, job_ids: list[int]) -> None:
        """Jobs that ended: those traced have their counts read (off the loop) and kept."""
        if not self.shared:
            return
        jobs = [j for j in self.db.get_jobs(job_ids).values()
                if j.terminal and j.spec.labels.get(META_LABEL) and j.backend_id]
        if jobs:  # each counted once, however often its end is heard
            seen = self.store.counted([j.id for j in jobs])
            jobs = [j for j in jobs if j.id not in seen]
        if not jobs:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        def work() -> list[tuple[int, str, str | None, tuple[int, int, dict[str, int]]]]:
            out = []
            for j in jobs:
                try:
                    d = self.lanes[j.backend].output_paths(str(j.backend_id)).stdout.parent
                except Exception:
                    continue
                got = meta.read(d, self.shared)
                if got is not None:
                    out.append((j.id, j.principal, j.session, got))
            return out

        async def account() -> None:
            rows = await asyncio.to_thread(work)
            self.store.add_ops([(jid, p, s, t, sh, by) for jid, p, s, (t, sh, by) in rows])
            if self.metrics is not None:
                for *_, (t, sh, _by) in rows:
                    self.metrics.meta_ops.labels("shared").inc(sh)
                    self.metrics.meta_ops.labels("all").inc(t)
                    self.metrics.meta_jobs.inc()

        task = loop.create_task(account())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def gc_loop(self, every_s: float = 86400.0) -> None:
        """The admin's policy, applied by itself: images unused for ``image_keep_days``
        go, and expired workspaces, once a day (and at start)."""
        while True:
            try:
                keys = await asyncio.to_thread(self.images.gc)
                gone = await asyncio.to_thread(self.workspaces.expire)
                if keys or gone:
                    log.info("storage: collected images %s, expired workspaces %s", keys, gone)
            except Exception:
                log.exception("storage collection failed; it runs again in %.0f s", every_s)
            await asyncio.sleep(every_s)

    def board(self, names: frozenset[str] | None) -> dict[str, Any]:
        """The dashboard's storage panel: images (everyone's, as they are shared), active
        workspaces and the sessions with the most metadata calls on shared paths, of
        ``names`` (None: everyone)."""
        listed = None if names is None else sorted(names)
        images, image_bytes, last_used = self.store.images_summary()
        sessions = [dict(zip(("principal", "session", "jobs", "shared_ops", "ops"), r))
                    for r in self.store.sessions_ops(listed)]
        return {"images": images, "image_bytes": int(image_bytes), "image_last_used": last_used,
                "workspaces": self.store.count_workspaces(listed),
                "budget": self.settings.session_meta_budget or None, "shared_paths": self.shared,
                "sessions": sessions}

    def facility(self, caller: Caller) -> dict[str, Any]:
        out: dict[str, Any] = {"images": str(self.images.images_dir), "scratch": str(self.scratch),
                               "shared_paths": self.shared, "meta_sample": self.settings.meta_sample,
                               "session_meta_budget": self.settings.session_meta_budget or None}
        if caller.session:
            out["session_meta_ops"] = self.session_ops(caller.principal.name, caller.session)
        return out
