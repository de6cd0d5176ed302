"""The fast lane's launcher and sandbox hosts alone: CPU per contained task, no gateway,
no engine, no Slurm (issue 40).

    python bench/fast_lane_hosts.py [--quick] [--tasks 1000] [--repeat 3] [--single] [--before auto|none|REV]

One launcher (corral/lanes/fast/launcher.py) with 28 slots and the facility's sandbox
(bwrap, the seccomp filter), ten agents each handing it a batch of ``--tasks``/10
contained ``true`` at once (``--single``: one task per batch, as agents that do not
batch). Reported per burst: the launcher's process CPU (its loop and the callers'
threads) and the sandbox hosts' own CPU apart from their tasks' (a host counts its
reaped tasks as its children). ``--before``: the same, on the commit this branch left
main from (its tree from ``git archive``), alternating. Needs bubblewrap; run as root
the tasks become ``nobody``. --quick: 200 tasks, one burst per side. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import finish  # noqa: E402


def _hosts_cpu() -> dict[str, float]:
    """CPU s of this process's descendants that are sandbox hosts: their own, their tasks'."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            st = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        parents[int(e)], stats[int(e)] = int(f[1]), f
    out = {"hosts": 0.0, "tasks": 0.0}
    for pid, f in stats.items():
        p = pid
        for _ in range(12):
            p = parents.get(p, 0)
            if p == me or p <= 1:
                break
        if p != me:
            continue
        try:
            host = b" -I -S -c " in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if host:
            out["hosts"] += (int(f[11]) + int(f[12])) / tick
            out["tasks"] += (int(f[13]) + int(f[14])) / tick
    return out


def measure(tasks: int, repeat: int, single: bool) -> list[dict[str, float]]:
    from corral.lanes.fast.launcher import Launcher, Slots
    from corral.sandbox.bwrap import build

    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-hosts-", dir="/var/tmp"))
    tmp.chmod(0o777)
    box = build(["agent"], [], False, "nobody", [tmp / "state"], pids_max=512)
    if box.why_not:
        raise SystemExit(f"no sandbox here: {box.why_not}")
    out_dir = tmp / "out"
    out_dir.mkdir()
    out_dir.chmod(0o777)
    la = Launcher(Slots(28, 64000), sandbox=box)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "CORRAL_PRINCIPAL": "agent"}

    def spec(jid: int, who: str) -> dict[str, Any]:
        return {"job_id": jid, "command": "true", "cpus": 1, "memory_mb": 100, "gpus": 0, "walltime_s": 60,
                "env": env, "dir": str(out_dir), "workdir": None,
                "contain": {"kind": "agent", "user": None, "principal": who, "ident": None, "readable": []}}

    def burst(base: int, n: int, one: bool) -> None:
        per = n // 10

        def agent(a: int) -> None:
            ids = range(base + a * per, base + (a + 1) * per)
            if one:
                for j in ids:
                    la.run_batch([spec(j, f"agent{a}")])
            else:
                la.run_batch([spec(j, f"agent{a}") for j in ids])

        threads = [threading.Thread(target=agent, args=(a,)) for a in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    runs = []
    try:
        burst(10**7, 100, False)  # every agent's sandbox built first, as in a warm pool
        for r in range(repeat):
            h0, s0, t0 = _hosts_cpu(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            burst((r + 1) * 10**6, tasks, single)
            wall, s1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            time.sleep(0.05)
            h1 = _hosts_cpu()
            runs.append({"wall_s": round(wall, 3),
                         "launcher_cpu_s": round(s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime, 3),
                         "hosts_own_cpu_s": round(h1["hosts"] - h0["hosts"], 3),
                         "tasks_cpu_s": round(h1["tasks"] - h0["tasks"], 3)})
    finally:
        la.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 tasks, one burst per side")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--single", action="store_true", help="one task per batch")
    ap.add_argument("--before", default="auto", help="the commit to run alternating ('auto': where this branch "
                                                      "left main; 'none': skip)")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.tasks, a.repeat = 200, 1
    if a.measure_only:
        print(json.dumps(measure(a.tasks, a.repeat, a.single)))
        return
    sides = [("this tree", str(ROOT))]
    if a.before != "none":
        from bench.fast_lane import _before_rev, checkout

        sha, env = checkout(_before_rev(a.before))
        sides.append((f"commit {sha}", env["PYTHONPATH"]))
    out: dict[str, list[dict[str, float]]] = {label: [] for label, _ in sides}
    for _ in range(a.repeat):
        for label, tree in sides:
            argv = [sys.executable, str(Path(__file__).resolve()), "--measure-only", "--repeat", "1",
                    "--tasks", str(a.tasks), *(["--single"] if a.single else [])]
            res = subprocess.run(argv, env={**os.environ, "PYTHONPATH": tree}, cwd=tree, capture_output=True,
                                 text=True, check=True)
            run = json.loads(res.stdout.splitlines()[-1])[0]
            out[label].append(run)
            print(f"{label}: {run}", file=sys.stderr)
    # Per side: the launcher spent CPU, and sandbox hosts were found under it (their own
    # CPU or their tasks'): a tree whose hosts the /proc walk does not recognise reads 0.
    finish("fast_lane_hosts", {"bench": "fast_lane_hosts", "tasks": a.tasks, "single": a.single, "runs": out,
                               "load": os.getloadavg()[:2]},
           {**{f"{label} launcher": sum(r["launcher_cpu_s"] for r in runs) > 0 for label, runs in out.items()},
            **{f"{label} hosts": sum(r["hosts_own_cpu_s"] + r["tasks_cpu_s"] for r in runs) > 0
               for label, runs in out.items()}})


if __name__ == "__main__":
    main()
