"""``corral doctor``: a host checked before a gateway serves on it (corral/gateway/doctor.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.edges.cli.kit import Ctx, fail

MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "--  "}


@click.command()
@click.option("--home", type=click.Path(path_type=Path), help="The gateway's state directory (env CORRAL_HOME).")
@click.option("--backend", type=click.Choice(["local", "slurm"]), help="Check for this backend (default: the settings').")
@click.pass_obj
def doctor(o: Ctx, home: Path | None, backend: str | None) -> None:
    """Check this host before serving: Slurm, accounting, job_submit.lua, munge, the clock, preemption, bubblewrap,
    user namespaces, seccomp, the dynamic uid range, principals' Unix users in NSS, the store, free disk, TLS.

    Each finding says what to do. Exit 0 when a gateway could serve here (warnings
    included), 1 when something would make it fail, 2 when the settings themselves are
    invalid. Read-only: it submits nothing and resets no counter.

    \b
    Examples:
      corral doctor --backend slurm
      corral --json doctor --home /var/lib/corral      # for scripts: {"ok", "findings": [...]}
    """
    from corral.core.config import load_settings
    from corral.core.errors import InvalidRequest
    from corral.gateway.doctor import run

    try:
        settings = load_settings(home=home, backend=backend)
    except InvalidRequest as e:
        fail(e.message, 2, e.hint)
    findings = run(settings)
    ok = not any(f.status == "fail" for f in findings)

    def human(d: dict[str, Any]) -> str:
        lines = [f"{MARK[f['status']]}  {f['check']}: {f['detail']}" + (f"\n        -> {f['fix']}"
                 if f["fix"] and f["status"] in ("warn", "fail") else "") for f in d["findings"]]
        verdict = "a gateway can serve here" if d["ok"] else "a gateway would fail here: fix each FAIL above"
        return "\n".join([*lines, verdict])

    o.out({"ok": ok, "findings": [f.to_dict() for f in findings]}, human)
    sys.exit(0 if ok else 1)
