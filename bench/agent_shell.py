"""Agents' own shell loops: bare against the private Slurm, and inside `corral agent run`.

    python bench/agent_shell.py [--quick] [--agents 20] [--duration 120]
    python bench/agent_shell.py --agents 10,20,40        # several sizes, one run
    python bench/agent_shell.py --launchers              # and corral with the Python shim launcher
    python bench/agent_shell.py --breakdown              # each turn timed: sbatch, start, run, notice, squeue

Each agent runs the same bash loop for a fixed time, as coding agents do: `sbatch` a
short job (`-t 1`, two seconds of work), poll it with `squeue -h -j $ID` every 2 s until
it has left the queue, `cat` its output file, repeat. Arm A runs it with Slurm's own
commands. Arm B runs the same script under `corral agent run` (its shims first on PATH,
munge hidden when bubblewrap is there) against a gateway on the Slurm backend whose
default lane is `auto`: a short job with a walltime goes to the fast lane. slurmctld's
RPCs come from sdiag, reset before each arm (REQUEST_STATS_INFO, sdiag itself, not
counted). The notice latency is from the job's last line (its own clock at the end)
to the loop seeing it gone.

Needs scripts/slurm-up (SLURM_CONF). Last line: one JSON object (the last --agents
size, every size under "runs").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct, sponsored_agents  # noqa: E402
from bench.control_plane import ENV, sdiag, sh  # noqa: E402

LOOP = r"""
end=$((SECONDS + DURATION))
while [ $SECONDS -lt $end ]; do
  id=$(sbatch --parsable -t 1 --wrap 'sleep 2; date +%s.%N') || { sleep 2; continue; }
  while squeue -h -j "$id" | grep -q .; do sleep 2; done
  seen=$(date +%s.%N)
  echo "$id $(tail -n 1 "slurm-$id.out" 2>/dev/null || echo none) $seen" >> log
done
"""

TIMED = r"""
end=$((SECONDS + DURATION))
while [ $SECONDS -lt $end ]; do
  a=$EPOCHREALTIME
  id=$(sbatch --parsable -t 1 --wrap 'date +%s.%N; sleep 2; date +%s.%N') || { sleep 2; continue; }
  b=$EPOCHREALTIME
  while p=$EPOCHREALTIME; squeue -h -j "$id" | grep -q .; do echo "$id $p $EPOCHREALTIME" >> polls; sleep 2; done
  seen=$EPOCHREALTIME
  echo "$id $p $seen" >> polls
  echo "$id $(tail -n 1 "slurm-$id.out" 2>/dev/null || echo none) $seen $a $b $(head -n 1 "slurm-$id.out" 2>/dev/null || echo none)" >> log
