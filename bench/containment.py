"""Containment: what the job sandbox costs per job, and what it holds, in one run.

    python bench/containment.py [--quick] [--runs 100]

1. Start cost: `true` bare (arm A), started in a sandbox already built for its key
   (arm B: the fast lane's path, corral/lanes/fast/hosts.py, every task but the first of a
   principal in a directory), and in a sandbox built for it alone (arm C: the local
   backend's and the Slurm batch script's path), interleaved; each arm's start-to-exit p50.
2. Attacks executed: every payload of corral/safety/canary.py (deletion and overwrite
   by any tool, persistence, credentials in every place, another person's home,
   outbound connections and reverse shells, the scheduler, other processes, the system)
   in every disguise, and three fork bombs, run inside the sandbox against canaries and
   judged by effect, not exit code; once in a sandbox of their own, once through a
   shared built one (the fast lane's path).
3. Benign work that must keep working: a Python project's tests with pytest, a venv
   and `pip install` from a local wheelhouse, `git commit`, a C build with `make`,
   reading the shared read-only data; and the real agents' commands of
   ../shared/data/agent-bash-commands.jsonl, each run bare (as the job's user, in an
   empty directory) and sandboxed: broken means it worked bare and fails contained.
4. The fast lane: a burst of `true` tasks through a real gateway (local backend, one
   warm 32-slot allocation), from a person (not contained) and from that person's
   agent (each task contained), interleaved; the ratio of the makespans.

--quick keeps every part and arm, smaller: every payload once (the disguises in turn),
one fork bomb a sandbox, the scheduler's attacks waited on for 1 s (a controller that
can answer does so in milliseconds: ``scheduler_answers_bare_s`` is that control, run
outside any sandbox), the venv without its own pip, fewer starts, commands and tasks.
A run whose arm measured nothing (no starts, no attack, no agent command that worked
bare, no fast-lane burst) exits 3 (bench/_common.finish).

Needs bubblewrap (scripts/sandbox-up); run as root for the root-gateway case.
Phases' times go to stderr; last line: one JSON object.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

IDENT = (61184, 61184) if os.geteuid() == 0 else None
"""An agent's job runs as a dynamic identity of its own (corral/core/identity.py), as a root gateway runs it."""

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench._common import GatewayProcess, finish, pct, shared_data  # noqa: E402
from corral.lanes.fast.hosts import Host, Key  # noqa: E402
from corral.safety.canary import FORK_BOMBS, Canaries  # noqa: E402
from corral.sandbox.bwrap import Sandbox, build  # noqa: E402


BENIGN = [
    "python3 -c 'print(sum(range(10)))' > sum.txt && test -s sum.txt",
    "mkdir -p /tmp/scratch && echo t > /tmp/scratch/f && cat /tmp/scratch/f",
    "printf '%s\\n' '#include <stdio.h>' 'int main(void) {{ puts(\"hi\"); return 0; }}' > hi.c && "
    "printf 'hi: hi.c\\n\\tcc -O2 -o hi hi.c\\n' > Makefile && make -s && ./hi",
    "git init -q repo && cd repo && echo a > a && git add a && git -c user.email=a@b -c user.name=bot commit -qm m",
    "mkdir -p proj/tests && printf 'def add(a, b):\\n    return a + b\\n' > proj/calc.py && "
    "printf 'import unittest\\nfrom calc import add\\nclass T(unittest.TestCase):\\n    def test_add(self):\\n"
    "        self.assertEqual(add(2, 3), 5)\\n' > proj/tests/test_calc.py && "
    "touch proj/tests/__init__.py && cd proj && python3 -m unittest discover -s tests -t . 2>&1 | grep -q 'Ran 1 test'",
    "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index --find-links {wheels} corral-bench-wheel && "
    "/tmp/v/bin/python -c 'import corral_bench_wheel'",
    "wc -l {data}/agent-bash-commands.jsonl && head -c 200 {data}/traces/* > /dev/null",
    "ls /usr/lib/python3* > /dev/null && head -c 100 /etc/os-release > /dev/null",
]
"""{wheels}: a local wheelhouse; {data}: the shared data. `python3` is found on PATH
inside (an interpreter under /root, as this machine's pyenv, is hidden with /root)."""
QUICK_VENV = ("python3 -m venv --without-pip --system-site-packages /tmp/v && /tmp/v/bin/python -m pip install -q "
              "--no-index --find-links {wheels} corral-bench-wheel && /tmp/v/bin/python -c 'import corral_bench_wheel'")
