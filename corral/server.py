"""Assembles one gateway from settings: logging, database, backend, service, app."""

from __future__ import annotations

import faulthandler
import os
import logging
import logging.handlers
import signal
import sys

from .api import STOP_DEADLINE_S, create_app
from .backends import Backend
from .backends.local import LocalBackend
from .config import Settings
from .db import Database
from .service import Service

log = logging.getLogger("corral")


def setup_logging(settings: Settings) -> None:
    settings.home.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("corral")
    root.setLevel(settings.log_level.upper())
    root.handlers.clear()
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    filelog = logging.handlers.RotatingFileHandler(settings.home / "gateway.log", maxBytes=10_000_000, backupCount=3)
    filelog.setFormatter(fmt)
    root.addHandler(stream)
    root.addHandler(filelog)


def build_service(settings: Settings) -> Service:
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_path)
    backend: Backend
    if settings.backend == "slurm":
        from .backends.slurm import SlurmBackend

        backend = SlurmBackend(settings.slurm_jobs_dir or settings.home / "slurm" / "jobs", settings.slurm_conf,
                               settings.slurm_agent_nice, settings.slurm_agent_qos, settings.slurm_timeout_s,
                               settings.slurm_poll_s)
    else:
        backend = LocalBackend(settings.home / "local", settings.local_cpus, settings.local_memory_mb,
                               settings.local_max_walltime_s)
    return Service(settings, db, backend)


def serve(settings: Settings) -> None:
    import uvicorn

    setup_logging(settings)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: how to see where a gateway
    # that will not stop (or answer) is stuck, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    service = build_service(settings)
    created = service.accounts.bootstrap_admin()
    app = create_app(service, STOP_DEADLINE_S)
    token_path = settings.admin_token_path.resolve()
    print(f"corral gateway on {settings.base_url}  (API docs: {settings.base_url}/docs)", flush=True)
    where = f"{settings.local_cpus} CPU slots" if settings.backend == "local" else f"SLURM_CONF={settings.slurm_conf or os.environ.get('SLURM_CONF')}"
    print(f"backend: {settings.backend} ({where}); state in {settings.home}", flush=True)
    print(f"admin token {'created' if created else 'kept'} in {token_path} (mode 0600)", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools", timeout_graceful_shutdown=3)
