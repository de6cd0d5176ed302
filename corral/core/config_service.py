"""The parts of the settings the gateway's own services read (the store, HTTP's bounds,
people's sign-in, notifications), apart from corral/core/config.py to keep each module
small; config.py re-exports them, so ``from corral.core.config import NotifySettings``
still holds and docs/config.md is written from them as before."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Part(BaseModel):
    """One part of the settings: a table of corral.toml, handed only to what reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SigninSettings(Part):
    """How people sign in without an admin (corral/gateway/signin.py, decision 0060): munge, or a local
    socket's peer credentials, mapped by uid to a person; and what a person may mint for their agents."""

    munge: bool = Field(True, description="Take munge credentials at POST /v1/signin/munge (what 'corral login' and a CLI without a token send): a person whose Unix user a principal has signs in as that principal.")
    munge_socket: str | None = Field(None, examples=["/run/munge/munge.socket.2"], description="munged's socket the gateway checks credentials with. Default: the socket slurm.conf's AuthInfo names, else munge's own default.")
    max_age_s: int = Field(60, ge=5, le=600, description="A munge credential older than this (by the time it was made) is refused, whatever munge's own TTL; each one used is remembered in the store this long, so none is taken twice, on any replica.")
    audiences: list[str] = Field(default_factory=list, examples=[["https://corral.cluster.example"]], description="The gateway URLs a credential may name (the URL the person's CLI spoke to): a credential made for another gateway is refused. Default: the gateway's own URL (url, else http(s)://HOST:PORT).")
    socket: Path | None = Field(None, examples=["/run/corral/signin.sock"], description="A Unix socket where a person on this machine signs in by the kernel's peer credentials (SO_PEERCRED), without munge. Unset: no such socket.")
    token_s: int = Field(8 * 3600, ge=60, le=7 * 86400, description="Lifetime of the token a person gets by signing in.")
    link_s: int = Field(120, ge=10, le=3600, description="Lifetime of the one-time dashboard link 'corral dashboard' prints.")
    agent_token_max_s: int = Field(7 * 86400, ge=60, description="The longest lifetime of a token a person (not an admin) mints, for an agent or for themselves.")
    agent_tokens_max: int = Field(5, ge=1, le=1000, description="Live (neither expired nor revoked) tokens one agent may hold from its sponsor at once; past it the sponsor revokes one first.")
    agent_actions: list[str] | None = Field(None, examples=[["submit", "status", "cancel", "read_output"]], description="The actions a person may grant an agent's token; a token minted without --actions gets these. Unset: every action but 'manage'.")


class StoreSettings(Part):
    """Where the gateway keeps its state (corral/core/store/)."""

    url: str | None = Field(None, examples=["postgresql://corral@db.example:5432/corral"], description="The store: 'postgresql://USER@HOST:PORT/DB' for PostgreSQL (production: several gateways, backups, a server an operator already runs), or a SQLite file's path. Default HOME/corral.db, SQLite.")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and "://" in v and not v.startswith(("postgresql://", "postgres://", "sqlite://")):
            raise ValueError(f"store url {v.split('://')[0]}://... is not postgresql:// or a SQLite path")
        return v


class HttpSettings(Part):
    """Bounds on what an HTTP client may make the gateway do before it is authenticated
    (corral/edges/http/bounds.py, corral/edges/http/app.py); see docs/security.md, "Request bounds"."""

    max_header_bytes: int = Field(65536, ge=4096, le=16 * 1024 * 1024, description="Most bytes of a request's line and headers (431 past it).")
    max_headers: int = Field(100, ge=16, le=10_000, description="Most header lines in a request (431 past it).")
    max_body_bytes: int = Field(1024 * 1024, ge=65536, description="Most bytes of a request body, except a batch (413 past it, refused from Content-Length before it is read).")
    max_batch_body_bytes: int = Field(8 * 1024 * 1024, ge=65536, description="Most bytes of the body of POST /v1/jobs/batch (413 past it).")
    unauthenticated_body_bytes: int = Field(65536, ge=1024, description="A body larger than this is parsed only after its token is checked (a bad token: 401 without parsing).")
    max_json_depth: int = Field(32, ge=4, le=500, description="Deepest nesting of arrays and objects in a JSON body (400 past it).")
    header_timeout_s: float = Field(10.0, gt=0, le=3600, description="A request's line and headers must arrive within this many seconds of its first byte, or of the connection (408; an idle new connection is closed).")
    body_timeout_s: float = Field(30.0, gt=0, le=3600, description="A request's body must arrive within this many seconds of its headers (408).")
    keep_alive_s: float = Field(5.0, gt=0, le=3600, description="An idle keep-alive connection is closed after this many seconds.")
    max_connections: int = Field(1024, ge=16, description="Most connections open at once (503 past it); the gateway raises its open-file limit to fit.")
    max_connections_per_client: int = Field(128, ge=1, description="Most connections open at once from one network (a /24, a /64, all of loopback as one; 429 past it). Behind a proxy every client has its address: raise it there.")
    max_unauthenticated_connections: int = Field(256, ge=1, description="Most connections open at once on which no request has authenticated yet (503 past it): the share a flood without a token can hold. Past it, or past any cap, the oldest such connection serving no request is answered and closed for the new one; a connection that has authenticated never is.")
    max_unauthenticated_connections_per_client: int = Field(64, ge=1, description="Most connections from one network on which no request has authenticated yet (429 past it): what a flood from a login node can hold beside its honest agents.")
    max_connections_per_principal: int = Field(64, ge=1, description="Most connections one principal's token keeps from being closed for others; its connections past it count as unauthenticated.")


