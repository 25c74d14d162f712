"""Failed authentications counted per client address in a sliding minute, so guessing is slow."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

WINDOW_SECONDS = 60.0
# Addresses remembered at once: a flood from many addresses cannot grow memory without bound (the
# least recently failing are forgotten first).
MAX_TRACKED_ADDRESSES = 10_000


class FailedAuthLimiter:
    """Per address: at most `limit` failures in any window; `retry_after` says how long is left."""

    def __init__(self, limit: int, window: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 max_addresses: int = MAX_TRACKED_ADDRESSES) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        cutoff = self._clock() - self.window
        while failures and failures[0] <= cutoff:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures

    def retry_after(self, address: str) -> int | None:
        """Seconds until this address may try again, or None when it may now."""
        failures = self._recent(address)
        if failures is None or len(failures) < self.limit:
            return None
        return max(1, int(failures[0] + self.window - self._clock()) + 1)

    def failed(self, address: str) -> None:
        failures = self._recent(address)
        if failures is None:
            failures = self._failures[address] = deque()
        self._failures.move_to_end(address)
        failures.append(self._clock())
        while len(failures) > self.limit:
            failures.popleft()  # the oldest no longer decides anything once the limit is reached
        while len(self._failures) > self._max_addresses:
            self._failures.popitem(last=False)
