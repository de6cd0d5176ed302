"""Memory's semantic index: one vector per note, kept in SQLite (``note_vectors``) so a
restart re-embeds nothing, and in memory for search.

A note is written at once and embedded a moment later by the gateway's index loop
(``MemoryVerbs.index_loop``): embedding is never on a request's path. Notes are only
appended (their text never changes), so "not embedded yet" is every note after the
last one that is.

Search takes two steps, so it stays in budget at 100,000 notes and beyond: the sign
bits of every vector (48 bytes a note) are compared with the query's by Hamming
distance, which picks ``RERANK`` candidates in under a millisecond (below that many
notes, all are candidates); those are ranked by cosine over int8 copies of the vectors
(a scale per vector; SQLite keeps the float16 vectors they came from). A float32
product over all of 100,000 x 384 reads 150 MB a query: 16 ms p50 on this machine,
over budget by itself; this takes about 2.5 ms and 43 MB at 100,000 notes. The Hamming
pass is approximate: meaning alone found 0.837 against 0.856 exact (docs/benchmarks.md).

Threads: the database is touched only by the event loop (``pending``, ``add``,
``load``); ``nearest`` runs in a worker thread over a snapshot of the arrays, which
``add`` only appends to past the snapshot's length.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from corral.core.db import Database

if TYPE_CHECKING:
    from corral.memory.embed import Embedder

log = logging.getLogger("corral.memory")

RERANK = 2000
"""Candidates from the Hamming pass that are ranked by cosine."""


class _Arrays(NamedTuple):
    ids: np.ndarray  # int64 note ids
    q8: np.ndarray  # int8 vectors, each scaled so its largest component is +-127
    scale: np.ndarray  # float32: a row's cosine is q8 . query * scale
    codes: np.ndarray  # uint64, (dim / 64) x capacity: the sign bits, word by word
    n: int


def _quantize(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> int8 rows, their scales, their sign bits (one row of words per 64 dimensions)."""
    v = vecs.astype(np.float32)
    top = np.maximum(np.abs(v).max(axis=1), 1e-12)
    q8 = np.round(v * (127.0 / top)[:, None]).astype(np.int8)
    return q8, (top / 127.0).astype(np.float32), np.packbits(v > 0, axis=1).view(np.uint64).T