class NotifySettings(Part):
    """Notifications to sponsors (corral/notify/, docs/notify.md): what a person is told
    when they have not chosen, and how it is delivered."""

    smtp_host: str | None = Field(None, examples=["smtp.cluster.example"], description="SMTP server that email notifications go through. Unset: no email (webhooks only).")
    smtp_port: int = Field(25, ge=1, le=65535, description="Port of smtp_host.")
    smtp_from: str = Field("corral@localhost", examples=["corral@cluster.example"], description="The From: address of email notifications.")
    smtp_starttls: bool = Field(False, description="Upgrade the SMTP connection with STARTTLS (verified against the system store).")
    webhook_hosts: list[str] = Field(default_factory=list, examples=[["ntfy.sh", "*.slack.com", "chat.cluster.example:443"]], description="Hosts a person's webhook may point at: 'host', 'host:port' or '*.domain'. Empty: webhooks are refused (the gateway would otherwise send requests wherever a person says, its own network included).")
    jobs: Literal["all", "failures", "none"] = Field("failures", description="Default for a person who has not chosen: which of their agents' job ends they are told of.")
    budget: bool = Field(True, description="Default: tell a sponsor when an agent's budget crosses 50, 80 and 100%.")
    denials: bool = Field(True, description="Default: tell a sponsor when the policy refuses their agent or taints its token (at most one notification per agent and rule an hour).")
    quiet_hours: str | None = Field(None, examples=["22-07"], description="Default quiet hours, 'HH-HH' in the gateway's local time: what falls inside waits until they end (as one digest).")
    digest: bool = Field(False, description="Default: gather what is due for a person into one message, not one each.")
    retry_max_s: float = Field(3600.0, gt=0, description="Longest pause between tries of a notification that failed (the pause doubles from 5 s).")
    give_up_s: float = Field(86400.0, gt=0, description="A notification not delivered this long after it was made is given up (kept, marked failed).")
    timeout_s: float = Field(5.0, gt=0, le=60, description="Longest one delivery may take.")
    flood_per_hour: int = Field(10, ge=0, examples=[30], description="Messages to one address an hour before the rest is gathered into one digest every 10 minutes (an agent ending a failing job a second made 3,600 an hour); approvals are never held back. 0: no bound.")
    concurrency: int = Field(8, ge=1, le=256, description="Deliveries in flight at once.")
    approval_wait_s: float = Field(86400.0, gt=0, description="How long an action a policy rule asks a sponsor to approve (@ask) waits for the answer; unanswered, it expires (its jobs cancelled, the agent told).")
    slurm_mail: bool = Field(False, description="On the Slurm lane, a person may also choose Slurm's own mail (slurm_mail in their notification choices): their agents' and their own batch jobs are submitted with --mail-user (their email) and --mail-type (END for all job ends, FAIL for failures only), and Slurm's MailProg sends it.")
    idle: bool = Field(True, description="Default: tell a sponsor when an agent's RUNNING job holds its allocation idle (its CPU use below idle_cpu_share of its cores for idle_after_s), once per job; the agent is told too.")
    idle_after_s: float = Field(1800.0, ge=0, description="How long a running job's CPU use is weighed before it is called idle (and how often, at most, it is sampled: a tenth of it, at least 1 s). 0: never (local lane: the job's processes; Slurm: sstat, one call per sample).")
    idle_cpu_share: float = Field(0.05, ge=0, le=1, description="A job whose CPU time over idle_after_s is below this share of its cores' time is idle (sleep infinity, a notebook, a step waiting on input).")
