"""A cache bounded by size, never by history: the gateway's per-job caches are LRUs.

A gateway that runs for months sees millions of jobs; a dict keyed by job, spec or
request that is only ever added to grows with every one of them (issue 46: ~3.5 KB a
job). An ``LRU`` keeps the entries used last, at most ``size`` of them and, given a
``weigh``, at most ``budget`` units of their weight (bytes of text, say), so one entry of
256 KiB cannot hold a thousand entries' room. What falls out is computed again when it
is asked for: the caches here hold what can be recomputed, never a record.

Thread-safe: the gateway reads some of these from its worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Iterator, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, size: int, budget: int | None = None, weigh: Callable[[K, V], int] | None = None) -> None:
        if size < 1:
            raise ValueError("an LRU holds at least one entry")
        self.size, self.budget, self.weigh = size, budget, weigh
        self.weight = 0
        """The sum of the entries' weights (0 without ``weigh``)."""
        self._d: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            hit = self._d.get(key)
            if hit is None:
                return default
            self._d.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V) -> None:
        w = self.weigh(key, value) if self.weigh is not None else 0
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.weight -= old[1]
            self._d[key] = (value, w)
            self.weight += w
            while len(self._d) > self.size or (self.budget is not None and self.weight > self.budget
                                                and len(self._d) > 1):
                self.weight -= self._d.popitem(last=False)[1][1]

    def pop(self, key: K, default: V | None = None) -> V | None:
        with self._lock:
            hit = self._d.pop(key, None)
            if hit is None:
                return default
            self.weight -= hit[1]
            return hit[0]

    def drop_oldest_while(self, stale: Callable[[V], bool]) -> int:
        """Drop the least recently used entries while ``stale`` holds for them; -> how many."""
        n = 0
        with self._lock:
            while self._d:
                key, (value, w) = next(iter(self._d.items()))
                if not stale(value):
                    break
                del self._d[key]
                self.weight -= w
                n += 1
        return n

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.weight = 0

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._d))
