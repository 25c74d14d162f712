"""The overview's chart: attempts per time bucket, as bar geometry for a server-rendered SVG."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH = 720
HEIGHT = 160


@dataclass(frozen=True)
class Bar:
    start: datetime
    delivered: int
    failed: int
    x: float
    width: float
    delivered_height: float
    failed_height: float  # drawn on top of the delivered part


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    peak: int
    start: datetime
    end: datetime
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def hours(self) -> int:
        return int((self.end - self.start).total_seconds() // 3600)

    @property
    def failed_total(self) -> int:
        return sum(b.failed for b in self.bars)

    @property
    def delivered_total(self) -> int:
        return sum(b.delivered for b in self.bars)

    @property
    def first_failure(self) -> datetime | None:
        """Where trouble started in the window: the first bucket with a failure."""
        return next((b.start for b in self.bars if b.failed), None)


def bucket_start(at: datetime, bucket: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=at.tzinfo)
    return epoch + ((at - epoch) // bucket) * bucket


def build(counts: dict[datetime, tuple[int, int]], end: datetime, hours: int, bucket: timedelta) -> Chart:
    """One bar per bucket of the last `hours` before `end` (empty buckets included, so time reads
    evenly); `counts` maps a bucket's start to (delivered, failed). Heights scale to the busiest bucket."""
    last = bucket_start(end, bucket)
    count = int(timedelta(hours=hours) / bucket)
    starts = [last - bucket * i for i in range(count - 1, -1, -1)]
    peak = max((d + f for d, f in (counts.get(s, (0, 0)) for s in starts)), default=0)
    slot = WIDTH / count
    bars = []
    for index, start in enumerate(starts):
        delivered, failed = counts.get(start, (0, 0))
        scale = HEIGHT / peak if peak else 0.0
        bars.append(Bar(start, delivered, failed, x=round(index * slot, 2), width=round(max(slot - 1, 1), 2),
                        delivered_height=round(delivered * scale, 2), failed_height=round(failed * scale, 2)))
    return Chart(bars, peak, starts[0], last + bucket)
