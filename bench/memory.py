"""Memory: (a) note retrieval, corral's recall (BM25 and a semantic index, fused) against
each alone and a plain substring scan, on a labeled set; (b) a replay of agent campaigns with planted pitfalls through real
gateways, with and without corral's memory.

    python bench/memory.py [--quick] [--notes 100000]

(a) The 52 facility notes of bench/memory_notes.py (104 questions, each labeled with
the note that answers it) are written as facility notes, then the corpus is grown
with unrelated filler notes to ``--notes``, and every note is embedded by the
gateway's own index loop (notes/s). Four arms answer every question: corral (words and
meaning fused, as ``MemoryVerbs.recall`` does), words alone (BM25), meaning alone, and
a plain substring scan: recall@5 and latency, at the small corpus and the full one;
and recall@5 on 52 held-out questions written after recall's settings were fixed.

(b) 3 agents of one sponsor each work 4 sessions; in every session an agent has 4 tasks,
each with a planted pitfall a first try hits: out of memory (needs 512M, tries 100M), a
missing Python module (needs PYTHONPATH), a command not found (needs PATH, as a
'module load' would), and a timeout (needs 10 s, tries 1 s). A second arm's
gateway has the same jobs. The agent's fix logic is the same in both arms: read the
failure (state, stderr), change the one thing. Without memory each session starts
from nothing. With memory the agent asks ``POST /v1/advice`` before its first try and
applies what it says; a refused exact repeat (409) is read the same way, and resubmitted
with force when the agent has already changed what it names. A *repeated identical
failure* is a failed job whose pitfall already failed for that sponsor's agents in an
earlier session. (Wrong partitions are refused at submit by preflight in both arms, so
they cause no failed jobs.) Both arms run at once, each with its own gateway. The run
fails (exit 3, bench/_common.finish) if a planted pitfall never failed without memory.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct, sponsored_agents  # noqa: E402
from bench.memory_notes import HELDOUT, NOTES, filler  # noqa: E402
from corral.core.db import Database  # noqa: E402
from corral.memory.embed import Embedder  # noqa: E402
from corral.memory.semantic import SemanticRecall  # noqa: E402
from corral.memory.store import Memory  # noqa: E402
from corral.gateway.memory_verbs import SEMANTIC_DEPTH  # noqa: E402
from corral.core.principals import Caller, Kind, Principal  # noqa: E402


# -- (a) retrieval -------------------------------------------------------------------------
def substring_scan(db: Database, query: str, k: int) -> list[int]:
    """The alternative: every note that contains any query word, ranked by how many."""
    words = [w for w in query.lower().split() if len(w) > 2]
    if not words:
        return []
    score = " + ".join("(instr(lower(text), ?) > 0)" for _ in words)
    rows = db.conn.execute(f"SELECT id, {score} AS s FROM notes WHERE s > 0 ORDER BY s DESC, id LIMIT ?",
                           (*words, k)).fetchall()
    return [r[0] for r in rows]


def retrieval(total: int, threads: int, every: int = 1) -> dict[str, Any]:
    """``every``: ask every n-th question only (--quick: 2, one labeled question per note)."""
    tmp = tempfile.mkdtemp(prefix="corral-bench-mem-")
    db = Database(Path(tmp) / "m.db")
    admin = Principal("admin", Kind.HUMAN, is_admin=True)
    db.add_principal(admin)
    caller = Caller(admin, None, "t", frozenset({"admin"}))
    mem = Memory(db)
    sem = SemanticRecall(db, Embedder(threads=threads), poll_s=0.05)
    ids = []
    with db.transaction():
        for text, _ in NOTES:
            ids.append(mem.remember(caller, text, "facility")["id"])
    questions = [(q, ids[i]) for i, (_, qs) in enumerate(NOTES) for q in qs][::every]
    heldout = [(q, ids[i]) for i, q in enumerate(HELDOUT)][::every]

    async def embed_all() -> float:
        """The gateway's own index loop, until every note has its vector: -> notes/s."""
        loop = asyncio.create_task(sem.run())
        t, last = time.perf_counter(), -1
        while sem.index is None or sem.index.backlog():
            if sem.unavailable:
                raise SystemExit(f"bench/memory: no semantic index: {sem.unavailable}")
            await asyncio.sleep(0.5)
            if sem.index is not None and sem.index.size // 10_000 != last:
                last = sem.index.size // 10_000
                print(f"  embedded {sem.index.size:,} notes", file=sys.stderr)
        rate = sem.index.size / (time.perf_counter() - t)
        loop.cancel()
        return rate

    async def fused(q: str) -> list[int]:  # MemoryVerbs.recall's path
        return [n["id"] for n in mem.recall(caller, q, 5, await sem.nearest(q, SEMANTIC_DEPTH))]

    async def meaning(q: str) -> list[int]:
        return [i for i, _ in (await sem.nearest(q, 5) or [])]

    async def words(q: str) -> list[int]:
        return [n["id"] for n in mem.recall(caller, q, 5)]

    async def scan(q: str) -> list[int]:
        return substring_scan(db, q, 5)

    async def run(label: str) -> dict[str, Any]:
        out: dict[str, Any] = {"notes": db.conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0]}
        out["embed_notes_per_s"] = round(await embed_all(), 1)
        for arm, fn in (("corral", fused), ("bm25", words), ("semantic", meaning), ("substring", scan)):
            lat, hits = [], 0
            for q, want in questions:
                t = time.perf_counter()
                got = await fn(q)
                lat.append((time.perf_counter() - t) * 1000)
                hits += want in got
            out[arm] = {"recall_at_5": round(hits / len(questions), 3), "p50_ms": round(pct(lat, 50), 3),
                        "p95_ms": round(pct(lat, 95), 3)}
            if arm != "substring":
                out[arm]["heldout_recall_at_5"] = round(sum([want in await fn(q) for q, want in heldout])
                                                        / len(heldout), 3)
        print(f"retrieval [{label}]: {out}", file=sys.stderr)
        return out

    try:
        small = asyncio.run(run("facility notes only"))
        with db.transaction():
            for i in range(total - len(NOTES)):
                text = filler(i)
                cur = db.conn.execute(
                    "INSERT INTO notes (text, scope, author, family, created) VALUES (?, 'facility', 'admin', 'admin', ?)",
                    (text, time.time()))
                db.conn.execute("INSERT INTO notes_fts (rowid, text) VALUES (?, ?)", (cur.lastrowid, text))
        big = asyncio.run(run(f"{total:,} notes"))
    finally:
        db.close()
        shutil.rmtree(tmp, ignore_errors=True)  # 100 MB at 100,000 notes
    return {"questions": len(questions), "heldout_questions": len(heldout), "model": sem.embedder.name, "embed_threads": threads,
            "small": small, "large": big}


