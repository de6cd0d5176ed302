"""corral's memory of outcomes and notes, in the gateway's SQLite database.

**Episodes.** Every job that ends becomes one row: a fingerprint of what it ran (the
command or script with comments and spacing normalized), its resources, its state and
exit code, and an error signature read from its output (``signatures``). At submit time
``advise`` looks up the episodes of the same fingerprint in the submitter's *family*
(a person and the agents they sponsor; with ``memory_share_account``, the whole
account) and says what happened before. The exact repeat (same fingerprint, same
resources) of a job whose last run failed deterministically is refused unless the
submission says ``force``.

**Notes.** Agents and people write notes with a scope: ``agent`` (only its author),
``user`` (the family), ``account``, ``session``, or ``facility`` (everyone; only an admin
writes or promotes to it). Notes carry provenance (author, time, job) and may expire.
They are guarded on write (``guard``): secrets redacted, suspected injection flagged.
Recall is SQLite FTS5 with BM25 ranking, fused with a semantic index (``semantic``)
when it is on, filtered to what the caller may read.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.clock import Clock
from corral.core.db import Database
from corral.core.store.memory import Viewer
from corral.core.errors import Forbidden, InvalidRequest, NotFound
from corral.core.jobs import Job, JobSpec
from corral.core.lru import LRU
from corral.core.principals import Caller, Kind, Principal
from corral.safety import guard
from corral.core import safe_read
from corral.memory import semantic, signatures

if TYPE_CHECKING:
    from corral.core.identity import Identity

SCOPES = ("facility", "account", "user", "agent", "session")
COMMON_SHARE = 0.05
TERMS_KEPT = 10_000
"""Document frequencies of recall's terms kept (the ones asked last): every distinct word
of every query was kept before issue 46."""
STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from how i in is it its my of on or should so that the their "
    "this to use was what when where which who why will with you your".split())
CACHE_LABEL = "corral-cache-key"
"""The job's cache key, computed at submit (inputs as they were then) and kept in its labels."""
FUSE_DEPTH = 20
"""How far down each ranking (words, meaning) fusion looks."""
MIN_COSINE = 0.3
"""A note found by meaning alone must be at least this near the query. On the labelled
set of bench/memory.py the answering note's cosine was 0.235 at its lowest (0.575 at the
median; 4 of 156 under 0.3, 3 of them not found by words either); unrelated sentences of
the same trade sit up to 0.27 ("why does pytorch not see the graphics card" against a
note on numpy wheels, issue 49), and 0.2 returned them."""
MIN_WORDS = 2
"""A note found by words must hold at least this many of the query's words (half of
them, rounded up, when it has fewer than four): one word of five ('see', 'not') is not
an answer (issue 49), and a pasted error message of twenty words still finds a note
holding two. Together with MIN_COSINE, on bench/memory.py's labelled set: 3 of 156
answers are found by neither (none before)."""
REPEAT_WINDOW_S = 7 * 86400
"""Failures older than this no longer block an exact repeat (the facility may have changed)."""


def family(p: Principal) -> str:
    """The person an agent acts for, or the person themself: the unit that shares memory."""
    return p.sponsor if p.kind is Kind.AGENT and p.sponsor else p.name


def fingerprint(spec: JobSpec) -> str:
    """The work, whitespace and comments aside: what makes two submissions "the same"."""
    return _fingerprint(spec.command or spec.script or "")


@functools.lru_cache(maxsize=32)  # bridges prepare -> advise of one request; 32 x 256 KiB at most
def _fingerprint(text: str) -> str:
    # str.split, not a regex per line: the same result (both split on Unicode whitespace)
    # at a quarter of the cost, 7 ms for a 256 KiB script instead of 29.
    kept = [ln for ln in (" ".join(raw.split()) for raw in text.splitlines())
            if ln and not (ln[0] == "#" and not ln.startswith(("#!", "#SBATCH")))]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:32]


async def prepare(spec: JobSpec) -> None:
    """Fingerprint a long text in a thread, so ``advise`` finds it made: not on the event
    loop that answers every other agent (a 256 KiB script took it 29 ms)."""
    text = spec.command or spec.script or ""
    if len(text) >= 4096:
        await asyncio.to_thread(_fingerprint, text)


def resources(spec: JobSpec) -> str:
    return f"cpus={spec.cpus} mem={spec.memory_mb}M gpus={spec.gpus} partition={spec.partition or '-'}"


