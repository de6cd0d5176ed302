"""What a shim call costs on the login node beyond Slurm's own command (bench/agent_shell.py,
issue 50 item 4): in an agent's closed loop on a busy node, each millisecond of a call's CPU
becomes many of its latency. The session's helper does once, before it forks, what every
call would otherwise do again in its child; and a call asks the gateway only what it prints.
Against a real gateway (local backend), real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import Gateway

CALLS = r'''
import contextlib, io, json, sys
from corral.edges.shims import dispatch, helper
helper.warm()
before = set(sys.modules)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = [dispatch("sbatch", ["--parsable", "-H", "-t", "1", "--wrap", "true"])]
job = out.getvalue().strip()
with contextlib.redirect_stdout(io.StringIO()):
    rc += [dispatch("squeue", ["-h", "-j", job]), dispatch("scontrol", ["show", "job", job]),
           dispatch("scancel", [job])]
print(json.dumps({"rc": rc, "job": job,
                  "imported": sorted(m for m in set(sys.modules) - before if m.startswith("corral"))}))
'''


def run_calls(gw: Gateway, token: str, cwd: Path, code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], env=gw.env(token), capture_output=True, text=True,
                       timeout=120, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.splitlines()[-1]))


def test_the_helper_imports_before_it_forks_what_the_common_calls_use(
        gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    # Before: sbatch's look for secrets in the exported environment imported
    # corral.safety.secrets (and compiled its patterns) in every call's child.
    got = run_calls(gateway, people["bot1"], agent_dir, CALLS)
    assert got["rc"] == [0, 0, 0, 0] and got["job"].isdigit(), got
    assert got["imported"] == [], got


SQUEUE = r'''
import sys
from corral.edges.shims import dispatch
sys.exit(dispatch("squeue", ["-h", "-j", *sys.argv[1:]]))
'''


def test_a_default_squeue_row_asks_the_gateway_nothing_but_the_job(
        gateway: Gateway, people: dict[str, str], agent_dir: Path) -> None:
    # Before: every field of a row was computed for each column printed, and %a (the
    # account) asks /v1/whoami: each `squeue -h -j $ID` of a loop cost the gateway two requests.
    with gateway.http(people["bot1"]) as h:
        job = h.post("/v1/jobs?hold=true", json={"command": "true", "walltime": 60,
                                                 "workdir": str(agent_dir)}).json()["id"]
    asked = 'corral_requests_total{edge="http",op="whoami"}'
    rows = []
    for extra in ([], ["-o", "%i %a %T"]):  # each a process of its own, as each shim call is
        before = gateway.metric(asked)
        r = subprocess.run([sys.executable, "-c", SQUEUE, str(job), *extra], env=gateway.env(people["bot1"]),
                           capture_output=True, text=True, timeout=120, cwd=agent_dir)
        assert r.returncode == 0, r.stderr
        rows.append((r.stdout.split(), gateway.metric(asked) - before))
    (default, asked_default), (named, asked_named) = rows
    assert default[0] == str(job) and default[-1] == "(JobHeldUser)", rows
    assert asked_default == 0, rows
    # a format that names %a asks, once, and prints the account as before
    assert named[0] == str(job) and named[2] == "PENDING" and named[1] and asked_named == 1, rows