# -- (b) campaigns ---------------------------------------------------------------------------
PITFALLS = ("oom", "module", "command", "timeout")


def task(kind: str, tools: Path) -> dict[str, Any]:
    """The first try of a task with a planted pitfall, in ``tools/work``. The out-of-memory
    job holds its 300 MB for half a second, as a job computing over its data would: the
    local lane enforces memory by sampling (corral/lanes/local_runner.py, first sample
    at 50 ms), and an allocation freed at once could end before any sample saw it."""
    return {
        "oom": {"command": "python3 -c 'import time; b = bytearray(300 * 2**20); time.sleep(0.5)'",
                "memory": "100M"},
        "module": {"command": "python3 -c 'import bench_helper_mod; print(bench_helper_mod.X)'"},
        "command": {"command": "bench-tool --version"},
        "timeout": {"command": "sleep 2; echo done", "walltime": "1s"},
    }[kind] | {"workdir": str(tools / "work")}


def fix(spec: dict[str, Any], kind: str, tools: Path) -> dict[str, Any]:
    """What an agent changes once it knows the cause: the same in both arms."""
    s = dict(spec)
    if kind == "out_of_memory":
        s["memory"] = "512M"
    elif kind == "module_not_found":
        s["env"] = {**s.get("env", {}), "PYTHONPATH": str(tools / "lib")}
    elif kind == "command_not_found":
        s["command"] = f"PATH={tools / 'bin'}:$PATH " + s["command"]
    elif kind == "timeout":
        s["walltime"] = "10s"
    return s


def diagnose(job: dict[str, Any], stderr: str) -> str | None:
    if job["state"] == "OUT_OF_MEMORY":
        return "out_of_memory"
    if job["state"] == "TIMEOUT":
        return "timeout"
    if "ModuleNotFoundError" in stderr:
        return "module_not_found"
    if "command not found" in stderr:
        return "command_not_found"
    return None


def from_advice(text: str) -> list[str]:
    return [k for k in ("out_of_memory", "module_not_found", "command_not_found", "timeout") if k in text]