def cache_key(spec: JobSpec, identity: "Identity | None" = None, hidden: "list[str] | None" = None) -> str:
    """What decides a result: the script, the declared inputs' contents, the environment,
    the working directory and the resources. Any change is a new key. The inputs are read
    as ``identity``, the job's (None: the gateway's own user), plain files only and
    bounded (corral/core/safe_read.py): an input the job could not read, or that lies under
    ``hidden`` (what its sandbox empties), is refused, with one answer whether it is
    missing or only not the job's to see."""
    h = hashlib.sha256()
    h.update(fingerprint(spec).encode())
    h.update(json.dumps({"env": spec.env, "workdir": spec.workdir, "res": resources(spec),
                         "walltime": spec.walltime_s}, sort_keys=True).encode())
    paths = sorted(spec.inputs or [])
    if paths:
        try:
            h.update(safe_read.hash_inputs(paths, identity, hidden).encode())
        except safe_read.InputRefused as e:
            who = identity.describe() if identity is not None else "the job's user"
            if e.why == "large":
                raise InvalidRequest(
                    f"the inputs from {paths[e.index]!r} on pass {safe_read.MAX_INPUT_BYTES >> 20} MiB together, "
                    "more than corral hashes at submit", hint="name fewer or smaller inputs, or submit without cache"
                ) from None
            if e.index < 0 or e.index >= len(paths):
                raise InvalidRequest(f"the inputs cannot be hashed: {e.why}", hint="name fewer inputs") from None
            raise InvalidRequest(
                f"input {paths[e.index]!r} cannot be read as {who}: it is missing, not a plain file, or not "
                "that identity's to read", hint="fix the path or drop it from inputs") from None
    return h.hexdigest()


def _quoted(episode: dict[str, Any]) -> str:
    """An episode's error detail, which its job wrote: secrets redacted, and always
    between nonce'd delimiters as data (corral/safety/guard.py), whoever reads it."""
    clean, _ = guard.redact(str(episode["detail"]))
    return guard.delimit(clean, f"output of job {episode['job_id']}", guard.injection(clean))


