"""Bounded caches for work that candidates of one search share inside a worker process.

A search plans many candidates of one model in each worker process; many of them repeat
work another has done: candidates that differ only in their pipeline schedule share the
completed and lowered program of one micro-batch (`plan_pipeline`), and sibling recipes
(dp, ZeRO-1, ZeRO-2) share the forward and backward units of their stages
(`cost.pipeline_slots`). Each such cache is a `Reuse`: bounded (the least recently used
entry goes first), keyed by exactly what its result depends on, and registered here so that
`clear_all` empties them and `enabled(False)` turns them off (tests build the same plan
with and without them and compare). What a cache hands back must never be mutated by its
caller: the programs, graphs and events it holds are shared by every hit.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

#: Every cache made here, by name (`clear_all`, `stats`).
_ALL: dict[str, Reuse[object]] = {}
_ON = [True]


class Reuse(Generic[V]):
    """A least-recently-used map of at most `size` entries, with hit and miss counts."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self.entries: OrderedDict[Hashed, V] = OrderedDict()
        self.hits = self.misses = 0
        _ALL[name] = self  # type: ignore[assignment]

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value kept for `key`, else `make()` (kept, the oldest entry dropped when
        full). With the caches turned off (`enabled`), always `make()`."""
        if not _ON[0]:
            return make()
        # a key of thousands of parts is hashed once, not thrice (`Hashed`: once in all)
        hashed = key if isinstance(key, Hashed) else Hashed(key)
        value = self.entries.get(hashed, _MISSING)
        if value is not _MISSING:
            self.hits += 1
            self.entries.move_to_end(hashed)
            return value  # type: ignore[return-value]
        self.misses += 1
        value = make()
        self.entries[hashed] = value
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value

    def keys(self) -> list[Hashable]:
        """The keys kept, the least recently used first."""
        return [hashed.key for hashed in self.entries]

    def clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0


_MISSING = object()


class Memo(Generic[V]):
    """A plain map of at most `size` entries, emptied when full: for many small values
    looked up once per op, where a `Reuse`'s bookkeeping would cost more than the work it
    saves. Registered like a `Reuse` (`clear_all`, `stats`, `enabled`)."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self.entries: dict[Hashable, V] = {}
        self.hits = self.misses = 0
        _ALL[name] = self  # type: ignore[assignment]

    def get(self, key: Hashable) -> V | None:
        """The value kept for `key`, None where there is none (or the caches are off)."""
        if not _ON[0]:
            return None
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: Hashable, value: V) -> None:
        if _ON[0]:
            if len(self.entries) >= self.size:
                self.entries.clear()
            self.entries[key] = value

    def clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0


class Hashed:
    """A key with its hash taken once (tuples do not keep theirs): a `Reuse` takes it as
    it is, and a key built of it hashes it in one step."""

    __slots__ = ("hash", "key")

    def __init__(self, key: Hashable) -> None:
        self.key, self.hash = key, hash(key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hashed) and self.hash == other.hash and self.key == other.key


def hashed(key: Hashable) -> Hashed | None:
    """`key` with its hash taken once, or None where a part of it cannot be hashed."""
    try:
        return Hashed(key)
    except TypeError:
        return None


def clear_all() -> None:
    """Empty every cache (and reset its counts)."""
    for cache in _ALL.values():
        cache.clear()


def stats() -> dict[str, tuple[int, int]]:
    """(hits, misses) of every cache, by name."""
    return {name: (c.hits, c.misses) for name, c in _ALL.items()}


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Within the block, the caches are used (`on`) or bypassed (every value made anew)."""
    before = _ON[0]
    _ON[0] = on
    try:
        yield
    finally:
        _ON[0] = before