def project() -> Path:
    """A project: work/ (the jobs' working directory), lib/ (the Python module they lack
    until PYTHONPATH names it) and bin/ (the tool they lack until PATH does).

    Under a root gateway an agent's job runs as a dynamic identity of its own
    (corral/core/identity.py): work/ is one that identity may enter and write (as the
    tests' agent_dir), not root's 0700 mkdtemp, which the gateway refuses at submit
    (issue 46: every job was refused, no job ran, and the run printed 0 repeated
    failures in both arms). The module and the tool lie beside work/, not in it:
    ``python3 -c`` imports from its working directory, so a module there is no pitfall.
    Under /var/tmp, not /tmp, which is private inside the job's sandbox."""
    tools = Path(tempfile.mkdtemp(prefix="corral-bench-project-", dir="/var/tmp"))
    tools.chmod(0o755)
    for sub in ("work", "lib", "bin"):
        (tools / sub).mkdir(mode=0o755)
    (tools / "work").chmod(0o777)
    (tools / "lib" / "bench_helper_mod.py").write_text("X = 42\n")
    (tools / "bin" / "bench-tool").write_text("#!/bin/sh\necho bench-tool 1.0\n")
    for f in ("lib/bench_helper_mod.py", "bin/bench-tool"):
        (tools / f).chmod(0o755)
    return tools


def arm_gateway(use_memory: bool) -> GatewayProcess:
    return GatewayProcess("--cpus", "4", "--tick", "0.2", env={} if use_memory else {"CORRAL_MEMORY": "false"})