done
"""


def rpcs(counts: dict[str, int]) -> int:
    return sum(n for k, n in counts.items() if k != "REQUEST_STATS_INFO")


def breakdown(dirs: list[Path]) -> dict:
    """Where one turn of the timed loop went (seconds, p50/p90 over every turn of every agent):
    sbatch's own latency, its return to the job's first line (the start), the job's run, its
    end to the loop seeing it gone (notice), the whole turn, each squeue's latency, and how
    many polls a turn took (a turn of N polls sleeps 2 s N-1 times)."""
    phases: dict[str, list[float]] = {k: [] for k in ("sbatch", "to_start", "run", "notice", "turn", "squeue")}
    polls: dict[int, int] = {}
    for d in dirs:
        rows = [line.split() for line in (d / "log").read_text().splitlines()] if (d / "log").exists() else []
        rows = [r for r in rows if len(r) == 6 and "none" not in r]
        for r in rows:
            end, seen, a, b, start = map(float, r[1:])
            for k, v in (("sbatch", b - a), ("to_start", start - b), ("run", end - start), ("notice", seen - end)):
                phases[k].append(v)
        phases["turn"] += [float(n[3]) - float(r[3]) for r, n in zip(rows, rows[1:])]
        seen_polls: dict[str, int] = {}
        for line in (d / "polls").read_text().splitlines() if (d / "polls").exists() else []:
            polled, p0, p1 = line.split()
            phases["squeue"].append(float(p1) - float(p0))
            seen_polls[polled] = seen_polls.get(polled, 0) + 1
        for count in seen_polls.values():
            polls[count] = polls.get(count, 0) + 1
    out = {f"{k}_p{q}_s": round(pct(v, q), 3) for k, v in phases.items() if v for q in (50, 90)}
    return {**out, "turns_by_polls": dict(sorted(polls.items()))}


def run_arm(n: int, duration: float, command: list[str] | None, env_for: list[dict[str, str]] | None,
            timed: bool = False) -> dict:
    root = Path(tempfile.mkdtemp(prefix="corral-agent-shell-"))
    root.chmod(0o777)
    dirs = []
    for i in range(n):
        d = root / f"agent{i}"
        d.mkdir()
        d.chmod(0o777)  # an agent's job may run as another (unprivileged) user in corral's sandbox
        (d / "loop.sh").write_text(TIMED if timed else LOOP)
        dirs.append(d)
    sh("sdiag", "-r")
    t0 = time.monotonic()
    procs = []
    for i, d in enumerate(dirs):
        env = {**ENV, "DURATION": str(int(duration)), **(env_for[i] if env_for else {})}
        argv = (command or []) + ["bash", str(d / "loop.sh")]
        procs.append(subprocess.Popen(argv, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=open(d / "err", "w")))
        time.sleep(0.05)
    for p in procs:
        p.wait(timeout=duration + 300)
    wall = time.monotonic() - t0
    counts = sdiag()
    notice, jobs, failed = [], 0, 0
    for d in dirs:
        log = d / "log"
        for line in log.read_text().splitlines() if log.exists() else []:
            parts = line.split()
            try:
                end, seen = float(parts[1]), float(parts[2])
            except (ValueError, IndexError):
                failed += 1
                continue
            jobs += 1
            notice.append(seen - end)
    errors = sum(1 for d in dirs if (d / "err").exists() and (d / "err").read_text().strip())
    turns = breakdown(dirs) if timed else {}
    if os.environ.get("AGENT_SHELL_KEEP"):
        print(f"kept {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return {"rpc": rpcs(counts), "jobs": jobs, "failed_or_unread": failed, "agents_with_stderr": errors,
            "notice_p50_s": round(pct(notice, 50), 3), "notice_p90_s": round(pct(notice, 90), 3),
            "wall_s": round(wall, 1), "by_type": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:8]),
            **({"breakdown": turns} if timed else {})}


def one_size(n: int, duration: float, launchers: bool = False, timed: bool = False) -> dict:
    bare = run_arm(n, duration, None, None, timed)
    print(f"[{n} agents] bare: {bare}", file=sys.stderr)
    gw = GatewayProcess("--backend", "slurm", env={"SLURM_CONF": ENV["SLURM_CONF"], "CORRAL_DEFAULT_LANE": "auto"})
    try:
        tokens = sponsored_agents(gw, n)
        corral = str(Path(sys.executable).with_name("corral"))
        envs = [{"CORRAL_URL": gw.url, "CORRAL_TOKEN": t, "PATH": f"{Path(sys.executable).parent}:{ENV['PATH']}"}
                for t in tokens]
        inside = run_arm(n, duration, [corral, "agent", "run", "--quiet", "--url", gw.url, "--"], envs, timed)
        with gw.client() as h:
            pilots = len(h.get("/v1/jobs", params={"principal": "fastlane", "limit": 1000}).json()["jobs"])
        print(f"[{n} agents] corral: {inside} (fast-lane allocations: {pilots})", file=sys.stderr)
        py = None
        if launchers:  # the same, with decision 0008's Python launcher instead of the compiled one (0013)
            py = run_arm(n, duration, [corral, "agent", "run", "--quiet", "--url", gw.url, "--"],
                         [{**e, "CORRAL_SHIM_COMPILED": "0"} for e in envs])
            print(f"[{n} agents] corral, Python launcher: {py}", file=sys.stderr)
    finally:
        gw.stop()
    return {"agents": n, "duration_s": duration, "rpc_bare": bare["rpc"], "rpc_corral": inside["rpc"],
            "ratio": round(bare["rpc"] / inside["rpc"], 1) if inside["rpc"] else None,
            "rpc_per_job_bare": round(bare["rpc"] / max(bare["jobs"], 1), 2),
            "rpc_per_job_corral": round(inside["rpc"] / max(inside["jobs"], 1), 2),
            "jobs_bare": bare["jobs"], "jobs_corral": inside["jobs"],
            "notice_p50_s_bare": bare["notice_p50_s"], "notice_p50_s_corral": inside["notice_p50_s"],
            "notice_p90_s_bare": bare["notice_p90_s"], "notice_p90_s_corral": inside["notice_p90_s"],
            "fast_lane_allocations": pilots, "bare": bare, "corral": inside,
            **({"jobs_corral_python_launcher": py["jobs"], "notice_p50_s_corral_python_launcher": py["notice_p50_s"],
                "corral_python_launcher": py} if py else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 agents for 6 s an arm")
    ap.add_argument("--agents", default="20", help="agents, or a comma list of sizes")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds per arm")
    ap.add_argument("--launchers", action="store_true",
                    help="a third arm: corral with the Python shim launcher (decision 0008) instead of the compiled one")
    ap.add_argument("--breakdown", action="store_true",
                    help="time each turn's parts (sbatch, to the job's start, its run, the notice, each squeue)")
    a = ap.parse_args()
    sizes = [8] if a.quick else [int(x) for x in a.agents.split(",")]
    duration = 6.0 if a.quick else a.duration
    if not os.path.exists(ENV["SLURM_CONF"]):
        raise SystemExit("needs the private Slurm: scripts/slurm-up")
    runs = [one_size(n, duration, a.launchers, a.breakdown) for n in sizes]
    last = {k: v for k, v in runs[-1].items() if k not in ("bare", "corral", "corral_python_launcher")}
    # Per size: each arm's loops saw jobs end, and Slurm's controller counted their RPCs
    # (corral's are the ratio's denominator).
    arms = [("bare", "jobs_bare", "rpc_bare"), ("corral", "jobs_corral", "rpc_corral")]
    measured = {f"{r['agents']} agents {arm}": r[jobs] > 0 and r[rpc] > 0 for r in runs for arm, jobs, rpc in arms}
    measured.update({f"{r['agents']} agents corral, Python launcher": r["jobs_corral_python_launcher"] > 0
                     for r in runs if "jobs_corral_python_launcher" in r})
    finish("agent_shell", {"bench": "agent_shell", **last, "runs": runs}, measured)


if __name__ == "__main__":
    main()
