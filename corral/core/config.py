"""One typed configuration for the gateway and its clients.

Precedence, highest first: explicit arguments (CLI flags), ``CORRAL_*`` environment
variables, the TOML file (``$CORRAL_CONFIG``, else ``$CORRAL_HOME/corral.toml``),
then the defaults below. An unknown key in the file is refused with the closest valid one
(docs/config.md, written from these declarations by corral/core/config_reference.py, lists them all).

The settings are nested: the gateway's own keys, then a part per component
(``[fastlane]``, ``[slurm]``, ``[memory]``, ``[safety]`` in the file;
``CORRAL_FASTLANE__CPUS`` in the environment), each handed only to what uses it. The flat
spelling of before (``fastlane_cpus``, ``CORRAL_FASTLANE_CPUS``, ``rate_api_per_s``,
``memory = false``) is the same key and still taken.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from corral.core.config_service import HttpSettings, NotifySettings, SigninSettings, StoreSettings
from corral.core.config_service import Part as _Part
from corral.core.errors import InvalidRequest
from corral.core.paths import home_dir
from corral.core.lane_names import BATCH, LaneChoice


__all__ = ["HttpSettings", "NotifySettings", "SigninSettings", "StoreSettings"]  # re-exported: one name to import


def _total_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1024 * 1024))
    except (ValueError, OSError):
        return 4096


class FastLaneSettings(_Part):
    """The fast lane (corral/lanes/fast): handed to it alone."""

    enabled: bool = Field(True, description="Offer the fast lane: warm allocations that run many tiny tasks.")
    host: str | None = Field(None, examples=["login1.cluster.example"], description="Address the pools' schedulers listen on, reachable from the nodes (default: 127.0.0.1 for the local backend, this host's name for Slurm).")
    python: str | None = Field(None, examples=["/opt/corral/bin/python"], description="Python (with corral installed) that allocations run on the nodes; default: the gateway's own.")
    dir: Path | None = Field(None, examples=["/shared/corral/fastlane"], description="Fast-lane task output and journals; on a filesystem the nodes share. Default HOME/fastlane.")
    cpus: int | None = Field(None, ge=1, examples=[16], description="Most CPUs of one fast-lane allocation (default: the partition's largest node, at most 32). Each allocation is sized to the demand it starts for, between min_cpus and this.")
    min_cpus: int = Field(4, ge=1, description="Fewest CPUs of one allocation (bounded by cpus): each allocation is sized to the demand it starts for, between this and cpus. Set it to cpus to keep every allocation at the full shape.")
    memory_mb: int | None = Field(None, ge=64, examples=[65536], description="Memory (MB) of one allocation (default: the partition's largest node).")
    gpus: int = Field(0, ge=0, description="GPUs of one allocation.")
    alloc_walltime_s: int = Field(3600, ge=60, description="Walltime of one allocation (a pilot job).")
    max_task_s: int = Field(600, ge=1, description="Longest walltime a task may ask for in the fast lane; 'auto' sends longer ones to batch.")
    min_allocations: int = Field(0, ge=0, description="Allocations each pool keeps warm even when idle.")
    max_allocations: int = Field(2, ge=1, description="Most allocations one pool holds.")
    max_queued: int = Field(1, ge=1, description="Most allocations of one pool waiting to start at once.")
    idle_s: float = Field(120.0, gt=0, description="An allocation without work this long is released.")
    start_timeout_s: float = Field(300.0, gt=0, description="An allocation whose worker has not joined by then counts as failed.")
    breaker_failures: int = Field(3, ge=1, description="Allocations failing to start in a row that turn a pool's fast lane off.")
    breaker_cooldown_s: float = Field(300.0, gt=0, description="How long a tripped pool stays off.")
    give_back_s: float = Field(10.0, gt=0, description="Longest a batch job waits for cores a fast-lane allocation holds: an allocation idle this long is released for it; a busy one takes no new tasks once the job has waited this long, and is released when its tasks end.")


class SlurmSettings(_Part):
    """The Slurm backend (corral/lanes/slurm/backend.py)."""

    conf: str | None = Field(None, examples=["/etc/slurm/slurm.conf"], description="slurm.conf of the cluster (default: $SLURM_CONF).")
    jobs_dir: Path | None = Field(None, examples=["/shared/corral/jobs"], description="Job scripts and output; on a filesystem the nodes share. Default HOME/slurm/jobs.")
    agent_nice: int = Field(100, ge=0, le=2147483645, description="Nice value for agents' jobs: people keep priority.")
    agent_qos: str | None = Field(None, examples=["agents"], description="QOS for agents' jobs, when the site has one.")
    timeout_s: float = Field(30.0, gt=0, description="Longest wait for one Slurm command.")
    poll_s: float = Field(10.0, gt=0, description="Full squeue poll interval; jobs report their own start and end in between.")
    opportunistic_qos: str | None = Field("agents-opportunistic", description="QOS of agents' opportunistic batch work: preemptible, requeued by Slurm when a person's job needs its cores, reported as one job with its requeue count (docs/decisions/0022). Used where Slurm preempts it (PreemptType=preempt/qos, the QOS exists; scripts/slurm-up sets both); '' turns the tier off.")
    agent_guarantee: float = Field(0.0, ge=0, le=1, description="Share of a partition's CPUs agents' batch jobs hold without preemption (niced, in agent_qos); beyond it they are opportunistic. 0: all of agents' batch work is opportunistic (decision 0009).")
    tighten_walltime: bool = Field(True, description="An opportunistic job whose script completed before at the same resources asks Slurm for its recent runtimes times walltime_margin instead of the agent's walltime, and gets the agent's own back before it reaches that (plan_job and the job's record show both).")
    walltime_margin: float = Field(2.0, ge=1, description="The tightened walltime: the largest of the last walltime_history runtimes times this.")
    walltime_history: int = Field(3, ge=2, le=50, description="Runs of the same script the tightened walltime is taken from (at least 2 needed).")
    walltime_min_s: int = Field(300, ge=60, description="The shortest walltime corral asks of Slurm when it tightens one.")
    submitter: str | None = Field(None, examples=["/usr/local/libexec/corral-submit"], description="A gateway run as a service account: the privileged submitter scripts/privsep-up installed (e.g. /usr/local/libexec/corral-submit), run through `sudo -n`, so each principal with a Unix user has its Slurm jobs run as that user (decision 0021). Unset: they run as the gateway's account. A root gateway needs none.")
    clusters: dict[str, str] = Field(default_factory=dict, examples=[{"cpu": "/etc/slurm-cpu/slurm.conf", "gpu": "/etc/slurm-gpu/slurm.conf"}], description="Several clusters behind one gateway, name -> its slurm.conf: each a batch lane of its own (the first is the default), jobs named by their cluster. Empty: the one cluster of `conf` (decision 0053).")
    placement: Literal["earliest", "cheapest", "blend"] = Field("earliest", description="How a job submitted with cluster 'auto' (or none, with several clusters) is placed: the earliest start Slurm estimates (sbatch --test-only), the fewest SUs, or a blend (SUs plus each hour of waiting at placement_su_per_hour).")
    placement_su_per_hour: float = Field(1.0, ge=0, description="placement = 'blend': the SUs one hour of waiting is worth.")
    preemption_window_s: float = Field(7 * 86400.0, ge=60, description="Several clusters: the window over which slurmdbd's record of the opportunistic QOS (sacct: runs PREEMPTED or REQUEUED, and the hours its runs ran) gives each cluster's preemption rate, for the preemptible tier's expected loss in plan_job's cost and the placement (decision 0064).")
    preemption_min_hours: float = Field(24.0, ge=0, description="Several clusters: the hours the opportunistic QOS's runs must add up to in the window for the measured preemption rate to be used; under it, the cluster's preemption_rate.")
    preemption_rate: dict[str, float] = Field(default_factory=dict, examples=[{"cpu": 0.02}], description="Several clusters: preemptions per hour of an opportunistic job's running, cluster -> rate, where the measured history is thin (preemption_min_hours). Unnamed and thin: 0 (plan_job says 'none').")
    charge: dict[str, dict[Literal["cpu_hour", "gpu_hour"], float]] = Field(default_factory=dict, examples=[{"cpu": {"cpu_hour": 1.0}, "gpu/gpu": {"cpu_hour": 0.5, "gpu_hour": 20.0}}], description="Charge rates in SUs, per 'cluster' or 'cluster/partition' (the more specific wins): cpu_hour and gpu_hour. Unnamed: 1 SU per CPU-hour, 0 per GPU-hour.")

    gateway_address: str | None = Field(None, examples=["10.0.0.1:8765"], description="HOST:PORT where the Slurm nodes reach this gateway's HTTP API (plain HTTP, an address of this host): Slurm's commands inside a contained job (srun, squeue, scontrol, sacct, sinfo) are corral's shims there, reaching the gateway through a relay the job's batch script starts on its node, with a credential of the job's own that reads its principal's jobs while it runs (decision 0057). Unset: srun inside a job still runs its tasks; the other commands say they cannot reach corral.")

    @field_validator("gateway_address")
    @classmethod
    def _gateway_address(cls, v: str | None) -> str | None:
        if v is not None:
            host_port(v)
        return v

    filesystems: dict[str, list[str]] = Field(default_factory=dict, examples=[{"cpu": ["/home", "/scratch"], "gpu": ["/home", "/gpfs"]}], description="Several clusters: the filesystems each cluster's nodes mount, cluster -> path prefixes. A job whose working directory, image or workspace is on none of a cluster's is not placed there (plan_job and a refusal say 'needs data moved'); images and workspaces list the clusters that hold them. A cluster not named sees every path.")
    rebalance_margin_s: float = Field(0.0, ge=0, description="Several clusters: a pending job that allowed it (submitted with movable) is moved to another cluster when Slurm's estimate there (sbatch --test-only) starts it at least this many seconds sooner than where it waits; cancelled there once held, submitted again as the same job, never run twice (decision 0053). 0: never moved.")
    rebalance_every_s: float = Field(60.0, gt=0, description="How often pending jobs are weighed for a move (each weighing asks every cluster's controller one sbatch --test-only per job).")
    rebalance_max_jobs: int = Field(20, ge=1, description="Pending jobs weighed for a move per round, the longest waiting first: bounds the controller RPCs a round costs.")

    @field_validator("clusters")
    @classmethod
    def _cluster_names(cls, v: dict[str, str]) -> dict[str, str]:
        # A cluster's name is its lane's (a job's record names it): never a lane word.
        import re

        for name in v:
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", name) or name in ("fast", "batch", "auto", "local"):
                raise ValueError(f"cluster name {name!r}: lowercase letters, digits and '-', at most 32, "
                                 "not fast, batch, auto or local")
        return v


class MemorySettings(_Part):
    """Memory (corral/memory): outcomes, advice, notes, the facility's facts."""

    enabled: bool = Field(True, description="Remember every job's outcome and advise at submit; refuse exact repeats of deterministic failures (see refuse_repeats).")
    refuse_repeats: bool = Field(True, description="Refuse the exact repeat of a job whose last run failed in a way that repeats, unless it says force.")
    share_account: bool = Field(False, description="Advice also draws on the outcomes of everyone in the same account, not only the submitter's family.")
    facility_paths: dict[str, str] = Field(default_factory=dict, examples=[{"scratch": "/scratch"}], description="Filesystems agents should know, name -> path (e.g. {scratch = '/scratch'}); part of the facility facts.")
    facility_quotas: dict[str, str] = Field(default_factory=dict, examples=[{"home": "20 GB per user"}], description="Storage quotas agents should know, name -> text (e.g. {home = '20 GB per user'}); part of the facility facts.")
    facts_interval_s: float = Field(600.0, gt=0, description="How often the facility facts are harvested again (they are also harvested at start).")
    semantic: bool = Field(True, description="Recall also by meaning: notes are embedded by a small sentence encoder (all-MiniLM-L6-v2, int8, on the CPU) and fused with the BM25 ranking. Off: BM25 alone.")
    embed_model: Path | None = Field(None, examples=["/opt/models/all-MiniLM-L6-v2"], description="A BERT sentence-encoder directory (config.json, model.safetensors, tokenizer.json) to embed notes with. Default: the packaged all-MiniLM-L6-v2.")
    embed_threads: int = Field(1, ge=1, le=64, description="Notes the encoder embeds at once, one CPU thread each (a query takes one).")
    model_cache: Path | None = Field(None, examples=["/var/cache/corral/models"], description="Where the encoder's int8 graph is kept once built (shared by the gateways of one machine). Default ~/.cache/corral/models.")