def campaigns(use_memory: bool, agents: int, sessions: int, gw: "Future[GatewayProcess] | None" = None) -> dict[str, Any]:
    """``gw``: the arm's gateway, being started already (--quick); else one is started here."""
    tools = project()
    gw = gw.result() if gw is not None else arm_gateway(use_memory)
    failed_pitfall: dict[str, int] = {}  # pitfall -> first session it failed in (the sponsor's family)
    stats: dict[str, Any] = {"jobs": 0, "failed": 0, "repeated": 0, "refused": 0, "forced": 0, "undiagnosed": 0,
                             "first_try_failed": {k: 0 for k in PITFALLS}, "tasks": {k: 0 for k in PITFALLS},
                             "causes": {}}
    """first_try_failed: of each pitfall's tasks, those whose first job failed (without memory:
    every one, or the pitfall is not planted); causes: what each failure was diagnosed as
    ("none": a failure the agent could not read, which is not the pitfall's)."""
    errors: list[str] = []
    lock = threading.Lock()
    try:
        tokens = sponsored_agents(gw, agents)

        def run_task(h: httpx.Client, session: int, kind: str) -> None:
            spec = task(kind, tools)
            if use_memory:
                for cause in from_advice(json.dumps(h.post("/v1/advice", json=spec).json())):
                    spec = fix(spec, cause, tools)
            with lock:
                stats["tasks"][kind] += 1
            for attempt in range(6):
                r = h.post("/v1/jobs", json=spec)
                if r.status_code == 409:  # an exact repeat refused: the message names the cause
                    with lock:
                        stats["refused"] += 1
                    before = spec
                    for cause in from_advice(r.json()["error"]["message"]):
                        spec = fix(spec, cause, tools)
                    if spec == before:
                        # Already changed what the cause names, where memory does not look:
                        # the repeat check compares script, resources and directory, not the
                        # environment, so a job mended by PYTHONPATH is refused as the same
                        # job. The agent does what the refusal says: resubmits with force.
                        spec = {**spec, "force": True}
                        with lock:
                            stats["forced"] += 1
                    continue
                if r.status_code != 201:  # not a failed job: a refused one, which no agent would count
                    raise RuntimeError(f"task {kind}: submission refused: {r.status_code} {r.text[:400]}")
                job = h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 60}).json()
                with lock:
                    stats["jobs"] += 1
                if job["state"] == "COMPLETED":
                    return
                err = h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"]
                cause = diagnose(job, err)
                with lock:
                    stats["failed"] += 1
                    stats["first_try_failed"][kind] += attempt == 0
                    stats["causes"][cause or "none"] = stats["causes"].get(cause or "none", 0) + 1
                    stats["undiagnosed"] += cause is None
                    first = failed_pitfall.setdefault(kind, session)
                    if first < session:
                        stats["repeated"] += 1
                if cause:
                    spec = fix(spec, cause, tools)
                else:
                    print(f"  {kind}: failed for no planted reason: {job['state']} {job.get('reason')}: "
                          f"{err[-300:]!r}", file=sys.stderr)
            raise RuntimeError(f"task {kind} never succeeded")

        for session in range(sessions):  # sessions in order; the agents of a session in parallel
            # An agent's four tasks are independent (each its own script, so its own memory):
            # it works on them at once, as an agent with a sweep does; each task's tries in order.
            def agent_task(token: str, kind: str, s: int = session) -> None:
                try:
                    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}",
                                                                "X-Corral-Session": f"s{s}"}, timeout=120) as h:
                        run_task(h, s, kind)
                except Exception as e:  # a thread's exception is otherwise printed and forgotten
                    with lock:
                        errors.append(f"session {s}: {type(e).__name__}: {e}")

            threads = [threading.Thread(target=agent_task, args=(t, k)) for t in tokens for k in PITFALLS]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise SystemExit(f"bench/memory.py: campaign (memory {'on' if use_memory else 'off'}) broke: "
                                 + "; ".join(errors))
    finally:
        gw.stop()
        shutil.rmtree(tools, ignore_errors=True)
    print(f"campaigns, memory {'on' if use_memory else 'off'}: {stats}", file=sys.stderr)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 notes, half the questions; 2 agents x 2 sessions")
    ap.add_argument("--notes", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=2, help="the encoder's CPU threads while indexing and answering")
    ap.add_argument("--retrieval-only", action="store_true", help="skip (b), the campaigns")
    a = ap.parse_args()
    total = 300 if a.quick else a.notes
    agents, sessions = (2, 2) if a.quick else (3, 4)
    t0 = time.monotonic()
    # --quick starts the campaigns' two gateways (seconds of imports each) while retrieval
    # runs, whose latencies are then not a quiet machine's; the full run starts them after.
    early = ThreadPoolExecutor(2)
    gateways = [early.submit(arm_gateway, use) for use in (False, True)] if a.quick and not a.retrieval_only else [None, None]
    r = retrieval(total, a.threads, 2 if a.quick else 1)
    print(f"[{time.monotonic() - t0:6.1f} s] retrieval, {total:,} notes", file=sys.stderr, flush=True)
    retrieved = {"retrieval_questions": r["questions"] > 0, "retrieval_heldout": r["heldout_questions"] > 0,
                 "retrieval_large_corpus": r["large"]["notes"] > len(NOTES)}
    if a.retrieval_only:
        big = r["large"]
        finish("memory", {"bench": "memory", "notes": big["notes"], "questions": r["questions"],
                          "recall_at_5": big["corral"]["recall_at_5"], "recall_p95_ms": big["corral"]["p95_ms"],
                          "bm25_recall_at_5": big["bm25"]["recall_at_5"],
                          "semantic_recall_at_5": big["semantic"]["recall_at_5"],
                          "heldout_recall_at_5": big["corral"]["heldout_recall_at_5"],
                          "bm25_heldout_recall_at_5": big["bm25"]["heldout_recall_at_5"], "retrieval": r}, retrieved)
        return
    # The two arms side by side: their gateways and agents run at once, so each meets the
    # same machine (their figures are counts of failures, not times).
    with ThreadPoolExecutor(2) as pool:
        arms = [pool.submit(campaigns, use, agents, sessions, g) for use, g in zip((False, True), gateways)]
        without, with_ = (f.result() for f in arms)
    early.shutdown()
    print(f"[{time.monotonic() - t0:6.1f} s] campaigns, {agents} agents x {sessions} sessions, both arms",
          file=sys.stderr, flush=True)
    reduction = 1 - with_["repeated"] / without["repeated"] if without["repeated"] else None
    finish("memory", {
        "bench": "memory", "notes": r["large"]["notes"], "questions": r["questions"],
        "recall_p50_ms": r["large"]["corral"]["p50_ms"], "recall_p95_ms": r["large"]["corral"]["p95_ms"],
        "recall_at_5": r["large"]["corral"]["recall_at_5"],
        "bm25_recall_at_5": r["large"]["bm25"]["recall_at_5"], "bm25_p95_ms": r["large"]["bm25"]["p95_ms"],
        "semantic_recall_at_5": r["large"]["semantic"]["recall_at_5"],
        "semantic_p95_ms": r["large"]["semantic"]["p95_ms"],
        "embed_notes_per_s": r["large"]["embed_notes_per_s"], "embed_model": r["model"],
        "heldout_recall_at_5": r["large"]["corral"]["heldout_recall_at_5"],
        "bm25_heldout_recall_at_5": r["large"]["bm25"]["heldout_recall_at_5"],
        "substring_p95_ms": r["large"]["substring"]["p95_ms"],
        "substring_recall_at_5": r["large"]["substring"]["recall_at_5"],
        "latency_ratio": round(r["large"]["substring"]["p95_ms"] / r["large"]["corral"]["p95_ms"], 1),
        "repeat_failures_without": without["repeated"], "repeat_failures_with": with_["repeated"],
        "failed_jobs_without": without["failed"], "failed_jobs_with": with_["failed"],
        "reduction": round(reduction, 3) if reduction is not None else None,
        "retrieval": r, "campaigns": {"without": without, "with": with_, "agents": agents, "sessions": sessions},
    }, {**retrieved,
        # The planted pitfalls are the point: without memory each must fail on its first try.
        **{f"pitfall_{k}_failed_without_memory": without["first_try_failed"][k] > 0 for k in PITFALLS},
        "repeat_failures_without": without["repeated"] > 0, "jobs_with_memory": with_["jobs"] > 0,
        "reduction": reduction is not None})


if __name__ == "__main__":
    main()
