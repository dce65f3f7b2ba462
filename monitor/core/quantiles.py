"""Medians that merge and stay small: a log-scale histogram whose buckets keep a count and a sum.

The scores need the median reachability RTT over a day and each peer's median chat speed over a week.
Exact medians need every value in memory (or a sort in SQL per peer); a histogram needs one row
per (peer, bucket), can be summed in SQL (``GROUP BY peer, bucket``) and merged across rollups,
and is the same whether it was filled from Python objects or from SQL. Buckets are 1/16 of an
octave wide (``bucket(v) = floor(ln(v / LOW) × BUCKETS_PER_OCTAVE / ln 2)``), so the estimate — the
mean of the values in the bucket holding the middle value (of the two middle buckets' means for
an even count) — is within ``MAX_RELATIVE_ERROR`` (4.4 %) of the true median, and exact when the
values in that bucket are equal.

Pure: no I/O. ``SCALE`` and ``LOW`` are what the store's SQL uses, so both compute the same bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

BUCKETS_PER_OCTAVE = 16
LOW = 1e-5  # seconds: values at or below it fall in bucket 0
MAX_BUCKET = 27 * BUCKETS_PER_OCTAVE  # LOW × 2^27 ≈ 22 minutes: larger values share the last bucket
SCALE = BUCKETS_PER_OCTAVE / math.log(2)
MAX_RELATIVE_ERROR = 2 ** (1 / BUCKETS_PER_OCTAVE) - 1


def bucket(value: float) -> int:
    """The bucket of a positive value (as the store computes it in SQL: ``floor(ln(v / LOW) × SCALE)``)."""
    if not value > LOW:
        return 0
    return clamp_bucket(math.floor(math.log(value / LOW) * SCALE))


def clamp_bucket(index: int) -> int:
    return min(MAX_BUCKET, max(0, int(index)))


@dataclass(frozen=True)
class Histogram:
    """``bins``: (bucket, count, sum of the values) per non-empty bucket, by bucket."""

    bins: tuple[tuple[int, int, float], ...] = ()

    @property
    def count(self) -> int:
        return sum(n for _, n, _ in self.bins)

    def median(self) -> Optional[float]:
        """The mean of the bucket holding the middle value (the mean of both middle buckets' means
        for an even count); None when empty."""
        n = self.count
        if n == 0:
            return None
        return (self._value_at((n - 1) // 2) + self._value_at(n // 2)) / 2

    def _value_at(self, rank: int) -> float:
        seen = 0
        for _, count, total in self.bins:
            seen += count
            if rank < seen:
                return total / count
        raise IndexError(rank)


def histogram(values: Iterable[Optional[float]]) -> Histogram:
    """The histogram of ``values`` (None and non-finite values are left out)."""
    return from_bins((bucket(v), 1, v) for v in values if v is not None and math.isfinite(v))


def merge_bins(into: dict[int, list], rows: Iterable[tuple[int, int, float]]) -> None:
    """Add (bucket, count, sum) rows into ``into`` (bucket -> [count, sum]). The score job merges a
    day of hourly histograms per peer here: kept to plain dict work."""
    for index, count, total in rows:
        slot = into.get(index)
        if slot is None:
            into[index] = [count, total]
        else:
            slot[0] += count
            slot[1] += total


def from_bins(rows: Iterable[tuple[int, int, float]]) -> Histogram:
    """A histogram from (bucket, count, sum) rows, in any order and with repeats (merged)."""
    merged: dict[int, list] = {}
    merge_bins(merged, rows)
    clamped: dict[int, list] = {}
    for index, (count, total) in merged.items():
        if count:
            key = clamp_bucket(index)
            if key in clamped:
                clamped[key][0] += count
                clamped[key][1] += total
            else:
                clamped[key] = [int(count), float(total)]
    return Histogram(tuple((index, n, total) for index, (n, total) in sorted(clamped.items())))