class SafetySettings(_Part):
    """The gate (corral/safety): the policy, rate limits, caps."""

    policy_file: Path | None = Field(None, examples=["/etc/corral/policy.cedar"], description="The facility policy (Cedar). Default HOME/policy.cedar when it exists, else the packaged default; 'corral policy init' writes a copy to edit.")
    policy_groups: dict[str, list[str]] = Field(default_factory=dict, examples=[{"gpu-users": ["alice", "bot1"]}], description="Groups for the policy, name -> principals (e.g. {gpu-users = ['alice', 'bot1']}): Corral::Group::\"NAME\". Every principal with an account is also in group 'account:ACCOUNT'.")
    rate_limit_kinds: list[str] = Field(["agent"], description="Kinds of principal the rate limits apply to (human, agent, service).")
    rate_api_per_s: float = Field(50.0, ge=0, description="API calls per second per principal and per session (0: no limit).")
    rate_api_burst: float = Field(200.0, ge=1, description="API calls allowed at once above the rate.")
    rate_submit_per_min: float = Field(600.0, ge=0, description="Jobs submitted per minute per principal and per session (0: no limit).")
    rate_submit_burst: float = Field(1000.0, ge=1, description="Jobs that may be submitted at once above the rate (a batch counts each job).")
    cluster_budgets: dict[str, dict[Literal["cpu_hours", "gpu_hours"], float]] = Field(default_factory=dict, examples=[{"gpu": {"gpu_hours": 500.0}}], description="Several clusters: each sponsor's budget on a cluster (the person and their agents together), cluster -> {cpu_hours, gpu_hours}, charged as token budgets are (a live job its walltime, an ended one what it ran). A job that would pass it is not placed there (plan_job says why). Budgets on tokens are facility-wide: every cluster counts (decision 0053).")
    agent_max_active_jobs: int = Field(2000, ge=0, description="Unfinished jobs one agent may have at once (0: no cap).")

    def policy_path(self, home: Path) -> Path:
        """The policy file the gateway reads (and 'corral policy init' writes)."""
        return self.policy_file or home / "policy.cedar"

    def policy_groups_of(self, name: str, account: str | None) -> list[str]:
        groups = [g for g, members in self.policy_groups.items() if name in members]
        return groups + [f"account:{account}"] if account else groups