class VectorIndex:
    def __init__(self, db: Database, model: str, dim: int) -> None:
        self.db, self.model, self.dim = db, model, dim
        if dim % 64:
            raise ValueError(f"vectors of {dim} dimensions: a multiple of 64 is needed")
        self._a = self._empty(0)
        self.loaded_to = 0
        """The highest note id whose stored vector is in memory (``load`` goes on from it)."""

    @property
    def size(self) -> int:
        return self._a.n

    # -- the event loop's side ------------------------------------------------------------
    def forget_other_models(self) -> int:
        """Vectors of another model are not comparable: drop them (their notes are
        embedded again). Returns how many went."""
        return self.db.memory.forget_vectors(self.model)

    def load(self, limit: int = 5000) -> int:
        """Read up to ``limit`` stored vectors into memory; 0 when all are in. A slice
        of 5,000 holds the event loop about 30 ms (20,000: 125 ms)."""
        rows = self.db.memory.vectors_after(self.loaded_to, limit)
        if rows:
            vecs = np.frombuffer(b"".join(r[1] for r in rows), np.float16).reshape(len(rows), self.dim)
            self._append(np.array([r[0] for r in rows], np.int64), vecs)
            self.loaded_to = rows[-1][0]
        return len(rows)

    def _last_embedded(self) -> int:
        """The newest note with a stored vector: every note after it waits (notes are
        embedded in id order)."""
        return self.db.memory.last_embedded()

    def pending(self, limit: int = 256) -> list[tuple[int, str]]:
        """Notes not embedded yet, oldest first."""
        return self.db.memory.notes_after(self._last_embedded(), limit)

    def backlog(self) -> int:
        """How many notes wait for their vector."""
        return self.db.memory.count_notes_after(self._last_embedded())

    def add(self, ids: list[int], vecs: np.ndarray) -> None:
        """Store the vectors of these notes and make them searchable."""
        half = vecs.astype(np.float16)
        self.db.memory.put_vectors([(int(i), self.model, v.tobytes()) for i, v in zip(ids, half, strict=True)])
        self._append(np.asarray(ids, np.int64), half)
        self.loaded_to = max(self.loaded_to, max(ids))

    def _empty(self, cap: int) -> _Arrays:
        return _Arrays(np.empty(cap, np.int64), np.empty((cap, self.dim), np.int8), np.empty(cap, np.float32),
                       np.empty((self.dim // 64, cap), np.uint64), 0)

    def _append(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        a, k = self._a, len(ids)
        if a.n + k > len(a.ids):  # grow by doubling into new arrays: a reader keeps its old ones
            grown = self._empty(max(1024, 2 * (a.n + k)))._replace(n=a.n)
            grown.ids[:a.n], grown.q8[:a.n], grown.scale[:a.n] = a.ids[:a.n], a.q8[:a.n], a.scale[:a.n]
            grown.codes[:, :a.n] = a.codes[:, :a.n]
            a = grown
        q8, scale, codes = _quantize(vecs)
        a.ids[a.n:a.n + k], a.q8[a.n:a.n + k], a.scale[a.n:a.n + k] = ids, q8, scale
        a.codes[:, a.n:a.n + k] = codes
        self._a = a._replace(n=a.n + k)  # published last: readers see whole rows only

    # -- any thread -----------------------------------------------------------------------
    def nearest(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` notes nearest the query vector: (note id, cosine), best first."""
        a = self._a
        if a.n == 0:
            return []
        if a.n > RERANK:
            # Word by word over contiguous rows: numpy's sum along a row of 6 words
            # cost ten times as much (4 ms at 100,000 notes; this is 0.4 ms).
            q = np.packbits(query > 0).view(np.uint64)
            dist = np.bitwise_count(a.codes[0, :a.n] ^ q[0]).astype(np.uint16)
            for w in range(1, len(q)):
                dist += np.bitwise_count(a.codes[w, :a.n] ^ q[w])
            cand = np.argpartition(dist, RERANK)[:RERANK]
        else:
            cand = np.arange(a.n)
        sims = (a.q8[cand].astype(np.float32) @ query.astype(np.float32)) * a.scale[cand]
        k = min(k, len(cand))
        top = np.argpartition(-sims, k - 1)[:k]
        top = top[np.argsort(-sims[top])]
        return [(int(a.ids[cand[i]]), float(sims[i])) for i in top]


class SemanticRecall:
    """The embedder and the index together, as ``MemoryVerbs`` uses them: ``run`` is the
    gateway's index loop, ``nearest`` answers a query. Nothing is loaded while there is
    no note: a gateway whose agents write none never pays for the model."""

    def __init__(self, db: Database, embedder: "Embedder", poll_s: float = 2.0) -> None:
        self.db, self.embedder, self.poll_s = db, embedder, poll_s
        self.index: VectorIndex | None = None
        self.unavailable: str | None = None
        """Why recall is BM25 alone, if it is (the model or onnxruntime missing)."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A note was written: embed it now rather than at the next poll."""
        self._wake.set()

    def status(self) -> dict[str, object]:
        if self.unavailable:
            return {"semantic": False, "why": self.unavailable}
        if self.index is None:
            return {"semantic": True, "model": "not loaded yet (no note so far)"}
        return {"semantic": True, "model": self.index.model, "embedded": self.index.size,
                "waiting": self.index.backlog()}

    async def run(self, batch: int = 128) -> None:
        while not self.db.memory.any_note():
            await self._sleep()
        try:
            await asyncio.to_thread(self.embedder.load)
        except Exception as e:  # EmbedderUnavailable, or a model that would not build
            self.unavailable = str(e)
            log.warning("recall is BM25 alone: %s", e)
            return
        index = VectorIndex(self.db, self.embedder.name, self.embedder.dim)
        if gone := index.forget_other_models():
            log.info("%d note vectors of another model dropped; their notes are embedded again", gone)
        while index.load():  # in slices: other requests go between them
            await asyncio.sleep(0)
        self.index = index
        while True:
            todo = index.pending(batch)
            if not todo:
                await self._sleep()
                continue
            try:
                vecs = await asyncio.to_thread(self.embedder.embed, [t for _, t in todo])
            except Exception as e:  # never expected; the loop must outlive it and say so
                log.error("notes %d..%d not embedded: %s", todo[0][0], todo[-1][0], e)
                await asyncio.sleep(30)
                continue
            index.add([i for i, _ in todo], vecs)

    async def _sleep(self) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), self.poll_s)
        except TimeoutError:
            pass

    async def nearest(self, query: str, k: int) -> list[tuple[int, float]] | None:
        """The notes nearest ``query`` in meaning, or None while there is no index."""
        index = self.index
        if index is None or index.size == 0:
            return None

        def near() -> list[tuple[int, float]]:
            return index.nearest(self.embedder.embed([query])[0], k)

        return await asyncio.to_thread(near)


def fuse(*rankings: list[int], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion: each list gives 1 / (k + rank) to what it ranks; the sum
    decides. k = 60 as Cormack et al. chose it; ties keep the first list's order.
    -> (id, fused score), best first."""
    score: dict[int, float] = {}
    for ranking in rankings:
        for r, i in enumerate(ranking):
            score[i] = score.get(i, 0.0) + 1.0 / (k + r + 1)
    return sorted(score.items(), key=lambda kv: -kv[1])