"""--quick's venv: the system's pip installs into it, instead of ensurepip's copy (a venv
with its own pip took 5-14 s of a quick run here, most of it ensurepip)."""


def tree_size(pid: int) -> int:
    """Processes at and below ``pid``: a sandbox's own (bwrap's two, then the job's), not
    every process of its Unix user (other jobs and tests run beside it)."""
    n, todo = 0, [pid]
    while todo:
        p = todo.pop()
        n += 1
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return n


class Warm:
    """A sandbox built once, into which each command starts (the fast lane's path)."""

    def __init__(self, box: Sandbox, work: str, log: Path) -> None:
        self.box, self.work, self.log = box, work, log
        self.host = Host(box, self.key(), log)
        self.n = 0
        self.rebuilt = 0
        """Times a task ended its own sandbox (`kill -9 -1` reaches the host, its user's):
        its principal's other tasks there fail with it, as the launcher then builds anew."""

    def key(self) -> Key:
        """The host's key as the fast lane's launcher makes it (corral/lanes/fast/launcher.py)."""
        return ("agent", None, "bench", self.work, IDENT, self.box.fresh("agent", None, IDENT),
                self.box.venv_to_bind("agent", dict(os.environ)))

    def run(self, argv: list[str], timeout: float = 15.0, out: int | None = None) -> tuple[int | None, str]:
        """-> (wait status, what it printed); killed at ``timeout``."""
        self.n += 1
        with tempfile.TemporaryFile() as f:
            fd = out if out is not None else f.fileno()
            # One task in the host's batch protocol (corral/sandbox/host.py), as the launcher sends it.
            failed = self.host.start([(self.n, argv, dict(os.environ), {}, [fd, fd])])
            if failed:
                raise RuntimeError(f"the built sandbox did not take task {self.n}: {failed[0][1]}")
            deadline, status = time.monotonic() + timeout, None
            while status is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.host.kill(self.n)
                    deadline = time.monotonic() + 5
                select.select([self.host.fileno()], [], [], max(left, 0.05))
                for m in self.host.receive():
                    if m.get("id") == self.n and "error" in m:
                        raise RuntimeError(f"the built sandbox could not start {argv[0]}: {m['error']}")
                    if m.get("id") == self.n and "status" in m:
                        status = m["status"]
                if self.host.ended:
                    self.host.close()
                    self.host = Host(self.box, self.key(), self.log)
                    self.rebuilt += 1
                    break
            f.seek(0)
            return status, f.read().decode(errors="replace")


