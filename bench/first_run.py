"""A new user's first minute: a fresh clone, `make run`, until the gateway answers.

    python bench/first_run.py [--quick] [--before REF]

Clones this checkout's HEAD into a temporary directory (so the venv built is the clone's
own, never the shared .venv), runs `make run` there as README says (the relative home
`.corral`; the port from CORRAL_PORT so it clashes with no running gateway), and times
it until /healthz answers. Then `corral --help` and each command's help, through the
clone's installed entry point, and the size of the venv. With --before REF the same for
that commit (e.g. the one before `make run` was split from `make test`), in the same run.

pip and uv read this machine's configured indexes and their caches: figures say what a
second user of the same machine sees; --no-cache measures a cold download from those indexes.
Last line: one JSON object with make_run_s, venv_mb, help_ms (p50 of `corral --help`, wall),
help_cpu_ms (its CPU time: what it costs on a loaded machine too), command_help_max_ms, and
the same keys prefixed before_ for --before.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish, free_port, pct  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def du_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total / 1e6


def cpu_ms(argv: list[str], env: dict[str, str]) -> float:
    """The CPU time (user + system) of one run: what the command costs whatever the load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    timed_ms(argv, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def timed_ms(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True)
    ms = (time.perf_counter() - t) * 1000
    if cp.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({cp.returncode}): {cp.stderr.strip()[:300]}")
    return ms


def first_run(ref: str, runs: int, no_cache: bool) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="corral-first-run-"))
    clone = work / "corral"
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True, text=True,
                             check=True).stdout.strip()
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", sha], check=True)
        port = free_port()
        # The clone's own code and venv only: nothing of the caller's (PYTHONPATH would import
        # the checkout the bench runs from instead of the clone).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CORRAL_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"))}
        env.update(CORRAL_PORT=str(port), XDG_STATE_HOME=str(work / "state"))
        if no_cache:  # both installers: uv does most of the install and keeps a cache of its own
            env["PIP_NO_CACHE_DIR"] = "1"
            env["UV_NO_CACHE"] = "1"
        log = open(work / "make-run.log", "wb")
        t0 = time.perf_counter()
        make = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                if make.poll() is not None:
                    raise SystemExit(f"make run ended ({make.returncode}) before serving: "
                                     f"{(work / 'make-run.log').read_text()[-2000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            make_run_s = time.perf_counter() - t0
            corral = str(clone / ".venv" / "bin" / "corral")
            cenv = {**env, "CORRAL_URL": f"http://127.0.0.1:{port}"}
            timed_ms([corral, "--help"], cenv)  # the page cache warmed, as for every later call
            help_ms = [timed_ms([corral, "--help"], cenv) for _ in range(runs)]
            help_cpu = [cpu_ms([corral, "--help"], cenv) for _ in range(runs)]
            names = json.loads(subprocess.run(
                [str(clone / ".venv" / "bin" / "python"), "-c",
                 "import json, click; from corral.edges.cli.main import cli; ctx = click.Context(cli); "
                 "print(json.dumps(cli.list_commands(ctx)))"], env=cenv, capture_output=True, text=True,
                check=True).stdout)
            per_command = {n: min(timed_ms([corral, n, "--help"], cenv) for _ in range(max(1, runs // 5)))
                           for n in names}
        finally:
            try:
                os.killpg(make.pid, signal.SIGTERM)
            except ProcessLookupError:  # make already ended
                pass
            try:
                make.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(make.pid, signal.SIGKILL)
                make.wait()
        slowest = max(per_command, key=lambda n: per_command[n], default="")
        slowest_ms = per_command.get(slowest, 0.0)
        print(f"{ref}: make run {make_run_s:.1f} s to a serving gateway, venv {du_mb(clone / '.venv'):.0f} MB, "
              f"corral --help p50 {pct(help_ms, 50):.0f} ms, slowest command help {slowest} "
              f"{slowest_ms:.0f} ms", file=sys.stderr)
        return {"make_run_s": round(make_run_s, 1), "venv_mb": round(du_mb(clone / ".venv")),
                "help_ms": round(pct(help_ms, 50)), "help_cpu_ms": round(pct(help_cpu, 50)),
                "command_help_max_ms": round(slowest_ms), "commands": len(per_command),
                "command_help_slowest": slowest}  # type: ignore[dict-item]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 runs of each help (default 20)")
    ap.add_argument("--before", help="also measure this commit, in the same run")
    ap.add_argument("--no-cache", action="store_true", help="pip and uv without their caches (a cold download)")
    args = ap.parse_args()
    runs = 5 if args.quick else 20
    out: dict[str, object] = dict(first_run("HEAD", runs, args.no_cache))
    sides = [""]
    if args.before:
        out.update({f"before_{k}": v for k, v in first_run(args.before, runs, args.no_cache).items()})
        sides.append("before_")
    # Per side: a venv was built, the gateway served, `corral --help` took CPU (its rusage
    # read), and each command's help was timed (a CLI listing no command measures no max).
    finish("first_run", out, {f"{side}{what}": bool(out[f"{side}{key}"]) for side in sides for what, key in (
        ("make run", "make_run_s"), ("venv", "venv_mb"), ("help", "help_cpu_ms"), ("command help", "commands"))})


if __name__ == "__main__":
    main()
