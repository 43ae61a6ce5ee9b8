"""Requests per minute per team: a token bucket per team, in the API process's memory.

Every authenticated request (`backend.deps.current_principal`) takes a token from its team's
bucket. A bucket holds up to a minute's worth (`requests_per_minute`, so a burst of that many
is fine: the UI loading view after view) and refills at `requests_per_minute / 60` a second.
An empty bucket answers 429 `rate_limited` with `Retry-After` (whole seconds until a token is
back). Buckets live in one process: with several API processes a team gets the limit in each.

The team's limit (`backend.tenancy`) is read from the database at most every `LIMITS_TTL_S`
seconds; the admin endpoint that changes it calls `forget` so this process applies it at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from backend.errors import ApiError

#: seconds a team's `requests_per_minute` is kept before it is read again
LIMITS_TTL_S = 5.0


@dataclass(slots=True)
class Bucket:
    """Tokens left at `at` (a monotonic time)."""

    tokens: float
    at: float


class RateLimiter:
    """The buckets of every team seen by this process; safe to use from many threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, Bucket] = {}
        self._limits: dict[int, tuple[float, int]] = {}

    def limit_of(self, team_id: int, read: Callable[[], int]) -> int:
        """The team's requests a minute, from `read()` when not known for `LIMITS_TTL_S`."""
        now = self.clock()
        with self._lock:
            known = self._limits.get(team_id)
        if known is not None and now - known[0] < LIMITS_TTL_S:
            return known[1]
        per_minute = read()
        with self._lock:
            self._limits[team_id] = (now, per_minute)
        return per_minute

    def forget(self, team_id: int) -> None:
        """Read the team's limit again on its next request (an admin changed it)."""
        with self._lock:
            self._limits.pop(team_id, None)

    def take(self, team_id: int, per_minute: int) -> float:
        """Take one token of the team's bucket: 0.0 when there was one, else the seconds
        until there is."""
        now, capacity, rate = self.clock(), float(per_minute), per_minute / 60.0
        with self._lock:
            bucket = self._buckets.setdefault(team_id, Bucket(capacity, now))
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
            bucket.at = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / rate


def rate_limited(per_minute: int, wait_s: float) -> ApiError:
    """The 429 of a team over its `per_minute` requests, to retry in `wait_s` seconds."""
    retry = max(1, math.ceil(wait_s))
    return ApiError(
        429,
        "rate_limited",
        f"too many requests: the team's limit is {per_minute} a minute (per API process); "
        f"retry in {retry} s",
        headers={"Retry-After": str(retry)},
        limit=per_minute,
        retry_after_s=retry,
    )