class SandboxSettings(_Part):
    """Containment of jobs (corral/sandbox/bwrap.py): handed to the backend that runs them."""

    kinds: list[str] = Field(["agent"], description="Kinds of principal whose jobs run in a bubblewrap sandbox (human, agent, service); [] turns the sandbox off. Where it cannot be built, their jobs are refused.")
    network: bool = Field(False, description="Whether sandboxed jobs keep the host's network (default: none, only a private loopback).")
    hide: list[Path] = Field(default_factory=list, examples=[["/etc/site-secrets"]], description="More paths a sandboxed job sees empty, beside the defaults (credentials under every home, munge, Slurm's state, /root, corral's own state). Each must exist.")
    run_as: str = Field("nobody", description="The unprivileged Unix user a sandboxed job runs as when root starts it and its principal has no Unix user of its own.")
    allow_hosts: list[str] = Field(default_factory=list, examples=[["pypi.internal.example:443", "*.mirror.example"]], description="Hosts a sandboxed job without the host's network may reach, through corral's egress proxy: 'host', 'host:port' or '*.domain' (for example the facility's PyPI mirror). Empty: no way out at all.")
    egress_listen: str | None = Field(None, examples=["10.0.0.1:3128"], description="HOST:PORT where the egress proxy also listens, an address of this host that the Slurm nodes reach: a job on a node then reaches the allow-list through a relay its batch script starts there. Unset: only through a Unix socket in corral's state, which connects on this machine alone (a node that is another machine reaches nothing).")
    pids_max: int = Field(512, ge=16, le=1_000_000, description="Most processes and threads one sandboxed job may have at once (a fork bomb stops there).")
    dynamic_uids: tuple[int, int] = Field((61184, 65519), description="The uids a root gateway hands out, one per principal that has no Unix user (nor a sponsor with one), as systemd's DynamicUser does; never reused.")
    uid_registry: Path = Field(Path("/var/lib/corral/uids"), description="The machine-wide record of dynamic uids, shared by every corral install on this machine (root's, 0600 in a 0700 directory), so that two installs never hand out one uid.")
    nss_users: Path | None = Field(Path("/var/lib/extrausers"), description="Where a root gateway writes its dynamic uids as users and groups for NSS (libnss-extrausers' passwd and group files; nsswitch.conf names extrausers), so that Slurm resolves them and an agent's job runs as its own uid, its name in sacct (decision 0063). Empty: not written (its Slurm jobs then start as root and drop to the uid).")
    seccomp: bool = Field(True, description="Whether sandboxed jobs run under corral's system-call filter (no Unix or vsock sockets, no io_uring, no new user namespaces, no keyring).")
    unix_sockets: bool = Field(False, description="Whether sandboxed jobs may open Unix sockets (the filter refuses them by default: a namespace does not hide the host's socket files).")
    file_max: int = Field(16 * 2**30, ge=2**20, description="The largest file a sandboxed job may write, in bytes (its output included); past it the write fails and the job is told why.")
    tmp_max: int = Field(2 * 2**30, ge=2**20, description="The size of a sandboxed job's private /tmp, in bytes (it is memory-backed).")
    output_max: int = Field(4 * 2**30, ge=2**20, description="The most a job of the local backend may write to its stdout and stderr together, in bytes; past it the job is stopped (FAILED) with that reason.")

    @field_validator("egress_listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is not None:
            host_port(v)
        return v

    @field_validator("nss_users", mode="before")
    @classmethod
    def _nss_off(cls, v: object) -> object:
        return None if v == "" else v  # '' in corral.toml or the environment: not written


class StorageSettings(_Part):
    """Environment images, trial workspaces and metadata accounting (corral/storage/)."""

    images_dir: Path | None = Field(None, examples=["/shared/corral/images"], description="The shared store of environment images (one squashfs file each); on a filesystem the nodes share. Default HOME/images.")
    scratch: Path | None = Field(None, examples=["/local/corral"], description="Node-local scratch: images' mount points, unpacked images, build staging, and workspaces' layers unless [storage] workspaces names another directory. Not under HOME, whose contents jobs never see. Default /var/tmp/corral-<hash of HOME>.")
    workspaces: Path | None = Field(None, examples=["/shared/corral/workspaces"], description="Where trial workspaces' layers live (its workspaces/: each one's changes, its overlay's work directory and mount point; its trees/: the revisions forked). On the Slurm backend each job mounts its workspace on the node it runs on, over these layers: a directory every node sees at this path (a shared filesystem) for a workspace to be used on more than one node. Default [storage] scratch.")
    python: str | None = Field(None, examples=["/usr/bin/python3"], description="The Python images are built for (the nodes must have it at the same path). Default /usr/bin/python3 where it exists, else the gateway's base interpreter.")
    index_url: str | None = Field(None, examples=["https://pypi.internal.example/simple"], description="Package index uv resolves and installs from (the facility's PyPI mirror); default uv's (PyPI).")
    build_cpus: int = Field(2, ge=1, description="CPUs of one environment build job.")
    build_memory_mb: int = Field(4096, ge=256, description="Memory (MB) of one environment build job.")
    build_walltime_s: int = Field(3600, ge=60, description="Walltime of one environment build job.")
    build_max_mb: int = Field(20480, ge=16, description="Most MB an installed environment may hold; a larger one is refused when packed.")
    image_keep_days: float = Field(30.0, gt=0, description="An image no job has used for this long is collected by 'corral env gc'.")
    workspace_ttl_s: int = Field(7 * 86400, ge=60, description="A workspace not committed or discarded is dropped this long after it was forked.")
    shared_paths: list[Path] = Field(default_factory=list, examples=[["/home", "/project"]], description="Paths on the shared filesystem whose file-metadata operations corral counts (e.g. ['/home', '/project']).")
    meta_sample: float = Field(0.0, ge=0, le=1, description="Share of batch jobs run under strace to count their metadata operations on shared_paths (0: none; 1: every job). Sampled jobs run slower.")
    session_meta_budget: int = Field(0, ge=0, description="Metadata operations on shared_paths one session's measured jobs may make; past it, its jobs must use an image or a workspace (0: no cap).")


def host_port(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} is not HOST:PORT (for example 10.0.0.1:3128, an address of this host)")
    return host.strip("[]"), int(port)


PARTS: dict[str, type[_Part]] = {"fastlane": FastLaneSettings, "slurm": SlurmSettings, "memory": MemorySettings,
                                 "safety": SafetySettings, "sandbox": SandboxSettings, "storage": StorageSettings,
                                 "http": HttpSettings, "store": StoreSettings,
                                 "notify": NotifySettings, "signin": SigninSettings}


def _flat_names() -> dict[str, tuple[str, str]]:
    """The flat spelling of every part's key (``fastlane_cpus``, ``rate_api_per_s``,
    ``memory``) -> (part, key): what corral.toml and CORRAL_* took before the parts, still
    taken, so a site's file and environment keep working."""
    out: dict[str, tuple[str, str]] = {"fastlane": ("fastlane", "enabled"), "memory": ("memory", "enabled")}
    for part, model in PARTS.items():
        for key in model.model_fields:
            if part == "safety" or key.startswith(("facility_", "facts_")):
                out[key] = (part, key)
            elif key != "enabled":
                out[f"{part}_{key}"] = (part, key)
    return out


class Settings(BaseModel):
    """The gateway's settings: its own keys, then one part per component (``fastlane``,
    ``slurm``, ``memory``, ``safety``), each handed only to what uses it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path = Field(default_factory=home_dir, json_schema_extra={"shown_default": "$CORRAL_HOME, else ./.corral"}, examples=["/var/lib/corral"], description="State directory: database, admin token, logs, job files.")
    host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(8765, ge=0, le=65535, description="Port the gateway listens on (0: any free port).")
    url: str | None = Field(None, examples=["https://corral.cluster.example:8765"], description="Gateway URL for clients; default http://HOST:PORT (https:// with tls_cert).")
    tls_cert: Path | None = Field(None, examples=["/etc/corral/tls/fullchain.pem"], description="The certificate (PEM, with its chain) the gateway serves HTTPS with; needs tls_key. Clients verify it against the system store, or CORRAL_CA_FILE for a site CA.")
    tls_key: Path | None = Field(None, examples=["/etc/corral/tls/privkey.pem"], description="The private key (PEM) of tls_cert; readable by the gateway's account only.")
    insecure: bool = Field(False, description="Listen on an address other than loopback without TLS. Bearer tokens then cross the network in clear: only for a proxy on this host that terminates TLS (docs/deploy.md) or a network no one else reaches. Refused otherwise.")
    personal: bool = Field(False, description="This gateway is one person's own: it runs as her account and serves her and her agents only (`make run` as a plain user sets it). An unprivileged gateway runs every job as its own account, so it refuses to start without this (or, on Slurm, [slurm] submitter), and refuses the job of a principal whose Unix user is someone else (decision 0046).")
    backend: Literal["local", "slurm"] = Field("local", description="Where jobs run: 'local' (processes on this machine) or 'slurm'.")
    tick_s: float = Field(0.5, gt=0, le=60, description="Reconciler interval: one backend status call per tick.")
    max_backoff_s: float = Field(30.0, gt=0, description="Longest pause between ticks while the backend fails.")
    wait_max_s: float = Field(600.0, gt=0, description="Longest long-poll a client may ask of 'wait'.")
    mcp_wait_s: float = Field(50.0, gt=0, le=600, description="Longest an MCP tool call waits before it answers 'not yet, call again', with a cursor or the job to wait on: below the least patient client's tool timeout (Codex stops waiting after 60 s by default; Claude Code moves a call to the background after ~120 s, where its answer can be orphaned).")
    metrics_token: str | None = Field(None, examples=["a-long-random-secret"], description="A secret a Prometheus scraper sends as 'Authorization: Bearer <it>' to see figures per person on /metrics (sponsors' budgets); an admin's token does too. Without either, /metrics shows the facility's totals only.")
    mcp_sessions_per_principal: int = Field(64, ge=1, le=10_000, description="MCP sessions (streamable HTTP) one principal may hold at once, over all its tokens: opening one more closes its oldest. A caller without a token never gets one.")
    mcp_progress_s: float = Field(10.0, gt=0, le=60, description="A waiting MCP tool call sends a progress notification at least this often.")
    mcp_authorization_servers: list[str] = Field(default_factory=list, examples=[["https://login.example/realms/hpc"]], description="The facility's OAuth authorization servers (URLs) that MCP clients may get a token from: published as the /mcp resource's RFC 9728 metadata. Empty: none is published (corral's own tokens, minted by a sponsor, are the way in).")
    local_cpus: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, json_schema_extra={"shown_default": "this machine's cores"}, examples=[8], description="CPU slots of the local backend.")
    local_memory_mb: int = Field(default_factory=_total_memory_mb, ge=64, json_schema_extra={"shown_default": "this machine's memory"}, examples=[16384], description="Memory (MB) of the local backend.")
    local_max_walltime_s: int = Field(7 * 86400, ge=1, description="Longest walltime the local backend accepts.")
    local_keep_days: float = Field(30.0, gt=0, description="How long the local backend keeps an ended job's directory (its output); the job's record stays in the database.")
    audit_segment_mb: float = Field(64.0, gt=0, description="The audit chain's live file is closed as a segment (audit-<first record>.jsonl) once it passes this size; the chain runs on across segments and 'corral audit verify' walks them all. Archive old segments together: verify needs every one.")
    log_level: str = Field("INFO", description="Python logging level of the gateway.")
    log_max_mb: float = Field(10.0, ge=0, description="The gateway rotates HOME/gateway.log itself past this size, keeping 3 (gateway.log.1 ...). 0: never; leave it to logrotate (deploy/corral.logrotate). Either way a log moved away is let go and the file at HOME/gateway.log written again, with no signal.")
    default_lane: LaneChoice = Field(BATCH, description="Lane of a submission that names none: 'batch' (the scheduler), 'fast' (warm pool) or 'auto'.")
    fastlane: FastLaneSettings = Field(default_factory=FastLaneSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    safety: SafetySettings = Field(default_factory=SafetySettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    signin: SigninSettings = Field(default_factory=SigninSettings)

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        """Flat keys (``fastlane_cpus=2``) into their parts; a part given whole stays."""
        if not isinstance(data, dict):
            return data
        flat, out = _flat_names(), {}
        parts: dict[str, dict[str, Any]] = {}
        for key, value in data.items():
            if key in flat and not (key in PARTS and isinstance(value, (dict, BaseModel))):
                part, sub = flat[key]
                parts.setdefault(part, {})[sub] = value
            else:
                out[key] = value
        for part, values in parts.items():
            given = out.get(part)
            base = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
            out[part] = {**base, **values}
        return out

    @field_validator("mcp_authorization_servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.startswith(("https://", "http://")) or len(url) > 2000:
                raise ValueError(f"mcp_authorization_servers: {url[:80]!r} is not an http(s) URL")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> "Settings":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both (or neither)")
        return self

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        # Fixed at start: the gateway's cwd must not change what the paths mean later.
        return v.expanduser().resolve()

    @property
    def base_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.home / "corral.db"

    @property
    def store_url(self) -> str:
        """The store to open: ``[store] url``, else the SQLite file in HOME."""
        return self.store.url or str(self.db_path)

    @property
    def replicated(self) -> bool:
        """A PostgreSQL store: replicas may share this home, its jobs and its audit chain
        (gateway/replicas.py); on SQLite one gateway holds the home (serve.lock_home)."""
        return self.store_url.startswith(("postgresql://", "postgres://"))

    @property
    def admin_token_path(self) -> Path:
        return self.home / "admin.token"



def config_file(home: Path | None = None) -> Path:
    explicit = os.environ.get("CORRAL_CONFIG")
    if explicit:
        return Path(explicit)
    return (home or home_dir()) / "corral.toml"


def valid_keys() -> list[str]:
    return sorted({*Settings.model_fields, *_flat_names()})


def unknown_keys(data: dict[str, Any]) -> dict[str, str | None]:
    """Each key of a corral.toml that no setting has -> the closest one that exists
    ('fastlane.cpu' -> 'fastlane.cpus', 'cpus' -> 'fastlane.cpus'), or None: a typo is
    answered with one name to try, not with all of them."""
    import difflib

    dotted = [k for k in Settings.model_fields if k not in PARTS]
    dotted += [f"{p}.{k}" for p, model in PARTS.items() for k in model.model_fields]
    flat = set(valid_keys())
    out: dict[str, str | None] = {}
    for key, value in data.items():
        if key in PARTS and isinstance(value, dict):
            for sub in sorted(set(value) - set(PARTS[key].model_fields)):
                out[f"{key}.{sub}"] = _closest(f"{key}.{sub}", dotted, difflib)
        elif key not in flat:
            out[key] = _closest(key, dotted, difflib)
    return out


def _closest(key: str, names: list[str], difflib: Any) -> str | None:
    # A key written at the top that lives in a table ('cpus') is matched by its last part too.
    exact = [n for n in names if n.rpartition(".")[2] == key.rpartition(".")[2]]
    if len(exact) == 1:
        return exact[0]
    best = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if not best:
        tails = {n.rpartition(".")[2]: n for n in names}
        best = [tails[t] for t in difflib.get_close_matches(key.rpartition(".")[2], list(tails), n=1, cutoff=0.75)]
    return best[0] if best else None


def _from_env() -> dict[str, Any]:
    """CORRAL_<KEY> (flat) and CORRAL_<PART>__<KEY> (nested); other CORRAL_* variables
    (CORRAL_TOKEN, CORRAL_SESSION ...) are the clients', not settings."""
    known = set(valid_keys())
    out: dict[str, Any] = {}
    for name, value in os.environ.items():
        if not name.startswith("CORRAL_"):
            continue
        key = name[len("CORRAL_"):].lower()
        parsed: Any = value
        if value[:1] in "[{":  # lists and tables as JSON
            try:
                parsed = json.loads(value)
            except ValueError:
                pass
        part, _, sub = key.partition("__")
        if sub and part in PARTS:
            out.setdefault(part, {})[sub] = parsed
        elif key in known and key not in PARTS:
            out[key] = parsed
        elif key in ("fastlane", "memory"):  # the flat on/off switches
            out[key] = parsed
    return out


def _merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win, key by key inside each part too."""
    out: dict[str, Any] = {}
    for layer in layers:
        nested = Settings._nest(layer)  # type: ignore[operator]
        for key, value in nested.items():
            out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_settings(**overrides: Any) -> Settings:
    """Settings from file, environment and ``overrides`` (None values are ignored)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    path = config_file(Path(overrides["home"]) if "home" in overrides else None)
    from_file: dict[str, Any] = {}
    if path.is_file():
        try:
            from_file = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise InvalidRequest(f"config file {path} is not valid TOML: {e}") from None
        unknown = unknown_keys(from_file)
        if unknown:
            raise InvalidRequest(
                f"config file {path}: " + "; ".join(f"unknown key '{k}'" + (f": did you mean '{m}'?" if m else "")
                                                    for k, m in unknown.items()),
                hint="every key, with its type, default and meaning: docs/config.md (or 'corral config reference')")
    from_env = _from_env()
    unknown = unknown_keys(from_env)
    if unknown:  # CORRAL_FASTLANE__CPU: a typo in a variable is named as one, with the one meant
        def var(key: str) -> str:
            return "CORRAL_" + key.replace(".", "__").upper()
        raise InvalidRequest("environment: " + "; ".join(
            f"{var(k)} is no setting" + (f": did you mean {var(m)}?" if m else "") for k, m in unknown.items()),
            hint="every key and its variable: docs/config.md (or 'corral config reference')")
    try:
        return Settings(**_merge(from_file, from_env, overrides))
    except ValidationError as e:
        from corral.core.errors import describe_validation

        raise InvalidRequest(f"configuration: {describe_validation(e.errors(), 'settings')}") from None  # type: ignore[arg-type]
