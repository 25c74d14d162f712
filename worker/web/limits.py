"""Failed authentications counted per client address in a sliding minute, so guessing is slow, and
the one rule every credential (API token, console login, console session) is checked by."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

WINDOW_SECONDS = 60.0
# Addresses (and credentials that passed) remembered at once: a flood from many addresses cannot
# grow memory without bound (the least recently seen are forgotten first).
MAX_TRACKED_ADDRESSES = 10_000
T = TypeVar("T")


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """What a credential stands for, or None; `retry_after` is set when it failed from an address
    that was already locked out (answer 429 rather than 401)."""

    found: T | None
    retry_after: int | None = None


class _Turn:
    """The lookups of one locked-out address, one at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


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
        # hashes of credentials that passed within the window, by when
        self._passed: OrderedDict[bytes, float] = OrderedDict()
        self._turns: dict[str, _Turn] = {}

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
        """Seconds until this address is no longer locked out, or None when it is not."""
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

    async def check(self, address: str, key: bytes | None,
                    lookup: Callable[[], Awaitable[T | None]]) -> Verdict[T]:
        """Check a credential from `address`: `key` is its hash, or None when its shape alone
        refuses it (then nothing is looked up); `lookup` asks the database what it stands for.

        A credential that is valid is never refused, locked-out address or not: a lockout must not
        let anyone behind the same address (a NAT, a proxy) shut out everyone else. Only failures
        are limited: past the limit they answer 429 and keep the address locked while they go on.
        Each answer still tells valid from invalid, so what bounds guessing from a locked-out
        address is that its lookups go one at a time: it holds one database connection, never the
        pool, and guesses at the speed of one index lookup. A credential that passed within the
        window (from anywhere) skips that queue, so clients already in use behind a locked-out
        address do not wait behind a guesser.
        """
        locked = self.retry_after(address) is not None
        found: T | None = None
        if key is not None:
            if locked and not self.passed_recently(key):
                async with self._one_at_a_time(address):
                    found = await lookup()
            else:
                found = await lookup()
        return self.verdict(address, key, found, locked)

    def verdict(self, address: str, key: bytes | None, found: T | None, locked: bool) -> Verdict[T]:
        """The verdict on a credential looked up from `address` (`locked`: whether the address was
        locked out before the lookup), counting a failure against it."""
        if found is not None:
            assert key is not None
            self._remember_passed(key)
            return Verdict(found)
        if key is not None:
            self._passed.pop(key, None)  # revoked or expired since: no longer one that passed
        self.failed(address)
        return Verdict(None, self.retry_after(address) if locked else None)

    def passed(self, key: bytes) -> None:
        """A credential checked some other way passed (it skips a locked-out address's queue)."""
        self._remember_passed(key)

    def passed_recently(self, key: bytes) -> bool:
        """Whether this credential passed within the window (and has not failed since)."""
        when = self._passed.get(key)
        return when is not None and when > self._clock() - self.window

    def _remember_passed(self, key: bytes) -> None:
        self._passed[key] = self._clock()
        self._passed.move_to_end(key)
        while len(self._passed) > self._max_addresses:
            self._passed.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, address: str) -> AsyncIterator[None]:
        turn = self._turns.get(address)
        if turn is None:
            turn = self._turns[address] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[address]