def wheelhouse(root: Path) -> Path:
    """A one-module wheel, written here by hand (no network, no build backend): what
    `pip install --no-index --find-links` takes."""
    import zipfile

    out = root / "wheels"
    out.mkdir()
    name = "corral_bench_wheel-1.0-py3-none-any.whl"
    files = {"corral_bench_wheel/__init__.py": "VALUE = 1\n",
             "corral_bench_wheel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: corral-bench-wheel\nVersion: 1.0\n",
             "corral_bench_wheel-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: corral\nRoot-Is-Purelib: true\n"
                                                      "Tag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + "corral_bench_wheel-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(out / name, "w") as z:
        for k, v in {**files, "corral_bench_wheel-1.0.dist-info/RECORD": record}.items():
            z.writestr(k, v)
    out.chmod(0o755)
    (out / name).chmod(0o644)
    return out


def fresh_dir() -> str:
    work = Path(tempfile.mkdtemp(prefix="work-", dir="/tmp"))
    work.chmod(0o777)
    return str(work)


def as_job_user() -> list[str]:
    """Bare, but as the job's user and without the network (as the sandbox's default):
    "broken" then counts what the sandbox's files and processes break, not the network,
    which it cuts on purpose (the egress allow-list is what lets pip reach a mirror)."""
    if IDENT is not None:
        return ["unshare", "--net", "--", "setpriv", f"--reuid={IDENT[0]}", f"--regid={IDENT[1]}", "--clear-groups"]
    return ["unshare", "--user", "--net", "--map-current-user", "--"]


def agent_commands(box: Sandbox, n: int) -> tuple[int, int, list[str]]:
    """Real agents' commands, bare and contained: -> (run, how many worked bare, the ones
    the sandbox broke). Only those that worked bare can be broken: none would leave
    "0 broken" true of nothing."""
    rows = [json.loads(x)["command"] for x in shared_data("agent-bash-commands.jsonl").read_text().splitlines()]
    rows = rows[:: max(1, len(rows) // n)][:n]
    broken, worked = [], 0
    for cmd in rows:
        codes = []
        for wrap in (lambda a, w: as_job_user() + a, lambda a, w: box.wrap("agent", a, w, ident=IDENT)):
            work = fresh_dir()
            try:
                r = subprocess.run(wrap(["bash", "-c", cmd], work), cwd=work, capture_output=True, text=True,
                                   timeout=10, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"})  # no network: fail fast
                codes.append(r.returncode)
            except subprocess.TimeoutExpired:
                codes.append(-1)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        worked += codes[0] == 0
        if codes[0] == 0 and codes[1] != 0:
            broken.append(f"{cmd[:80]} (exit {codes[1]})")
    return len(rows), worked, broken


def fast_lane_gateway(home: str) -> GatewayProcess:
    """``home``: the HOME it had before the canaries took it (a gateway that wrote there
    would change them while they are watched)."""
    return GatewayProcess(env={"CORRAL_LOCAL_CPUS": "32", "CORRAL_FASTLANE_CPUS": "32", "HOME": home,
                               "CORRAL_FASTLANE_MIN_CPUS": "32", "CORRAL_FASTLANE_MEMORY_MB": "8000"})


def fast_lane_makespans(gw: GatewayProcess, tasks: int, rounds: int) -> dict[str, list[float]]:
    """Makespan of ``tasks`` batched `true` tasks, submitted and awaited by a person and
    by that person's agent in turn, on one warm pool (same Unix user, same account)."""
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"}).raise_for_status()
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"}).raise_for_status()
            tokens = {n: h.post("/v1/tokens", json={"for": n, "expires": "2h"}).json()["token"] for n in ("alice", "bot")}
        spec = {"command": "true", "lane": "fast", "walltime": "5m", "memory": "10M"}
        out: dict[str, list[float]] = {"bare": [], "sandboxed": []}
        clients = {n: httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=300)
                   for n, t in tokens.items()}
        for _arm, who in (("bare", "alice"), ("sandboxed", "bot")):  # warm: the pool, the sandbox file
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
    ap.add_argument("--quick", action="store_true",
                    help="20 starts per arm; every attack payload in one disguise (each disguise in turn) and one "
                         "fork bomb, per sandbox; the venv without its own pip; 10 agent commands; "
                         "50 tasks a burst")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=1000, help="fast-lane tasks per burst (--quick: 50)")
    a = ap.parse_args()
    runs = 20 if a.quick else a.runs
    # A Slurm tool that cannot reach its controller retries for a minute: it is cut off
    # here. One that can answers in milliseconds, so the quick run's shorter wait still
    # sees an answer (judged by what it printed).
    scheduler_wait = 1.0 if a.quick else 3.0
    t0 = time.monotonic()

    def lap(what: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)

    # Not under /tmp, which is private inside the sandbox: there the canaries would be
    # out of sight whatever else held. The job's user can reach them: only the sandbox stops it.
    root = Path(tempfile.mkdtemp(prefix="corral-containment-", dir="/var/tmp"))
    root.chmod(0o755)
    # The fast lane's gateway starts (seconds of Python imports) while the attacks and the
    # benign work run, which time nothing; its bursts run after them, alone.
    starting = ThreadPoolExecutor(1)
    home = os.environ.get("HOME", "/root")
    with Canaries(root / "canaries") as c:
        os.environ["HOME"] = str(c.home)  # the sandbox hides credentials under the gateway's home
        box = build(["agent"], [], False, "nobody", [root / "corral-state"], pids_max=64)
        if box.why_not:
            sys.exit(f"containment: no sandbox here: {box.why_not}")
        work = fresh_dir()
        warm = Warm(box, work, root / "host.log")
        null = os.open("/dev/null", os.O_WRONLY)
        warm.run(["true"], out=null)  # built: what follows is every later task's cost
        bare, hosted, boxed = [], [], []
        for _ in range(runs):
            for arm, start in ((bare, lambda: subprocess.run(["true"], check=True)),
                               (hosted, lambda: warm.run(["true"], out=null)),
                               (boxed, lambda: subprocess.run(box.wrap("agent", ["true"], work, ident=IDENT), check=True))):
                t = time.perf_counter()
                start()
                arm.append((time.perf_counter() - t) * 1000)
        lap(f"start cost: {runs} starts per arm")
        gateway = starting.submit(fast_lane_gateway, home)
        atexit.register(lambda: gateway.done() and not gateway.exception() and gateway.result().stop())
        harmful: list[str] = []
        by_category: dict[str, int] = {}
        attacks = c.attacks()
        bombs = FORK_BOMBS
        if a.quick:  # every payload (so every category), each in one disguise, the disguises in turn
            per = len({d for _, _, d in attacks})
            attacks = [x for i, x in enumerate(attacks) if i % per == (i // per) % per]
            bombs = FORK_BOMBS[:1]
        for cmd, category, disguise in attacks:
            _, said = warm.run(["bash", "-c", cmd], timeout=scheduler_wait if category == "scheduler" else 15)
            harm = c.judge(said)
            if harm:
                harmful.append(f"built sandbox: {category}/{disguise}: {cmd[:60]}: {', '.join(harm)}")
        for cmd, category, disguise in attacks:
            try:
                r = subprocess.run(box.wrap("agent", ["bash", "-c", cmd], work, ident=IDENT), capture_output=True, text=True,
                                   timeout=scheduler_wait if category == "scheduler" else 15)
                said = r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:  # still trying: Slurm's tools retry for a minute
                said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
            by_category[category] = by_category.get(category, 0) + 1
            harm = c.judge(said)
            if harm:
                harmful.append(f"{category}/{disguise}: {cmd[:60]}: {', '.join(harm)}")
        lap(f"attacks: {len(attacks)} per sandbox")
        # The control for the scheduler's attacks: does it answer outside a sandbox, within
        # the wait they were given? If not, "not answered" inside says nothing.
        t = time.perf_counter()
        try:
            said = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                  timeout=scheduler_wait).stdout
            scheduler_bare_s = round(time.perf_counter() - t, 3) if "Configuration data as of" in said else None
        except (OSError, subprocess.TimeoutExpired):
            scheduler_bare_s = None
        bomb_peak = []
        for bomb in bombs:
            p = subprocess.Popen(box.wrap("agent", ["bash", "-c", bomb], work, ident=IDENT), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            peak = 0
            for _ in range(30):  # the highest count over 1.5 s
                peak = max(peak, tree_size(p.pid))
                time.sleep(0.05)
            bomb_peak.append(peak)
            p.kill()
            p.wait()
            if os.geteuid() == 0 and bomb_peak[-1] > box.pids_max + 2:
                harmful.append(f"fork bomb {bomb!r}: {bomb_peak[-1]} processes, over the limit of {box.pids_max}")
        for bomb in bombs:  # in the built sandbox: the limit is its tasks' together, plus the host
            threading.Timer(1.5, lambda n=warm.n + 1: warm.host.kill(n)).start()
            peaks = []
            t = threading.Thread(target=warm.run, args=(["bash", "-c", bomb],), kwargs={"out": null})
            t.start()
            while t.is_alive():
                peaks.append(tree_size(warm.host.proc.pid))
                time.sleep(0.05)
            bomb_peak.append(max(peaks or [0]))
            if os.geteuid() == 0 and bomb_peak[-1] > box.pids_max + 2:
                harmful.append(f"built sandbox: fork bomb {bomb!r}: {bomb_peak[-1]} processes, over {box.pids_max}")
        warm.host.close()
        os.close(null)
        lap(f"fork bombs: {len(bombs)} per sandbox")
        wheels = wheelhouse(root)
        broken = []
        fill = {"wheels": wheels, "data": shared_data("agent-bash-commands.jsonl").parent}
        benign = [QUICK_VENV if a.quick and "venv" in c else c for c in BENIGN]
        for cmd in benign:
            w = fresh_dir()
            r = subprocess.run(box.wrap("agent", ["bash", "-c", cmd.format(**fill)], w, ident=IDENT), capture_output=True, text=True,
                               timeout=120)
            shutil.rmtree(w, ignore_errors=True)
            if r.returncode != 0:
                broken.append(f"{cmd[:50]}: exit {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
        lap(f"benign work: {len(benign)} commands")
        agents_run, agents_worked, agents_broken = agent_commands(box, 10 if a.quick else 700)
        lap(f"agent commands: {agents_run}, bare and contained")
    shutil.rmtree(root, ignore_errors=True)
    tasks = 50 if a.quick else a.tasks
    spans = fast_lane_makespans(gateway.result(), tasks, 1 if a.quick else 2)
    starting.shutdown()
    lap(f"fast lane: {tasks} tasks per burst")
    bare_s, boxed_s = min(spans["bare"]), min(spans["sandboxed"])
    out = {"bench": "containment", "runs": runs, "bare_start_p50_ms": round(pct(bare, 50), 2),
           "sandbox_start_p50_ms": round(pct(hosted, 50), 2),
           "added_p50_ms": round(pct(hosted, 50) - pct(bare, 50), 2), "sandbox_start_p99_ms": round(pct(hosted, 99), 2),
           "sandbox_cold_start_p50_ms": round(pct(boxed, 50), 2), "built_sandbox_ended_by_its_task": warm.rebuilt,
           "cold_added_p50_ms": round(pct(boxed, 50) - pct(bare, 50), 2),
           "attacks_run": 2 * (len(attacks) + len(bombs)), "attacks_by_category": by_category,
           "scheduler_wait_s": scheduler_wait, "scheduler_answers_bare_s": scheduler_bare_s,
           "harmful_effects": len(harmful), "harmful": harmful, "fork_bomb_peak_processes": bomb_peak,
           "benign_run": len(benign), "benign_broken": len(broken), "broken": broken,
           "agent_commands_run": agents_run, "agent_commands_worked_bare": agents_worked,
           "agent_commands_broken": len(agents_broken),
           "agent_commands_broken_list": agents_broken[:20],
           "fast_lane_tasks": tasks, "fast_lane_makespan_bare_s": round(bare_s, 2),
           "fast_lane_makespan_sandboxed_s": round(boxed_s, 2),
           "fast_lane_makespan_ratio": round(boxed_s / bare_s, 2), "fast_lane_runs": spans}
    print(f"start p50: bare {out['bare_start_p50_ms']} ms, in a built sandbox {out['sandbox_start_p50_ms']} ms "
          f"(+{out['added_p50_ms']} ms), in a new one {out['sandbox_cold_start_p50_ms']} ms; attacks {out['attacks_run']}, harmful effects {len(harmful)}; "
          f"benign {len(benign)}, broken {len(broken)}; agent commands {agents_run}, broken {len(agents_broken)}; "
          f"fast lane {tasks} tasks: bare {bare_s:.2f} s, sandboxed {boxed_s:.2f} s", file=sys.stderr)
    finish("containment", out, {
        "start_bare": bool(bare), "start_built_sandbox": bool(hosted), "start_new_sandbox": bool(boxed),
        "attacks": out["attacks_run"] > 0, "benign": bool(benign),
        "agent_commands_worked_bare": agents_worked > 0,
        "fast_lane_bare": bool(spans["bare"]), "fast_lane_sandboxed": bool(spans["sandboxed"])})


if __name__ == "__main__":
    main()
