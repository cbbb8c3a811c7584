"""Which partition the cleaner takes next (storage/cleaner/manager.py: candidate, choose): Kafka's dirty ratio
over the cleanable range, min.cleanable.dirty.ratio, max.compaction.lag.ms (KIP-354), the checkpoint clamped to
the log start."""

from __future__ import annotations

from oncelog.storage.cleaner.manager import CleanerView, candidate, choose
from oncelog.storage.cleaner.segment_cleaner import SourceSegment

NOW = 1_700_000_000_000
NEVER = (1 << 63) - 1


def view(sizes: list[int], *, uncleanable: int | None = None, ratio: float = 0.5, lag: int = NEVER,
         first_dirty_ts: int = -1, log_start: int = 0, key=("t", 0)) -> CleanerView:
    segs = tuple(SourceSegment(i * 10, i * 10 + 10, s, first_dirty_ts) for i, s in enumerate(sizes))
    return CleanerView(key=key, directory="unused", generation=0, log_start=log_start, segments=segs,
                       first_uncleanable=len(sizes) * 10 if uncleanable is None else uncleanable, aborted=(),
                       last_batch_of_producer={}, delete_retention_ms=0, min_cleanable_ratio=ratio,
                       max_compaction_lag_ms=lag, segment_bytes=1 << 30, max_index_bytes=1 << 20,
                       index_interval_bytes=4096)


def test_the_ratio_counts_clean_and_dirty_bytes_of_the_cleanable_range():
    v = view([100, 100, 100, 100])
    c = candidate(v, checkpoint=20, now_ms=NOW)  # 200 clean, 200 dirty
    assert (c.first_dirty, c.ratio, c.due) == (20, 0.5, False)
    assert candidate(view([100, 100, 100, 100], ratio=0.51), checkpoint=20, now_ms=NOW) is None
    # Segments past the first uncleanable offset do not count.
    c = candidate(view([100, 100, 100, 100], uncleanable=30, ratio=0.3), checkpoint=20, now_ms=NOW)
    assert c.ratio == 100 / 300


def test_nothing_dirty_or_nothing_cleanable_is_no_candidate():
    assert candidate(view([100, 100]), checkpoint=20, now_ms=NOW) is None
    assert candidate(view([100, 100], uncleanable=0), checkpoint=None, now_ms=NOW) is None


def test_the_checkpoint_is_clamped_to_the_log_start():
    c = candidate(view([100, 100, 100], log_start=20, ratio=0.1), checkpoint=10, now_ms=NOW)
    assert c.first_dirty == 20


def test_max_compaction_lag_makes_a_partition_due_below_the_ratio():
    low = view([100, 100, 100, 100], ratio=0.9, lag=60_000, first_dirty_ts=NOW - 60_001)
    c = candidate(low, checkpoint=30, now_ms=NOW)
    assert c is not None and c.due and c.ratio == 0.25
    assert candidate(view([100] * 4, ratio=0.9, lag=60_000, first_dirty_ts=NOW - 60_000), 30, NOW) is None


def test_the_dirtiest_goes_first():
    a = candidate(view([100, 100], key=("a", 0)), checkpoint=10, now_ms=NOW)
    b = candidate(view([100, 300], key=("b", 0)), checkpoint=10, now_ms=NOW)
    assert choose([a, b]).view.key == ("b", 0)
    assert choose([]) is None
