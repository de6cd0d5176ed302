"""One typed configuration for the gateway and its clients.

Precedence, highest first: explicit arguments (CLI flags), ``CORRAL_*`` environment
variables, the TOML file (``$CORRAL_CONFIG``, else ``$CORRAL_HOME/corral.toml``),
then the defaults below. Unknown keys in the file are refused with the list of valid ones.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import InvalidRequest


def _total_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1024 * 1024))
    except (ValueError, OSError):
        return 4096


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="forbid")

    home: Path = Field(Path(".corral"), description="State directory: database, admin token, logs, job files.")
    host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(8765, ge=0, le=65535, description="Port the gateway listens on (0: any free port).")
    url: str | None = Field(None, description="Gateway URL for clients; default http://HOST:PORT.")
    backend: Literal["local", "slurm"] = Field("local", description="Where jobs run: 'local' (processes on this machine) or 'slurm'.")
    tick_s: float = Field(0.5, gt=0, le=60, description="Reconciler interval: one backend status call per tick.")
    max_backoff_s: float = Field(30.0, gt=0, description="Longest pause between ticks while the backend fails.")
    wait_max_s: float = Field(600.0, gt=0, description="Longest long-poll a client may ask of 'wait'.")
    local_cpus: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, description="CPU slots of the local backend.")
    local_memory_mb: int = Field(default_factory=_total_memory_mb, ge=64, description="Memory (MB) of the local backend.")
    local_max_walltime_s: int = Field(7 * 86400, ge=1, description="Longest walltime the local backend accepts.")
    log_level: str = Field("INFO", description="Python logging level of the gateway.")
    slurm_conf: str | None = Field(None, description="slurm.conf of the cluster (default: $SLURM_CONF).")
    slurm_jobs_dir: Path | None = Field(None, description="Job scripts and output; on a filesystem the nodes share. Default HOME/slurm/jobs.")
    slurm_agent_nice: int = Field(100, ge=0, le=2147483645, description="Nice value for agents' jobs: people keep priority.")
    slurm_agent_qos: str | None = Field(None, description="QOS for agents' jobs, when the site has one.")
    slurm_timeout_s: float = Field(30.0, gt=0, description="Longest wait for one Slurm command.")
    slurm_poll_s: float = Field(10.0, gt=0, description="Full squeue poll interval; jobs report their own start and end in between.")
    facility_paths: dict[str, str] = Field(default_factory=dict, description="Filesystems agents should know, name -> path (e.g. {scratch = '/scratch'}); part of the facility facts.")
    facility_quotas: dict[str, str] = Field(default_factory=dict, description="Storage quotas agents should know, name -> text (e.g. {home = '20 GB per user'}); part of the facility facts.")
    facts_interval_s: float = Field(600.0, gt=0, description="How often the facility facts are harvested again (they are also harvested at start).")
    memory: bool = Field(True, description="Remember every job's outcome and advise at submit; refuse exact repeats of deterministic failures (see memory_refuse_repeats).")
    memory_refuse_repeats: bool = Field(True, description="Refuse the exact repeat of a job whose last run failed in a way that repeats, unless it says force.")
    memory_share_account: bool = Field(False, description="Advice also draws on the outcomes of everyone in the same account, not only the submitter's family.")
    default_lane: Literal["batch", "fast", "auto"] = Field("batch", description="Lane of a submission that names none: 'batch' (the scheduler), 'fast' (warm pool) or 'auto'.")
    fastlane: bool = Field(True, description="Offer the fast lane: warm allocations that run many tiny tasks.")
    fastlane_host: str | None = Field(None, description="Address the pools' schedulers listen on, reachable from the nodes (default: 127.0.0.1 for the local backend, this host's name for Slurm).")
    fastlane_python: str | None = Field(None, description="Python (with corral installed) that allocations run on the nodes; default: the gateway's own.")
    fastlane_dir: Path | None = Field(None, description="Fast-lane task output and journals; on a filesystem the nodes share. Default HOME/fastlane.")
    fastlane_cpus: int | None = Field(None, ge=1, description="CPUs of one fast-lane allocation (default: the partition's largest node, at most 32).")
    fastlane_memory_mb: int | None = Field(None, ge=64, description="Memory (MB) of one allocation (default: the partition's largest node).")
    fastlane_gpus: int = Field(0, ge=0, description="GPUs of one allocation.")
    fastlane_alloc_walltime_s: int = Field(3600, ge=60, description="Walltime of one allocation (a pilot job).")
    fastlane_max_task_s: int = Field(600, ge=1, description="Longest walltime a task may ask for in the fast lane; 'auto' sends longer ones to batch.")
    fastlane_min_allocations: int = Field(0, ge=0, description="Allocations each pool keeps warm even when idle.")
    fastlane_max_allocations: int = Field(2, ge=1, description="Most allocations one pool holds.")
    fastlane_max_queued: int = Field(1, ge=1, description="Most allocations of one pool waiting to start at once.")
    fastlane_idle_s: float = Field(120.0, gt=0, description="An allocation without work this long is released.")
    fastlane_start_timeout_s: float = Field(300.0, gt=0, description="An allocation whose worker has not joined by then counts as failed.")
    fastlane_breaker_failures: int = Field(3, ge=1, description="Allocations failing to start in a row that turn a pool's fast lane off.")
    fastlane_breaker_cooldown_s: float = Field(300.0, gt=0, description="How long a tripped pool stays off.")

    policy_file: Path | None = Field(None, description="The facility policy (Cedar). Default HOME/policy.cedar when it exists, else the packaged default; 'corral policy init' writes a copy to edit.")
    policy_groups: dict[str, list[str]] = Field(default_factory=dict, description="Groups for the policy, name -> principals (e.g. {gpu-users = ['alice', 'bot1']}): Corral::Group::\"NAME\". Every principal with an account is also in group 'account:ACCOUNT'.")
    rate_limit_kinds: list[str] = Field(["agent"], description="Kinds of principal the rate limits apply to (human, agent, service).")
    rate_api_per_s: float = Field(50.0, ge=0, description="API calls per second per principal and per session (0: no limit).")
    rate_api_burst: float = Field(200.0, ge=1, description="API calls allowed at once above the rate.")
    rate_submit_per_min: float = Field(600.0, ge=0, description="Jobs submitted per minute per principal and per session (0: no limit).")
    rate_submit_burst: float = Field(1000.0, ge=1, description="Jobs that may be submitted at once above the rate (a batch counts each job).")
    agent_max_active_jobs: int = Field(2000, ge=0, description="Unfinished jobs one agent may have at once (0: no cap).")

    def policy_groups_of(self, name: str, account: str | None) -> list[str]:
        groups = [g for g, members in self.policy_groups.items() if name in members]
        return groups + [f"account:{account}"] if account else groups

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        # Fixed at start: the gateway's cwd must not change what the paths mean later.
        return v.expanduser().resolve()

    @property
    def base_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.home / "corral.db"

    @property
    def admin_token_path(self) -> Path:
        return self.home / "admin.token"


def config_file(home: Path | None = None) -> Path:
    explicit = os.environ.get("CORRAL_CONFIG")
    if explicit:
        return Path(explicit)
    base = home or Path(os.environ.get("CORRAL_HOME", ".corral"))
    return base / "corral.toml"


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
        unknown = set(from_file) - set(Settings.model_fields)
        if unknown:
            raise InvalidRequest(
                f"config file {path} has unknown keys {sorted(unknown)}; valid keys: {sorted(Settings.model_fields)}"
            )
    # Environment beats the file: drop file keys the environment sets.
    for key in list(from_file):
        if f"CORRAL_{key.upper()}" in os.environ:
            from_file.pop(key)
    try:
        settings = Settings(**{**from_file, **overrides})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise InvalidRequest(f"configuration {where}: {first['msg']}") from None
    return settings