def _mem(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def read_tail(paths: tuple[Path, Path], limit: int = 16_384) -> str:
    """The ends of a failed job's stdout and stderr, for its error signature: plain files
    only, never through a link, ``limit`` bytes each (read as the reconciler records the
    outcome, so it must never block: corral/core/safe_read.py)."""
    out = []
    for p in paths:
        try:
            out.append(safe_read.read_tail(p, limit).decode("utf-8", "replace"))
        except OSError:
            continue
    return "\n".join(out)


class Memory:
    def __init__(self, db: Database, share_account: bool = False, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.db = db
        self.share_account = share_account
        self._df: LRU[str, tuple[int, float]] = LRU(TERMS_KEPT)
        """term -> (notes holding it, when read): document frequencies change slowly."""

    # -- episodes -----------------------------------------------------------------------
    def record(self, items: list[tuple[Job, Principal, str]]) -> None:
        """Episodes of ended jobs: (job, its principal, the tail of its output, read only
        for failures). One statement for many; a job already remembered is skipped."""
        rows = []
        per_spec: dict[int, tuple[str, str]] = {}  # a sweep's jobs share one spec object
        for job, principal, output in items:
            sig = signatures.extract(job.state.value, job.exit_code, output)
            key = job.spec.labels.get(CACHE_LABEL) if job.spec.cache else None
            fp, res = per_spec.get(id(job.spec)) or per_spec.setdefault(
                id(job.spec), (fingerprint(job.spec), resources(job.spec)))
            rows.append((job.id, principal.name, family(principal), principal.account, fp,
                         res, job.spec.memory_mb, job.state.value, job.exit_code,
                         sig.name if sig else None, sig.detail if sig else None, int(bool(sig and sig.deterministic)),
                         job.end_time or self.clock.time(), key))
        self.db.memory.record_episodes(rows)

    def cached(self, principal: Principal, key: str) -> int | None:
        """The job whose successful run had this key, if this principal ran one."""
        return self.db.memory.cached(key, principal.name)

    def episode(self, job_id: int) -> dict[str, Any] | None:
        r = self.db.memory.episode(job_id)
        return {"signature": r[0], "detail": r[1], "deterministic": bool(r[2])} if r else None

    def _episodes(self, principal: Principal, fp: str) -> list[dict[str, Any]]:
        rows = self.db.memory.episodes(fp, family(principal),
                                       principal.account if self.share_account else None)
        keys = ("job_id", "principal", "resources", "memory_mb", "state", "exit_code", "signature", "detail",
                "deterministic", "ended", "workdir")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def runtimes(self, principal: Principal, spec: JobSpec, n: int) -> list[tuple[int, float]]:
        """The last ``n`` completed runs of this script at these resources in the
        principal's family: (job id, seconds its run took), newest first. A job its
        scheduler requeued is left out: its start to its end spans more than one run."""
        return self.db.memory.runtimes(fingerprint(spec), family(principal), resources(spec), n)

    def advise(self, principal: Principal, spec: JobSpec) -> tuple[list[str], str | None]:
        """-> (advice for this submission, why it is refused or None)."""
        eps = self._episodes(principal, fingerprint(spec))
        if not eps:
            return [], None
        advice: list[str] = []
        res = resources(spec)
        failures: dict[str, list[dict[str, Any]]] = {}
        for e in eps:
            if e["signature"]:
                failures.setdefault(e["signature"], []).append(e)
        hints = {n: h for n, _, _, h in signatures.PATTERNS} | {v[0]: v[2] for v in signatures.STATE_SIGNATURES.values()}
        for name, fs in failures.items():
            last = fs[0]
            what = f"{name}: {_quoted(last)}" if last["detail"] else name
            at = f" at {_mem(last['memory_mb'])}" if name == "out_of_memory" else ""
            advice.append(f"this script failed {len(fs)} time(s) with {what}{at} (last: job {last['job_id']}); "
                          f"{hints.get(name, '')}".rstrip("; "))
            if name == "out_of_memory":
                bigger = [e for e in eps if e["state"] == "COMPLETED" and e["memory_mb"] > last["memory_mb"]]
                if bigger:
                    advice.append(f"a similar run succeeded with {_mem(bigger[0]['memory_mb'])} "
                                  f"(job {bigger[0]['job_id']})")
        ok = [e for e in eps if e["state"] == "COMPLETED"]
        if ok and not failures:
            advice.append(f"this script succeeded {len(ok)} time(s) before (last: job {ok[0]['job_id']}, "
                          f"{ok[0]['resources']})")
        # Refused only as a repeat of the submitter's own failure in the same directory: a
        # sibling agent's failure elsewhere is advice, never a refusal (H4 F15: one agent's
        # output must not stop, or speak to, another).
        same = [e for e in eps if e["resources"] == res and e["principal"] == principal.name
                and e["workdir"] == spec.workdir]
        refuse = None
        if same and same[0]["deterministic"] and self.clock.time() - same[0]["ended"] < REPEAT_WINDOW_S and not spec.force:
            n = sum(1 for e in same if e["signature"] == same[0]["signature"])
            refuse = (f"this exact job (same script, {res}, same workdir) failed {n} time(s) with "
                      f"{same[0]['signature']}{': ' + _quoted(same[0]) if same[0]['detail'] else ''} "
                      f"(last: job {same[0]['job_id']}), and that failure repeats by itself; change the script or "
                      "resources, or resubmit with force")
        return advice, refuse

    # -- notes ----------------------------------------------------------------------------
    def remember(self, caller: Caller, text: str, scope: str = "user", expires_s: float | None = None,
                 job_id: int | None = None) -> dict[str, Any]:
        if scope not in SCOPES:
            raise InvalidRequest(f"unknown scope {scope!r}; use one of: {', '.join(SCOPES)}")
        if not text.strip() or len(text) > 20_000:
            raise InvalidRequest("a note is 1 to 20,000 characters of text")
        p = caller.principal
        if scope == "facility" and not p.is_admin:
            raise Forbidden("only an admin writes facility notes; write it with scope 'user' and ask an admin to "
                            "promote it")
        if scope == "session" and not caller.session:
            raise InvalidRequest("scope 'session' needs a session (X-Corral-Session or CORRAL_SESSION)")
        if scope == "account" and not p.account:
            raise InvalidRequest(f"{p.name} has no account; use scope 'user'")
        if expires_s is not None and expires_s <= 0:
            raise InvalidRequest("expires must be a positive duration, e.g. '30d'")
        clean, secrets = guard.redact(text)
        flags: dict[str, Any] = {"redacted": secrets} if secrets else {}
        if guard.suspicious(clean):
            flags["suspected_injection"] = True
        now = self.clock.time()
        nid = self.db.memory.add_note(clean, scope, p.name, family(p), p.account, caller.session, job_id, now,
                                      now + expires_s if expires_s else None, json.dumps(flags) if flags else None)
        return self._note(nid)

    def _viewer(self, caller: Caller) -> Viewer | None:
        p = caller.principal
        return None if p.is_admin else Viewer(p.account, family(p), p.name, caller.session)

    def recall(self, caller: Caller, query: str, k: int = 5,
               near: list[tuple[int, float]] | None = None) -> list[dict[str, Any]]:
        """The ``k`` notes this caller may read that best answer ``query``: BM25 over its
        words, fused by reciprocal rank with ``near`` (the semantic index's nearest
        notes and their cosines, from ``SemanticRecall``) when given. A note counts by
        meaning from ``MIN_COSINE`` up, by words from ``MIN_WORDS`` of the query's, so a
        query with no good answer gets none rather than the least bad."""
        if not 1 <= k <= 50:
            raise InvalidRequest("k must be between 1 and 50")
        terms = [t for t in re.findall(r"\w+", query.lower()) if t not in STOPWORDS] or re.findall(r"\w+", query.lower())
        if not terms:
            raise InvalidRequest("give some words to search for")
        depth = max(FUSE_DEPTH, k)
        asked = list(dict.fromkeys(terms[:32]))
        words = self._covering(asked, self._bm25(caller, self._selective(asked), depth))
        meaning: list[int] = []
        if near:
            close = [i for i, cos in near if cos >= MIN_COSINE]
            readable = self._readable(caller, close)
            meaning = [i for i in close if i in readable][:depth]
        if not meaning:
            return [{**self._note(i), "score": round(s, 3), "by": ["words"]} for i, s in words[:k]]
        ranked = [i for i, _ in words]
        return [{**self._note(i), "score": round(score, 4),
                 "by": [b for b, ids in (("words", ranked), ("meaning", meaning)) if i in ids]}
                for i, score in semantic.fuse(ranked, meaning)[:k]]

    def _bm25(self, caller: Caller, terms: list[str], k: int) -> list[tuple[int, float]]:
        """The ``k`` best BM25 matches this caller may read: (note id, score), best first."""
        limit = max(50, 20 * k)
        while True:
            # Rank inside the full-text index first (its own top-N), then keep what this caller may read.
            cand = self.db.memory.match(terms, limit)
            if not cand:
                return []
            ok = self._readable(caller, [i for i, _ in cand])
            rows = [(i, s) for i, s in cand if i in ok]
            if len(rows) >= k or len(cand) < limit:
                return rows[:k]
            limit *= 10  # the best matches were not this caller's to read: look further

    def _covering(self, terms: list[str], found: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """The matches that hold at least ``MIN_WORDS`` of ``terms`` (as the full-text index
        splits words: a term 'cuda_home' is its two words)."""
        need = min(MIN_WORDS, math.ceil(len(terms) / 2))
        if need == 1:
            return found
        parts = [set(re.findall(r"[^\W_]+", t)) for t in terms]
        out = []
        for i, score in found:
            row = self.db.memory.note(i)
            held = set(re.findall(r"[^\W_]+", row[1].lower())) if row else set()
            if sum(1 for p in parts if p and p <= held) >= need:
                out.append((i, score))
        return out

    def _readable(self, caller: Caller, ids: list[int]) -> set[int]:
        """Which of these notes the caller may read now (scope, expiry)."""
        if not ids:
            return set()
        return self.db.memory.readable(ids, self._viewer(caller), self.clock.time())

    def _selective(self, terms: list[str]) -> list[str]:
        """The terms found in at most ``COMMON_SHARE`` of all notes. The others weigh
        almost nothing in BM25, yet an OR over them ranks a large part of the corpus
        (measured: p95 172 ms at 100,000 notes). If every term is that common, all."""
        total = self.db.memory.newest_note()  # O(1), near enough
        if total < 1000:
            return terms
        now = time.monotonic()
        docs: dict[str, int] = {}
        for t in terms:
            hit = self._df.get(t)
            if hit is not None and now - hit[1] <= 60:
                docs[t] = hit[0]
        missing = [t for t in terms if t not in docs]
        if missing:
            got = self.db.memory.term_docs(missing)
            for t in missing:
                docs[t] = got.get(t, 0)
                self._df.put(t, (docs[t], now))
        rare = [t for t in terms if docs[t] <= COMMON_SHARE * total]
        return rare or terms

    def promote(self, caller: Caller, note_id: int) -> dict[str, Any]:
        if not caller.principal.is_admin:
            raise Forbidden("only an admin promotes notes to facility scope")
        if not self.db.memory.promote(note_id):
            raise NotFound(f"no note {note_id}")
        return self._note(note_id)

    def _note(self, nid: int) -> dict[str, Any]:
        r = self.db.memory.note(nid)
        assert r is not None, nid  # asked only for a note just written or found
        flags = json.loads(r[8]) if r[8] else {}
        note = {"id": r[0], "text": r[1], "scope": r[2], "author": r[3], "session": r[4], "job_id": r[5],
                "created": r[6], "expires": r[7], **({"flags": flags} if flags else {})}
        if flags.get("suspected_injection"):
            # Handed to a model as quoted data, never as instructions.
            note["text"] = f"<untrusted-note author={r[3]!r}>\n{r[1]}\n</untrusted-note>"
        return note
